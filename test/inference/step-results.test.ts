/**
 * The seam of issue 19, point 1: the request record is built from step results.
 *
 * - Codecs and answer writers get the exchange only as `ExchangeView` (read, here a frozen plain object) and
 *   `AnswerMeter` (count): given nothing else, every codec still frames a whole stream, and what it counts lands
 *   on the meter. The type checks below fail to compile if the view or the meter could record a step's result.
 * - Only the pipeline records step results: no other module of `src/` calls the recording methods.
 * - A request's row fields (model, provider, byok, fell_back, stream, had_tools, tool_choice, deployment,
 *   attempts) are what the steps returned, for a chat, a BYOK fallback, an embedding, a Messages request, and a
 *   request refused at its size step (after the model was resolved, before it was routed).
 */
import { Effect, Schema } from "effect"
import * as Crypto from "node:crypto"
import * as Fs from "node:fs"
import * as Path from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { AccountRow } from "../../src/accounts/AccountsRepo.js"
import { LimitsConfig } from "../../src/config/GatewayConfig.js"
import { accumulate, sseFraming } from "../../src/inference/ChatWire.js"
import type { WireCodec } from "../../src/inference/Codec.js"
import type { AnswerMeter, ExchangeView } from "../../src/inference/Exchange.js"
import { messagesCodec } from "../../src/protocols/anthropic/Routes.js"
import { messageFraming } from "../../src/protocols/anthropic/Wire.js"
import { makeResponsesCodec } from "../../src/protocols/responses/Route.js"
import type { Usage, UpstreamEvent } from "../../src/upstream/Upstream.js"
import { chatCodec } from "../../src/inference/Chat.js"
import { call, flushRequestLog, newUser, query } from "../accounts/support.js"
import { type FakeOpenAi, GOOD, startFakeOpenAi } from "../byok/FakeOpenAi.js"
import { type FakeDeployment, providerFor, startFakeDeployment } from "../support/FakeDeployment.js"
import { authed, startGateway, type TestGateway } from "../support/Gateway.js"

// ----- the view and the meter

const USAGE: Usage = { prompt_tokens: 11, completion_tokens: 4, reasoning_tokens: 1, cached_tokens: 0 }
const EVENTS: ReadonlyArray<UpstreamEvent> = [
  { _tag: "Reasoning", text: "think" },
  { _tag: "Content", text: "hello" },
  { _tag: "ToolCallStart", index: 0, id: "call_1", name: "lookup" },
  { _tag: "ToolCallArgs", index: 0, fragment: "{\"q\":1}" },
  { _tag: "Finish", reason: "tool_calls" },
  { _tag: "Usage", usage: USAGE }
]
/** Characters of reasoning, content and tool arguments above. */
const DELIVERED = 5 + 5 + 7

const account = { id: "acc_seam", plan: null, is_guest: false } as unknown as AccountRow

/** A meter that keeps what it was told, and an exchange view that is a frozen plain object reading it. */
const seam = () => {
  const meter = {
    delivered: 0,
    usage: null as Usage | null,
    marks: [] as Array<string>,
    attempt: (deployment: string) => void meter.marks.push(`attempt ${deployment}`),
    markDispatched: () => void meter.marks.push("dispatched"),
    markFirstByte: () => void meter.marks.push("first byte"),
    markFirstEvent: () => void meter.marks.push("first event"),
    addDelivered: (chars: number) => void (meter.delivered += chars),
    setUsage: (usage: Usage) => void (meter.usage = usage)
  }
  const view: ExchangeView = Object.freeze({
    caller: { account, key: null },
    accountId: account.id,
    rowId: 42,
    requestId: "req_seam",
    createdAt: new Date(0),
    modelId: "seam-model",
    estimatedInput: 9,
    ticket: null,
    chargeable: () => meter.usage ?? { prompt_tokens: 9, completion_tokens: 0, reasoning_tokens: 0, cached_tokens: 0 }
  })
  const typed: AnswerMeter = meter
  return { meter, typed, view }
}

/** Compiles only while the view and the meter cannot record a step's result (checked by `npm run typecheck`). */
export const viewAndMeterCannotRecord = (view: ExchangeView, meter: AnswerMeter) => {
  // @ts-expect-error the view records no route
  view.routeTo("p")
  // @ts-expect-error the view resolves no model
  view.resolveModel("m")
  // @ts-expect-error the view completes nothing
  view.succeed()
  // @ts-expect-error the meter records no fallback
  meter.fallBack("m", 0)
  // @ts-expect-error the meter describes nothing
  meter.describe({ stream: true, hadTools: false, toolChoice: null })
  // @ts-expect-error the meter sets no estimate
  meter.setEstimatedInput(1)
}

const limits = Schema.decodeSync(LimitsConfig)({})

/** The whole stream of `codec` on the view and meter only: head, one batch of events, the closing frames. */
const streamThrough = async (codec: WireCodec, body: unknown) => {
  const { meter, typed, view } = seam()
  await Effect.runPromise(codec.decode(body, view, limits))
  const framing = codec.stream(view, typed)
  const text = framing.head + framing.frames(EVENTS) + framing.last(null)
  return { meter, text }
}

describe("codecs get the exchange's view and meter only", () => {
  const chatBody = { model: "seam-model", messages: [{ role: "user", content: "hi" }], stream: true }

  it("chat: frames name the view's model; delivered output and usage go to the meter", async () => {
    const { meter, text } = await streamThrough(chatCodec, chatBody)
    expect(meter.delivered).toBe(DELIVERED)
    expect(meter.usage).toEqual(USAGE)
    expect(text).toContain(`"model":"seam-model"`)
    expect(text).toContain(`"completion_tokens":4`)
    expect(text.endsWith("data: [DONE]\n\n")).toBe(true)
  })

  it("Messages: the same, on Anthropic's events", async () => {
    const { meter, text } = await streamThrough(messagesCodec, {
      model: "seam-model",
      max_tokens: 50,
      messages: [{ role: "user", content: "hi" }],
      stream: true
    })
    expect(meter.delivered).toBe(DELIVERED)
    expect(meter.usage).toEqual(USAGE)
    expect(text).toContain(`"model":"seam-model"`)
    expect(text).toContain(`"output_tokens":4`)
    expect(text).toContain("event: message_stop")
  })

  it("Responses: the same, its turn kept by the view", async () => {
    const unused = () => {
      throw new Error("not used by a stream without previous_response_id")
    }
    const codec = makeResponsesCodec(
      { chain: unused, put: unused } as unknown as Parameters<typeof makeResponsesCodec>[0],
      { current: unused } as unknown as Parameters<typeof makeResponsesCodec>[1]
    )
    const { meter, text } = await streamThrough(codec, { model: "seam-model", input: "hi", stream: true })
    expect(meter.delivered).toBe(DELIVERED)
    expect(meter.usage).toEqual(USAGE)
    expect(text).toContain(`"model":"seam-model"`)
    expect(text).toContain("event: response.completed")
  })

  it("the writers take the meter alone: a whole answer's `accumulate`, the framings", () => {
    const { meter, typed, view } = seam()
    const answer = accumulate(EVENTS, typed)
    expect(answer).toMatchObject({ content: "hello", reasoning: "think", finish: "tool_calls" })
    expect(meter.delivered).toBe(DELIVERED)
    expect(meter.usage).toEqual(USAGE)
    for (const framing of [sseFraming(view, typed), messageFraming(view, typed)]) framing.frames(EVENTS)
    expect(meter.delivered).toBe(3 * DELIVERED)
    // Nothing but the meter's counters moved: no time mark, no attempt.
    expect(meter.marks).toEqual([])
  })
})

describe("only the pipeline records step results", () => {
  const RECORDING = /\.(requestedModel|setApi|describe|resolveModel|setEstimatedInput|routeTo|routeByok|fallBack)\(/
  const RECORDERS = new Set(["src/inference/Pipeline.ts", "src/inference/Exchange.ts"])

  const sources = (dir: string): Array<string> =>
    Fs.readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
      const path = Path.join(dir, entry.name)
      if (entry.isDirectory()) return sources(path)
      return entry.name.endsWith(".ts") ? [path] : []
    })

  it("no other module of src/ calls a recording method", () => {
    const callers = sources("src").filter((file) => RECORDING.test(Fs.readFileSync(file, "utf8")))
    expect(callers.sort()).toEqual([...RECORDERS].sort())
  })
})

// ----- the rows

describe("a request's row fields come from its steps' results", () => {
  let gw: TestGateway
  let bad: FakeDeployment
  let good: FakeDeployment
  let fake: FakeOpenAi

  beforeAll(async () => {
    bad = await startFakeDeployment("bad")
    good = await startFakeDeployment("good")
    bad.mode = { _tag: "status", status: 503 }
    fake = await startFakeOpenAi()
    gw = await startGateway({
      configure: (doc) => {
        doc.routing = { health: { consecutive_failures: 1_000 } }
        doc.catalog.providers.bad = providerFor(bad)
        doc.catalog.providers.good = providerFor(good)
        // The failing deployment is always tried first: every pool request makes two attempts, answered by `second`.
        const deployments = [
          { id: "first", provider: "bad", model: "m", priority: 0 },
          { id: "second", provider: "good", model: "m", priority: 1 }
        ]
        const limits = { max_output_tokens: 100, rate_limit_rpm: 10_000, concurrency: 100 }
        doc.catalog.models.push(
          { id: "multi", owned_by: "test", supports_tools: true, max_input_tokens: 2_000, ...limits, deployments },
          {
            id: "multi-embed",
            owned_by: "test",
            supports_chat: false,
            supports_embeddings: true,
            max_input_tokens: 2_000,
            ...limits,
            deployments
          }
        )
        doc.catalog.aliases = { fast: "multi" }
        doc.byok = { providers: { openai: { base_url: `${fake.origin}/v1` } } }
      }
    })
  })
  afterAll(async () => {
    await gw?.stop()
    await bad?.kill()
    await good?.kill()
    await fake?.close()
  })

  const FIELDS = "model_id, provider, byok, fell_back, stream, had_tools, tool_choice, deployment, attempts, api, status, error_code"
  const rowOf = async (response: Response) => {
    await flushRequestLog(gw)
    const rows = await query(gw, `SELECT ${FIELDS} FROM request_log WHERE id = $1`, [Number(response.headers.get("x-request-id"))])
    expect(rows).toHaveLength(1)
    return rows[0]
  }
  const post = (path: string, key: string, body: unknown, headers: Record<string, string> = {}) =>
    fetch(`${gw.url}${path}`, { method: "POST", headers: authed(key, headers), body: JSON.stringify(body) })
  const tool = { type: "function", function: { name: "lookup", parameters: { type: "object" } } }

  it("chat, streamed, through an alias with tools: the resolved model, the model's route, the router's attempts", async () => {
    const response = await post("/v1/chat/completions", gw.key, {
      model: "fast",
      messages: [{ role: "user", content: "hi" }],
      stream: true,
      tools: [tool],
      tool_choice: { type: "function", function: { name: "lookup" } }
    })
    expect(response.status).toBe(200)
    expect(await response.text()).toContain("from good")
    expect(await rowOf(response)).toEqual({
      model_id: "multi",
      provider: "bad",
      byok: false,
      fell_back: false,
      stream: true,
      had_tools: true,
      tool_choice: "function:lookup",
      deployment: "second",
      attempts: 2,
      api: "chat",
      status: "success",
      error_code: null
    })
  })

  it("a refusal at the size step keeps what the steps before it returned: resolved model, description; no route", async () => {
    const response = await post("/v1/chat/completions", gw.key, {
      model: "fast",
      messages: [{ role: "user", content: "긴 글 ".repeat(4_000) }],
      tools: [tool],
      tool_choice: "required"
    })
    expect(response.status).toBe(400)
    expect(await rowOf(response)).toEqual({
      model_id: "multi",
      provider: null,
      byok: false,
      fell_back: false,
      stream: false,
      had_tools: true,
      tool_choice: "required",
      deployment: null,
      attempts: 0,
      api: "chat",
      status: "error",
      error_code: "input_too_long"
    })
  })

  it("a BYOK fallback: the credential's provider, byok, fell_back, the pool model and its deployment", async () => {
    const u = await newUser(gw)
    const secret = `${GOOD}seam-${Crypto.randomBytes(6).toString("hex")}`
    const saved = await call(gw, "POST", "/api/user/me/byok", { key: u.key, body: { provider: "openai", secret } })
    expect(saved.status, saved.text).toBe(200)
    const id = saved.body.data.credential.id
    const patched = await call(gw, "PATCH", `/api/user/me/byok/${id}`, { key: u.key, body: { fallback_model_id: "multi" } })
    expect(patched.status, patched.text).toBe(200)
    expect((await call(gw, "PUT", "/api/user/me/byok/fallback", { key: u.key, body: { enabled: true } })).status).toBe(200)
    fake.fail.set(secret, 500)
    const response = await post("/v1/chat/completions", u.key, { model: "@openai/gpt-fake", messages: [{ role: "user", content: "hi" }] })
    expect(response.status).toBe(200)
    expect(((await response.json()) as { model: string }).model).toBe("multi")
    expect(await rowOf(response)).toEqual({
      model_id: "multi",
      provider: "openai",
      byok: true,
      fell_back: true,
      stream: false,
      had_tools: false,
      tool_choice: null,
      deployment: "second",
      attempts: 2,
      api: "chat",
      status: "success",
      error_code: null
    })
  })

  it("an embedding: the model, its route and attempts; no description", async () => {
    const response = await post("/v1/embeddings", gw.key, { model: "multi-embed", input: ["a", "b"] })
    expect(response.status).toBe(200)
    expect(await rowOf(response)).toEqual({
      model_id: "multi-embed",
      provider: "bad",
      byok: false,
      fell_back: false,
      stream: false,
      had_tools: false,
      tool_choice: null,
      deployment: "second",
      attempts: 2,
      api: "embeddings",
      status: "success",
      error_code: null
    })
  })

  it("a Messages request: the codec's decoding described (Anthropic's `any` is `required`), the same route", async () => {
    const response = await post("/v1/messages", gw.key, {
      model: "fast",
      max_tokens: 50,
      messages: [{ role: "user", content: "hi" }],
      stream: true,
      tools: [{ name: "lookup", description: "d", input_schema: { type: "object" } }],
      tool_choice: { type: "any" }
    }, { "anthropic-version": "2023-06-01" })
    expect(response.status).toBe(200)
    expect(await response.text()).toContain("event: message_stop")
    expect(await rowOf(response)).toEqual({
      model_id: "multi",
      provider: "bad",
      byok: false,
      fell_back: false,
      stream: true,
      had_tools: true,
      tool_choice: "required",
      deployment: "second",
      attempts: 2,
      api: "messages",
      status: "success",
      error_code: null
    })
  })
})
