import { createHash } from "node:crypto"
import { describe, expect, it } from "vitest"
import { upstreamFailure } from "../../../src/upstream/Failure.js"
import { encodeRequest, type EncodeOptions, thinkingBudget } from "../../../src/upstream/anthropic/Encode.js"
import { type Message, UpstreamError, type UpstreamRequest } from "../../../src/upstream/Upstream.js"

const KEY = "sk-ant-api03-test-key"
const base: UpstreamRequest = {
  model: "claude-sonnet-4-5",
  messages: [{ role: "user", content: "hi" }],
  stream: false,
  max_tokens: 1000
}

const encode = (patch: Partial<UpstreamRequest>, options: EncodeOptions = { apiKey: KEY }) => {
  const out = encodeRequest({ ...base, ...patch }, options)
  if (out instanceof UpstreamError) throw new Error(`refused: ${out.detail}`)
  return { ...out, json: JSON.parse(out.body) }
}
const body = (patch: Partial<UpstreamRequest>) => encode(patch).json
const messagesOf = (messages: ReadonlyArray<Message>) => body({ messages }).messages

const refused = (patch: Partial<UpstreamRequest>): UpstreamError => {
  const out = encodeRequest({ ...base, ...patch }, { apiKey: KEY })
  if (!(out instanceof UpstreamError)) throw new Error("expected a refusal")
  return out
}

const tool = (name: string, parameters?: Record<string, unknown>) => ({
  type: "function" as const,
  function: { name, description: `does ${name}`, ...(parameters ? { parameters } : {}) }
})
const call = (id: string, name: string, args: string) => ({
  id,
  type: "function" as const,
  function: { name, arguments: args }
})

describe("Anthropic request encoding", () => {
  it("sends POST /v1/messages with x-api-key, anthropic-version and a JSON body", () => {
    const out = encode({})
    expect(out.path).toBe("/v1/messages")
    expect(out.headers).toEqual({
      "content-type": "application/json",
      "anthropic-version": "2023-06-01",
      "x-api-key": KEY
    })
    expect(out.json).toEqual({
      model: "claude-sonnet-4-5",
      max_tokens: 1000,
      messages: [{ role: "user", content: [{ type: "text", text: "hi" }] }],
      stream: false
    })
  })

  it("sends the key as a bearer token for the bearer scheme, and never both", () => {
    const out = encode({ stream: true }, { apiKey: KEY, scheme: "bearer" })
    expect(out.headers.authorization).toBe(`Bearer ${KEY}`)
    expect(out.headers["x-api-key"]).toBeUndefined()
    expect(out.json.stream).toBe(true)
    expect(out.body).not.toContain(KEY)
  })

  it("sends no credential header at all without a key", () => {
    for (const options of [{}, { apiKey: "" }, { apiKey: undefined, scheme: "bearer" as const }]) {
      const out = encode({ stream: true }, options)
      expect(out.headers).toEqual({ "content-type": "application/json", "anthropic-version": "2023-06-01" })
    }
  })

  it("lifts system messages (multi-part, anywhere) into the top-level system text", () => {
    const json = body({
      messages: [
        { role: "system", content: "Be brief." },
        { role: "system", content: [{ type: "text", text: "Answer in Korean." }, { type: "text", text: "No emoji." }] },
        { role: "user", content: "hi" },
        { role: "system", content: "" },
        { role: "system", content: "Late rule." }
      ]
    })
    expect(json.system).toBe("Be brief.\n\nAnswer in Korean.\nNo emoji.\n\nLate rule.")
    expect(json.messages).toEqual([{ role: "user", content: [{ type: "text", text: "hi" }] }])
  })

  it("omits system when there is none", () => {
    expect(body({})).not.toHaveProperty("system")
  })

  it("refuses an image in a system message", () => {
    const error = refused({
      messages: [
        { role: "system", content: [{ type: "image_url", image_url: { url: "https://example.com/a.png" } }] },
        { role: "user", content: "hi" }
      ]
    })
    expect(error).toMatchObject({ kind: "status", status: 400 })
  })

  it("maps multi-part user content: text, https images, base64 data URIs; drops detail and empty text", () => {
    expect(messagesOf([{
      role: "user",
      content: [
        { type: "text", text: "What is in these?" },
        { type: "text", text: "" },
        { type: "image_url", image_url: { url: "https://example.com/cat.png", detail: "high" } },
        { type: "image_url", image_url: { url: "data:image/jpeg;base64,/9j/4AAQ" } },
        { type: "image_url", image_url: { url: "data:image/JPG;base64,/9j/4BBQ" } },
        { type: "image_url", image_url: { url: "data:image/png;charset=binary;base64,iVBORw0K" } },
        { type: "image_url", image_url: { url: "data:image/gif;base64,R0lGOD" } },
        { type: "image_url", image_url: { url: "data:image/webp;base64,UklGR" } }
      ]
    }])).toEqual([{
      role: "user",
      content: [
        { type: "text", text: "What is in these?" },
        { type: "image", source: { type: "url", url: "https://example.com/cat.png" } },
        { type: "image", source: { type: "base64", media_type: "image/jpeg", data: "/9j/4AAQ" } },
        { type: "image", source: { type: "base64", media_type: "image/jpeg", data: "/9j/4BBQ" } },
        { type: "image", source: { type: "base64", media_type: "image/png", data: "iVBORw0K" } },
        { type: "image", source: { type: "base64", media_type: "image/gif", data: "R0lGOD" } },
        { type: "image", source: { type: "base64", media_type: "image/webp", data: "UklGR" } }
      ]
    }])
  })

  it.each([
    ["an unsupported media type", "data:image/bmp;base64,Qk0=", /media type "image\/bmp" is not supported/],
    ["a non-image media type", "data:application/pdf;base64,JVBERi0=", /not supported/],
    ["a data URI that is not base64", "data:image/png,%89PNG", /base64/],
    ["an empty data URI", "data:image/png;base64,", /empty/],
    ["a data URI without a comma", "data:image/png;base64" + "A".repeat(300), /malformed/],
    ["a plain http URL", "http://example.com/a.png", /https/]
  ])("refuses %s with a 400 the gateway answers as upstream_rejected", (_, url, detail) => {
    const error = refused({ messages: [{ role: "user", content: [{ type: "image_url", image_url: { url } }] }] })
    expect(error.kind).toBe("status")
    expect(error.status).toBe(400)
    expect(error.detail).toMatch(detail)
    expect(upstreamFailure(error).code).toBe("upstream_rejected")
  })

  it("maps assistant tool calls to tool_use blocks and tool messages to tool_result blocks of one user turn", () => {
    expect(messagesOf([
      { role: "user", content: "Weather in Seoul and Busan?" },
      {
        role: "assistant",
        content: "Checking.",
        tool_calls: [
          call("call_0123456789abcdef0123456789abcdef", "weather", "{\"city\":\"Seoul\"}"),
          call("toolu_01A09q90qw90lq917835lq9", "weather", "{\"city\":\"Busan\"}")
        ]
      },
      { role: "tool", tool_call_id: "call_0123456789abcdef0123456789abcdef", content: "12°C" },
      { role: "tool", tool_call_id: "toolu_01A09q90qw90lq917835lq9", content: "15°C" },
      { role: "user", content: "Thanks" }
    ])).toEqual([
      { role: "user", content: [{ type: "text", text: "Weather in Seoul and Busan?" }] },
      {
        role: "assistant",
        content: [
          { type: "text", text: "Checking." },
          { type: "tool_use", id: "call_0123456789abcdef0123456789abcdef", name: "weather", input: { city: "Seoul" } },
          { type: "tool_use", id: "toolu_01A09q90qw90lq917835lq9", name: "weather", input: { city: "Busan" } }
        ]
      },
      {
        role: "user",
        content: [
          { type: "tool_result", tool_use_id: "call_0123456789abcdef0123456789abcdef", content: "12°C" },
          { type: "tool_result", tool_use_id: "toolu_01A09q90qw90lq917835lq9", content: "15°C" },
          { type: "text", text: "Thanks" }
        ]
      }
    ])
  })

  it("puts tool results before user text in the same turn, and omits empty result content", () => {
    const messages = messagesOf([
      { role: "user", content: "go" },
      { role: "assistant", content: null, tool_calls: [call("toolu_01abcdefghijklmnop", "run", "{}")] },
      { role: "user", content: "also this" },
      { role: "tool", tool_call_id: "toolu_01abcdefghijklmnop", content: "" }
    ])
    expect(messages[2]).toEqual({
      role: "user",
      content: [
        { type: "tool_result", tool_use_id: "toolu_01abcdefghijklmnop" },
        { type: "text", text: "also this" }
      ]
    })
  })

  it("turns arguments that are not a JSON object into an empty input", () => {
    const messages = messagesOf([
      { role: "user", content: "go" },
      {
        role: "assistant",
        content: null,
        tool_calls: [
          call("a1", "f", "{\"x\": 1"), // cut by max_tokens
          call("a2", "f", "[1,2]"),
          call("a3", "f", ""),
          call("a4", "f", "null")
        ]
      },
      { role: "tool", tool_call_id: "a1", content: "r" },
      { role: "tool", tool_call_id: "a2", content: "r" },
      { role: "tool", tool_call_id: "a3", content: "r" },
      { role: "tool", tool_call_id: "a4", content: "r" }
    ])
    expect(messages[1].content.map((b: any) => b.input)).toEqual([{}, {}, {}, {}])
  })

  it("replaces tool call ids Anthropic would refuse by a hash, identically on tool_use and tool_result", () => {
    const odd = "functions.get_weather:0"
    const hashed = "toolu_" + createHash("sha256").update(odd).digest("hex").slice(0, 32)
    const long = "x".repeat(65)
    const messages = messagesOf([
      { role: "user", content: "go" },
      { role: "assistant", content: null, tool_calls: [call(odd, "get_weather", "{}"), call(long, "f", "{}")] },
      { role: "tool", tool_call_id: odd, content: "sunny" },
      { role: "tool", tool_call_id: long, content: "ok" }
    ])
    expect(messages[1].content[0].id).toBe(hashed)
    expect(messages[2].content[0].tool_use_id).toBe(hashed)
    expect(messages[1].content[1].id).toMatch(/^toolu_[0-9a-f]{32}$/)
    expect(messages[2].content[1].tool_use_id).toBe(messages[1].content[1].id)
  })

  it("merges consecutive messages of the same role and drops empty ones", () => {
    expect(messagesOf([
      { role: "user", content: "one" },
      { role: "user", content: [{ type: "text", text: "two" }] },
      { role: "assistant", content: "" },
      { role: "user", content: "three" },
      { role: "assistant", content: "A" },
      { role: "assistant", content: null },
      { role: "assistant", content: "B" },
      { role: "user", content: "four" }
    ])).toEqual([
      {
        role: "user",
        content: [{ type: "text", text: "one" }, { type: "text", text: "two" }, { type: "text", text: "three" }]
      },
      { role: "assistant", content: [{ type: "text", text: "A" }, { type: "text", text: "B" }] },
      { role: "user", content: [{ type: "text", text: "four" }] }
    ])
  })

  it("drops assistant reasoning (Anthropic needs its own signed thinking blocks)", () => {
    const out = encode({
      messages: [
        { role: "user", content: "q" },
        { role: "assistant", content: "a", reasoning: "SECRET-CHAIN-OF-THOUGHT" },
        { role: "user", content: "q2" }
      ]
    })
    expect(out.body).not.toContain("SECRET-CHAIN-OF-THOUGHT")
    expect(out.json.messages[1]).toEqual({ role: "assistant", content: [{ type: "text", text: "a" }] })
  })

  it("trims the trailing whitespace of a final assistant message (a prefill)", () => {
    expect(messagesOf([{ role: "user", content: "q" }, { role: "assistant", content: "The answer is  \n" }])).toEqual([
      { role: "user", content: [{ type: "text", text: "q" }] },
      { role: "assistant", content: [{ type: "text", text: "The answer is" }] }
    ])
    expect(messagesOf([{ role: "user", content: "q" }, { role: "assistant", content: "  " }])).toEqual([
      { role: "user", content: [{ type: "text", text: "q" }] }
    ])
  })

  it("maps tools to name, description and input_schema (an empty object schema when none)", () => {
    const schema = { type: "object", properties: { city: { type: "string" } }, required: ["city"] }
    const json = body({
      tools: [
        tool("weather", schema),
        { type: "function", function: { name: "now", strict: true } },
        { type: "function", function: { name: "bare", parameters: { properties: { a: { type: "integer" } } } } }
      ]
    })
    expect(json.tools).toEqual([
      { name: "weather", description: "does weather", input_schema: schema },
      { name: "now", input_schema: { type: "object", properties: {} } },
      { name: "bare", input_schema: { type: "object", properties: { a: { type: "integer" } } } }
    ])
    expect(json).not.toHaveProperty("tool_choice")
  })

  it.each([
    ["auto", undefined, { type: "auto" }],
    ["required", undefined, { type: "any" }],
    ["none", undefined, { type: "none" }],
    [{ type: "function", function: { name: "weather" } }, undefined, { type: "tool", name: "weather" }],
    ["auto", false, { type: "auto", disable_parallel_tool_use: true }],
    ["required", false, { type: "any", disable_parallel_tool_use: true }],
    [undefined, false, { type: "auto", disable_parallel_tool_use: true }],
    ["none", false, { type: "none" }],
    ["auto", true, { type: "auto" }]
  ] as const)("maps tool_choice %j with parallel_tool_calls %j", (choice, parallel, expected) => {
    const json = body({
      tools: [tool("weather")],
      ...(choice !== undefined ? { tool_choice: choice } : {}),
      ...(parallel !== undefined ? { parallel_tool_calls: parallel } : {})
    })
    expect(json.tool_choice).toEqual(expected)
  })

  it("sends tool_choice only with tools", () => {
    const json = body({ tool_choice: "required", parallel_tool_calls: false })
    expect(json).not.toHaveProperty("tool_choice")
    expect(json).not.toHaveProperty("tools")
  })

  it("declares the history's tools with tool_choice none when the request has no tools", () => {
    const json = body({
      messages: [
        { role: "user", content: "go" },
        { role: "assistant", content: null, tool_calls: [call("toolu_01abcdefghijklmnop", "search", "{\"q\":\"x\"}")] },
        { role: "tool", tool_call_id: "toolu_01abcdefghijklmnop", content: "found" },
        { role: "user", content: "summarize" }
      ]
    })
    expect(json.tools).toEqual([{ name: "search", input_schema: { type: "object", properties: {} } }])
    expect(json.tool_choice).toEqual({ type: "none" })
  })

  it("maps stop to stop_sequences", () => {
    expect(body({ stop: "END" }).stop_sequences).toEqual(["END"])
    expect(body({ stop: ["a", "b"] }).stop_sequences).toEqual(["a", "b"])
    expect(body({ stop: [] })).not.toHaveProperty("stop_sequences")
  })

  it("passes temperature (clamped to Anthropic's 0..1), or top_p when there is no temperature", () => {
    const both = body({ temperature: 0.3, top_p: 0.5 })
    expect(both.temperature).toBe(0.3)
    expect(both).not.toHaveProperty("top_p")
    expect(body({ top_p: 0.5 }).top_p).toBe(0.5)
    expect(body({ temperature: 1.7 }).temperature).toBe(1)
    expect(body({ temperature: 0 }).temperature).toBe(0)
    expect(body({})).not.toHaveProperty("temperature")
  })

  describe("reasoning_effort -> thinking", () => {
    it.each([
      [undefined, 32_000, 0],
      ["none", 32_000, 0],
      ["low", 32_000, 1024],
      ["high", 32_000, 8192],
      ["max", 32_000, 24_576],
      ["high", 4000, 3999],
      ["max", 8193, 8192],
      ["low", 1025, 1024],
      ["low", 1024, 0],
      ["high", 500, 0]
    ] as const)("effort %s with max_tokens %i -> budget %i", (effort, maxTokens, budget) => {
      expect(thinkingBudget(effort, maxTokens)).toBe(budget)
      const json = body({ max_tokens: maxTokens, ...(effort !== undefined ? { reasoning_effort: effort } : {}) })
      expect(json.max_tokens).toBe(maxTokens)
      if (budget === 0) expect(json).not.toHaveProperty("thinking")
      else expect(json.thinking).toEqual({ type: "enabled", budget_tokens: budget })
    })

    it("omits temperature with thinking, and top_p below 0.95", () => {
      const on = body({ reasoning_effort: "high", max_tokens: 16_000, temperature: 0.2, top_p: 0.5 })
      expect(on.thinking).toEqual({ type: "enabled", budget_tokens: 8192 })
      expect(on).not.toHaveProperty("temperature")
      expect(on).not.toHaveProperty("top_p")
      const high = body({ reasoning_effort: "high", max_tokens: 16_000, top_p: 0.97 })
      expect(high.top_p).toBe(0.97)
      const off = body({ reasoning_effort: "none", temperature: 0.2, top_p: 0.5 })
      expect(off.temperature).toBe(0.2)
      expect(off).not.toHaveProperty("thinking")
    })

    it("turns thinking off for a forced tool, a prefill, or a tool loop continuation", () => {
      const effort = { reasoning_effort: "high", max_tokens: 16_000 } as const
      expect(body({ ...effort, tools: [tool("f")], tool_choice: "required" })).not.toHaveProperty("thinking")
      expect(
        body({ ...effort, tools: [tool("f")], tool_choice: { type: "function", function: { name: "f" } } })
      ).not.toHaveProperty("thinking")
      expect(body({ ...effort, tools: [tool("f")], tool_choice: "auto" }).thinking).toBeDefined()
      expect(body({ ...effort, tools: [tool("f")], tool_choice: "none" }).thinking).toBeDefined()
      expect(
        body({ ...effort, messages: [{ role: "user", content: "q" }, { role: "assistant", content: "Sure:" }] })
      ).not.toHaveProperty("thinking")
      const loop: ReadonlyArray<Message> = [
        { role: "user", content: "q" },
        { role: "assistant", content: null, tool_calls: [call("toolu_01abcdefghijklmnop", "f", "{}")] },
        { role: "tool", tool_call_id: "toolu_01abcdefghijklmnop", content: "r" }
      ]
      expect(body({ ...effort, tools: [tool("f")], messages: loop })).not.toHaveProperty("thinking")
      expect(body({ ...effort, tools: [tool("f")], messages: [...loop, { role: "assistant", content: "done" }, {
        role: "user",
        content: "next question"
      }] }).thinking).toEqual({ type: "enabled", budget_tokens: 8192 })
    })
  })
})
