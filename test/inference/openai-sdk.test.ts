/**
 * The official `openai` SDK against the running gateway (issue [2/4] §6): non-streaming, streaming,
 * a tool round trip and reasoning, against the simulated upstream served over HTTP and the in-process
 * simulated provider; and the errors the SDK surfaces, with the scripted mock upstream.
 */
import OpenAI from "openai"
import type { ChatCompletionMessageParam, ChatCompletionTool } from "openai/resources/chat/completions"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type SimServer, startSimServer } from "../../src/upstream/simulated/server.js"
import { startGateway, type TestGateway } from "../support/Gateway.js"
import { Behaviour, Chunks, type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"
import { makeUnlimitedAdmission } from "../support/UnlimitedAdmission.js"
import { addMockModel, eventually, HANGUL } from "./helpers.js"

const CALL_ID = /^call_[0-9a-f]{32}$/

const weatherTool: ChatCompletionTool = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Current weather of a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] }
  }
}

describe("openai SDK", () => {
  let gw: TestGateway
  let sim: SimServer
  let mock: MockUpstream
  let client: OpenAI
  const adm = makeUnlimitedAdmission()

  beforeAll(async () => {
    sim = await startSimServer({ port: 0 })
    mock = await startMockUpstream()
    gw = await startGateway({
      admission: adm.layer,
      configure: (doc) => {
        addMockModel(doc, { baseUrl: mock.url, timeouts: { first_token_ms: 2_000, idle_ms: 2_000 } })
        // The simulated upstream as its own HTTP server, behind the openai-compatible adapter.
        addMockModel(doc, { id: "ws-sim-http", provider: "simhttp", baseUrl: `${sim.url}/v1`, model: {} })
        doc.catalog.models.at(-1).route.model = "sim-pro"
      }
    })
    client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: gw.key, maxRetries: 0 })
  })
  afterAll(async () => {
    await gw?.stop()
    await sim?.close()
    await mock?.close()
  })

  describe.each([
    ["simulated upstream over HTTP", "ws-sim-http"],
    ["in-process simulated provider", "ws-pro"]
  ])("%s", (_name, model) => {
    it("non-streaming completion", async () => {
      const { data: completion, response, request_id } = await client.chat.completions
        .create({ model, messages: [{ role: "user", content: "Hello from the SDK" }] })
        .withResponse()
      expect(completion.object).toBe("chat.completion")
      expect(completion.model).toBe(model)
      const choice = completion.choices[0]!
      expect(choice.message.role).toBe("assistant")
      expect(choice.message.content).toMatch(/^Echo: Hello from the SDK\./)
      expect(choice.finish_reason).toBe("stop")
      expect(completion.usage!.total_tokens).toBe(completion.usage!.prompt_tokens + completion.usage!.completion_tokens)
      expect(completion.usage!.completion_tokens).toBeGreaterThan(0)
      expect((completion as unknown as { wellspring: { request_id: string } }).wellspring.request_id).toBe(
        response.headers.get("x-request-id")
      )
      // The SDK reports x-request-id (our request row id) as the request id.
      expect(request_id).toBe(response.headers.get("x-request-id"))
    })

    it("streaming completion", async () => {
      const stream = await client.chat.completions.create({
        model,
        stream: true,
        messages: [{ role: "user", content: "Stream this please" }]
      })
      const chunks: Array<OpenAI.Chat.Completions.ChatCompletionChunk> = []
      for await (const chunk of stream) chunks.push(chunk)
      expect(chunks[0]!.choices[0]!.delta.role).toBe("assistant")
      const text = chunks.map((c) => c.choices[0]?.delta.content ?? "").join("")
      expect(text).toMatch(/^Echo: Stream this please\./)
      const last = chunks.at(-1)!
      expect(last.choices[0]!.finish_reason).toBe("stop")
      expect(last.usage!.completion_tokens).toBeGreaterThan(0)
      expect(chunks.slice(0, -1).every((c) => c.choices[0]!.finish_reason === null)).toBe(true)
    })

    it("tool round trip: tool call -> tool result -> final text", async () => {
      const messages: Array<ChatCompletionMessageParam> = [{ role: "user", content: "What is the weather in Seoul" }]
      const first = await client.chat.completions.create({ model, messages, tools: [weatherTool] })
      const call = first.choices[0]!.message.tool_calls?.[0]
      expect(first.choices[0]!.finish_reason).toBe("tool_calls")
      expect(call?.type).toBe("function")
      if (call?.type !== "function") throw new Error("expected a function tool call")
      expect(call.id).toMatch(CALL_ID)
      expect(call.function.name).toBe("get_weather")
      expect(JSON.parse(call.function.arguments)).toEqual({ city: "Seoul" })

      messages.push(first.choices[0]!.message)
      messages.push({ role: "tool", tool_call_id: call.id, content: "Sunny and 21 degrees" })
      const second = await client.chat.completions.create({ model, messages, tools: [weatherTool] })
      expect(second.choices[0]!.finish_reason).toBe("stop")
      expect(second.choices[0]!.message.content).toMatch(/^The get_weather tool returned: Sunny and 21 degrees\./)
    })

    it("tool round trip, streamed: the call is assembled from incremental deltas", async () => {
      const messages: Array<ChatCompletionMessageParam> = [{ role: "user", content: "Weather for Busan" }]
      const stream = await client.chat.completions.create({ model, messages, tools: [weatherTool], stream: true })
      const calls = new Map<number, { id: string; name: string; args: string }>()
      let finish: string | null = null
      for await (const chunk of stream) {
        const choice = chunk.choices[0]!
        for (const d of choice.delta.tool_calls ?? []) {
          const known = calls.get(d.index)
          if (!known) calls.set(d.index, { id: d.id!, name: d.function!.name!, args: d.function?.arguments ?? "" })
          else known.args += d.function?.arguments ?? ""
        }
        finish = choice.finish_reason ?? finish
      }
      expect(finish).toBe("tool_calls")
      const call = calls.get(0)!
      expect(call.id).toMatch(CALL_ID)
      expect(call.name).toBe("get_weather")
      expect(JSON.parse(call.args)).toEqual({ city: "Busan" })
      messages.push({
        role: "assistant",
        content: null,
        tool_calls: [{ id: call.id, type: "function", function: { name: call.name, arguments: call.args } }]
      })
      messages.push({ role: "tool", tool_call_id: call.id, content: "Rain" })
      const final = await client.chat.completions.create({ model, messages })
      expect(final.choices[0]!.message.content).toMatch(/^The get_weather tool returned: Rain\./)
    })

    it("reasoning: delta.reasoning chunks come before the content", async () => {
      const stream = await client.chat.completions.create({
        model,
        stream: true,
        reasoning_effort: "low",
        messages: [{ role: "user", content: "Think about rivers" }]
      })
      const kinds: Array<"reasoning" | "content"> = []
      let reasoning = ""
      for await (const chunk of stream) {
        const delta = chunk.choices[0]?.delta as { reasoning?: string; content?: string | null } | undefined
        if (delta?.reasoning) {
          kinds.push("reasoning")
          reasoning += delta.reasoning
        }
        if (delta?.content) kinds.push("content")
      }
      expect(reasoning).toMatch(/^Considering the request about Think about rivers\./)
      expect(kinds.indexOf("content")).toBeGreaterThan(kinds.lastIndexOf("reasoning"))
      const completion = await client.chat.completions.create({
        model,
        reasoning_effort: "high",
        messages: [{ role: "user", content: "Think about rivers" }]
      })
      const message = completion.choices[0]!.message as { reasoning?: string; content: string | null }
      expect(message.reasoning).toMatch(/^Considering the request/)
      expect(message.content).toMatch(/^Echo: Think about rivers\./)
    })
  })

  describe("errors the SDK surfaces (scripted mock upstream)", () => {
    const failure = async (promise: Promise<unknown>) => {
      const error = await promise.then(() => null, (e: unknown) => e)
      expect(error).toBeInstanceOf(OpenAI.APIError)
      return error as InstanceType<typeof OpenAI.APIError>
    }

    it("400 gates: BadRequestError with our code and a Korean message", async () => {
      const unknown = await failure(client.chat.completions.create({ model: "no-such-model", messages: [{ role: "user", content: "x" }] }))
      expect(unknown).toBeInstanceOf(OpenAI.BadRequestError)
      expect([unknown.status, unknown.code, unknown.type]).toEqual([400, "model_not_found", "invalid_request_error"])
      expect(unknown.message).toMatch(HANGUL)
      const effort = await failure(client.chat.completions.create({
        model: "ws-lite",
        reasoning_effort: "high",
        messages: [{ role: "user", content: "x" }]
      }))
      expect([effort.status, effort.code]).toEqual([400, "invalid_reasoning_effort"])
    })

    it("401 for a bad key: AuthenticationError invalid_api_key", async () => {
      const bad = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: "sk-ws-not-a-real-key", maxRetries: 0 })
      const error = await failure(bad.chat.completions.create({ model: "ws-lite", messages: [{ role: "user", content: "x" }] }))
      expect(error).toBeInstanceOf(OpenAI.AuthenticationError)
      expect(error.code).toBe("invalid_api_key")
    })

    it.each([
      ["upstream 500", 500, "upstream_error", () => Behaviour.status(500, { error: { message: "boom" } })],
      ["upstream 429", 503, "upstream_rate_limited", () => Behaviour.rateLimited()],
      ["upstream connection dropped", 503, "service_unavailable", () => Behaviour.dropBeforeHeaders()]
    ])("%s -> APIError %i %s (streaming request)", async (_name, status, code, behaviour) => {
      mock.script(behaviour())
      const error = await failure(client.chat.completions.create({ model: "ws-mock", stream: true, messages: [{ role: "user", content: "x" }] }))
      expect(error).toBeInstanceOf(OpenAI.InternalServerError)
      expect([error.status, error.code]).toEqual([status, code])
    })

    it("a mid-stream failure makes the SDK's iteration throw instead of ending quietly", async () => {
      mock.script(Behaviour.dropAfter([Chunks.role(), Chunks.content("partial "), Chunks.content("answer")]))
      const stream = await client.chat.completions.create({ model: "ws-mock", stream: true, messages: [{ role: "user", content: "x" }] })
      let text = ""
      const error = await (async () => {
        for await (const chunk of stream) text += chunk.choices[0]?.delta.content ?? ""
      })().then(() => null, (e: unknown) => e)
      expect(text).toBe("partial answer")
      expect(error).toBeInstanceOf(Error)
    })

    it("aborting a stream from the SDK cancels the upstream request and frees the slot", async () => {
      mock.script(Behaviour.hangAfter([Chunks.role(), Chunks.content("slow ")]))
      const aborts = mock.clientAborts()
      const stream = await client.chat.completions.create({ model: "ws-mock", stream: true, messages: [{ role: "user", content: "x" }] })
      for await (const chunk of stream) {
        if (chunk.choices[0]?.delta.content) break // leaving the loop aborts the request
      }
      await mock.waitForClientAborts(aborts + 1)
      await eventually(() => expect(adm.stats.open).toBe(0))
    })
  })
})
