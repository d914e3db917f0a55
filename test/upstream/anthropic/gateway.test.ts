/**
 * End to end: the whole gateway (real PostgreSQL) with a catalog model routed to an `anthropic` provider whose
 * base_url is the fake Anthropic server on 127.0.0.1, driven by the official `openai` SDK (and plain fetch where the
 * SDK hides the wire: `[DONE]`, a cut transfer). The provider's key comes from its `api_key_env`.
 */
import OpenAI from "openai"
import type { ChatCompletionChunk, ChatCompletionTool } from "openai/resources/chat/completions"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type FreshDatabase, freshDatabase } from "../../support/Db.js"
import {
  FakeBehaviour,
  type FakeAnthropic,
  FakeEvents as E,
  FakeMessages,
  startFakeAnthropic
} from "../../support/FakeAnthropic.js"
import { startGateway, type TestGateway } from "../../support/Gateway.js"
import { serviceGate } from "../../support/Services.js"
import { makeUnlimitedAdmission } from "../../support/UnlimitedAdmission.js"
import {
  eventually,
  latestRows,
  parseSse,
  postChat,
  readBody,
  type RequestRowView,
  rowById,
  rowIdOf
} from "../../inference/helpers.js"

const postgres = await serviceGate("postgres")

const KEY = "sk-ant-api03-gateway-e2e-Zq8xW3vN5tR7yU9iO1pA2sD4fG6hJ8kL"
const KEY_ENV = "WELLSPRING_UPSTREAM_E2E_ANTHROPIC"
const MODEL = "ws-claude"
const UPSTREAM_MODEL = "claude-fake-4"
const CALL_ID = /^call_[0-9a-f]{32}$/

const weatherTool: ChatCompletionTool = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather of a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] }
  }
}

const rowIdOfRequest = (requestId: string | null | undefined): number => {
  expect(requestId, "x-request-id").toMatch(/^\d+$/)
  return Number(requestId)
}

describe.skipIf(!postgres)("an anthropic provider behind the gateway (openai SDK)", () => {
  let fake: FakeAnthropic
  let db: FreshDatabase
  let gw: TestGateway
  let client: OpenAI
  /** Every raw response text the tests read, checked for the upstream key at the end. */
  const seen: Array<string> = []
  const adm = makeUnlimitedAdmission()

  beforeAll(async () => {
    process.env[KEY_ENV] = KEY
    fake = await startFakeAnthropic({ apiKey: KEY })
    db = await freshDatabase("anthropic_e2e")
    gw = await startGateway({
      admission: adm.layer,
      databaseUrl: db.url,
      configure: (doc) => {
        doc.catalog.providers.claude = {
          kind: "anthropic",
          base_url: fake.url,
          api_key_env: KEY_ENV,
          timeouts: { connect_ms: 2_000, first_token_ms: 5_000, idle_ms: 5_000, total_ms: 20_000 }
        }
        doc.catalog.models.push({
          id: MODEL,
          owned_by: "anthropic",
          supports_tools: true,
          supports_reasoning: true,
          reasoning_efforts: ["low", "high"],
          max_input_tokens: 100_000,
          max_output_tokens: 4_096,
          rate_limit_rpm: 100_000,
          concurrency: 1_000,
          route: { provider: "claude", model: UPSTREAM_MODEL }
        })
      }
    })
    client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: gw.key, maxRetries: 0 })
  })
  afterAll(async () => {
    await gw?.stop()
    await db?.drop()
    await fake?.close()
    delete process.env[KEY_ENV]
  })

  const lastRequest = () => fake.requests.at(-1)!

  it("non-streaming chat: content, finish_reason and usage from the Anthropic answer", async () => {
    fake.script(FakeBehaviour.message(FakeMessages.text("안녕하세요, Claude입니다.", { input_tokens: 21, output_tokens: 9 })))
    const { data, response } = await client.chat.completions
      .create({
        model: MODEL,
        messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Hello" }],
        temperature: 0.3
      })
      .withResponse()
    seen.push(JSON.stringify(data))
    expect(data.model).toBe(MODEL)
    expect(data.choices[0]!.message.content).toBe("안녕하세요, Claude입니다.")
    expect(data.choices[0]!.finish_reason).toBe("stop")
    expect(data.usage).toMatchObject({ prompt_tokens: 21, completion_tokens: 9, total_tokens: 30 })
    // What Anthropic received: the routed model, the lifted system prompt, the configured key.
    expect(lastRequest()).toMatchObject({
      path: "/v1/messages",
      headers: { "x-api-key": KEY, "anthropic-version": "2023-06-01" },
      body: {
        model: UPSTREAM_MODEL,
        system: "Be brief.",
        messages: [{ role: "user", content: [{ type: "text", text: "Hello" }] }],
        max_tokens: 4_096,
        temperature: 0.3,
        stream: false
      }
    })
    const row = await rowById(gw, rowIdOfRequest(response.headers.get("x-request-id")))
    expect(row).toMatchObject({
      model_id: MODEL,
      status: "success",
      provider: "claude",
      input_tokens: 21,
      output_tokens: 9,
      stream: false
    })
  })

  it("streaming with thinking: reasoning deltas before content, a final usage frame, then [DONE]", async () => {
    const message = FakeMessages.thinkingThenText(
      "The user greets me; answer warmly.",
      "Hello there, friend!",
      { input_tokens: 14, output_tokens: 40 }
    )
    fake.script(FakeBehaviour.message(message, 4))
    const stream = await client.chat.completions.create({
      model: MODEL,
      stream: true,
      reasoning_effort: "low",
      messages: [{ role: "user", content: "Hi" }]
    })
    const chunks: Array<ChatCompletionChunk> = []
    for await (const chunk of stream) chunks.push(chunk)
    seen.push(JSON.stringify(chunks))
    expect(lastRequest().body).toMatchObject({ stream: true, thinking: { type: "enabled", budget_tokens: 1024 } })
    const kinds: Array<string> = []
    let reasoning = ""
    let content = ""
    for (const chunk of chunks) {
      const delta = chunk.choices[0]?.delta as { reasoning?: string; content?: string | null } | undefined
      if (delta?.reasoning) {
        kinds.push("reasoning")
        reasoning += delta.reasoning
      }
      if (delta?.content) {
        kinds.push("content")
        content += delta.content
      }
    }
    expect(reasoning).toBe("The user greets me; answer warmly.")
    expect(content).toBe("Hello there, friend!")
    // Several deltas of each kind (4-character pieces upstream), every reasoning one before the first content one.
    expect(kinds.filter((k) => k === "reasoning").length).toBeGreaterThan(1)
    expect(kinds.indexOf("content")).toBe(kinds.lastIndexOf("reasoning") + 1)
    const last = chunks.at(-1)!
    expect(last.choices[0]!.finish_reason).toBe("stop")
    expect(last.usage).toMatchObject({ prompt_tokens: 14, completion_tokens: 40, total_tokens: 54 })
    expect(chunks.slice(0, -1).every((c) => c.choices[0]?.finish_reason == null)).toBe(true)

    // The same answer on the wire: [DONE] closes it.
    fake.script(FakeBehaviour.message(message, 4))
    const res = await postChat(gw, { model: MODEL, stream: true, reasoning_effort: "low", messages: [{ role: "user", content: "Hi" }] })
    const text = await res.text()
    seen.push(text)
    const sse = parseSse(text)
    expect(sse.doneLast).toBe(true)
    expect(sse.chunks.at(-1).usage).toMatchObject({ prompt_tokens: 14, completion_tokens: 40 })
    // The row's thinking tokens are estimated from the thinking text (Anthropic reports none): ceil(34 / 4).
    expect(await rowById(gw, rowIdOf(res))).toMatchObject({
      status: "success",
      stream: true,
      input_tokens: 14,
      output_tokens: 40,
      reasoning_tokens: 9
    })
  })

  it("tools with tool_choice: streamed tool-call deltas, then the tool result goes back as a tool_result", async () => {
    const toolUseId = "toolu_01A09q90qw90lq917835lq9"
    fake.script(FakeBehaviour.message(FakeMessages.toolUse([{ id: toolUseId, name: "get_weather", input: { city: "Seoul" } }]), 3))
    const stream = await client.chat.completions.create({
      model: MODEL,
      stream: true,
      reasoning_effort: "low",
      messages: [{ role: "user", content: "Weather in Seoul?" }],
      tools: [weatherTool],
      tool_choice: { type: "function", function: { name: "get_weather" } }
    })
    const calls = new Map<number, { id: string; name: string; args: string; deltas: number }>()
    let finish: string | null = null
    for await (const chunk of stream) {
      seen.push(JSON.stringify(chunk))
      const choice = chunk.choices[0]
      if (choice === undefined) continue
      for (const d of choice.delta.tool_calls ?? []) {
        const known = calls.get(d.index)
        if (!known) calls.set(d.index, { id: d.id!, name: d.function!.name!, args: d.function?.arguments ?? "", deltas: 1 })
        else {
          known.args += d.function?.arguments ?? ""
          known.deltas++
        }
      }
      finish = choice.finish_reason ?? finish
    }
    // The forced tool reached Anthropic as {type: "tool"}; thinking is off (Anthropic refuses it with a forced tool).
    const sent = lastRequest().body
    expect(sent.tool_choice).toEqual({ type: "tool", name: "get_weather" })
    expect(sent.tools).toEqual([{
      name: "get_weather",
      description: "Current weather of a city",
      input_schema: weatherTool.function.parameters
    }])
    expect(sent.thinking).toBeUndefined()
    expect(finish).toBe("tool_calls")
    expect(calls.size).toBe(1)
    const call = calls.get(0)!
    expect(call.id).toMatch(CALL_ID)
    expect(call.id).not.toContain(toolUseId)
    expect(call.name).toBe("get_weather")
    expect(JSON.parse(call.args)).toEqual({ city: "Seoul" })
    expect(call.deltas).toBeGreaterThan(2)

    fake.script(FakeBehaviour.message(FakeMessages.text("It is sunny in Seoul.")))
    const final = await client.chat.completions.create({
      model: MODEL,
      tools: [weatherTool],
      tool_choice: "required",
      messages: [
        { role: "user", content: "Weather in Seoul?" },
        {
          role: "assistant",
          content: null,
          tool_calls: [{ id: call.id, type: "function", function: { name: call.name, arguments: call.args } }]
        },
        { role: "tool", tool_call_id: call.id, content: "Sunny, 21 degrees" }
      ]
    })
    expect(final.choices[0]!.message.content).toBe("It is sunny in Seoul.")
    expect(lastRequest().body).toMatchObject({
      tool_choice: { type: "any" },
      messages: [
        { role: "user", content: [{ type: "text", text: "Weather in Seoul?" }] },
        { role: "assistant", content: [{ type: "tool_use", id: call.id, name: "get_weather", input: { city: "Seoul" } }] },
        { role: "user", content: [{ type: "tool_result", tool_use_id: call.id, content: "Sunny, 21 degrees" }] }
      ]
    })
  })

  it("an upstream 401 is the gateway's 500 upstream_error (not retryable), and the key stays out of it", async () => {
    // An upstream that echoes the credential in its message: the redaction, not luck, keeps it out.
    fake.script(FakeBehaviour.error(401, "authentication_error", `invalid x-api-key ${KEY}`))
    const error = await client.chat.completions
      .create({ model: MODEL, stream: true, messages: [{ role: "user", content: "x" }] })
      .then(() => null, (e: unknown) => e)
    expect(error).toBeInstanceOf(OpenAI.InternalServerError)
    const apiError = error as InstanceType<typeof OpenAI.APIError>
    expect([apiError.status, apiError.code]).toEqual([500, "upstream_error"])
    expect(apiError.headers?.get("x-should-retry")).toBe("false")
    seen.push(JSON.stringify(apiError.error), apiError.message)
    const row = await rowById(gw, rowIdOfRequest(apiError.requestID))
    expect(row).toMatchObject({ status: "error", error_code: "upstream_error", http_status: 500, provider: "claude" })
  })

  it("an upstream 429 and 529 (overloaded) are 503 upstream_rate_limited", async () => {
    for (const [status, type] of [[429, "rate_limit_error"], [529, "overloaded_error"]] as const) {
      fake.script(FakeBehaviour.error(status, type, "slow down"))
      const res = await postChat(gw, { model: MODEL, messages: [{ role: "user", content: "x" }] })
      const text = await res.text()
      seen.push(text)
      expect([res.status, JSON.parse(text).error.code], type).toEqual([503, "upstream_rate_limited"])
    }
  })

  it("an error event mid-stream cuts the stream without [DONE]; the row has the mapped code", async () => {
    const cut = async (errorType: string) => {
      fake.script(FakeBehaviour.events([
        E.messageStart(),
        E.blockStart(0, { type: "text", text: "" }),
        E.textDelta(0, "partial "),
        E.textDelta(0, "answer"),
        E.error(errorType, `something failed for ${KEY}`)
      ]))
      const res = await postChat(gw, { model: MODEL, stream: true, messages: [{ role: "user", content: "x" }] })
      expect(res.status).toBe(200)
      const rowId = rowIdOf(res)
      const { text, error } = await readBody(res)
      seen.push(text)
      const sse = parseSse(text)
      expect(sse.chunks.map((c) => c.choices[0]?.delta.content ?? "").join("")).toBe("partial answer")
      expect(sse.done).toBe(false)
      expect(sse.chunks.every((c) => c.choices[0]?.finish_reason == null)).toBe(true)
      // The transfer itself fails, so a client cannot take it for a complete answer.
      expect(error).toBeInstanceOf(Error)
      return rowById(gw, rowId)
    }
    expect(await cut("api_error")).toMatchObject({ status: "error", error_code: "upstream_error", stream: true })
    expect(await cut("overloaded_error")).toMatchObject({ status: "error", error_code: "upstream_rate_limited" })

    // Through the SDK: the iteration throws instead of ending quietly.
    fake.script(FakeBehaviour.events([
      E.messageStart(),
      E.blockStart(0, { type: "text", text: "" }),
      E.textDelta(0, "partial"),
      E.error("api_error", "Internal server error")
    ]))
    const stream = await client.chat.completions.create({ model: MODEL, stream: true, messages: [{ role: "user", content: "x" }] })
    let text = ""
    const failure = await (async () => {
      for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? ""
    })().then(() => null, (e: unknown) => e)
    expect(text).toBe("partial")
    expect(failure).toBeInstanceOf(Error)
  })

  it("the configured key is what Anthropic received, and it never reaches a response or a request row", async () => {
    expect(fake.requests.length).toBeGreaterThan(8)
    for (const request of fake.requests) {
      expect(request.headers["x-api-key"]).toBe(KEY)
      // The client's gateway key is not forwarded either.
      expect(request.headers.authorization).toBeUndefined()
      expect(JSON.stringify(request.headers)).not.toContain(gw.key)
    }
    expect(seen.length).toBeGreaterThan(8)
    for (const text of seen) expect(text).not.toContain(KEY)
    let rows: Array<RequestRowView> = []
    await eventually(async () => {
      rows = await latestRows(gw, 1_000)
      expect(rows.length).toBeGreaterThan(8)
    })
    expect(rows.filter((r) => r.status === "error").length).toBeGreaterThan(3)
    for (const row of rows) expect(JSON.stringify(row)).not.toContain(KEY)
    // Nor the key's distinctive tail on its own (a cut or partly redacted copy).
    for (const row of rows) expect(JSON.stringify(row)).not.toContain(KEY.slice(-16))
  })
})
