/**
 * The official `openai` SDK (major 7) against a running gateway, on the Responses API: `responses.create`,
 * `responses.stream`, a function-call round trip, `previous_response_id`, `responses.retrieve` / `delete`,
 * another account's id (404), built-in tools (400), reasoning; against the in-process simulated provider and
 * the simulated upstream served over HTTP (openai-compatible adapter).
 */
import OpenAI from "openai"
import type { FunctionTool, ResponseInputItem } from "openai/resources/responses/responses"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type SimServer, startSimServer } from "../../src/upstream/simulated/server.js"
import { newAccount, newKey } from "../accounts/support.js"
import { addMockModel, HANGUL } from "../inference/helpers.js"
import { startGateway, type TestGateway } from "../support/Gateway.js"

const CALL_ID = /^call_[0-9a-f]{32}$/
const RESP_ID = /^resp_[0-9a-f]{48}$/

const weatherTool: FunctionTool = {
  type: "function",
  name: "get_weather",
  description: "Current weather of a city",
  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  strict: false
}

describe("openai SDK 7: Responses API", () => {
  let gw: TestGateway
  let sim: SimServer
  let client: OpenAI

  beforeAll(async () => {
    sim = await startSimServer({ port: 0 })
    gw = await startGateway({
      configure: (doc) => {
        addMockModel(doc, { id: "ws-sim-http", provider: "simhttp", baseUrl: `${sim.url}/v1`, model: {} })
        doc.catalog.models.at(-1).route.model = "sim-pro"
      }
    })
    client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: gw.key, maxRetries: 0 })
  })
  afterAll(async () => {
    await gw?.stop()
    await sim?.close()
  })

  describe.each([
    ["in-process simulated provider", "ws-pro"],
    ["simulated upstream over HTTP", "ws-sim-http"]
  ])("%s", (_name, model) => {
    it("responses.create: a message with output_text, usage, receipt and quota headers", async () => {
      const { data, response } = await client.responses.create({ model, input: "Hello from the Responses SDK" })
        .withResponse()
      expect(data.id).toMatch(RESP_ID)
      expect(data.object).toBe("response")
      expect(data.status).toBe("completed")
      expect(data.model).toBe(model)
      expect(data.output).toHaveLength(1)
      const message = data.output[0]!
      expect(message.type).toBe("message")
      if (message.type !== "message") throw new Error("expected a message")
      expect(message.id).toMatch(/^msg_[0-9a-f]{48}$/)
      expect(message.role).toBe("assistant")
      expect(data.output_text).toMatch(/^Echo: Hello from the Responses SDK\./)
      const usage = data.usage!
      expect(usage.output_tokens).toBeGreaterThan(0)
      expect(usage.total_tokens).toBe(usage.input_tokens + usage.output_tokens)
      expect(usage.input_tokens_details.cached_tokens).toBe(0)
      expect(usage.output_tokens_details.reasoning_tokens).toBe(0)
      const receipt = (data as unknown as { wellspring: { request_id: string } }).wellspring
      expect(receipt.request_id).toBe(response.headers.get("x-request-id"))
      for (const h of ["x-session-used-pct", "x-session-remaining-pct", "x-weekly-used-pct", "x-weekly-remaining-pct"]) {
        expect(response.headers.get(h), h).not.toBeNull()
      }
    })

    it("responses.stream: deltas assemble the final response; the completed event carries usage", async () => {
      const stream = client.responses.stream({ model, input: "Stream this through responses", instructions: "Be brief." })
      const types: Array<string> = []
      let text = ""
      for await (const event of stream) {
        types.push(event.type)
        if (event.type === "response.output_text.delta") text += event.delta
      }
      const final = await stream.finalResponse()
      expect(types[0]).toBe("response.created")
      expect(types[1]).toBe("response.in_progress")
      expect(types.at(-1)).toBe("response.completed")
      expect(types).toContain("response.output_item.added")
      expect(types).toContain("response.content_part.added")
      expect(types).toContain("response.output_text.done")
      expect(types).toContain("response.output_item.done")
      expect(text).toMatch(/^Echo: Stream this through responses\./)
      expect(final.output_text).toBe(text)
      expect(final.status).toBe("completed")
      expect(final.instructions).toBe("Be brief.")
      expect(final.usage!.output_tokens).toBeGreaterThan(0)
    })

    it("function-call round trip: function_call item (call_id kept) -> function_call_output -> text", async () => {
      const input: Array<ResponseInputItem> = [{ role: "user", content: "What is the weather in Seoul" }]
      const first = await client.responses.create({ model, input, tools: [weatherTool] })
      const call = first.output.find((item) => item.type === "function_call")
      if (call?.type !== "function_call") throw new Error("expected a function_call item")
      expect(call.call_id).toMatch(CALL_ID)
      expect(call.id).toMatch(/^fc_[0-9a-f]{48}$/)
      expect(call.name).toBe("get_weather")
      expect(JSON.parse(call.arguments)).toEqual({ city: "Seoul" })
      expect(first.tools[0]).toMatchObject({ type: "function", name: "get_weather" })

      input.push(...first.output as Array<ResponseInputItem>)
      input.push({ type: "function_call_output", call_id: call.call_id, output: "Sunny and 21 degrees" })
      const second = await client.responses.create({ model, input, tools: [weatherTool], store: false })
      expect(second.output_text).toMatch(/^The get_weather tool returned: Sunny and 21 degrees\./)
      // `store` is on the wire (as OpenAI answers it), not in the SDK's type.
      expect((second as unknown as { store: boolean }).store).toBe(false)
    })

    it("function-call round trip, streamed: argument deltas and the done event agree", async () => {
      const stream = client.responses.stream({ model, input: "Weather for Busan", tools: [weatherTool] })
      let args = ""
      let done: string | null = null
      for await (const event of stream) {
        if (event.type === "response.function_call_arguments.delta") args += event.delta
        if (event.type === "response.function_call_arguments.done") done = event.arguments
      }
      const final = await stream.finalResponse()
      const call = final.output.find((item) => item.type === "function_call")
      if (call?.type !== "function_call") throw new Error("expected a function_call item")
      expect(done).toBe(args)
      expect(call.arguments).toBe(args)
      expect(JSON.parse(args)).toEqual({ city: "Busan" })
      // The stored call continues by id alone.
      const next = await client.responses.create({
        model,
        previous_response_id: final.id,
        input: [{ type: "function_call_output", call_id: call.call_id, output: "Rain" }]
      })
      expect(next.output_text).toMatch(/^The get_weather tool returned: Rain\./)
      expect(next.previous_response_id).toBe(final.id)
    })
  })

  it("reasoning is its own output item, before the message, with its tokens counted", async () => {
    const created = await client.responses.create({
      model: "ws-pro",
      input: "Think about rivers",
      reasoning: { effort: "medium" }
    })
    expect(created.output.map((item) => item.type)).toEqual(["reasoning", "message"])
    const reasoning = created.output[0]!
    if (reasoning.type !== "reasoning") throw new Error("expected a reasoning item")
    expect(reasoning.id).toMatch(/^rs_/)
    expect(reasoning.content?.[0]?.text).toMatch(/^Considering the request about Think about rivers\./)
    expect(created.usage!.output_tokens_details.reasoning_tokens).toBeGreaterThan(0)
    expect(created.reasoning?.effort).toBe("medium")

    const stream = client.responses.stream({ model: "ws-pro", input: "Think about lakes", reasoning: { effort: "low" } })
    const order: Array<string> = []
    for await (const event of stream) {
      if (event.type === "response.reasoning_text.delta") order.push("reasoning")
      if (event.type === "response.output_text.delta") order.push("text")
    }
    expect(order[0]).toBe("reasoning")
    expect(order.indexOf("text")).toBeGreaterThan(order.lastIndexOf("reasoning"))
    const final = await stream.finalResponse()
    expect(final.output.map((item) => item.type)).toEqual(["reasoning", "message"])
  })

  it("previous_response_id and responses.retrieve; another account gets 404; delete", async () => {
    const first = await client.responses.create({ model: "ws-pro", input: "Remember the word lantern" })
    const retrieved = await client.responses.retrieve(first.id)
    expect(retrieved.id).toBe(first.id)
    expect(retrieved.status).toBe("completed")
    expect(retrieved.output_text).toBe(first.output_text)
    expect(retrieved.usage?.output_tokens).toBe(first.usage?.output_tokens)

    const account = await newAccount(gw)
    const { key } = await newKey(gw, account.id)
    const other = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: key, maxRetries: 0 })
    const foreign = await other.responses.retrieve(first.id).then(() => null, (e: unknown) => e)
    expect(foreign).toBeInstanceOf(OpenAI.NotFoundError)
    expect((foreign as InstanceType<typeof OpenAI.APIError>).message).toMatch(HANGUL)
    const continued = await other.responses.create({ model: "ws-pro", previous_response_id: first.id, input: "and?" })
      .then(() => null, (e: unknown) => e)
    expect(continued).toBeInstanceOf(OpenAI.NotFoundError)

    const second = await client.responses.create({ model: "ws-pro", previous_response_id: first.id, input: "Say it back" })
    expect(second.previous_response_id).toBe(first.id)
    expect(second.output_text).toMatch(/^Echo: Say it back\./)

    await client.responses.delete(first.id)
    const gone = await client.responses.retrieve(first.id).then(() => null, (e: unknown) => e)
    expect(gone).toBeInstanceOf(OpenAI.NotFoundError)
    const unknown = await client.responses.retrieve(`resp_${"0".repeat(48)}`).then(() => null, (e: unknown) => e)
    expect(unknown).toBeInstanceOf(OpenAI.NotFoundError)
  })

  it("store: false is not retrievable", async () => {
    const created = await client.responses.create({ model: "ws-pro", input: "Do not keep this", store: false })
    expect((created as unknown as { store: boolean }).store).toBe(false)
    const error = await client.responses.retrieve(created.id).then(() => null, (e: unknown) => e)
    expect(error).toBeInstanceOf(OpenAI.NotFoundError)
  })

  it.each([
    ["web_search", { type: "web_search" }],
    ["file_search", { type: "file_search", vector_store_ids: ["vs_1"] }],
    ["code_interpreter", { type: "code_interpreter", container: { type: "auto" } }]
  ])("built-in tool %s: 400 naming the tool, in Korean", async (name, tool) => {
    const error = await client.responses.create({
      model: "ws-pro",
      input: "search something",
      tools: [weatherTool, tool as never]
    }).then(() => null, (e: unknown) => e)
    expect(error).toBeInstanceOf(OpenAI.BadRequestError)
    const api = error as InstanceType<typeof OpenAI.APIError>
    expect(api.code).toBe("invalid_request")
    expect(api.message).toContain(name)
    expect(api.message).toContain("tools[1]")
    expect(api.message).toMatch(HANGUL)
  })

  it("the chat gates apply: unknown model, tools on a model without them, max_output_tokens honoured", async () => {
    const unknown = await client.responses.create({ model: "no-such-model", input: "x" }).then(() => null, (e: unknown) => e)
    expect(unknown).toBeInstanceOf(OpenAI.BadRequestError)
    expect((unknown as InstanceType<typeof OpenAI.APIError>).code).toBe("model_not_found")
    const tools = await client.responses.create({ model: "ws-lite", input: "x", tools: [weatherTool] })
      .then(() => null, (e: unknown) => e)
    expect((tools as InstanceType<typeof OpenAI.APIError>).code).toBe("tools_not_supported")
    const capped = await client.responses.create({ model: "ws-lite", input: "Write a long story", max_output_tokens: 3 })
    expect(capped.status).toBe("incomplete")
    expect(capped.incomplete_details?.reason).toBe("max_output_tokens")
    expect(capped.usage!.output_tokens).toBeLessThanOrEqual(3)
  })
})
