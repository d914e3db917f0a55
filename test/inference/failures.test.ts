/**
 * Upstream failures and client disconnects (spec: Event 7, Errors for chat; ARCHITECTURE §4–5):
 * before the first byte a JSON envelope with its real status; mid-stream the connection ends without
 * `[DONE]`; a client that goes away interrupts the upstream request; every admission ticket is released
 * and charged at most once, and every request leaves exactly one row.
 */
import { Effect, Layer } from "effect"
import * as Net from "node:net"
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { Admission } from "../../src/quota/Admission.js"
import { startGateway, type TestGateway } from "../support/Gateway.js"
import { Behaviour, Chunks, type MockUpstream, raw, startMockUpstream } from "../support/MockUpstream.js"
import { makeUnlimitedAdmission } from "../support/UnlimitedAdmission.js"
import {
  addMockModel,
  eventually,
  expectError,
  latestRows,
  parseSse,
  postChat,
  readBody,
  rowById,
  rowIdOf,
  rowsById,
  user
} from "./helpers.js"

const closedPort = async () => {
  const server = Net.createServer()
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r))
  const port = (server.address() as Net.AddressInfo).port
  await new Promise<void>((r) => server.close(() => r()))
  return port
}

const hi = [user("hello")]

describe("chat failures", () => {
  let gw: TestGateway
  let mock: MockUpstream
  const adm = makeUnlimitedAdmission()

  // The test admission, except that it dies (a defect, not a GatewayError) for the model "ws-boom".
  const admission = Layer.effect(
    Admission,
    Effect.map(Admission, (inner) =>
      Admission.of({
        ...inner,
        admit: (input) => input.model.id === "ws-boom" ? Effect.die(new Error("admission exploded")) : inner.admit(input)
      }))
  ).pipe(Layer.provide(adm.layer))

  beforeAll(async () => {
    mock = await startMockUpstream()
    const deadPort = await closedPort()
    gw = await startGateway({
      admission,
      configure: (doc) => {
        addMockModel(doc, { id: "ws-boom", provider: "boom", baseUrl: mock.url })
        // total_ms (also undici's headers timeout backstop) is far above the deadlines under test.
        addMockModel(doc, { baseUrl: mock.url, timeouts: { first_token_ms: 400, idle_ms: 400, total_ms: 30_000 } })
        addMockModel(doc, { id: "ws-dead", provider: "dead", baseUrl: `http://127.0.0.1:${deadPort}/v1` })
      }
    })
  })
  afterAll(async () => {
    await gw?.stop()
    await mock?.close()
  })
  afterEach(async () => {
    // Nothing leaks: every ticket is released (a cancelled stream releases it just after the response).
    await eventually(() => expect(adm.stats.open).toBe(0))
  })

  /** Each ticket is either settled or refunded, once. */
  const charges = () => ({ settled: adm.stats.settled.length, refunded: adm.stats.refunded, admitted: adm.stats.admitted })

  describe("before the first byte: a JSON envelope with the real status", () => {
    it.each([false, true])("upstream 500 -> 500 upstream_error (stream: %s), reservation refunded", async (stream) => {
      mock.script(Behaviour.status(500, { error: { message: "internal upstream failure" } }))
      const before = charges()
      const res = await postChat(gw, { model: "ws-mock", messages: hi, stream })
      expect(res.headers.get("content-type")).toContain("application/json")
      await expectError(res, 500, "upstream_error", "server_error")
      const row = await rowById(gw, rowIdOf(res))
      expect(row).toMatchObject({ status: "error", error_code: "upstream_error", http_status: 500, stream })
      expect(row.error).toContain("500")
      expect(charges()).toEqual({ ...before, admitted: before.admitted + 1, refunded: before.refunded + 1 })
    })

    it("upstream 400 -> 400 upstream_rejected (a deterministic refusal SDKs do not retry)", async () => {
      mock.script(Behaviour.status(400, { error: { message: "bad param" } }))
      const res = await postChat(gw, { model: "ws-mock", messages: hi })
      await expectError(res, 400, "upstream_rejected", "invalid_request_error")
    })

    it.each([false, true])("upstream 429 -> 503 upstream_rate_limited with Retry-After (stream: %s)", async (stream) => {
      mock.script(Behaviour.rateLimited())
      const res = await postChat(gw, { model: "ws-mock", messages: hi, stream })
      await expectError(res, 503, "upstream_rate_limited", "service_unavailable")
      expect(res.headers.get("retry-after")).toBe("5")
      const row = await rowById(gw, rowIdOf(res))
      expect(row).toMatchObject({ status: "error", error_code: "upstream_rate_limited", http_status: 503 })
    })

    it.each([false, true])("connection refused -> 503 service_unavailable (stream: %s)", async (stream) => {
      const before = charges()
      const res = await postChat(gw, { model: "ws-dead", messages: hi, stream })
      await expectError(res, 503, "service_unavailable", "service_unavailable")
      const row = await rowById(gw, rowIdOf(res))
      expect(row).toMatchObject({ status: "error", error_code: "service_unavailable", provider: "dead" })
      expect(charges().refunded).toBe(before.refunded + 1)
    })

    it.each([false, true])("no answer within first_token_ms -> 503 upstream_timeout (stream: %s)", async (stream) => {
      mock.script(Behaviour.hangBeforeHeaders())
      const aborts = mock.clientAborts()
      const started = Date.now()
      const res = await postChat(gw, { model: "ws-mock", messages: hi, stream })
      await expectError(res, 503, "upstream_timeout", "service_unavailable")
      // first_token_ms (400) decides, not total_ms (30 s).
      expect(Date.now() - started).toBeLessThan(3_000)
      const row = await rowById(gw, rowIdOf(res))
      expect(row).toMatchObject({ status: "error", error_code: "upstream_timeout" })
      // The gateway gave up on the upstream request: its socket is closed.
      await mock.waitForClientAborts(aborts + 1)
    })

    it("headers but no first token within first_token_ms -> JSON 503 upstream_timeout, not a stream", async () => {
      mock.script(Behaviour.hangAfter([]))
      const started = Date.now()
      const res = await postChat(gw, { model: "ws-mock", messages: hi, stream: true })
      expect(res.headers.get("content-type")).toContain("application/json")
      await expectError(res, 503, "upstream_timeout", "service_unavailable")
      expect(Date.now() - started).toBeLessThan(3_000)
    })

    it("upstream drops the connection before headers -> 503 service_unavailable", async () => {
      mock.script(Behaviour.dropBeforeHeaders())
      const res = await postChat(gw, { model: "ws-mock", messages: hi, stream: true })
      await expectError(res, 503, "service_unavailable", "service_unavailable")
    })

    it("an error object inside a 200 stream before any content -> 500 upstream_error", async () => {
      mock.script(Behaviour.stream([{ error: { message: "model crashed" } }]))
      const res = await postChat(gw, { model: "ws-mock", messages: hi, stream: true })
      await expectError(res, 500, "upstream_error", "server_error")
    })

    it("a non-JSON 200 answer to a non-streaming request -> 500 upstream_error", async () => {
      mock.script(Behaviour.json("<html>gateway</html>"))
      const res = await postChat(gw, { model: "ws-mock", messages: hi })
      await expectError(res, 500, "upstream_error", "server_error")
    })
  })

  it("a defect inside the pipeline: 500 internal_error, and its row says error/internal_error (not cancelled)", async () => {
    const res = await postChat(gw, { model: "ws-boom", messages: hi })
    await expectError(res, 500, "internal_error", "server_error")
    await eventually(async () => {
      const [row] = await latestRows(gw, 1)
      expect(row).toMatchObject({ model_id: "ws-boom", status: "error", error_code: "internal_error", http_status: 500 })
    })
  })

  describe("mid-stream: the connection ends without [DONE]", () => {
    const expectCutStream = async (res: Response) => {
      expect(res.status).toBe(200)
      expect(res.headers.get("content-type")).toContain("text/event-stream")
      const { text, error } = await readBody(res)
      const sse = parseSse(text)
      expect(sse.done).toBe(false)
      // The transfer itself fails (no chunked terminator), so clients cannot mistake it for a complete answer.
      expect(error).toBeInstanceOf(Error)
      expect(sse.chunks[0].choices[0].delta.role).toBe("assistant")
      expect(sse.chunks.every((c) => c.choices[0].finish_reason === null)).toBe(true)
      return sse
    }

    it("upstream drops the connection mid-stream: partial frames, no [DONE], row status error", async () => {
      mock.script(Behaviour.dropAfter([Chunks.role(), Chunks.content("partial "), Chunks.content("answer")]))
      const before = charges()
      const res = await postChat(gw, { model: "ws-mock", messages: hi, stream: true })
      const rowId = rowIdOf(res)
      const sse = await expectCutStream(res)
      expect(sse.chunks.map((c) => c.choices[0].delta.content ?? "").join("")).toBe("partial answer")
      const row = await rowById(gw, rowId)
      expect(row).toMatchObject({ status: "error", error_code: "upstream_error", stream: true })
      expect(row.ttfb_ms).not.toBeNull()
      // Delivered output is charged once, never refunded too.
      expect(charges()).toEqual({ admitted: before.admitted + 1, settled: before.settled + 1, refunded: before.refunded })
      expect(adm.stats.settled.at(-1)).toBeGreaterThan(0)
    })

    it("a stream cut after the upstream reported usage is charged that usage, not an estimate", async () => {
      mock.script(Behaviour.dropAfter([
        Chunks.role(),
        Chunks.content("partial answer"),
        Chunks.finish("stop"),
        Chunks.usage({ prompt: 321, completion: 45 })
      ]))
      const res = await postChat(gw, { model: "ws-mock", messages: hi, stream: true })
      const rowId = rowIdOf(res)
      await expectCutStream(res)
      const row = await rowById(gw, rowId)
      expect(row).toMatchObject({ status: "error", input_tokens: 321, output_tokens: 45 })
      // weights of ws-mock: input 1, output 2
      expect(adm.stats.settled.at(-1)).toBe(321 * 1 + 45 * 2)
    })

    it("upstream goes idle longer than idle_ms mid-stream: no [DONE], row upstream_timeout, upstream socket closed", async () => {
      mock.script(Behaviour.hangAfter([Chunks.role(), Chunks.content("partial")]))
      const aborts = mock.clientAborts()
      const started = Date.now()
      const res = await postChat(gw, { model: "ws-mock", messages: hi, stream: true })
      const rowId = rowIdOf(res)
      await expectCutStream(res)
      // idle_ms (400) decides, not total_ms (30 s).
      expect(Date.now() - started).toBeLessThan(3_000)
      expect(await rowById(gw, rowId)).toMatchObject({ status: "error", error_code: "upstream_timeout" })
      await mock.waitForClientAborts(aborts + 1)
    })

    it("an error object mid-stream: no [DONE], row upstream_error", async () => {
      mock.script(Behaviour.stream([Chunks.role(), Chunks.content("partial"), { error: { message: "overloaded" } }]))
      const res = await postChat(gw, { model: "ws-mock", messages: hi, stream: true })
      const rowId = rowIdOf(res)
      await expectCutStream(res)
      expect(await rowById(gw, rowId)).toMatchObject({ status: "error", error_code: "upstream_error" })
    })

    it("a stream that ends without finish_reason or [DONE] is a failure, not a success", async () => {
      mock.script(Behaviour.stream([Chunks.role(), Chunks.content("partial")], { done: false }))
      const res = await postChat(gw, { model: "ws-mock", messages: hi, stream: true })
      const rowId = rowIdOf(res)
      await expectCutStream(res)
      expect(await rowById(gw, rowId)).toMatchObject({ status: "error", error_code: "upstream_error" })
    })

    it("malformed frames are skipped; the stream completes", async () => {
      mock.script(Behaviour.stream([
        Chunks.role(),
        raw("data: {not json\n\n"),
        Chunks.content("fine"),
        raw(": upstream comment\n\n"),
        Chunks.finish("stop")
      ]))
      const res = await postChat(gw, { model: "ws-mock", messages: hi, stream: true })
      const sse = parseSse(await res.text())
      expect(sse.doneLast).toBe(true)
      expect(sse.chunks.map((c) => c.choices[0].delta.content ?? "").join("")).toBe("fine")
    })
  })

  describe("client disconnect", () => {
    it("mid-stream: the upstream socket is closed, the ticket released and charged for delivered output only", async () => {
      mock.script(Behaviour.hangAfter([Chunks.role(), Chunks.content("first words "), Chunks.content("then more")]))
      const aborts = mock.clientAborts()
      const before = charges()
      const controller = new AbortController()
      const res = await postChat(gw, { model: "ws-mock", messages: hi, stream: true }, { signal: controller.signal })
      expect(res.status).toBe(200)
      const rowId = rowIdOf(res)
      const reader = res.body!.getReader()
      const decoder = new TextDecoder()
      let text = ""
      while (!text.includes("then more")) {
        const { value, done } = await reader.read()
        if (done) throw new Error(`stream ended early: ${text}`)
        text += decoder.decode(value, { stream: true })
      }
      controller.abort()
      await mock.waitForClientAborts(aborts + 1)
      await eventually(() => expect(adm.stats.open).toBe(0))
      expect(charges()).toEqual({ admitted: before.admitted + 1, settled: before.settled + 1, refunded: before.refunded })
      // "first words then more" is 21 chars: about 6 tokens at 4 chars per token, weight 2.
      const charged = adm.stats.settled.at(-1)!
      expect(charged).toBeGreaterThan(0)
      await eventually(async () => {
        const row = await rowById(gw, rowId)
        expect(row).toMatchObject({ status: "cancelled", http_status: 499, stream: true })
        expect(row.output_tokens).toBe(Math.ceil("first words then more".length / 4))
      })
    })

    it("before the first byte (streaming): the upstream request is aborted, the reservation refunded, the row cancelled", async () => {
      mock.script(Behaviour.hangBeforeHeaders())
      const aborts = mock.clientAborts()
      const requests = mock.requests.length
      const before = charges()
      const controller = new AbortController()
      const pending = postChat(gw, { model: "ws-mock", messages: hi, stream: true }, { signal: controller.signal }).catch((e) => e)
      await eventually(() => expect(mock.requests.length).toBe(requests + 1))
      controller.abort()
      expect(await pending).toBeInstanceOf(Error)
      await mock.waitForClientAborts(aborts + 1)
      await eventually(() => expect(adm.stats.open).toBe(0))
      expect(charges()).toEqual({ admitted: before.admitted + 1, settled: before.settled, refunded: before.refunded + 1 })
      await eventually(async () => {
        const [row] = await latestRows(gw, 1)
        expect(row).toMatchObject({ model_id: "ws-mock", status: "cancelled", http_status: 499, stream: true, output_tokens: 0 })
      })
    })

    it("40 concurrent streams, clients leaving at different points: every ticket closed once, one row each", async () => {
      const frames = [Chunks.role(), ...Array.from({ length: 8 }, (_, i) => Chunks.content(`w${i} `)), Chunks.finish("stop"), Chunks.usage({ prompt: 5, completion: 8 })]
      mock.script(Behaviour.slow(frames, 15))
      const before = charges()
      const outcomes = await Promise.all(Array.from({ length: 40 }, async (_, i) => {
        const leaveAfter = i % 5 // 0-3: leave after that many content frames; 4: read to the end
        const controller = new AbortController()
        const res = await postChat(gw, { model: "ws-mock", messages: hi, stream: true }, { signal: controller.signal })
        const rowId = rowIdOf(res)
        if (leaveAfter === 4) {
          expect(parseSse(await res.text()).doneLast).toBe(true)
          return { rowId, completed: true }
        }
        const reader = res.body!.getReader()
        const decoder = new TextDecoder()
        let text = ""
        while ((text.match(/"content":"w/g) ?? []).length < leaveAfter) {
          const { value, done } = await reader.read()
          if (done) break
          text += decoder.decode(value, { stream: true })
        }
        controller.abort()
        return { rowId, completed: false }
      }))
      await eventually(() => expect(adm.stats.open).toBe(0))
      const after = charges()
      expect(after.admitted - before.admitted).toBe(40)
      expect((after.settled - before.settled) + (after.refunded - before.refunded)).toBe(40)
      await eventually(async () => {
        const rows = await rowsById(gw, outcomes.map((o) => o.rowId))
        expect(rows).toHaveLength(40)
        const status = new Map(rows.map((r) => [Number(r.id), r.status]))
        for (const o of outcomes) expect(status.get(o.rowId)).toBe(o.completed ? "success" : "cancelled")
      })
    })

    it("before the first byte (non-streaming): the upstream request is aborted and the reservation refunded", async () => {
      mock.script(Behaviour.hangBeforeHeaders())
      const aborts = mock.clientAborts()
      const requests = mock.requests.length
      const before = charges()
      const controller = new AbortController()
      const pending = postChat(gw, { model: "ws-mock", messages: hi }, { signal: controller.signal }).catch((e) => e)
      await eventually(() => expect(mock.requests.length).toBe(requests + 1))
      controller.abort()
      expect(await pending).toBeInstanceOf(Error)
      await mock.waitForClientAborts(aborts + 1)
      await eventually(() => expect(adm.stats.open).toBe(0))
      expect(charges()).toEqual({ admitted: before.admitted + 1, settled: before.settled, refunded: before.refunded + 1 })
      await eventually(async () => {
        const rows = await latestRows(gw, 1)
        expect(rows[0]).toMatchObject({ model_id: "ws-mock", status: "cancelled", http_status: 499, stream: false, output_tokens: 0 })
      })
    })
  })
})
