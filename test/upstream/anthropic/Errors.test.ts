import { describe, expect, it } from "vitest"
import { upstreamFailure } from "../../../src/upstream/Failure.js"
import { errorFromEvent, mapError, MAX_MESSAGE } from "../../../src/upstream/anthropic/Errors.js"
import { errorBody } from "../../support/FakeAnthropic.js"

const body = (type: string, message: string) => JSON.stringify(errorBody(type, message))

describe("Anthropic error mapping", () => {
  it.each([
    [400, "invalid_request_error", "messages.0.content: Field required", "status", "upstream_rejected"],
    [400, "invalid_request_error", "prompt is too long: 208310 tokens > 200000 maximum", "status", "input_too_long"],
    [
      400,
      "invalid_request_error",
      "input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000, decrease input length or `max_tokens` and try again",
      "status",
      "input_too_long"
    ],
    [401, "authentication_error", "invalid x-api-key", "status", "upstream_error"],
    [402, "billing_error", "Your credit balance is too low", "status", "upstream_error"],
    [403, "permission_error", "Your API key does not have permission to use the specified resource.", "status", "upstream_error"],
    [404, "not_found_error", "model: claude-nope", "status", "upstream_rejected"],
    [413, "request_too_large", "Request exceeds the maximum allowed number of bytes.", "status", "upstream_rejected"],
    [429, "rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit", "rate_limited", "upstream_rate_limited"],
    [500, "api_error", "Internal server error", "status", "upstream_error"],
    [504, "timeout_error", "Request timed out", "timeout", "upstream_timeout"],
    [529, "overloaded_error", "Overloaded", "rate_limited", "upstream_rate_limited"]
  ])("maps %i %s to %s, answered as %s", (status, type, message, kind, code) => {
    const error = mapError(status, body(type, message))
    expect(error.kind).toBe(kind)
    expect(error.status).toBe(status)
    expect(error.detail).toContain(type)
    expect(error.detail).toContain(message.slice(0, 40))
    expect(error.detail).toContain("req_011CfakeRequest0000000000")
    const answered = upstreamFailure(error)
    expect(answered.code).toBe(code)
    if (status === 401 || status === 403 || status === 402) expect(answered.shouldRetry).toBe(false)
  })

  it("does not call a non-context 400 a context-length refusal", () => {
    const error = mapError(400, body("invalid_request_error", "max_tokens: 300000 > 64000, which is the maximum"))
    expect(error.detail).not.toContain("context_length_exceeded")
    expect(upstreamFailure(error).code).toBe("upstream_rejected")
  })

  it("maps answers that are not Anthropic's envelope by their status", () => {
    const html = mapError(502, "<html><body>Bad gateway</body></html>")
    expect(html).toMatchObject({ kind: "status", status: 502 })
    expect(html.detail).toContain("Bad gateway")
    expect(upstreamFailure(html).code).toBe("upstream_error")
    expect(mapError(529, "")).toMatchObject({ kind: "rate_limited", status: 529 })
    expect(mapError(400, JSON.stringify({ error: "plain string" })).detail).toContain("plain string")
  })

  it("bounds the detail and never carries the API key", () => {
    const key = "sk-ant-api03-SECRETSECRETSECRET-abcdef"
    const long = mapError(400, body("invalid_request_error", `bad header ${key} ` + "x".repeat(5000)))
    expect(long.detail.length).toBeLessThan(MAX_MESSAGE + 200)
    expect(long.detail).not.toContain("SECRETSECRET")
    const other = "custom-proxy-token-1234567890"
    const echoed = mapError(401, body("authentication_error", `key ${other} is invalid`), [other])
    expect(echoed.detail).not.toContain(other)
    expect(echoed.detail).toContain("[redacted]")
    const event = errorFromEvent({ type: "api_error", message: `oops ${other}` }, [other])
    expect(event.detail).not.toContain(other)
    // A secret straddling the cut is redacted too (never half of it).
    const straddling = mapError(400, body("invalid_request_error", "y".repeat(MAX_MESSAGE - 10) + other), [other])
    expect(straddling.detail).not.toContain(other.slice(0, 10))
  })

  it("maps an error event by its type, or as a 500 when the type is unknown or missing", () => {
    expect(errorFromEvent({ type: "overloaded_error", message: "Overloaded" })).toMatchObject({
      kind: "rate_limited",
      status: 529
    })
    expect(errorFromEvent({ type: "constructor", message: "x" })).toMatchObject({ kind: "status", status: 500 })
    expect(errorFromEvent(undefined)).toMatchObject({ kind: "status", status: 500 })
    expect(errorFromEvent({ type: "invalid_request_error", message: "prompt is too long: 5 tokens > 4 maximum" }).detail)
      .toContain("context_length_exceeded")
  })
})
