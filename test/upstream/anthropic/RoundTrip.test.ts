/**
 * The codec over real HTTP: requests built by `encodeRequest` are sent with undici to the fake Anthropic server
 * (which checks the credential, the version header and Anthropic's request rules), and its answers go through
 * `AnthropicSse` / `decodeResponse` / `mapError` as a transport would feed them.
 */
import { createHash } from "node:crypto"
import { StringDecoder } from "node:string_decoder"
import { request as undiciRequest } from "undici"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { upstreamFailure } from "../../../src/upstream/Failure.js"
import { AnthropicSse, decodeResponse } from "../../../src/upstream/anthropic/Decode.js"
import { encodeRequest, type EncodeOptions } from "../../../src/upstream/anthropic/Encode.js"
import { mapError } from "../../../src/upstream/anthropic/Errors.js"
import { UpstreamError, type UpstreamEvent, type UpstreamRequest } from "../../../src/upstream/Upstream.js"
import {
  type FakeAnthropic,
  FakeBehaviour,
  FakeEvents as E,
  FakeMessages,
  startFakeAnthropic
} from "../../support/FakeAnthropic.js"

const KEY = "sk-ant-api03-roundtrip-key-0123456789"

interface Outcome {
  readonly status: number
  readonly events: ReadonlyArray<UpstreamEvent>
  /** The codec's failure (mapped status, error event, protocol error). */
  readonly error?: UpstreamError
  /** The connection failed while reading the body. */
  readonly transport?: string
}

/** One call as a transport makes it: encode, send, decode the answer by its status and content type. */
const call = async (
  fake: FakeAnthropic,
  request: UpstreamRequest,
  options: EncodeOptions = { apiKey: KEY }
): Promise<Outcome> => {
  const encoded = encodeRequest(request, options)
  const secrets = options.apiKey ? [options.apiKey] : []
  if (encoded instanceof UpstreamError) throw new Error(`refused: ${encoded.detail}`)
  const res = await undiciRequest(fake.url + encoded.path, {
    method: "POST",
    headers: encoded.headers,
    body: encoded.body
  })
  if (res.statusCode >= 300) {
    const error = mapError(res.statusCode, await res.body.text(), secrets)
    return { status: res.statusCode, events: [], error }
  }
  if (!String(res.headers["content-type"]).includes("text/event-stream")) {
    const events = decodeResponse(await res.body.json(), secrets)
    return events instanceof UpstreamError
      ? { status: res.statusCode, events: [], error: events }
      : { status: res.statusCode, events }
  }
  const sse = new AnthropicSse(secrets)
  const decoder = new StringDecoder("utf8")
  const events: Array<UpstreamEvent> = []
  try {
    for await (const chunk of res.body) {
      sse.push(decoder.write(chunk as Buffer))
      events.push(...sse.decoder.take())
      if (sse.decoder.error !== undefined) break
    }
  } catch (error) {
    return { status: res.statusCode, events, transport: (error as Error).message }
  }
  sse.push(decoder.end())
  const error = sse.end()
  events.push(...sse.decoder.take())
  return error === undefined ? { status: res.statusCode, events } : { status: res.statusCode, events, error }
}

const base: UpstreamRequest = {
  model: "claude-fake-4",
  messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Say hello" }],
  stream: true,
  max_tokens: 256
}

const derived = (toolu: string) =>
  "call_" + createHash("sha256").update("anthropic:" + toolu).digest("hex").slice(0, 32)

const texts = (events: ReadonlyArray<UpstreamEvent>, tag: "Content" | "Reasoning") =>
  events.flatMap((e) => (e._tag === tag ? [e.text] : [])).join("")

describe("Anthropic codec over HTTP (fake Anthropic)", () => {
  let fake: FakeAnthropic
  beforeAll(async () => {
    fake = await startFakeAnthropic({ apiKey: KEY })
  })
  afterAll(async () => {
    await fake.close()
  })

  it("streams a text answer: the request carries the key, version and mapped body; the events are exact", async () => {
    fake.script(FakeBehaviour.message(FakeMessages.text("Hello, world!", { input_tokens: 21, output_tokens: 5 }), 5))
    const outcome = await call(fake, base)
    expect(outcome).toEqual({
      status: 200,
      events: [
        { _tag: "Content", text: "Hello" },
        { _tag: "Content", text: ", wor" },
        { _tag: "Content", text: "ld!" },
        { _tag: "Finish", reason: "stop" },
        { _tag: "Usage", usage: { prompt_tokens: 21, completion_tokens: 5, reasoning_tokens: 0, cached_tokens: 0 } }
      ]
    })
    const recorded = fake.requests.at(-1)!
    expect(recorded.path).toBe("/v1/messages")
    expect(recorded.headers["x-api-key"]).toBe(KEY)
    expect(recorded.headers["anthropic-version"]).toBe("2023-06-01")
    expect(recorded.body).toEqual({
      model: "claude-fake-4",
      max_tokens: 256,
      system: "Be brief.",
      messages: [{ role: "user", content: [{ type: "text", text: "Say hello" }] }],
      stream: true
    })
  })

  it("decodes the same answer non-streamed", async () => {
    fake.script(FakeBehaviour.message(FakeMessages.text("Hello, world!", { input_tokens: 21, output_tokens: 5 })))
    const outcome = await call(fake, { ...base, stream: false })
    expect(outcome).toEqual({
      status: 200,
      events: [
        { _tag: "Content", text: "Hello, world!" },
        { _tag: "Finish", reason: "stop" },
        { _tag: "Usage", usage: { prompt_tokens: 21, completion_tokens: 5, reasoning_tokens: 0, cached_tokens: 0 } }
      ]
    })
    expect(fake.requests.at(-1)!.body.stream).toBe(false)
  })

  it("streams thinking then text with a thinking budget the fake accepts; reasoning comes first", async () => {
    const message = FakeMessages.thinkingThenText("First, greet. Then stop.", "Hello!", {
      input_tokens: 30,
      cache_read_input_tokens: 12,
      output_tokens: 44
    })
    fake.script(FakeBehaviour.message(message, 4))
    const outcome = await call(fake, { ...base, reasoning_effort: "high", max_tokens: 4000, temperature: 0.5 })
    expect(outcome.error).toBeUndefined()
    expect(fake.requests.at(-1)!.body.thinking).toEqual({ type: "enabled", budget_tokens: 3999 })
    expect(fake.requests.at(-1)!.body).not.toHaveProperty("temperature")
    const firstContent = outcome.events.findIndex((e) => e._tag === "Content")
    expect(outcome.events.slice(0, firstContent).every((e) => e._tag === "Reasoning")).toBe(true)
    expect(texts(outcome.events, "Reasoning")).toBe("First, greet. Then stop.")
    expect(texts(outcome.events, "Content")).toBe("Hello!")
    expect(outcome.events.slice(-2)).toEqual([
      { _tag: "Finish", reason: "stop" },
      { _tag: "Usage", usage: { prompt_tokens: 42, completion_tokens: 44, reasoning_tokens: 6, cached_tokens: 12 } }
    ])
  })

  it("streams tool calls whose input JSON is split mid-token", async () => {
    fake.script(FakeBehaviour.message(
      FakeMessages.toolUse([
        { id: "toolu_01A09q90qw90lq917835lq9", name: "weather", input: { city: "서울", unit: "celsius" } },
        { id: "toolu_01B7mJzqY2M8xk3PwTq9Rn4e", name: "time", input: {} }
      ], "Let me check."),
      3
    ))
    const outcome = await call(fake, {
      ...base,
      tools: [
        { type: "function", function: { name: "weather", parameters: { type: "object", properties: { city: { type: "string" } } } } },
        { type: "function", function: { name: "time" } }
      ],
      tool_choice: "auto"
    })
    expect(outcome.error).toBeUndefined()
    const starts = outcome.events.filter((e) => e._tag === "ToolCallStart")
    expect(starts).toEqual([
      { _tag: "ToolCallStart", index: 0, id: derived("toolu_01A09q90qw90lq917835lq9"), name: "weather" },
      { _tag: "ToolCallStart", index: 1, id: derived("toolu_01B7mJzqY2M8xk3PwTq9Rn4e"), name: "time" }
    ])
    const args = (index: number) =>
      outcome.events.flatMap((e) => (e._tag === "ToolCallArgs" && e.index === index ? [e.fragment] : []))
    expect(args(0).length).toBeGreaterThan(3) // split into pieces
    expect(args(0).join("")).toBe("{\"city\":\"서울\",\"unit\":\"celsius\"}")
    expect(args(1).join("")).toBe("{}")
    // Each call's start precedes its arguments.
    const startAt = outcome.events.findIndex((e) => e._tag === "ToolCallStart" && e.index === 1)
    const argsAt = outcome.events.findIndex((e) => e._tag === "ToolCallArgs" && e.index === 1)
    expect(startAt).toBeLessThan(argsAt)
    expect(outcome.events.at(-2)).toEqual({ _tag: "Finish", reason: "tool_calls" })
    expect(fake.requests.at(-1)!.body.tool_choice).toEqual({ type: "auto" })
  })

  it("maps errors answered before the first byte", async () => {
    fake.script(
      FakeBehaviour.error(529, "overloaded_error", "Overloaded"),
      FakeBehaviour.error(400, "invalid_request_error", "prompt is too long: 208310 tokens > 200000 maximum"),
      FakeBehaviour.error(429, "rate_limit_error", "rate limited"),
      FakeBehaviour.error(500, "api_error", "Internal server error"),
      FakeBehaviour.message(FakeMessages.text("ok"))
    )
    const codes: Array<[number, string | undefined, string]> = []
    for (let i = 0; i < 4; i++) {
      const outcome = await call(fake, base)
      expect(outcome.events).toEqual([])
      codes.push([outcome.status, outcome.error?.kind, upstreamFailure(outcome.error!).code])
    }
    expect(codes).toEqual([
      [529, "rate_limited", "upstream_rate_limited"],
      [400, "status", "input_too_long"],
      [429, "rate_limited", "upstream_rate_limited"],
      [500, "status", "upstream_error"]
    ])
  })

  it("is refused with a wrong key (authentication_error, no retry) and the key never reaches the detail", async () => {
    const wrong = "sk-ant-api03-WRONGWRONGWRONG"
    const outcome = await call(fake, base, { apiKey: wrong })
    expect(outcome.status).toBe(401)
    expect(outcome.error).toMatchObject({ kind: "status", status: 401 })
    expect(outcome.error!.detail).toContain("authentication_error")
    expect(outcome.error!.detail).not.toContain("WRONGWRONG")
    const answered = upstreamFailure(outcome.error!)
    expect(answered.code).toBe("upstream_error")
    expect(answered.shouldRetry).toBe(false)
  })

  it("sends the key as a bearer token to a server that expects one", async () => {
    const bearer = await startFakeAnthropic({ apiKey: KEY, scheme: "bearer" })
    try {
      bearer.script(FakeBehaviour.message(FakeMessages.text("hi")))
      const ok = await call(bearer, base, { apiKey: KEY, scheme: "bearer" })
      expect(texts(ok.events, "Content")).toBe("hi")
      expect(bearer.requests.at(-1)!.headers.authorization).toBe(`Bearer ${KEY}`)
      const refused = await call(bearer, base, { apiKey: KEY })
      expect(refused.status).toBe(401)
    } finally {
      await bearer.close()
    }
  })

  it("fails on an error event mid-stream, after the events already decoded", async () => {
    fake.script(FakeBehaviour.events([
      E.messageStart({ input_tokens: 9, output_tokens: 1 }),
      E.blockStart(0, { type: "text", text: "" }),
      E.ping(),
      E.textDelta(0, "Partial "),
      E.textDelta(0, "answer"),
      E.error("overloaded_error", "Overloaded")
    ]))
    const outcome = await call(fake, base)
    expect(outcome.events).toEqual([{ _tag: "Content", text: "Partial " }, { _tag: "Content", text: "answer" }])
    expect(outcome.error).toMatchObject({ kind: "rate_limited", status: 529 })
  })

  it("fails before any event when the stream errors right after message_start (a JSON error is still possible)", async () => {
    fake.script(FakeBehaviour.events([E.messageStart(), E.ping(), E.error("api_error", "Internal server error")]))
    const outcome = await call(fake, base)
    expect(outcome.events).toEqual([])
    expect(outcome.error).toMatchObject({ kind: "status", status: 500 })
  })

  it("reports a connection dropped mid-stream after the events that arrived", async () => {
    fake.script(FakeBehaviour.events([
      E.messageStart(),
      E.blockStart(0, { type: "text", text: "" }),
      E.textDelta(0, "cut "),
      E.textDelta(0, "here")
    ], "drop"))
    const outcome = await call(fake, base)
    expect(outcome.events).toEqual([{ _tag: "Content", text: "cut " }, { _tag: "Content", text: "here" }])
    expect(outcome.transport).toBeDefined()
    expect(outcome.error).toBeUndefined()
  })

  it("fails a stream that ends cleanly before finishing as a protocol error", async () => {
    fake.script(FakeBehaviour.events([E.messageStart(), E.blockStart(0, { type: "text", text: "" }), E.textDelta(0, "x")]))
    const outcome = await call(fake, base)
    expect(outcome.events).toEqual([{ _tag: "Content", text: "x" }])
    expect(outcome.error).toMatchObject({ kind: "protocol" })
  })

  it("sends a multi-turn tool conversation with images that the fake's Anthropic rules accept", async () => {
    fake.script(FakeBehaviour.message(FakeMessages.text("It is sunny.")))
    const outcome = await call(fake, {
      ...base,
      stream: false,
      messages: [
        { role: "system", content: "You are a weather bot." },
        {
          role: "user",
          content: [
            { type: "text", text: "Where is this, and what is the weather?" },
            { type: "image_url", image_url: { url: "data:image/png;base64,iVBORw0KGgo=" } }
          ]
        },
        { role: "user", content: "Please." },
        {
          role: "assistant",
          content: null,
          reasoning: "dropped",
          tool_calls: [{
            id: "call_0123456789abcdef0123456789abcdef",
            type: "function",
            function: { name: "weather", arguments: "{\"city\":\"Seoul\"}" }
          }]
        },
        { role: "tool", tool_call_id: "call_0123456789abcdef0123456789abcdef", content: "sunny" }
      ],
      tools: [{ type: "function", function: { name: "weather" } }]
    })
    expect(outcome.error).toBeUndefined()
    expect(texts(outcome.events, "Content")).toBe("It is sunny.")
    expect(fake.requests.at(-1)!.body.messages.map((m: any) => m.role)).toEqual(["user", "assistant", "user"])
  })
})
