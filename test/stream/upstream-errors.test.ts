/**
 * Finding 12, upstream answers: a context-length refusal is 400 `input_too_long`, other deterministic upstream
 * 4xx are 400 `upstream_rejected`, the gateway's own misconfiguration (upstream 401/403) is 500 `upstream_error`
 * with `x-should-retry: false`; 429 and 5xx stay retryable. The upstream's text never reaches the client nor
 * the account's request rows. And every 429 whose wait is over a minute carries `x-should-retry: false`, which
 * the official SDK honours.
 */
import { Effect, Layer } from "effect"
import OpenAI from "openai"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Catalog, codes, fail } from "../../src/errors/Catalog.js"
import { renderAccount, renderImage, renderInference } from "../../src/errors/Render.js"
import { isContextLengthText, upstreamFailure } from "../../src/upstream/Failure.js"
import { Admission } from "../../src/quota/Admission.js"
import { rateLimited, sessionExhausted } from "../../src/quota/Policy.js"
import { UpstreamError } from "../../src/upstream/Upstream.js"
import { startGateway, type TestGateway } from "../support/Gateway.js"
import { Behaviour, Chunks, type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"
import { makeUnlimitedAdmission } from "../support/UnlimitedAdmission.js"
import { addMockModel, expectError, postChat, rowById, rowIdOf, user } from "../inference/helpers.js"

const SECRET = "UPSTREAM-SECRET-7f3a"
const hi = [user("hello")]
const openAiError = (message: string, code: string | null = null, type = "invalid_request_error") => ({
  error: { message: `${message} ${SECRET}`, type, param: null, code }
})

describe("context-length detection", () => {
  it.each([
    "This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens.",
    "context_length_exceeded",
    "prompt is too long: 250000 tokens > 200000 maximum",
    "Input is too long for requested model.",
    "too many tokens in the request",
    "the request exceeds the model's maximum context length",
    "The input token count (1048577) exceeds the maximum number of tokens allowed (1048576).",
    "Requested token count exceeds the model's context window"
  ])("recognizes %s", (text) => expect(isContextLengthText(text)).toBe(true))

  it.each([
    "Invalid value for 'temperature': must be at most 2",
    "max_tokens must be at least 1",
    "Unrecognized request argument supplied: foo",
    "model not found"
  ])("does not take %s for a context-length refusal", (text) => expect(isContextLengthText(text)).toBe(false))

  it("upstream details are bounded before they are logged", () => {
    const error = upstreamFailure(new UpstreamError({ kind: "status", status: 502, detail: "x".repeat(100_000) }))
    expect(error.detail!.length).toBeLessThan(1_100)
  })
})

describe("x-should-retry, walking the catalog", () => {
  const inThreeHours = () => Date.now() + 3 * 3600_000
  const renderers = [renderInference, renderAccount, renderImage]

  for (const code of codes) {
    const status = Catalog[code].status
    it(`${code} (${status})`, () => {
      for (const render of renderers) {
        const long = render(fail(code, { resetsAt: inThreeHours() })).headers["x-should-retry"]
        expect(long).toBe(status === 429 ? "false" : undefined)
        expect(render(fail(code, { retryAfter: 61 })).headers["x-should-retry"]).toBe(status === 429 ? "false" : undefined)
        // A wait of a minute or less: the SDK may retry.
        expect(render(fail(code, { retryAfter: 60 })).headers["x-should-retry"]).toBeUndefined()
        expect(render(fail(code, { resetsAt: Date.now() + 30_000 })).headers["x-should-retry"]).toBeUndefined()
        expect(render(fail(code)).headers["x-should-retry"]).toBeUndefined()
        // An explicit verdict wins.
        expect(render(fail(code, { shouldRetry: false })).headers["x-should-retry"]).toBe("false")
      }
    })
  }
})

describe("upstream answers over HTTP", () => {
  let gw: TestGateway
  let mock: MockUpstream
  const adm = makeUnlimitedAdmission()
  /** admit() calls per model: a retried request is admitted again. */
  const admits = new Map<string, number>()

  // The test admission, except that "ws-weekly" is out of quota for 3 hours and "ws-rpm" is rate-limited for 1 s.
  const admission = Layer.effect(
    Admission,
    Effect.map(Admission, (inner) =>
      Admission.of({
        ...inner,
        admit: (input) => {
          admits.set(input.model.id, (admits.get(input.model.id) ?? 0) + 1)
          if (input.model.id === "ws-weekly") return Effect.fail(sessionExhausted(Date.now() + 3 * 3600_000))
          if (input.model.id === "ws-rpm") return Effect.fail(rateLimited(1))
          return inner.admit(input)
        }
      }))
  ).pipe(Layer.provide(adm.layer))

  beforeAll(async () => {
    mock = await startMockUpstream()
    gw = await startGateway({
      admission,
      configure: (doc) => {
        addMockModel(doc, { baseUrl: mock.url })
        addMockModel(doc, { id: "ws-weekly", provider: "weekly", baseUrl: mock.url })
        addMockModel(doc, { id: "ws-rpm", provider: "rpm", baseUrl: mock.url })
      }
    })
  })
  afterAll(async () => {
    await gw?.stop()
    await mock?.close()
  })

  const cases: Array<[string, number, unknown, number, string, string, string | null]> = [
    ["OpenAI context_length_exceeded", 400, openAiError("This model's maximum context length is 8192 tokens.", "context_length_exceeded"), 400, "input_too_long", "invalid_request_error", null],
    ["a code alone says context length", 400, openAiError("Invalid request.", "context_length_exceeded"), 400, "input_too_long", "invalid_request_error", null],
    ["413 prompt is too long", 413, { error: { message: `prompt is too long: 250000 tokens > 200000 maximum ${SECRET}` } }, 400, "input_too_long", "invalid_request_error", null],
    ["422 too many tokens (plain detail)", 422, { detail: `too many tokens ${SECRET}` }, 400, "input_too_long", "invalid_request_error", null],
    ["400 other", 400, openAiError("Unrecognized request argument supplied: foo"), 400, "upstream_rejected", "invalid_request_error", null],
    ["404", 404, openAiError("The model `mock-model` does not exist", "model_not_found"), 400, "upstream_rejected", "invalid_request_error", null],
    ["409", 409, openAiError("conflict"), 400, "upstream_rejected", "invalid_request_error", null],
    ["413 other", 413, `request entity too large ${SECRET}`, 400, "upstream_rejected", "invalid_request_error", null],
    ["422 other", 422, openAiError("messages.0.content: field required"), 400, "upstream_rejected", "invalid_request_error", null],
    ["401", 401, openAiError("Incorrect API key provided", "invalid_api_key"), 500, "upstream_error", "server_error", "false"],
    ["403", 403, openAiError("Forbidden", null, "permission_error"), 500, "upstream_error", "server_error", "false"],
    ["405", 405, `method not allowed ${SECRET}`, 500, "upstream_error", "server_error", "false"],
    ["408", 408, `request timeout ${SECRET}`, 503, "upstream_timeout", "service_unavailable", null],
    ["429", 429, openAiError("Rate limit reached", "rate_limit_exceeded", "requests"), 503, "upstream_rate_limited", "service_unavailable", null],
    ["500", 500, openAiError("The server had an error", null, "server_error"), 500, "upstream_error", "server_error", null],
    ["502", 502, `<html>bad gateway ${SECRET}</html>`, 500, "upstream_error", "server_error", null]
  ]

  describe.each([false, true])("stream: %s", (stream) => {
    it.each(cases)("upstream %s -> %i %s", async (_name, upstreamStatus, body, status, code, type, shouldRetry) => {
      mock.script(Behaviour.status(upstreamStatus, body))
      const res = await postChat(gw, { model: "ws-mock", messages: hi, stream })
      expect(res.headers.get("content-type")).toContain("application/json")
      const text = await res.clone().text()
      await expectError(res, status, code, type)
      expect(text).not.toContain(SECRET)
      expect(text.length).toBeLessThan(1_024)
      expect(res.headers.get("x-should-retry")).toBe(shouldRetry)
      const row = await rowById(gw, rowIdOf(res))
      expect(row).toMatchObject({ status: "error", error_code: code, http_status: status, stream })
      // The account sees the code and status, never the upstream's words.
      expect(row.error).toBe(`${code} (${status})`)
    })
  })

  describe("the openai SDK (maxRetries 2) retries only what may succeed", () => {
    const client = () => new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: gw.key, maxRetries: 2, timeout: 20_000 })

    it.each([
      [401, openAiError("Incorrect API key provided", "invalid_api_key"), 500],
      [400, openAiError("Unrecognized request argument supplied: foo"), 400],
      [400, openAiError("maximum context length is 8192 tokens", "context_length_exceeded"), 400]
    ])("upstream %i: one attempt, the SDK raises %i", async (upstreamStatus, body, status) => {
      mock.script(Behaviour.status(upstreamStatus, body))
      const before = mock.requests.length
      const error = await client().chat.completions.create({ model: "ws-mock", messages: [{ role: "user", content: "x" }] })
        .catch((e) => e)
      expect(error).toBeInstanceOf(OpenAI.APIError)
      expect(error.status).toBe(status)
      expect(mock.requests.length - before).toBe(1)
    })

    it("upstream 500 (transient) is retried: three attempts", async () => {
      mock.script(Behaviour.status(500, openAiError("The server had an error", null, "server_error")))
      const before = mock.requests.length
      const error = await client().chat.completions.create({ model: "ws-mock", messages: [{ role: "user", content: "x" }] })
        .catch((e) => e)
      expect(error).toBeInstanceOf(OpenAI.InternalServerError)
      expect(mock.requests.length - before).toBe(3)
      mock.script(Behaviour.stream([Chunks.role(), Chunks.content("ok"), Chunks.finish("stop")]))
    })

    it("a 429 that resets in 3 hours: x-should-retry false, one attempt", async () => {
      const res = await postChat(gw, { model: "ws-weekly", messages: hi })
      expect(res.status).toBe(429)
      expect(res.headers.get("x-should-retry")).toBe("false")
      expect(Number(res.headers.get("retry-after"))).toBeGreaterThan(3 * 3600 - 60)
      const before = admits.get("ws-weekly")!
      const error = await client().chat.completions.create({ model: "ws-weekly", messages: [{ role: "user", content: "x" }] })
        .catch((e) => e)
      expect(error).toBeInstanceOf(OpenAI.RateLimitError)
      expect(admits.get("ws-weekly")! - before).toBe(1)
    })

    it("a 429 with a 1 s wait: no x-should-retry, the SDK retries", async () => {
      const res = await postChat(gw, { model: "ws-rpm", messages: hi })
      expect(res.status).toBe(429)
      expect(res.headers.get("x-should-retry")).toBeNull()
      expect(res.headers.get("retry-after")).toBe("1")
      const before = admits.get("ws-rpm")!
      const error = await client().chat.completions.create({ model: "ws-rpm", messages: [{ role: "user", content: "x" }] })
        .catch((e) => e)
      expect(error).toBeInstanceOf(OpenAI.RateLimitError)
      expect(admits.get("ws-rpm")! - before).toBe(3)
    })
  })
})
