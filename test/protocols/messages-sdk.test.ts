/**
 * The official `@anthropic-ai/sdk` against a gateway this test starts (issue 20 point 1): messages.create,
 * messages.stream (text, tools, thinking), countTokens, the SDK's error classes, a multi-turn tool loop against
 * the simulated models and against a fake OpenAI-compatible upstream, and the request rows (`api = messages`).
 */
import Anthropic from "@anthropic-ai/sdk"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { startGateway, type TestGateway } from "../support/Gateway.js"
import { Behaviour, Chunks, type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"
import { makeUnlimitedAdmission } from "../support/UnlimitedAdmission.js"
import { addMockModel, HANGUL, rowById } from "../inference/helpers.js"

const TOOLU = /^toolu_[0-9a-f]{32}$/

const weatherTool: Anthropic.Tool = {
  name: "get_weather",
  description: "Current weather of a city",
  input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] }
}

describe("@anthropic-ai/sdk against /v1/messages", () => {
  let gw: TestGateway
  let mock: MockUpstream
  let client: Anthropic
  const adm = makeUnlimitedAdmission()

  beforeAll(async () => {
    mock = await startMockUpstream()
    gw = await startGateway({
      admission: adm.layer,
      configure: (doc) => {
        addMockModel(doc, { baseUrl: mock.url, timeouts: { first_token_ms: 2_000, idle_ms: 2_000 } })
      }
    })
    client = new Anthropic({ baseURL: gw.url, apiKey: gw.key, maxRetries: 0 })
  })
  afterAll(async () => {
    await gw?.stop()
    await mock?.close()
  })

  it("messages.create: a message with text, end_turn, usage, the receipt and quota headers; the row says messages", async () => {
    const { data, response } = await client.messages
      .create({ model: "ws-pro", max_tokens: 200, messages: [{ role: "user", content: "Hello from the Anthropic SDK" }] })
      .withResponse()
    expect(data.type).toBe("message")
    expect(data.id).toMatch(/^msg_/)
    expect(data.role).toBe("assistant")
    expect(data.model).toBe("ws-pro")
    expect(data.stop_reason).toBe("end_turn")
    expect(data.content).toHaveLength(1)
    expect(data.content[0]!.type).toBe("text")
    expect((data.content[0] as Anthropic.TextBlock).text.length).toBeGreaterThan(0)
    expect(data.usage.input_tokens).toBeGreaterThan(0)
    expect(data.usage.output_tokens).toBeGreaterThan(0)
    expect(data.usage.cache_read_input_tokens).toBe(0)
    expect((data as any).wellspring.request_id).toBe(response.headers.get("x-request-id"))
    expect(response.headers.get("x-session-remaining-pct")).not.toBeNull()
    expect(response.headers.get("x-weekly-remaining-pct")).not.toBeNull()
    const row = await rowById(gw, Number(response.headers.get("x-request-id")))
    expect(row.status).toBe("success")
    expect((row as any).api).toBe("messages")
    expect(row.model_id).toBe("ws-pro")
  })

  it("the key is accepted in Authorization: Bearer too (authToken)", async () => {
    const bearer = new Anthropic({ baseURL: gw.url, apiKey: null, authToken: gw.key, maxRetries: 0 })
    const message = await bearer.messages.create({
      model: "ws-lite",
      max_tokens: 50,
      messages: [{ role: "user", content: "hi" }]
    })
    expect(message.stop_reason).toBe("end_turn")
  })

  it("messages.stream: text deltas assemble into the final message with usage", async () => {
    const stream = client.messages.stream({
      model: "ws-pro",
      max_tokens: 200,
      messages: [{ role: "user", content: "Stream something please" }]
    })
    let text = ""
    stream.on("text", (delta) => (text += delta))
    const final = await stream.finalMessage()
    expect(final.stop_reason).toBe("end_turn")
    expect(final.content[0]!.type).toBe("text")
    expect((final.content[0] as Anthropic.TextBlock).text).toBe(text)
    expect(text.length).toBeGreaterThan(0)
    expect(final.usage.output_tokens).toBeGreaterThan(0)
  })

  it("messages.stream with thinking: a thinking block first (from the budget's effort), then text", async () => {
    const stream = client.messages.stream({
      model: "ws-reasoner",
      max_tokens: 2_000,
      thinking: { type: "enabled", budget_tokens: 1_024 },
      messages: [{ role: "user", content: "Think about it" }]
    })
    let thinking = ""
    stream.on("thinking", (delta) => (thinking += delta))
    const final = await stream.finalMessage()
    expect(final.content.map((b) => b.type)).toEqual(["thinking", "text"])
    expect((final.content[0] as Anthropic.ThinkingBlock).thinking).toBe(thinking)
    expect(thinking.length).toBeGreaterThan(0)
  })

  it("thinking on a model without reasoning is dropped, not refused", async () => {
    const message = await client.messages.create({
      model: "ws-lite",
      max_tokens: 100,
      thinking: { type: "enabled", budget_tokens: 20_000 },
      messages: [{ role: "user", content: "hi" }]
    })
    expect(message.content.map((b) => b.type)).toEqual(["text"])
  })

  it("messages.stream with tools: a tool_use block with a toolu_ id and its input from input_json deltas", async () => {
    const stream = client.messages.stream({
      model: "ws-pro",
      max_tokens: 500,
      tools: [weatherTool],
      tool_choice: { type: "any" },
      messages: [{ role: "user", content: "Weather in Seoul?" }]
    })
    let json = ""
    stream.on("inputJson", (delta) => (json += delta))
    const final = await stream.finalMessage()
    expect(final.stop_reason).toBe("tool_use")
    const use = final.content.find((b) => b.type === "tool_use") as Anthropic.ToolUseBlock
    expect(use.id).toMatch(TOOLU)
    expect(use.name).toBe("get_weather")
    expect(use.input).toEqual(JSON.parse(json))
    expect(typeof (use.input as any).city).toBe("string")
  })

  it("a multi-turn tool loop on the simulated model: the toolu_ id round-trips and the model reads the result", async () => {
    const messages: Array<Anthropic.MessageParam> = [{ role: "user", content: "What is the weather in Busan?" }]
    const first = await client.messages.create({ model: "ws-pro", max_tokens: 500, tools: [weatherTool], messages })
    expect(first.stop_reason).toBe("tool_use")
    const use = first.content.find((b) => b.type === "tool_use") as Anthropic.ToolUseBlock
    expect(use.id).toMatch(TOOLU)
    messages.push({ role: "assistant", content: first.content })
    messages.push({
      role: "user",
      content: [{ type: "tool_result", tool_use_id: use.id, content: "Sunny and 24 degrees" }]
    })
    const second = await client.messages.create({
      model: "ws-pro",
      max_tokens: 500,
      tools: [weatherTool],
      tool_choice: { type: "none" },
      messages
    })
    expect(second.stop_reason).toBe("end_turn")
    const text = (second.content.find((b) => b.type === "text") as Anthropic.TextBlock).text
    // The simulated model names the tool the result came from: found only through the call id.
    expect(text).toContain("The get_weather tool returned: Sunny and 24 degrees")
  })

  it("a multi-turn tool loop against an OpenAI-compatible upstream: ids map call_ <-> toolu_ both ways", async () => {
    const callId = "call_" + "ab".repeat(16)
    mock.script(
      Behaviour.stream([
        Chunks.role(),
        Chunks.toolStart(0, callId, "get_weather", "{\"city\":"),
        Chunks.toolArgs(0, "\"Seoul\"}"),
        Chunks.finish("tool_calls"),
        Chunks.usage({ prompt: 40, completion: 12, cached: 16 })
      ]),
      Behaviour.stream([
        Chunks.role(),
        Chunks.content("It is sunny."),
        Chunks.finish("stop"),
        Chunks.usage({ prompt: 60, completion: 4 })
      ])
    )
    const before = mock.requests.length
    const messages: Array<Anthropic.MessageParam> = [{ role: "user", content: "Weather in Seoul?" }]
    const first = await client.messages.stream({ model: "ws-mock", max_tokens: 300, tools: [weatherTool], messages })
      .finalMessage()
    const use = first.content.find((b) => b.type === "tool_use") as Anthropic.ToolUseBlock
    expect(use.id).toBe("toolu_" + "ab".repeat(16))
    expect(use.input).toEqual({ city: "Seoul" })
    // Cached tokens pass through: input_tokens excludes them.
    expect(first.usage).toMatchObject({ input_tokens: 24, output_tokens: 12, cache_read_input_tokens: 16 })
    messages.push({ role: "assistant", content: first.content })
    messages.push({ role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: [{ type: "text", text: "sunny" }] }] })
    const second = await client.messages.create({ model: "ws-mock", max_tokens: 300, tools: [weatherTool], messages })
    expect(second.content).toEqual([{ type: "text", text: "It is sunny." }])
    const sent = mock.requests[before + 1]!.body
    expect(sent.messages[1]).toMatchObject({
      role: "assistant",
      tool_calls: [{ id: callId, type: "function", function: { name: "get_weather", arguments: "{\"city\":\"Seoul\"}" } }]
    })
    expect(sent.messages[2]).toEqual({ role: "tool", tool_call_id: callId, content: "sunny" })
    expect(sent.tools[0]).toMatchObject({ type: "function", function: { name: "get_weather", parameters: weatherTool.input_schema } })
  })

  it("system, stop_sequences, temperature and tool_choice reach the upstream in chat form", async () => {
    mock.script(Behaviour.stream([Chunks.role(), Chunks.content("ok"), Chunks.finish("stop")]))
    const before = mock.requests.length
    await client.messages.create({
      model: "ws-mock",
      max_tokens: 100,
      system: [{ type: "text", text: "Be brief." }],
      stop_sequences: ["END"],
      // Typed out of SDK 1.14's params (newer models drop it); the API still takes it.
      ...({ temperature: 0.5 } as object),
      tools: [weatherTool],
      tool_choice: { type: "tool", name: "get_weather", disable_parallel_tool_use: true },
      messages: [{ role: "user", content: [{ type: "text", text: "hi" }, { type: "image", source: { type: "base64", media_type: "image/png", data: "iVBORw0KGgo=" } }] }]
    })
    const sent = mock.requests[before]!.body
    expect(sent.messages[0]).toEqual({ role: "system", content: "Be brief." })
    expect(sent.messages[1]).toEqual({
      role: "user",
      content: [{ type: "text", text: "hi" }, { type: "image_url", image_url: { url: "data:image/png;base64,iVBORw0KGgo=" } }]
    })
    expect(sent.stop).toEqual(["END"])
    expect(sent.temperature).toBe(0.5)
    expect(sent.tool_choice).toEqual({ type: "function", function: { name: "get_weather" } })
    expect(sent.parallel_tool_calls).toBe(false)
    expect(sent.max_tokens).toBe(100)
  })

  it("countTokens: the input counted with the gateway's tokenizer; more text counts more", async () => {
    const small = await client.messages.countTokens({ model: "ws-pro", messages: [{ role: "user", content: "hello" }] })
    const large = await client.messages.countTokens({
      model: "ws-pro",
      system: "You are a helpful assistant.",
      messages: [{ role: "user", content: "hello ".repeat(200) }]
    })
    expect(small.input_tokens).toBeGreaterThan(0)
    expect(large.input_tokens).toBeGreaterThan(small.input_tokens + 150)
  })

  it("SDK error classes: AuthenticationError, BadRequestError, NotFoundError-free model errors, in Anthropic's envelope", async () => {
    const bad = new Anthropic({ baseURL: gw.url, apiKey: "sk-ws-nope", maxRetries: 0 })
    const auth = await bad.messages.create({ model: "ws-pro", max_tokens: 10, messages: [{ role: "user", content: "x" }] })
      .catch((e) => e)
    expect(auth).toBeInstanceOf(Anthropic.AuthenticationError)
    expect(auth.status).toBe(401)
    expect(auth.error).toMatchObject({ type: "error", error: { type: "authentication_error" } })
    expect(auth.error.error.message).toMatch(HANGUL)

    const unknown = await client.messages.create({ model: "claude-nope", max_tokens: 10, messages: [{ role: "user", content: "x" }] })
      .catch((e) => e)
    expect(unknown).toBeInstanceOf(Anthropic.BadRequestError)
    expect(unknown.error.error.type).toBe("invalid_request_error")

    const missing = await client.messages.create({ model: "ws-pro", messages: [{ role: "user", content: "x" }] } as any)
      .catch((e) => e)
    expect(missing).toBeInstanceOf(Anthropic.BadRequestError)
    expect(missing.error.error.message).toContain("max_tokens")

    const serverTool = await client.messages.create({
      model: "ws-pro",
      max_tokens: 10,
      tools: [{ type: "web_search_20250305", name: "web_search" } as any],
      messages: [{ role: "user", content: "x" }]
    }).catch((e) => e)
    expect(serverTool).toBeInstanceOf(Anthropic.BadRequestError)
    expect(serverTool.error.error.message).toContain("web_search_20250305")
  })
})
