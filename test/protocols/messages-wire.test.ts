/**
 * The Anthropic Messages wire at the byte level, against a gateway with real admission: the SSE event names and
 * order, the final usage, `event: ping` while the upstream is idle, `event: error` on a mid-stream failure, and
 * the error envelope with its status for admission refusals (429 rate_limit_error with retry-after, 529
 * overloaded_error) and x-api-key authentication (counted failures).
 */
import Anthropic from "@anthropic-ai/sdk"
import { Duration } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { streamTiming } from "../../src/inference/SseBody.js"
import { startGateway, type TestGateway } from "../support/Gateway.js"
import { Behaviour, Chunks, type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"
import { addMockModel, eventually, HANGUL, readBody, rowById } from "../inference/helpers.js"

const post = (gw: TestGateway, body: unknown, headers: Record<string, string> = {}) =>
  fetch(`${gw.url}/v1/messages`, {
    method: "POST",
    headers: { "x-api-key": gw.key, "anthropic-version": "2023-06-01", "content-type": "application/json", ...headers },
    body: JSON.stringify(body)
  })

interface SseEvent {
  readonly event: string
  readonly data: any
}

/** Parses `event:`/`data:` blocks; every block must have both. */
const parseEvents = (text: string): Array<SseEvent> =>
  text.split("\n\n").filter((b) => b.length > 0).map((block) => {
    const [eventLine, dataLine, ...rest] = block.split("\n")
    expect(rest, block).toEqual([])
    expect(eventLine, block).toMatch(/^event: [a-z_]+$/)
    expect(dataLine, block).toMatch(/^data: /)
    const data = JSON.parse(dataLine!.slice(6))
    const event = eventLine!.slice(7)
    expect(data.type, block).toBe(event)
    return { event, data }
  })

describe("Anthropic Messages wire", () => {
  let gw: TestGateway
  let mock: MockUpstream

  beforeAll(async () => {
    mock = await startMockUpstream()
    gw = await startGateway({
      configure: (doc) => {
        addMockModel(doc, { baseUrl: mock.url, timeouts: { first_token_ms: 5_000, idle_ms: 5_000 } })
        addMockModel(doc, { id: "ws-one", provider: "mock1", baseUrl: mock.url, model: { concurrency: 1 } })
        addMockModel(doc, { id: "ws-slow-rpm", provider: "mock2", baseUrl: mock.url, model: { rate_limit_rpm: 1 } })
      }
    })
  })
  afterAll(async () => {
    await gw?.stop()
    await mock?.close()
  })

  it("a stream's events: message_start, thinking, text and tool_use blocks in order, message_delta with usage, message_stop", async () => {
    mock.script(Behaviour.stream([
      Chunks.role(),
      Chunks.reasoning("Let me think."),
      Chunks.content("Checking "),
      Chunks.content("now."),
      Chunks.toolStart(0, "call_" + "0f".repeat(16), "get_weather"),
      Chunks.toolArgs(0, "{\"city\""),
      Chunks.toolArgs(0, ":\"Seoul\"}"),
      Chunks.finish("tool_calls"),
      Chunks.usage({ prompt: 50, completion: 20, reasoning: 5, cached: 10 })
    ]))
    const res = await post(gw, {
      model: "ws-mock",
      max_tokens: 256,
      stream: true,
      thinking: { type: "enabled", budget_tokens: 2_000 },
      tools: [{ name: "get_weather", input_schema: { type: "object" } }],
      messages: [{ role: "user", content: "weather?" }]
    })
    expect(res.status).toBe(200)
    expect(res.headers.get("content-type")).toBe("text/event-stream")
    expect(res.headers.get("x-session-remaining-pct")).not.toBeNull()
    const { text } = await readBody(res)
    const events = parseEvents(text)
    expect(events.map((e) => e.event)).toEqual([
      "message_start",
      "content_block_start",
      "content_block_delta",
      "content_block_stop",
      "content_block_start",
      "content_block_delta",
      "content_block_delta",
      "content_block_stop",
      "content_block_start",
      "content_block_delta",
      "content_block_delta",
      "content_block_stop",
      "message_delta",
      "message_stop"
    ])
    expect(events[0]!.data.message).toMatchObject({
      type: "message",
      role: "assistant",
      model: "ws-mock",
      content: [],
      stop_reason: null
    })
    expect(events[1]!.data).toEqual({
      type: "content_block_start",
      index: 0,
      content_block: { type: "thinking", thinking: "", signature: "" }
    })
    expect(events[2]!.data.delta).toEqual({ type: "thinking_delta", thinking: "Let me think." })
    expect(events[4]!.data).toEqual({ type: "content_block_start", index: 1, content_block: { type: "text", text: "" } })
    expect(events[6]!.data.delta).toEqual({ type: "text_delta", text: "now." })
    expect(events[8]!.data.content_block).toEqual({
      type: "tool_use",
      id: "toolu_" + "0f".repeat(16),
      name: "get_weather",
      input: {}
    })
    expect(events[9]!.data).toEqual({
      type: "content_block_delta",
      index: 2,
      delta: { type: "input_json_delta", partial_json: "{\"city\"" }
    })
    expect(events[11]!.data).toEqual({ type: "content_block_stop", index: 2 })
    const delta = events[12]!.data
    expect(delta.delta).toEqual({ stop_reason: "tool_use", stop_sequence: null })
    expect(delta.usage).toEqual({
      input_tokens: 40,
      output_tokens: 20,
      cache_read_input_tokens: 10,
      cache_creation_input_tokens: 0
    })
    expect(delta.wellspring.request_id).toBe(res.headers.get("x-request-id"))
    expect(text.endsWith("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n")).toBe(true)
  })

  describe("first event slower than the wait", () => {
    const saved = streamTiming.firstEventWait
    beforeAll(() => {
      streamTiming.firstEventWait = Duration.millis(150)
    })
    afterAll(() => {
      streamTiming.firstEventWait = saved
    })

    it("commits with `event: ping` while the upstream is idle, then the message", async () => {
      mock.script(Behaviour.stream([Chunks.role(), Chunks.content("late"), Chunks.finish("stop")], { firstDelayMs: 600 }))
      const res = await post(gw, { model: "ws-mock", max_tokens: 50, stream: true, messages: [{ role: "user", content: "x" }] })
      const { text } = await readBody(res)
      const events = parseEvents(text)
      expect(events[0]).toEqual({ event: "ping", data: { type: "ping" } })
      expect(events.slice(1).map((e) => e.event)).toEqual([
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop"
      ])
    })

    it("a failure after the commit ends the stream with `event: error` (no message_stop); the row records it", async () => {
      mock.script(Behaviour.stream([Chunks.role(), Chunks.content("partial")], { firstDelayMs: 400, then: "drop", done: false }))
      const res = await post(gw, { model: "ws-mock", max_tokens: 50, stream: true, messages: [{ role: "user", content: "x" }] })
      const id = Number(res.headers.get("x-request-id"))
      const { text } = await readBody(res)
      const events = parseEvents(text)
      const last = events.at(-1)!
      expect(last.event).toBe("error")
      expect(last.data.error.type).toBe("api_error")
      expect(last.data.error.message).toMatch(HANGUL)
      expect(events.map((e) => e.event)).not.toContain("message_stop")
      expect(events.map((e) => e.event)).toContain("content_block_delta")
      await eventually(async () => expect((await rowById(gw, id)).status).toBe("error"))
    })
  })

  it("a non-stream message body carries the whole content and Anthropic usage", async () => {
    mock.script(Behaviour.json(Chunks.completion({
      content: "Hi",
      reasoning: "hmm",
      finish: "length",
      usage: { prompt: 12, completion: 3, cached: 2 }
    })))
    const res = await post(gw, { model: "ws-mock", max_tokens: 3, messages: [{ role: "user", content: "x" }] })
    expect(res.status).toBe(200)
    const body = await res.json()
    expect(body).toMatchObject({
      type: "message",
      role: "assistant",
      content: [{ type: "thinking", thinking: "hmm", signature: "" }, { type: "text", text: "Hi" }],
      stop_reason: "max_tokens",
      stop_sequence: null,
      usage: { input_tokens: 10, output_tokens: 3, cache_read_input_tokens: 2, cache_creation_input_tokens: 0 }
    })
  })

  it("a full in-flight cap is 529 overloaded_error (the SDK's OverloadedError)", async () => {
    mock.script(Behaviour.hangAfter([Chunks.role(), Chunks.content("holding")]))
    const holder = new AbortController()
    const held = await fetch(`${gw.url}/v1/messages`, {
      method: "POST",
      headers: { "x-api-key": gw.key, "content-type": "application/json" },
      body: JSON.stringify({ model: "ws-one", max_tokens: 50, stream: true, messages: [{ role: "user", content: "x" }] }),
      signal: holder.signal
    })
    expect(held.status).toBe(200)
    const client = new Anthropic({ baseURL: gw.url, apiKey: gw.key, maxRetries: 0 })
    const error = await client.messages.create({ model: "ws-one", max_tokens: 10, messages: [{ role: "user", content: "y" }] })
      .catch((e) => e)
    holder.abort()
    expect(error).toBeInstanceOf(Anthropic.InternalServerError)
    expect(error.status).toBe(529)
    expect(error.error).toMatchObject({ type: "error", error: { type: "overloaded_error" } })
    expect(error.error.error.message).toMatch(HANGUL)
    await mock.waitForClientAborts(1)
  })

  it("the model's RPM is 429 rate_limit_error with retry-after (the SDK's RateLimitError)", async () => {
    mock.script(Behaviour.stream([Chunks.role(), Chunks.content("ok"), Chunks.finish("stop")]))
    const client = new Anthropic({ baseURL: gw.url, apiKey: gw.key, maxRetries: 0 })
    await client.messages.create({ model: "ws-slow-rpm", max_tokens: 10, messages: [{ role: "user", content: "a" }] })
    const error = await client.messages.create({ model: "ws-slow-rpm", max_tokens: 10, messages: [{ role: "user", content: "b" }] })
      .catch((e) => e)
    expect(error).toBeInstanceOf(Anthropic.RateLimitError)
    expect(error.error.error.type).toBe("rate_limit_error")
    expect(Number(error.headers.get("retry-after"))).toBeGreaterThan(0)
  })

  it("x-api-key: a wrong key is 401 authentication_error; no key at all too; Authorization wins when both are sent", async () => {
    const wrong = await post(gw, { model: "ws-pro", max_tokens: 5, messages: [{ role: "user", content: "x" }] }, {
      "x-api-key": "sk-ws-wrong"
    })
    expect(wrong.status).toBe(401)
    expect(await wrong.json()).toMatchObject({ type: "error", error: { type: "authentication_error" } })
    const none = await fetch(`${gw.url}/v1/messages`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: "{}"
    })
    expect(none.status).toBe(401)
    const both = await post(gw, { model: "ws-pro", max_tokens: 5, messages: [{ role: "user", content: "x" }] }, {
      authorization: "Bearer sk-ws-wrong"
    })
    expect(both.status).toBe(401)
  })

  it("the chat route does not take x-api-key", async () => {
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: "POST",
      headers: { "x-api-key": gw.key, "content-type": "application/json" },
      body: JSON.stringify({ model: "ws-pro", messages: [{ role: "user", content: "x" }] })
    })
    expect(res.status).toBe(401)
    expect(((await res.json()) as any).error.code).toBe("invalid_api_key")
  })

  it("bad bodies get invalid_request_error in Anthropic's envelope, with a Korean message naming the field", async () => {
    const cases: Array<[unknown, string]> = [
      [{ model: "ws-pro", messages: [{ role: "user", content: "x" }] }, "max_tokens"],
      [{ model: "ws-pro", max_tokens: 5, messages: [{ role: "system", content: "x" }] }, "role"],
      [{ model: "ws-pro", max_tokens: 5, messages: [{ role: "user", content: [{ type: "document", source: {} }] }] }, "document"],
      [{ model: "ws-pro", max_tokens: 5, stop_sequences: ["a", "b", "c", "d", "e"], messages: [{ role: "user", content: "x" }] }, "stop_sequences"],
      [{ model: "ws-pro", max_tokens: 5, temperature: 1.5, messages: [{ role: "user", content: "x" }] }, "temperature"]
    ]
    for (const [body, named] of cases) {
      const res = await post(gw, body)
      const text = await res.text()
      expect(res.status, text).toBe(400)
      const parsed = JSON.parse(text)
      expect(parsed.type).toBe("error")
      expect(parsed.error.type).toBe("invalid_request_error")
      expect(parsed.error.message).toMatch(HANGUL)
      expect(parsed.error.message).toContain(named)
    }
    // A refused request's row still says which API it came in on.
    const refused = await post(gw, { model: "ws-pro", messages: [] })
    expect(refused.status).toBe(400)
    await eventually(async () => expect(((await rowById(gw, Number(refused.headers.get("x-request-id")))) as any).api).toBe("messages"))
  })

  it("hostile bodies are bounded before decoding: nested tool-result blocks count, deep tool schemas, huge texts", async () => {
    const block = { type: "text", text: "" }
    const nested = await post(gw, {
      model: "ws-pro",
      max_tokens: 5,
      messages: [{
        role: "user",
        content: [{ type: "tool_result", tool_use_id: "toolu_x", content: Array.from({ length: 5_000 }, () => block) }]
      }]
    })
    expect(nested.status).toBe(400)
    expect((await nested.json() as any).error.message).toContain("4096")
    let schema: any = { type: "string" }
    for (let i = 0; i < 12; i++) schema = { type: "object", properties: { a: schema } }
    const deep = await post(gw, {
      model: "ws-pro",
      max_tokens: 5,
      tools: [{ name: "t", input_schema: schema }],
      messages: [{ role: "user", content: "x" }]
    })
    expect(deep.status).toBe(400)
    expect((await deep.json() as any).error.message).toContain("tools[0]")
    const long = await post(gw, {
      model: "ws-pro",
      max_tokens: 5,
      system: "x".repeat(2_000_000),
      messages: [{ role: "user", content: "x" }]
    })
    expect(long.status).toBe(400)
    expect((await long.json() as any).error.type).toBe("invalid_request_error")
  })

  it("dropped fields are named in x-wellspring-ignored-fields (top_k, unknown ones), names only", async () => {
    mock.script(Behaviour.stream([Chunks.role(), Chunks.content("ok"), Chunks.finish("stop")]))
    const res = await post(gw, {
      model: "ws-mock",
      max_tokens: 5,
      top_k: 5,
      service_tier: "auto",
      "bad name\r\n": 1,
      messages: [{ role: "user", content: "x" }]
    })
    expect(res.status).toBe(200)
    expect(res.headers.get("x-wellspring-ignored-fields")).toBe("top_k, service_tier, (unnamed)")
  })
})
