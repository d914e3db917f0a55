/**
 * Finding 12, what rows and the upstream see: `tps` on every row (non-streams included), the tool options
 * forwarded only with tools, tool call ids unique per call, and a cancelled row's `error_code` the same in
 * `/api/user/me/requests` and `/api/user/me/metrics`. On embedded PGlite and on real PostgreSQL.
 */
import { Effect } from "effect"
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { RequestLog } from "../../src/telemetry/RequestLog.js"
import { tokensPerSecond } from "../../src/telemetry/RequestRow.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { newUser } from "../accounts/support.js"
import { authed, startGateway, type TestGateway } from "../support/Gateway.js"
import { Behaviour, Chunks, type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"
import { serviceGate } from "../support/Services.js"
import { makeUnlimitedAdmission } from "../support/UnlimitedAdmission.js"
import { addMockModel, eventually, parseSse, postChat as postAs, rowById, rowIdOf, user } from "../inference/helpers.js"

const postgres = await serviceGate("postgres")

const CALL_ID = /^call_[0-9a-f]{32}$/
const hi = [user("hello")]
const tool = { type: "function", function: { name: "get_weather", parameters: { type: "object" } } }

const twoDecimals = (x: number) => Math.abs(Math.round(x * 100) - x * 100) < 1e-6

describe("tokensPerSecond", () => {
  it("output tokens per second of generation, 2 decimals; 0 without output or time; never Infinity or NaN", () => {
    expect(tokensPerSecond(100, 2_000)).toBe(50)
    expect(tokensPerSecond(10, 3_000)).toBe(3.33)
    expect(tokensPerSecond(0, 1_000)).toBe(0)
    expect(tokensPerSecond(10, 0)).toBe(0)
    expect(tokensPerSecond(10, -5)).toBe(0)
    expect(tokensPerSecond(10, null)).toBe(0)
    expect(tokensPerSecond(Number.NaN, 1_000)).toBe(0)
    expect(tokensPerSecond(1e308, 1e-300)).toBe(0)
  })
})

const suite = (name: string, database: () => Promise<FreshDatabase | undefined>) =>
  describe(`rows and upstream requests (${name})`, () => {
    let gw: TestGateway
    let db: FreshDatabase | undefined
    let mock: MockUpstream
    /** A key of an account of this test's own (the dev account only exists in embedded mode). */
    let key = ""
    const adm = makeUnlimitedAdmission()
    const postChat = (_gw: TestGateway, body: unknown, init: RequestInit = {}) =>
      postAs(gw, body, { headers: authed(key), ...init })

    beforeAll(async () => {
      db = await database()
      mock = await startMockUpstream()
      gw = await startGateway({
        admission: adm.layer,
        ...(db ? { databaseUrl: db.url } : {}),
        configure: (doc) => addMockModel(doc, { baseUrl: mock.url })
      })
      key = (await newUser(gw)).key
    })
    afterAll(async () => {
      await gw?.stop()
      await mock?.close()
      await db?.drop()
    })
    afterEach(async () => {
      await eventually(() => expect(adm.stats.open).toBe(0))
    })

    const timed = async (body: unknown) => {
      const started = performance.now()
      const res = await postChat(gw, body)
      const text = await res.text()
      return { res, text, seconds: (performance.now() - started) / 1000 }
    }

    describe("tps", () => {
      it("non-streaming: output tokens over the time from dispatch to the answer", async () => {
        mock.script(Behaviour.json(Chunks.completion({ content: "word ".repeat(20), usage: { prompt: 5, completion: 100 } }), {
          delayMs: 500
        }))
        const { res, seconds } = await timed({ model: "ws-mock", messages: hi })
        expect(res.status).toBe(200)
        const row = await rowById(gw, rowIdOf(res))
        expect(row.output_tokens).toBe(100)
        const tps = Number((row as any).tps)
        // Generation took at least the upstream's 500 ms and at most the whole request.
        expect(tps).toBeGreaterThanOrEqual(100 / seconds - 0.01)
        expect(tps).toBeLessThanOrEqual(100 / 0.5)
        expect(twoDecimals(tps)).toBe(true)
      })

      it("streaming: output tokens over the time from the first event to the end", async () => {
        const frames = [
          Chunks.role(),
          ...Array.from({ length: 10 }, (_, i) => Chunks.content(`w${i} `)),
          Chunks.finish("stop"),
          Chunks.usage({ prompt: 5, completion: 50 })
        ]
        mock.script(Behaviour.slow(frames, 50))
        const { res, text, seconds } = await timed({ model: "ws-mock", messages: hi, stream: true })
        expect(parseSse(text).doneLast).toBe(true)
        const row = await rowById(gw, rowIdOf(res))
        const tps = Number((row as any).tps)
        // From the first content frame to [DONE]: 12 frames 50 ms apart (timers may fire a little early).
        expect(tps).toBeLessThanOrEqual(50 / 0.5)
        expect(tps).toBeGreaterThanOrEqual(50 / seconds - 0.01)
        expect(twoDecimals(tps)).toBe(true)
      })

      it("a stream that arrives in one burst is measured from dispatch, not over ~0 ms", async () => {
        const frames = [Chunks.role(), Chunks.content("all at once"), Chunks.finish("stop"), Chunks.usage({ prompt: 5, completion: 60 })]
        mock.script(Behaviour.stream(frames, { firstDelayMs: 300 }))
        const { res, seconds } = await timed({ model: "ws-mock", messages: hi, stream: true })
        const row = await rowById(gw, rowIdOf(res))
        const tps = Number((row as any).tps)
        expect(Number.isFinite(tps)).toBe(true)
        // Never over a span under MIN_STREAM_SPAN_MS (50 ms); from dispatch (at least the upstream's 300 ms) unless a
        // loaded machine took that long between the burst's first event and its end, as the row's times show.
        expect(tps).toBeLessThanOrEqual(60 / 0.05)
        const span = Number((row as any).duration_ms) - Number((row as any).ttfb_ms)
        if (span < 45) expect(tps).toBeLessThanOrEqual(60 / 0.3)
        expect(tps).toBeGreaterThanOrEqual(60 / seconds - 0.01)
      })

      it("no output: 0", async () => {
        mock.script(Behaviour.json(Chunks.completion({ content: "", usage: { prompt: 5, completion: 0 } }), { delayMs: 50 }))
        const { res } = await timed({ model: "ws-mock", messages: hi })
        expect(res.status).toBe(200)
        expect(Number((await rowById(gw, rowIdOf(res)) as any).tps)).toBe(0)
      })
    })

    describe("tool options reach the upstream only with tools", () => {
      const lastUpstreamBody = () => mock.requests.at(-1)!.body

      it.each([
        ["no tools", {}],
        ["an empty tools list", { tools: [] }]
      ])("%s: neither tool_choice nor parallel_tool_calls is forwarded", async (_name, extra) => {
        mock.script(Behaviour.json(Chunks.completion({ content: "ok" })))
        for (const stream of [false, true]) {
          if (stream) mock.script(Behaviour.stream([Chunks.role(), Chunks.content("ok"), Chunks.finish("stop")]))
          const res = await postChat(gw, {
            model: "ws-mock",
            messages: hi,
            stream,
            tool_choice: "auto",
            parallel_tool_calls: false,
            ...extra
          })
          expect(res.status, await res.clone().text()).toBe(200)
          await res.text()
          const body = lastUpstreamBody()
          expect(body).not.toHaveProperty("tool_choice")
          expect(body).not.toHaveProperty("parallel_tool_calls")
          expect(body).not.toHaveProperty("tools")
        }
      })

      it("with tools: tools, tool_choice and parallel_tool_calls are forwarded", async () => {
        mock.script(Behaviour.json(Chunks.completion({ content: "ok" })))
        const res = await postChat(gw, {
          model: "ws-mock",
          messages: hi,
          tools: [tool],
          tool_choice: "required",
          parallel_tool_calls: false
        })
        expect(res.status).toBe(200)
        const body = lastUpstreamBody()
        expect(body.tools).toEqual([tool])
        expect(body.tool_choice).toBe("required")
        expect(body.parallel_tool_calls).toBe(false)
      })
    })

    describe("tool call ids", () => {
      const completionWithCalls = (calls: Array<Record<string, unknown>>) => ({
        id: "chatcmpl-mock",
        object: "chat.completion",
        created: 1_767_225_600,
        model: "mock-model",
        choices: [{
          index: 0,
          message: { role: "assistant", content: null, tool_calls: calls },
          finish_reason: "tool_calls"
        }]
      })
      const idsOf = async (res: Response) =>
        (((await res.json()) as any).choices[0].message.tool_calls as Array<{ id: string }>).map((c) => c.id)

      it("non-streaming, without an upstream id or with a numbered one: a fresh call_ id per call, per request", async () => {
        const calls = [
          { type: "function", function: { name: "get_weather", arguments: "{}" } },
          { id: "call_1", type: "function", function: { name: "get_weather", arguments: "{}" } },
          { id: "0", type: "function", function: { name: "get_weather", arguments: "{}" } }
        ]
        mock.script(Behaviour.json(completionWithCalls(calls)))
        const first = await idsOf(await postChat(gw, { model: "ws-mock", messages: hi, tools: [tool] }))
        const second = await idsOf(await postChat(gw, { model: "ws-mock", messages: hi, tools: [tool] }))
        for (const id of [...first, ...second]) expect(id).toMatch(CALL_ID)
        expect(new Set([...first, ...second]).size).toBe(6)
      })

      it("an upstream id already in the call_ + 32 hex form is kept", async () => {
        const kept = "call_0123456789abcdef0123456789abcdef"
        mock.script(Behaviour.json(completionWithCalls([
          { id: kept, type: "function", function: { name: "get_weather", arguments: "{}" } }
        ])))
        expect(await idsOf(await postChat(gw, { model: "ws-mock", messages: hi, tools: [tool] }))).toEqual([kept])
      })

      it("streaming: the id comes once per call index, the arguments follow by index; ids differ per request", async () => {
        mock.script(Behaviour.stream([
          Chunks.role(),
          Chunks.toolStart(0, "call_1", "get_weather", "{\"city\""),
          Chunks.toolStart(1, "call_2", "get_weather", "{\"city\""),
          Chunks.toolArgs(0, ":\"Paris\"}"),
          Chunks.toolArgs(1, ":\"Rome\"}"),
          Chunks.finish("tool_calls")
        ]))
        const read = async () => {
          const sse = parseSse(await (await postChat(gw, { model: "ws-mock", messages: hi, tools: [tool], stream: true })).text())
          expect(sse.doneLast).toBe(true)
          const calls = new Map<number, { id: string; args: string }>()
          for (const chunk of sse.chunks) {
            for (const delta of chunk.choices[0].delta.tool_calls ?? []) {
              if (delta.id !== undefined) {
                expect(calls.has(delta.index)).toBe(false)
                calls.set(delta.index, { id: delta.id, args: "" })
              }
              calls.get(delta.index)!.args += delta.function?.arguments ?? ""
            }
          }
          return calls
        }
        const a = await read()
        const b = await read()
        expect([...a.values()].map((c) => c.args)).toEqual(["{\"city\":\"Paris\"}", "{\"city\":\"Rome\"}"])
        const ids = [...a.values(), ...b.values()].map((c) => c.id)
        for (const id of ids) expect(id).toMatch(CALL_ID)
        expect(new Set(ids).size).toBe(4)
      })
    })

    describe("a cancelled request: the same code in the request rows and the metrics", () => {
      const get = async (path: string) => {
        const res = await fetch(`${gw.url}${path}`, { headers: { authorization: `Bearer ${key}` } })
        expect(res.status, path).toBe(200)
        return res.json() as Promise<any>
      }

      it("a client that disconnects mid-stream", async () => {
        mock.script(Behaviour.hangAfter([Chunks.role(), Chunks.content("partial")]))
        const aborts = mock.clientAborts()
        const controller = new AbortController()
        const res = await postChat(gw, { model: "ws-mock", messages: hi, stream: true }, { signal: controller.signal })
        const rowId = rowIdOf(res)
        const reader = res.body!.getReader()
        const decoder = new TextDecoder()
        let text = ""
        while (!text.includes("partial")) {
          const { value, done } = await reader.read()
          if (done) throw new Error(`stream ended early: ${text}`)
          text += decoder.decode(value, { stream: true })
        }
        controller.abort()
        await mock.waitForClientAborts(aborts + 1)
        await eventually(() => expect(adm.stats.open).toBe(0))
        // One failed request too, so that by_code is compared for more than one code.
        expect((await postChat(gw, { model: "no-such-model", messages: hi })).status).toBe(400)

        await eventually(async () => {
          await gw.run(Effect.flatMap(RequestLog, (log) => log.flush))
          const { requests } = await get("/api/user/me/requests?limit=50")
          const row = requests.find((r: any) => r.id === rowId)
          expect(row).toMatchObject({ status: "cancelled", error_code: "cancelled" })
        })
        const { requests } = await get("/api/user/me/requests?limit=50")
        const metrics = await get("/api/user/me/metrics?range=1h")
        // Every failed row's code is counted under that same code in the metrics.
        const counts = new Map<string, number>()
        for (const r of requests) if (r.status !== "success") counts.set(r.error_code, (counts.get(r.error_code) ?? 0) + 1)
        expect(counts.get("cancelled")).toBeGreaterThanOrEqual(1)
        expect(counts.get("model_not_found")).toBeGreaterThanOrEqual(1)
        const byCode = new Map<string, number>()
        for (const c of metrics.errors.by_code) byCode.set(c.code, (byCode.get(c.code) ?? 0) + c.count)
        expect(byCode).toEqual(counts)
        expect(metrics.errors.by_code).toContainEqual({ code: "cancelled", tier: "client", count: counts.get("cancelled") })
        expect(metrics.totals.cancelled).toBe(counts.get("cancelled"))
      })
    })
  })

suite("embedded PGlite", async () => undefined)

describe.skipIf(!postgres)("real PostgreSQL", () => {
  suite("PostgreSQL", () => freshDatabase("stream_rows"))
})
