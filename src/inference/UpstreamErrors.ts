/**
 * How an upstream failure is answered. The upstream's own text (`UpstreamError.detail`) never reaches the
 * client nor the account's request rows: it is kept as the GatewayError's `detail`, which is logged only.
 *
 * | upstream                                              | answer                                   |
 * |-------------------------------------------------------|------------------------------------------|
 * | connect refused, dropped before headers               | 503 service_unavailable                  |
 * | any timeout (first token, idle, total), HTTP 408      | 503 upstream_timeout                     |
 * | 429                                                   | 503 upstream_rate_limited, Retry-After 5 |
 * | 400 / 413 / 422 saying the context length is exceeded | 400 input_too_long                       |
 * | 400, 404, 409, 413, 422 otherwise                     | 400 upstream_rejected                    |
 * | 401, 403, any other 4xx (our credentials or route)    | 500 upstream_error, x-should-retry: false|
 * | 5xx, unreadable answer                                | 500 upstream_error (retryable)           |
 * | BYOK: the address guard refused the connection        | 400 address_not_allowed                  |
 *
 * Through a user's credential (BYOK) a 401 or 403 (or a 400 about the key) is 400 `byok_credential_rejected`.
 */
import { classifyStatus, type ProbeFailureKind, rejectsCredential } from "../byok/Probe.js"
import { fail, type GatewayError } from "../errors/Catalog.js"
import type { UpstreamError } from "../upstream/Upstream.js"

/** Upstream text longer than this is cut before it is logged. */
const MAX_LOGGED_DETAIL = 1_000

/** Deterministic refusals of the request itself: the same request would be refused again. */
const REJECTED = new Set([400, 404, 409, 413, 422])
/** Statuses with which upstreams report an input over the model's context window. */
const CONTEXT_STATUSES = new Set([400, 413, 422])

/**
 * What OpenAI, vLLM, llama.cpp, Anthropic-style and other compatible servers say when the prompt (with
 * max_tokens) does not fit the context window.
 */
const CONTEXT_LENGTH =
  /context[_ ]length[_ ]exceeded|maximum context length|context length|context window|too many tokens|prompt is too long|input is too long|prompt too long|exceeds? the (?:model'?s? )?(?:maximum|max) (?:context|input|prompt)|(?:input|prompt) tokens? exceed|token count[^.]{0,40}exceeds/i

export const isContextLengthText = (text: string): boolean => CONTEXT_LENGTH.test(text)

/** GatewayErrors made here: their detail is upstream text, so request rows record the code only. */
const made = new WeakSet<GatewayError>()

/** Whether `error` was mapped from an upstream failure (its `detail` is log-only upstream text). */
export const isUpstreamFailure = (error: GatewayError): boolean => made.has(error)

const bounded = (text: string): string =>
  text.length > MAX_LOGGED_DETAIL ? `${text.slice(0, MAX_LOGGED_DETAIL)}...` : text

const classify = (error: UpstreamError, detail: string): GatewayError => {
  switch (error.kind) {
    case "connect":
      return fail("service_unavailable", { detail })
    case "timeout":
      return fail("upstream_timeout", { detail })
    case "rate_limited":
      return fail("upstream_rate_limited", { detail, retryAfter: 5 })
    case "protocol":
      return fail("upstream_error", { detail })
    case "address":
      return fail("address_not_allowed", { detail })
    case "status": {
      const status = error.status ?? 500
      if (status >= 500) return fail("upstream_error", { detail })
      if (status === 408) return fail("upstream_timeout", { detail })
      if (status === 429) return fail("upstream_rate_limited", { detail, retryAfter: 5 })
      if (CONTEXT_STATUSES.has(status) && isContextLengthText(error.detail)) return fail("input_too_long", { detail })
      if (REJECTED.has(status)) return fail("upstream_rejected", { detail })
      // 401, 403 and the rest: the gateway's credentials or route are wrong; retrying cannot help.
      return fail("upstream_error", { detail, shouldRetry: false })
    }
  }
}

export const upstreamFailure = (error: UpstreamError): GatewayError => {
  const detail = bounded(`${error.kind}${error.status ? ` ${error.status}` : ""}: ${error.detail}`)
  const mapped = classify(error, detail)
  made.add(mapped)
  return mapped
}

/**
 * What a failed call through a user's credential means for the credential (`Probe.ts` kinds): auth and permission
 * failures condemn it (`rejectsCredential`); the rest are transient or about the request.
 */
export const dispatchFailureKind = (error: UpstreamError): ProbeFailureKind => {
  switch (error.kind) {
    case "status":
      return classifyStatus(error.status ?? 500, error.detail)
    case "rate_limited":
      return "rate_limited"
    case "timeout":
      return "timeout"
    case "connect":
      return "network_error"
    case "protocol":
      return "bad_response"
    case "address":
      return "address_not_allowed"
  }
}

/**
 * A failure through a user's credential: as `upstreamFailure`, except that the provider refusing the key (401,
 * 403, or a 400 that says so) is 400 `byok_credential_rejected`: the caller's key, not the gateway's.
 */
export const byokUpstreamFailure = (error: UpstreamError): GatewayError => {
  if (!rejectsCredential(dispatchFailureKind(error))) return upstreamFailure(error)
  const detail = bounded(`${error.kind}${error.status ? ` ${error.status}` : ""}: ${error.detail}`)
  const mapped = fail("byok_credential_rejected", { detail })
  made.add(mapped)
  return mapped
}
