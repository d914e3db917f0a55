/**
 * Responses request decoding (protocols/responses/Request.ts): the mapping to the internal chat request, every
 * bound checked before decoding costs more, built-in tools and unsupported items named (only known names are
 * ever echoed), Korean messages that never repeat a client's value; and the effort mapping.
 */
import { Result, Schema } from "effect"
import { describe, expect, it } from "vitest"
import { LimitsConfig } from "../../src/config/GatewayConfig.js"
import type { GatewayError } from "../../src/errors/Catalog.js"
import { MAX_CONTENT_PARTS, MAX_TOOLS } from "../../src/inference/ChatRequest.js"
import { decodeResponsesRequest, nearestEffort, type ResponsesCall } from "../../src/protocols/responses/Request.js"

const limits = Schema.decodeSync(LimitsConfig)({})
const HANGUL = /[\uac00-\ud7a3]/

const ok = (body: unknown): ResponsesCall => {
  const result = decodeResponsesRequest(body, limits)
  if (Result.isFailure(result)) throw new Error(`expected success, got ${result.failure.userMessage}`)
  return result.success
}
const refused = (body: unknown): GatewayError => {
  const result = decodeResponsesRequest(body, limits)
  if (Result.isSuccess(result)) throw new Error("expected a refusal")
  const error = result.failure
  expect(error.status).toBe(400)
  expect(error.userMessage).toMatch(HANGUL)
  return error
}

describe("Responses request mapping", () => {
  it("a string input is one user message; instructions come first as a system message", () => {
    const call = ok({ model: "m", input: "hi", instructions: "Be terse.", max_output_tokens: 50, temperature: 0.2 })
    expect(call.chat).toEqual({
      model: "m",
      messages: [{ role: "system", content: "Be terse." }, { role: "user", content: "hi" }],
      stream: false,
      max_tokens: 50,
      temperature: 0.2
    })
    expect(call.input).toEqual([{ role: "user", content: "hi" }])
    expect(call.store).toBe(true)
  })

  it("items: developer is system, images are image parts, assistant turns keep reasoning and call ids", () => {
    const call = ok({
      model: "m",
      stream: true,
      input: [
        { role: "developer", content: "rules" },
        {
          role: "user",
          content: [
            { type: "input_text", text: "look" },
            { type: "input_image", image_url: "https://example.com/a.png", detail: "original" }
          ]
        },
        { type: "reasoning", summary: [{ type: "summary_text", text: "sum" }] },
        { type: "function_call", call_id: "call_1", name: "f", arguments: "{}" },
        { type: "function_call", call_id: "call_2", name: "g", arguments: "{\"a\":1}" },
        { type: "function_call_output", call_id: "call_1", output: "one" },
        { type: "function_call_output", call_id: "call_2", output: [{ type: "input_text", text: "t" }, { type: "input_text", text: "wo" }] },
        { type: "message", role: "assistant", content: [{ type: "output_text", text: "done" }] }
      ],
      tools: [{ type: "function", name: "f", parameters: { type: "object" }, strict: true }],
      tool_choice: { type: "function", name: "f" },
      parallel_tool_calls: false,
      reasoning: { effort: "high" }
    })
    expect(call.chat.messages).toEqual([
      { role: "system", content: "rules" },
      {
        role: "user",
        content: [
          { type: "text", text: "look" },
          { type: "image_url", image_url: { url: "https://example.com/a.png", detail: "high" } }
        ]
      },
      {
        role: "assistant",
        content: null,
        reasoning: "sum",
        tool_calls: [
          { id: "call_1", type: "function", function: { name: "f", arguments: "{}" } },
          { id: "call_2", type: "function", function: { name: "g", arguments: "{\"a\":1}" } }
        ]
      },
      { role: "tool", tool_call_id: "call_1", content: "one" },
      { role: "tool", tool_call_id: "call_2", content: "two" },
      { role: "assistant", content: "done" }
    ])
    expect(call.chat).toMatchObject({
      stream: true,
      reasoning_effort: "high",
      tools: [{ type: "function", function: { name: "f", parameters: { type: "object" }, strict: true } }],
      tool_choice: { type: "function", function: { name: "f" } },
      parallel_tool_calls: false
    })
  })

  it("reasoning attaches only to the assistant output right after it", () => {
    const call = ok({
      model: "m",
      input: [
        { type: "reasoning", summary: [{ type: "summary_text", text: "stale" }] },
        { role: "user", content: "q" },
        { role: "assistant", content: "a" },
        { type: "reasoning", content: [{ type: "reasoning_text", text: "fresh" }] },
        { type: "function_call", call_id: "c", name: "f", arguments: "{}" }
      ]
    })
    expect(call.chat.messages).toEqual([
      { role: "user", content: "q" },
      {
        role: "assistant",
        content: "a",
        reasoning: "fresh",
        tool_calls: [{ id: "c", type: "function", function: { name: "f", arguments: "{}" } }]
      }
    ])
  })

  it("tool options go upstream only with tools, and only when sent", () => {
    expect(ok({ model: "m", input: "x", tool_choice: "none" }).chat).not.toHaveProperty("tool_choice")
    const chat = ok({ model: "m", input: "x", tools: [{ type: "function", name: "f" }] }).chat
    expect(chat).not.toHaveProperty("tool_choice")
    expect(chat).not.toHaveProperty("parallel_tool_calls")
  })

  it("Codex's usual fields are accepted", () => {
    const call = ok({
      model: "m",
      instructions: "x",
      input: [{ type: "message", role: "user", content: [{ type: "input_text", text: "hi" }] }],
      tools: [],
      tool_choice: "auto",
      parallel_tool_calls: false,
      reasoning: { effort: "medium", summary: "auto" },
      store: false,
      stream: true,
      include: ["reasoning.encrypted_content"],
      prompt_cache_key: "k",
      text: { verbosity: "medium" }
    })
    expect(call.store).toBe(false)
    expect(call.effort).toBe("medium")
  })
})

describe("Responses request bounds and refusals", () => {
  it.each([
    ["web_search", { type: "web_search" }],
    ["web_search_preview", { type: "web_search_preview" }],
    ["file_search", { type: "file_search" }],
    ["code_interpreter", { type: "code_interpreter" }],
    ["computer_use_preview", { type: "computer_use_preview" }],
    ["image_generation", { type: "image_generation" }],
    ["mcp", { type: "mcp", server_label: "x" }],
    ["local_shell", { type: "local_shell" }]
  ])("built-in tool %s is named", (name, tool) => {
    const error = refused({ model: "m", input: "x", tools: [{ type: "function", name: "f" }, tool] })
    expect(error.code).toBe("invalid_request")
    expect(error.userMessage).toContain(name)
    expect(error.userMessage).toContain("tools[1]")
  })

  it("a tool type that is not a known one is refused without echoing it", () => {
    const error = refused({ model: "m", input: "x", tools: [{ type: "<script>alert(1)</script>" }] })
    expect(error.userMessage).not.toContain("script")
    expect(error.userMessage).toContain("tools[0]")
    expect(refused({ model: "m", input: "x", tool_choice: { type: "web_search" } }).userMessage).toContain("web_search")
  })

  it("unsupported input items are named; unknown ones are not echoed; files are refused", () => {
    expect(refused({ model: "m", input: [{ type: "item_reference", id: "x" }] }).userMessage).toContain("item_reference")
    const unknown = refused({ model: "m", input: [{ type: "secret-value-123" }] })
    expect(unknown.userMessage).not.toContain("secret-value-123")
    expect(unknown.userMessage).toContain("input[0]")
    expect(refused({
      model: "m",
      input: [{ role: "user", content: [{ type: "input_file", file_id: "file_1" }] }]
    }).userMessage).toContain("input_file")
  })

  it("counts are checked before decoding: items, content parts, tools, metadata keys", () => {
    const many = Array.from({ length: limits.messages + 1 }, () => ({ role: "user", content: "x" }))
    expect(refused({ model: "m", input: many }).userMessage).toContain(String(limits.messages))
    const parts = Array.from({ length: MAX_CONTENT_PARTS + 1 }, () => ({ type: "input_text", text: "x" }))
    expect(refused({ model: "m", input: [{ role: "user", content: parts }] }).userMessage).toContain(String(MAX_CONTENT_PARTS))
    const tools = Array.from({ length: MAX_TOOLS + 1 }, (_, i) => ({ type: "function", name: `f${i}` }))
    expect(refused({ model: "m", input: "x", tools }).userMessage).toContain(String(MAX_TOOLS))
    const metadata = Object.fromEntries(Array.from({ length: 17 }, (_, i) => [`k${i}`, "v"]))
    expect(refused({ model: "m", input: "x", metadata }).userMessage).toContain("metadata")
  })

  it("a tool schema too deep or too large is refused", () => {
    let deep: Record<string, unknown> = { type: "string" }
    for (let i = 0; i < limits.tool_schema_depth + 1; i++) deep = { type: "object", properties: { a: deep } }
    expect(refused({ model: "m", input: "x", tools: [{ type: "function", name: "f", parameters: deep }] }).userMessage)
      .toContain(String(limits.tool_schema_depth))
    const large = { type: "object", description: "d".repeat(limits.tool_schema_bytes) }
    expect(refused({ model: "m", input: "x", tools: [{ type: "function", name: "f", parameters: large }] }).userMessage)
      .toContain("tools[0]")
  })

  it("texts are bounded: instructions, content, call arguments, call output, image URLs", () => {
    const long = "x".repeat(limits.text_chars + 1)
    expect(refused({ model: "m", input: "x", instructions: long }).userMessage).toContain("instructions")
    expect(refused({ model: "m", input: long }).userMessage).toContain("input")
    expect(refused({ model: "m", input: [{ type: "function_call", call_id: "c", name: "f", arguments: long }] }).userMessage)
      .toContain("input[0].arguments")
    expect(refused({ model: "m", input: [{ type: "function_call_output", call_id: "c", output: long }] }).userMessage)
      .toContain("input[0].output")
    const url = `data:image/png;base64,${"A".repeat(limits.image_url_chars)}`
    expect(refused({ model: "m", input: [{ role: "user", content: [{ type: "input_image", image_url: url }] }] }).userMessage)
      .toContain("input[0].content[0].image_url")
  })

  it("field errors name the field and never the value", () => {
    const error = refused({ model: "m", input: "x", temperature: 7.123456 })
    expect(error.userMessage).toContain("temperature")
    expect(error.userMessage).not.toContain("7.123456")
    expect(refused({ model: "m", input: [{ role: "robot", content: "x" }] }).userMessage).toContain("role")
    expect(refused({ model: "m", input: "x", reasoning: { effort: "ultra" } }).userMessage).toContain("reasoning.effort")
    expect(refused({ model: "m", input: "x", text: { format: { type: "json_schema", schema: {} } } }).userMessage)
      .toContain("json_schema")
    expect(refused({ model: "m", input: "x", background: true }).userMessage).toContain("background")
    expect(refused({ model: "m" }).userMessage).toContain("input")
    expect(refused([1, 2]).code).toBe("invalid_request")
  })

  it("previous_response_id alone is enough input", () => {
    expect(ok({ model: "m", previous_response_id: "resp_1" }).previousResponseId).toBe("resp_1")
  })
})

describe("nearestEffort", () => {
  it.each([
    ["medium", ["none", "low", "high"], "low"],
    ["medium", ["high", "max"], "high"],
    ["minimal", ["none", "low", "high"], "low"],
    ["xhigh", ["low", "high"], "high"],
    ["xhigh", ["low", "high", "max"], "max"],
    ["none", ["none", "low"], "none"],
    ["none", ["low", "high"], "low"],
    ["none", [], undefined],
    ["high", [], "high"]
  ])("%s with %j -> %s", (requested, allowed, expected) => {
    expect(nearestEffort(requested, allowed)).toBe(expected)
  })
})
