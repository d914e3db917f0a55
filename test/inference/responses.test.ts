/**
 * Response shapes (spec: Chat completion response, Events 1–7, response headers) against a scripted
 * OpenAI-wire upstream and the in-process simulated provider.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { startGateway, type TestGateway } from "../support/Gateway.js"
import { Behaviour, Chunks, type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"
import { makeUnlimitedAdmission } from "../support/UnlimitedAdmission.js"
import { addMockModel, parseSse, postChat, rowById, rowIdOf, user } from "./helpers.js"

const CALL_ID = /^call_[0-9a-f]{32}$/
const poolShape = {
  used_pct: expect.any(Number),
  remaining_pct: expect.any(Number),
  resets_at: null,
  resets_in_seconds: expect.any(Number),
  request_pct: expect.any(Number)
}
const receiptShape = (rowId: number) => ({
  request_id: String(rowId),
  session: poolShape,
  weekly: poolShape,
  rpm: { limit: expect.any(Number), remaining: expect.any(Number) }
})

describe("chat responses", () => {
  let gw: TestGateway
  let mock: MockUpstream
  const adm = makeUnlimitedAdmission()

  beforeAll(async () => {
    mock = await startMockUpstream()
    gw = await startGateway({ admission: adm.layer, configure: (doc) => addMockModel(doc, { baseUrl: mock.url }) })
  })
  afterAll(async () => {
    await gw?.stop()
    await mock?.close()
  })

  const expectIds = (res: Response) => {
    const rowId = rowIdOf(res)
    const correlation = res.headers.get("x-wellspring-request-id")
    expect(correlation).toMatch(/^req_[0-9a-z]+$/)
    expect(correlation).not.toBe(String(rowId))
    return rowId
  }

  describe("non-streaming", () => {
    it("has exactly the spec's fields: content, reasoning, usage totals and the receipt", async () => {
      mock.script(Behaviour.json(Chunks.completion({
        content: "Hello there",
        reasoning: "The user greets me.",
        usage: { prompt: 12, completion: 30, reasoning: 9, cached: 4 }
      })))
      const res = await postChat(gw, { model: "ws-mock", messages: [user("hello")] })
      expect(res.status).toBe(200)
      expect(res.headers.get("content-type")).toContain("application/json")
      const rowId = expectIds(res)
      const body: any = await res.json()
      expect(body).toStrictEqual({
        id: expect.stringMatching(/^chatcmpl-/),
        object: "chat.completion",
        created: expect.any(Number),
        model: "ws-mock",
        choices: [{
          index: 0,
          message: { role: "assistant", content: "Hello there", reasoning: "The user greets me." },
          finish_reason: "stop"
        }],
        usage: { prompt_tokens: 12, completion_tokens: 30, total_tokens: 42 },
        wellspring: receiptShape(rowId)
      })
      expect(Number.isInteger(body.created)).toBe(true)
      expect(Math.abs(body.created - Date.now() / 1000)).toBeLessThan(60)
      for (const h of ["x-ratelimit-limit-requests", "x-session-used-pct", "x-weekly-remaining-pct", "x-session-reset"]) {
        expect(res.headers.get(h), h).not.toBeNull()
      }
      const row = await rowById(gw, rowId)
      expect(row).toMatchObject({
        status: "success",
        error_code: null,
        http_status: 200,
        stream: false,
        model_id: "ws-mock",
        provider: "mock",
        input_tokens: 12,
        output_tokens: 30,
        reasoning_tokens: 9,
        weighted_cost: 12 * 1 + 30 * 2,
        had_tools: false,
        tool_choice: null
      })
      expect(row.ttfb_ms).not.toBeNull()
      expect(adm.stats.settled.at(-1)).toBe(72)
      expect(adm.stats.open).toBe(0)
    })

    it("tool calls: content null, ids normalized to call_ + 32 hex, finish_reason tool_calls, no reasoning key", async () => {
      mock.script(Behaviour.json(Chunks.completion({
        content: null,
        tool_calls: [
          { id: "toolu_01AbCdEf", name: "get_weather", arguments: "{\"city\":\"Seoul\"}" },
          { id: "call_0123456789abcdef0123456789abcdef", name: "get_time", arguments: "{}" }
        ],
        finish: "tool_calls",
        usage: { prompt: 20, completion: 10 }
      })))
      const res = await postChat(gw, {
        model: "ws-mock",
        messages: [user("weather and time in Seoul?")],
        tools: [
          { type: "function", function: { name: "get_weather", parameters: { type: "object" } } },
          { type: "function", function: { name: "get_time" } }
        ],
        tool_choice: { type: "function", function: { name: "get_weather" } }
      })
      expect(res.status).toBe(200)
      const rowId = expectIds(res)
      const body: any = await res.json()
      expect(body.choices).toStrictEqual([{
        index: 0,
        message: {
          role: "assistant",
          content: null,
          tool_calls: [
            { id: expect.stringMatching(CALL_ID), type: "function", function: { name: "get_weather", arguments: "{\"city\":\"Seoul\"}" } },
            { id: "call_0123456789abcdef0123456789abcdef", type: "function", function: { name: "get_time", arguments: "{}" } }
          ]
        },
        finish_reason: "tool_calls"
      }])
      expect(body.usage).toEqual({ prompt_tokens: 20, completion_tokens: 10, total_tokens: 30 })
      const row = await rowById(gw, rowId)
      expect(row).toMatchObject({ status: "success", had_tools: true, tool_choice: "function:get_weather" })
    })

    it("in-process simulated provider: reasoning on ws-pro with reasoning_effort", async () => {
      const res = await postChat(gw, { model: "ws-pro", reasoning_effort: "low", messages: [user("tell me about rivers")] })
      expect(res.status).toBe(200)
      const body: any = await res.json()
      const message = body.choices[0].message
      expect(message.role).toBe("assistant")
      expect(message.reasoning.length).toBeGreaterThan(0)
      expect(message.content).toContain("Echo: tell me about rivers.")
      expect(body.usage.total_tokens).toBe(body.usage.prompt_tokens + body.usage.completion_tokens)
      expect(body.wellspring.request_id).toBe(res.headers.get("x-request-id"))
    })
  })

  describe("streaming", () => {
    const stream = async (body: Record<string, unknown>) => {
      const res = await postChat(gw, { ...body, stream: true })
      expect(res.status).toBe(200)
      expect(res.headers.get("content-type")).toContain("text/event-stream")
      const rowId = expectIds(res)
      const sse = parseSse(await res.text())
      return { res, rowId, sse }
    }

    /** Chunk-level invariants of Events 1, 2 and 6. */
    const expectFraming = (sse: ReturnType<typeof parseSse>, rowId: number, finish: string) => {
      expect(sse.doneLast).toBe(true)
      const { chunks } = sse
      expect(chunks.length).toBeGreaterThanOrEqual(2)
      const id = chunks[0].id
      for (const c of chunks) {
        expect(c.object).toBe("chat.completion.chunk")
        expect(c.id).toBe(id)
        expect(c.model).toBe(chunks[0].model)
        expect(c.choices).toHaveLength(1)
        expect(c.choices[0].index).toBe(0)
      }
      expect(chunks[0].choices[0].delta.role).toBe("assistant")
      for (const c of chunks.slice(1)) expect(c.choices[0].delta).not.toHaveProperty("role")
      for (const c of chunks.slice(0, -1)) {
        expect(c.choices[0].finish_reason).toBeNull()
        expect(c).not.toHaveProperty("usage")
      }
      const last = chunks.at(-1)
      expect(last.choices[0].finish_reason).toBe(finish)
      expect(last.wellspring).toEqual(receiptShape(rowId))
      return last
    }

    it("Events 1-3, 6: role first, reasoning before content, last frame with usage, finish_reason and receipt, then [DONE]", async () => {
      mock.script(Behaviour.stream([
        Chunks.role(),
        Chunks.reasoning("Thinking "),
        Chunks.reasoning("hard.", "reasoning"),
        Chunks.content("Hel"),
        Chunks.reasoning("late reasoning is dropped"),
        Chunks.content("lo!"),
        Chunks.finish("stop"),
        Chunks.usage({ prompt: 7, completion: 11, reasoning: 4 })
      ]))
      const { rowId, sse } = await stream({ model: "ws-mock", messages: [user("hi")], reasoning_effort: "low" })
      const last = expectFraming(sse, rowId, "stop")
      expect(last.usage).toEqual({ prompt_tokens: 7, completion_tokens: 11, total_tokens: 18 })
      const deltas = sse.chunks.map((c) => c.choices[0].delta)
      const reasoningAt = deltas.flatMap((d, i) => (d.reasoning ? [i] : []))
      const contentAt = deltas.flatMap((d, i) => (d.content ? [i] : []))
      expect(deltas.map((d) => d.reasoning ?? "").join("")).toBe("Thinking hard.")
      expect(deltas.map((d) => d.content ?? "").join("")).toBe("Hello!")
      expect(Math.max(...reasoningAt)).toBeLessThan(Math.min(...contentAt))
      const row = await rowById(gw, rowId)
      expect(row).toMatchObject({ status: "success", stream: true, input_tokens: 7, output_tokens: 11, reasoning_tokens: 4 })
      expect(adm.stats.open).toBe(0)
    })

    it("Event 4: tool calls are incremental: index, id (call_ + 32 hex, also for toolu_ ids) and name first, arguments accumulate", async () => {
      mock.script(Behaviour.stream([
        Chunks.role(),
        Chunks.toolStart(0, "toolu_01XyZ", "get_weather"),
        Chunks.toolArgs(0, "{\"ci"),
        Chunks.toolArgs(0, "ty\":\"Se"),
        Chunks.toolArgs(0, "oul\"}"),
        Chunks.toolStart(1, "toolu_02XyZ", "get_time", "{"),
        Chunks.toolArgs(1, "}"),
        Chunks.finish("tool_calls"),
        Chunks.usage({ prompt: 30, completion: 12 })
      ]))
      const { rowId, sse } = await stream({
        model: "ws-mock",
        messages: [user("weather?")],
        tools: [
          { type: "function", function: { name: "get_weather", parameters: { type: "object" } } },
          { type: "function", function: { name: "get_time" } }
        ],
        parallel_tool_calls: true
      })
      expectFraming(sse, rowId, "tool_calls")
      const calls = sse.chunks.flatMap((c) => c.choices[0].delta.tool_calls ?? [])
      for (const index of [0, 1]) {
        const mine = calls.filter((c) => c.index === index)
        expect(mine[0]).toMatchObject({ index, id: expect.stringMatching(CALL_ID), type: "function", function: { name: expect.any(String) } })
        for (const later of mine.slice(1)) {
          expect(later).not.toHaveProperty("id")
          expect(later.function).not.toHaveProperty("name")
        }
      }
      const byIndex = (i: number) => calls.filter((c) => c.index === i)
      expect(byIndex(0)[0].function.name).toBe("get_weather")
      expect(byIndex(1)[0].function.name).toBe("get_time")
      expect(byIndex(0).map((c) => c.function.arguments).join("")).toBe("{\"city\":\"Seoul\"}")
      expect(byIndex(1).map((c) => c.function.arguments).join("")).toBe("{}")
      expect(byIndex(0)[0].id).not.toBe(byIndex(1)[0].id)
      expect(byIndex(0).length).toBeGreaterThan(2)
      const row = await rowById(gw, rowId)
      expect(row).toMatchObject({ status: "success", had_tools: true, tool_choice: null })
    })

    it("an upstream that sends no usage: the last frame still carries usage (estimated) and finish_reason", async () => {
      mock.script(Behaviour.stream([Chunks.role(), Chunks.content("abcdefgh"), Chunks.finish("length")]))
      const { rowId, sse } = await stream({ model: "ws-mock", messages: [user("hi")] })
      const last = expectFraming(sse, rowId, "length")
      expect(last.usage.completion_tokens).toBeGreaterThan(0)
      expect(last.usage.total_tokens).toBe(last.usage.prompt_tokens + last.usage.completion_tokens)
    })

    it("in-process simulated provider: reasoning then content then usage", async () => {
      const { rowId, sse } = await stream({ model: "ws-reasoner", reasoning_effort: "high", messages: [user("why is the sky blue")] })
      expectFraming(sse, rowId, "stop")
      const deltas = sse.chunks.map((c) => c.choices[0].delta)
      const firstContent = deltas.findIndex((d) => d.content)
      const lastReasoning = deltas.map((d) => Boolean(d.reasoning)).lastIndexOf(true)
      expect(lastReasoning).toBeGreaterThan(0)
      expect(firstContent).toBeGreaterThan(lastReasoning)
      expect(sse.chunks.at(-1).usage.completion_tokens).toBeGreaterThan(0)
    })

    it("in-process simulated provider: tool call stream on ws-pro", async () => {
      const { rowId, sse } = await stream({
        model: "ws-pro",
        messages: [user("look up Seoul")],
        tools: [{ type: "function", function: { name: "lookup", parameters: { type: "object", properties: { q: { type: "string" } }, required: ["q"] } } }]
      })
      expectFraming(sse, rowId, "tool_calls")
      const calls = sse.chunks.flatMap((c) => c.choices[0].delta.tool_calls ?? [])
      expect(calls[0]).toMatchObject({ index: 0, id: expect.stringMatching(CALL_ID), function: { name: "lookup" } })
      expect(JSON.parse(calls.map((c) => c.function.arguments).join(""))).toEqual({ q: "Seoul" })
    })
  })
})
