/**
 * Request schema and gates over HTTP (spec: Chat completion request, Errors for chat; ARCHITECTURE §5):
 * every rejection has its status, code, type, a Korean message, the correlation id, and leaves one
 * request row with that code; nothing rejected reaches the upstream; `max_tokens` is clamped and
 * unlisted fields are never forwarded.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { startGateway, type TestGateway } from "../support/Gateway.js"
import { Behaviour, Chunks, type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"
import { makeUnlimitedAdmission } from "../support/UnlimitedAdmission.js"
import { addMockModel, expectError, postChat, rowById, rowIdOf, user } from "./helpers.js"

const hi = [user("hello")]
const tool = (name: string) => ({ type: "function", function: { name, parameters: { type: "object" } } })

describe("chat request gates", () => {
  let gw: TestGateway
  let mock: MockUpstream
  const adm = makeUnlimitedAdmission()

  beforeAll(async () => {
    mock = await startMockUpstream()
    gw = await startGateway({
      admission: adm.layer,
      configure: (doc) => {
        addMockModel(doc, { baseUrl: mock.url })
        addMockModel(doc, { id: "ws-mock-small", baseUrl: mock.url, model: { max_input_tokens: 64 } })
      }
    })
  })
  afterAll(async () => {
    await gw?.stop()
    await mock?.close()
  })

  /** Sends `body`, asserts the envelope and the row, and that the upstream saw nothing. */
  const rejects = async (body: unknown, status: number, code: string) => {
    const before = mock.requests.length
    const res = await postChat(gw, body)
    const envelope = await expectError(res, status, code)
    const row = await rowById(gw, rowIdOf(res))
    expect(row).toMatchObject({ status: "error", error_code: code, http_status: status })
    expect(row.request_id).toBe(res.headers.get("x-wellspring-request-id"))
    expect(mock.requests.length).toBe(before)
    expect(adm.stats.open).toBe(0)
    return envelope
  }

  it("invalid_json: a body that is not JSON", async () => {
    await rejects("{\"model\": \"ws-mock\", \"messages\": [", 400, "invalid_json")
    await rejects("", 400, "invalid_json")
  })

  it.each([
    ["bad role", { model: "ws-mock", messages: [{ role: "robot", content: "hi" }] }],
    ["missing content", { model: "ws-mock", messages: [{ role: "user" }] }],
    ["null user content", { model: "ws-mock", messages: [{ role: "user", content: null }] }],
    ["tool message without tool_call_id", { model: "ws-mock", messages: [user("hi"), { role: "tool", content: "42" }] }],
    ["empty messages", { model: "ws-mock", messages: [] }],
    ["messages missing", { model: "ws-mock" }],
    ["bad content part", { model: "ws-mock", messages: [{ role: "user", content: [{ type: "audio", data: "x" }] }] }],
    ["image url not https", {
      model: "ws-mock",
      messages: [{ role: "user", content: [{ type: "image_url", image_url: { url: "http://example.com/a.png" } }] }]
    }]
  ])("invalid_messages: %s", async (_name, body) => {
    await rejects(body, 400, "invalid_messages")
  })

  it("invalid_request: a tool name outside ^[a-zA-Z0-9_-]{1,64}$", async () => {
    await rejects({ model: "ws-mock", messages: hi, tools: [tool("get weather")] }, 400, "invalid_request")
    await rejects({ model: "ws-mock", messages: hi, tools: [tool("x".repeat(65))] }, 400, "invalid_request")
  })

  it("invalid_request: more than 128 tools (128 pass)", async () => {
    const many = (n: number) => Array.from({ length: n }, (_, i) => tool(`t${i}`))
    const body = await rejects({ model: "ws-mock", messages: hi, tools: many(129) }, 400, "invalid_request")
    expect(body.error.message).toContain("128")
    mock.script(Behaviour.json(Chunks.completion({ content: "ok", usage: { prompt: 1, completion: 1 } })))
    const ok = await postChat(gw, { model: "ws-mock", messages: hi, tools: many(128) })
    expect(ok.status).toBe(200)
    await ok.text()
    expect(mock.requests.at(-1)!.body.tools).toHaveLength(128)
  })

  it.each([
    ["unknown string", "always"],
    ["object without function", { type: "function" }],
    ["wrong type", 7]
  ])("invalid_request: bad tool_choice (%s)", async (_name, choice) => {
    await rejects({ model: "ws-mock", messages: hi, tools: [tool("a")], tool_choice: choice }, 400, "invalid_request")
  })

  it.each([
    ["unknown id", "no-such-model"],
    ["disabled model", "ws-legacy"],
    ["malformed BYOK reference", "@openai"]
  ])("model_not_found: %s", async (_name, model) => {
    await rejects({ model, messages: hi }, 400, "model_not_found")
  })

  it.each([
    ["BYOK reference", "@openai/gpt-4o"],
    ["BYOK reference with label", "@openai:work/gpt-4o"]
  ])("byok_credential_missing: %s without a saved credential", async (_name, model) => {
    await rejects({ model, messages: hi }, 400, "byok_credential_missing")
  })

  it("model_not_chat: an embedding model", async () => {
    await rejects({ model: "ws-embed", messages: hi }, 400, "model_not_chat")
  })

  it("tools_not_supported: tools on a model without supports_tools (an empty list is fine)", async () => {
    await rejects({ model: "ws-lite", messages: hi, tools: [tool("a")] }, 400, "tools_not_supported")
    const ok = await postChat(gw, { model: "ws-lite", messages: hi, tools: [] })
    expect(ok.status).toBe(200)
    await ok.text()
  })

  it("invalid_reasoning_effort: the message lists the model's allowed values", async () => {
    const pro = await rejects({ model: "ws-pro", messages: hi, reasoning_effort: "max" }, 400, "invalid_reasoning_effort")
    expect(pro.error.message).toContain("none, low, high")
    const reasoner = await rejects(
      { model: "ws-reasoner", messages: hi, reasoning_effort: "none" },
      400,
      "invalid_reasoning_effort"
    )
    expect(reasoner.error.message).toContain("low, high, max")
    await rejects({ model: "ws-pro", messages: hi, reasoning_effort: "extreme" }, 400, "invalid_reasoning_effort")
  })

  it("invalid_reasoning_effort: any value on a model without supports_reasoning", async () => {
    const lite = await rejects({ model: "ws-lite", messages: hi, reasoning_effort: "low" }, 400, "invalid_reasoning_effort")
    expect(lite.error.message).toContain("없음")
  })

  it("images_not_supported: an image part on a model without supports_images", async () => {
    const image = {
      role: "user",
      content: [{ type: "text", text: "what is this" }, { type: "image_url", image_url: { url: "https://example.com/a.png" } }]
    }
    await rejects({ model: "ws-lite", messages: [image] }, 400, "images_not_supported")
    await rejects({ model: "ws-reasoner", messages: [image] }, 400, "images_not_supported")
    mock.script(Behaviour.json(Chunks.completion({ content: "a cat", usage: { prompt: 800, completion: 2 } })))
    const ok = await postChat(gw, { model: "ws-mock", messages: [image] })
    expect(ok.status).toBe(200)
    await ok.text()
  })

  it("input_too_long: the estimate is checked against the live max_input_tokens", async () => {
    const long = Array.from({ length: 200 }, (_, i) => `word${i}`).join(" ")
    const body = await rejects({ model: "ws-mock-small", messages: [user(long)] }, 400, "input_too_long")
    expect(body.error.message).toContain("64")
    // Just under the limit passes.
    mock.script(Behaviour.json(Chunks.completion({ content: "ok", usage: { prompt: 10, completion: 1 } })))
    const ok = await postChat(gw, { model: "ws-mock-small", messages: [user("a short question")] })
    expect(ok.status).toBe(200)
    await ok.text()
  })

  describe("what reaches the upstream", () => {
    const lastBody = () => mock.requests.at(-1)!.body

    it("max_tokens is clamped to max_output_tokens, and defaults to it", async () => {
      mock.script(Behaviour.json(Chunks.completion({ content: "ok", usage: { prompt: 1, completion: 1 } })))
      for (const [asked, forwarded] of [[100_000, 512], [100, 100], [undefined, 512]] as const) {
        const res = await postChat(gw, { model: "ws-mock", messages: hi, ...(asked ? { max_tokens: asked } : {}) })
        expect(res.status).toBe(200)
        await res.text()
        expect(lastBody().max_tokens).toBe(forwarded)
      }
      await rejects({ model: "ws-mock", messages: hi, max_tokens: 0 }, 400, "invalid_request")
      await rejects({ model: "ws-mock", messages: hi, max_tokens: 1.5 }, 400, "invalid_request")
    })

    const unlisted = {
      // n other than 1 is refused (issue 20 point 6); 1 is accepted and not forwarded.
      n: 1,
      seed: 42,
      response_format: { type: "json_object" },
      stream_options: { include_usage: false, extra: 1 },
      logprobs: true,
      top_logprobs: 5,
      presence_penalty: 1,
      frequency_penalty: 1,
      user: "someone",
      metadata: { a: "b" },
      store: true,
      something_new: "x"
    }
    const contract = {
      temperature: 0.5,
      top_p: 0.9,
      stop: ["\n\n"],
      reasoning_effort: "low",
      tools: [{ type: "function", function: { name: "lookup", description: "d", parameters: { type: "object" }, strict: true, extra: 1 } }],
      tool_choice: "auto",
      parallel_tool_calls: false
    }
    const allowed = [
      "model",
      "messages",
      "stream",
      "max_tokens",
      "temperature",
      "top_p",
      "stop",
      "reasoning_effort",
      "tools",
      "tool_choice",
      "parallel_tool_calls"
    ]

    it("non-streaming: unlisted fields are dropped, contract fields forwarded", async () => {
      mock.script(Behaviour.json(Chunks.completion({ content: "ok", usage: { prompt: 1, completion: 1 } })))
      const res = await postChat(gw, {
        model: "ws-mock",
        messages: [{ role: "system", content: "be brief", name: "sys" }, { role: "user", content: "hi", name: "me" }],
        ...unlisted,
        ...contract
      })
      expect(res.status).toBe(200)
      await res.text()
      const body = lastBody()
      expect(Object.keys(body).sort()).toEqual([...allowed].sort())
      expect(body).toMatchObject({ model: "mock-model", stream: false, ...contract, tools: [{ type: "function", function: { name: "lookup", description: "d", parameters: { type: "object" }, strict: true } }] })
      expect(body.tools[0].function).not.toHaveProperty("extra")
      expect(body.messages).toEqual([{ role: "system", content: "be brief" }, { role: "user", content: "hi" }])
    })

    it("streaming: the client's stream_options never pass; the gateway asks for usage itself", async () => {
      mock.script(Behaviour.stream([Chunks.role(), Chunks.content("ok"), Chunks.finish("stop"), Chunks.usage({ prompt: 1, completion: 1 })]))
      const res = await postChat(gw, { model: "ws-mock", messages: hi, stream: true, ...unlisted })
      expect(res.status).toBe(200)
      await res.text()
      const body = lastBody()
      expect(Object.keys(body).sort()).toEqual(["max_tokens", "messages", "model", "stream", "stream_options"])
      expect(body.stream_options).toEqual({ include_usage: true })
    })
  })

  it("no admission slot leaks after all of the above", () => {
    expect(adm.stats.open).toBe(0)
  })
})
