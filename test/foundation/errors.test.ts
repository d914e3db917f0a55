import type { HttpServerResponse } from "effect/http"
import { describe, expect, it } from "vitest"
import { Catalog, type Code, codes, type ErrorType, fail, GatewayError } from "../../src/errors/Catalog.js"
import { renderAccount, renderBare, renderImage, renderInference } from "../../src/errors/Render.js"

const HANGUL = /[\uAC00-\uD7A3]/

const bodyOf = (response: HttpServerResponse.HttpServerResponse): unknown => {
  expect(response.body._tag).toBe("Uint8Array")
  return JSON.parse(new TextDecoder().decode((response.body as { body: Uint8Array }).body))
}

/** What the spec's Errors section fixes: status and wire code (null: "none"). */
const spec: ReadonlyArray<readonly [Code, number, string | null]> = [
  ["model_not_found", 400, "model_not_found"],
  ["invalid_messages", 400, "invalid_messages"],
  ["invalid_json", 400, "invalid_json"],
  ["input_too_long", 400, "input_too_long"],
  ["invalid_reasoning_effort", 400, "invalid_reasoning_effort"],
  ["tools_not_supported", 400, "tools_not_supported"],
  ["model_not_chat", 400, "model_not_chat"],
  ["invalid_api_key", 401, "invalid_api_key"],
  ["geo_restricted", 403, "geo_restricted"],
  ["account_unlinked", 403, "account_unlinked"],
  ["legacy_account_upgrade_required", 403, "legacy_account_upgrade_required"],
  ["guest_expired", 403, "guest_expired"],
  ["email_required", 403, "email_required"],
  ["rate_limited", 429, "rate_limited"],
  ["abuse_cooldown", 429, "abuse_cooldown"],
  ["session_exhausted", 429, "session_exhausted"],
  ["weekly_exhausted", 429, "weekly_exhausted"],
  ["model_quota_exceeded", 429, "model_quota_exceeded"],
  ["model_overloaded", 529, "model_overloaded"],
  ["key_cap_reached", 400, "key_cap_reached"],
  ["invalid_id", 400, null],
  ["key_not_found", 404, null],
  ["key_not_revealable", 409, "key_not_revealable"],
  ["rotate_cooldown", 429, null],
  ["unauthorized", 401, null],
  ["invalid_range", 400, null],
  ["byok_disabled", 403, "byok_disabled"],
  ["invalid_request", 400, "invalid_request"],
  ["byok_credential_missing", 400, "byok_credential_missing"],
  ["byok_credential_conflict", 400, "byok_credential_conflict"],
  ["byok_upstream_error", 501, "byok_upstream_error"]
]

/** `type` values of the spec's envelope, plus `rate_limit_exceeded` (rotate) and our 404 type. */
const knownTypes: ReadonlyArray<ErrorType> = [
  "invalid_request_error",
  "rate_limit_error",
  "quota_exceeded",
  "access_denied",
  "overloaded_error",
  "server_error",
  "service_unavailable",
  "rate_limit_exceeded",
  "not_found_error"
]

describe("error catalog", () => {
  it("holds every code of the spec with its status and wire code", () => {
    for (const [code, status, wire] of spec) {
      expect(codes, code).toContain(code)
      expect(Catalog[code].status, code).toBe(status)
      expect(Catalog[code].wire, code).toBe(wire)
    }
  })

  it("fixes the types the spec implies", () => {
    expect(Catalog.rotate_cooldown.type).toBe("rate_limit_exceeded")
    expect(Catalog.model_overloaded.type).toBe("overloaded_error")
    for (const code of ["session_exhausted", "weekly_exhausted", "model_quota_exceeded"] as const) {
      expect(Catalog[code].type).toBe("quota_exceeded")
    }
    for (const code of ["rate_limited", "abuse_cooldown"] as const) expect(Catalog[code].type).toBe("rate_limit_error")
    for (const code of codes.filter((c) => Catalog[c].status === 403)) expect(Catalog[code].type).toBe("access_denied")
    for (const code of codes.filter((c) => Catalog[c].status === 503)) expect(Catalog[code].type).toBe("service_unavailable")
  })

  it("every entry: a valid status, a known type, a Korean message, wire = key, another code's key, or none", () => {
    for (const code of codes) {
      const e = Catalog[code]
      expect(e.status >= 400 && e.status <= 599, code).toBe(true)
      expect(knownTypes, code).toContain(e.type)
      expect(e.message, code).toMatch(HANGUL)
      // Another code's key: the same code on another status (`model_not_listed` is `model_not_found` as a 404).
      expect(e.wire === null || e.wire === code || (codes as ReadonlyArray<string>).includes(e.wire), code).toBe(true)
    }
  })
})

describe("renderers, walking the whole catalog", () => {
  for (const code of codes) {
    const entry = Catalog[code]
    it(`${code}: inference, image, account and bare shapes`, () => {
      const plain = fail(code)
      expect(plain).toBeInstanceOf(GatewayError)
      expect(plain.status).toBe(entry.status)

      const inference = renderInference(plain)
      expect(inference.status).toBe(entry.status)
      expect(inference.headers["retry-after"]).toBeUndefined()
      const envelope = bodyOf(inference) as { error: Record<string, unknown> }
      expect(Object.keys(envelope)).toEqual(["error"])
      expect(envelope.error).toEqual({
        message: entry.message,
        type: entry.type,
        ...(entry.wire !== null ? { code: entry.wire } : {})
      })
      expect(envelope.error.message).toMatch(HANGUL)

      const image = renderImage(plain)
      expect(image.status).toBe(entry.status)
      expect(bodyOf(image)).toEqual({ statusCode: entry.status, message: entry.message })

      const account = renderAccount(plain)
      expect(account.status).toBe(entry.status)
      expect(bodyOf(account)).toEqual({ success: false, error: envelope.error })

      const bare = renderBare(plain)
      expect(bare.status).toBe(entry.status)
      expect(bodyOf(bare)).toEqual({ error: entry.message })
    })

    it(`${code}: resets_at and Retry-After`, () => {
      const resetsAt = Date.now() + 90_500
      const withReset = fail(code, { resetsAt })
      const inference = renderInference(withReset)
      const body = bodyOf(inference) as { error: Record<string, unknown> }
      expect(body.error.resets_at).toBe(new Date(resetsAt).toISOString())
      expect(body.error.resets_at).toMatch(/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/)
      expect((bodyOf(renderAccount(withReset)) as { error: Record<string, unknown> }).error.resets_at)
        .toBe(body.error.resets_at)
      // The image shape never grows fields.
      expect(Object.keys(bodyOf(renderImage(withReset)) as object).sort()).toEqual(["message", "statusCode"])

      const retryAfter = fail(code, { retryAfter: 4.2 })
      if (code === "rotate_cooldown") {
        // Spec: the rotate cooldown 429 carries no Retry-After.
        for (const e of [withReset, retryAfter]) {
          expect(renderInference(e).headers["retry-after"]).toBeUndefined()
          expect(renderAccount(e).headers["retry-after"]).toBeUndefined()
          expect(renderImage(e).headers["retry-after"]).toBeUndefined()
        }
      } else {
        const seconds = Number(inference.headers["retry-after"])
        expect(seconds === 90 || seconds === 91).toBe(true)
        expect(renderInference(retryAfter).headers["retry-after"]).toBe("5")
        expect(renderAccount(retryAfter).headers["retry-after"]).toBe("5")
        expect(renderImage(retryAfter).headers["retry-after"]).toBe("5")
        // retryAfter wins over resetsAt; a reset in the past is 0, never negative.
        expect(renderInference(fail(code, { retryAfter: 1, resetsAt })).headers["retry-after"]).toBe("1")
        expect(renderInference(fail(code, { resetsAt: Date.now() - 10_000 })).headers["retry-after"]).toBe("0")
      }
      expect(renderBare(withReset).headers["retry-after"]).toBeUndefined()
    })
  }

  it("a message override replaces the text everywhere, and the detail is never rendered", () => {
    const e = fail("invalid_reasoning_effort", { message: "허용 값: low, high", detail: "internal-secret" })
    const rendered = [renderInference(e), renderImage(e), renderAccount(e), renderBare(e)].map((r) =>
      JSON.stringify(bodyOf(r))
    )
    for (const text of rendered) {
      expect(text).toContain("허용 값: low, high")
      expect(text).not.toContain("internal-secret")
    }
  })
})
