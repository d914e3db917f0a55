/**
 * Finding 11 over real HTTP: with a slow first token the client gets the 200 headers and `: ping` once the
 * first-event wait runs out (shortened here to 300 ms; 8 s by default), then the frames; a failure after that
 * cuts the stream without `[DONE]` and the row records it; a client that leaves while waiting releases its
 * slot and leaves a `cancelled` row.
 */
import { Duration } from "effect"
import OpenAI from "openai"
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { streamTiming } from "../../src/inference/SseBody.js"
import { startGateway, type TestGateway } from "../support/Gateway.js"
import { Behaviour, Chunks, type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"
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
  user
} from "../inference/helpers.js"

const WAIT_MS = 300
/** The upstream's first token comes well after the wait. */
const FIRST_TOKEN_MS = 1_500
const hi = [user("hello")]

const answer = [
  Chunks.role(),
  Chunks.content("late "),
  Chunks.content("answer"),
  Chunks.finish("stop"),
  Chunks.usage({ prompt: 7, completion: 2 })
]

/** Reads until `predicate` holds on the text so far; returns it. */
const readUntil = async (reader: ReadableStreamDefaultReader<Uint8Array>, predicate: (text: string) => boolean) => {
  const decoder = new TextDecoder()
  let text = ""
  while (!predicate(text)) {
    const { value, done } = await reader.read()
    if (done) throw new Error(`stream ended early: ${text}`)
    text += decoder.decode(value, { stream: true })
  }
  return text
}

describe("stream first-event wait over HTTP", () => {
  let gw: TestGateway
  let mock: MockUpstream
  const adm = makeUnlimitedAdmission()
  const saved = streamTiming.firstEventWait

  beforeAll(async () => {
    streamTiming.firstEventWait = Duration.millis(WAIT_MS)
    mock = await startMockUpstream()
    gw = await startGateway({
      admission: adm.layer,
      configure: (doc) => {
        addMockModel(doc, { baseUrl: mock.url, timeouts: { first_token_ms: 3_000, idle_ms: 3_000, total_ms: 30_000 } })
        // Gives up on the first token before the wait runs out: still a JSON error.
        addMockModel(doc, {
          id: "ws-impatient",
          provider: "impatient",
          baseUrl: mock.url,
          timeouts: { first_token_ms: 100, idle_ms: 3_000, total_ms: 30_000 }
        })
      }
    })
  })
  afterAll(async () => {
    streamTiming.firstEventWait = saved
    await gw?.stop()
    await mock?.close()
  })
  afterEach(async () => {
    await eventually(() => expect(adm.stats.open).toBe(0))
  })

  it("a slow first token: headers and `: ping` before it, then the frames and [DONE]; ttfb is the first token", async () => {
    mock.script(Behaviour.stream(answer, { firstDelayMs: FIRST_TOKEN_MS }))
    const started = Date.now()
    const res = await postChat(gw, { model: "ws-mock", messages: hi, stream: true })
    const headersAfter = Date.now() - started
    expect(res.status).toBe(200)
    expect(res.headers.get("content-type")).toContain("text/event-stream")
    expect(headersAfter).toBeLessThan(FIRST_TOKEN_MS)
    const rowId = rowIdOf(res)
    const reader = res.body!.getReader()
    const first = await readUntil(reader, (t) => t.length > 0)
    const firstAfter = Date.now() - started
    expect(first.startsWith(": ping\n\n")).toBe(true)
    expect(firstAfter).toBeLessThan(FIRST_TOKEN_MS)
    const rest = await readUntil(reader, (t) => t.includes("[DONE]"))
    const sse = parseSse(first + rest)
    expect(sse.blocks[0]).toBe(": ping")
    expect(sse.doneLast).toBe(true)
    expect(sse.chunks[0].choices[0].delta.role).toBe("assistant")
    expect(sse.chunks.map((c) => c.choices[0].delta.content ?? "").join("")).toBe("late answer")
    expect(sse.chunks.at(-1).usage).toMatchObject({ prompt_tokens: 7, completion_tokens: 2 })
    const row = await rowById(gw, rowId)
    expect(row).toMatchObject({ status: "success", error_code: null, stream: true, output_tokens: 2 })
    // Time to the first token, not to the ping.
    expect(row.ttfb_ms).toBeGreaterThanOrEqual(FIRST_TOKEN_MS - 50)
  })

  it("a first token within the wait: no ping, as before", async () => {
    mock.script(Behaviour.stream(answer))
    const res = await postChat(gw, { model: "ws-mock", messages: hi, stream: true })
    const sse = parseSse(await res.text())
    expect(sse.blocks[0]).not.toBe(": ping")
    expect(sse.chunks[0].choices[0].delta.role).toBe("assistant")
    expect(sse.doneLast).toBe(true)
  })

  it("a failure before the wait runs out is still a JSON error with its status", async () => {
    mock.script(Behaviour.hangBeforeHeaders())
    const res = await postChat(gw, { model: "ws-impatient", messages: hi, stream: true })
    expect(res.headers.get("content-type")).toContain("application/json")
    await expectError(res, 503, "upstream_timeout", "service_unavailable")
  })

  it.each([
    ["upstream 500 after 1 s", () => Behaviour.json({ error: { message: "boom" } }, { status: 500, delayMs: 1_000 }), "upstream_error"],
    ["no first token within first_token_ms (3 s)", () => Behaviour.hangAfter([]), "upstream_timeout"]
  ])("a failure after the commit (%s) cuts the stream without [DONE]; the row records it", async (_name, behaviour, code) => {
    mock.script(behaviour())
    const aborts = mock.clientAborts()
    const before = adm.stats.refunded
    const res = await postChat(gw, { model: "ws-mock", messages: hi, stream: true })
    expect(res.status).toBe(200)
    const rowId = rowIdOf(res)
    const { text, error } = await readBody(res)
    expect(error).toBeInstanceOf(Error)
    const sse = parseSse(text)
    expect(sse.blocks.length).toBeGreaterThan(0)
    expect(sse.blocks.every((b) => b === ": ping")).toBe(true)
    expect(sse.done).toBe(false)
    const row = await rowById(gw, rowId)
    expect(row).toMatchObject({ status: "error", error_code: code, stream: true, output_tokens: 0 })
    // Nothing was delivered: the reservation is refunded.
    expect(adm.stats.refunded).toBe(before + 1)
    if (code === "upstream_timeout") await mock.waitForClientAborts(aborts + 1)
  })

  it("the client leaves after the ping, before the first token: upstream aborted, slot released, row cancelled", async () => {
    mock.script(Behaviour.hangBeforeHeaders())
    const aborts = mock.clientAborts()
    const before = { admitted: adm.stats.admitted, refunded: adm.stats.refunded }
    const controller = new AbortController()
    const res = await postChat(gw, { model: "ws-mock", messages: hi, stream: true }, { signal: controller.signal })
    const rowId = rowIdOf(res)
    const text = await readUntil(res.body!.getReader(), (t) => t.includes(": ping"))
    expect(text).toBe(": ping\n\n")
    controller.abort()
    await mock.waitForClientAborts(aborts + 1)
    await eventually(() => expect(adm.stats.open).toBe(0))
    expect(adm.stats.admitted).toBe(before.admitted + 1)
    expect(adm.stats.refunded).toBe(before.refunded + 1)
    await eventually(async () => {
      const row = await rowById(gw, rowId)
      expect(row).toMatchObject({ status: "cancelled", error_code: "cancelled", http_status: 499, output_tokens: 0 })
    })
  })

  it("the client leaves during the wait, before any byte: upstream aborted, slot released, row cancelled", async () => {
    mock.script(Behaviour.hangBeforeHeaders())
    const aborts = mock.clientAborts()
    const requests = mock.requests.length
    const controller = new AbortController()
    const pending = postChat(gw, { model: "ws-mock", messages: hi, stream: true }, { signal: controller.signal })
      .catch((e) => e)
    await eventually(() => expect(mock.requests.length).toBe(requests + 1))
    controller.abort()
    expect(await pending).toBeInstanceOf(Error)
    await mock.waitForClientAborts(aborts + 1)
    await eventually(() => expect(adm.stats.open).toBe(0))
    await eventually(async () => {
      const [row] = await latestRows(gw, 1)
      expect(row).toMatchObject({ model_id: "ws-mock", status: "cancelled", error_code: "cancelled", stream: true })
    })
  })

  it("the openai SDK streams through the ping: a slow first token is read normally", async () => {
    mock.script(Behaviour.stream(answer, { firstDelayMs: FIRST_TOKEN_MS }))
    const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: gw.key, maxRetries: 0, timeout: 10_000 })
    const stream = await client.chat.completions.create({
      model: "ws-mock",
      messages: [{ role: "user", content: "hello" }],
      stream: true
    })
    let text = ""
    let finish: string | null = null
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta.content ?? ""
      finish = chunk.choices[0]?.finish_reason ?? finish
    }
    expect(text).toBe("late answer")
    expect(finish).toBe("stop")
  })
})
