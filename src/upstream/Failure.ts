/**
 * The one failure model: every upstream failure (a catalog deployment, a BYOK credential, a credential probe) is
 * classified here, once, into what it means:
 *
 * - `kind`: what went wrong, in the words the BYOK API shows (`last_error_code`, probe answers);
 * - `error`: the client's answer (code, status, Korean message; the upstream's own text stays in `detail`, which is
 *   only ever logged);
 * - `retryable`: another deployment may answer the same request (failover before the first byte);
 * - `health`: the failure counts against the deployment's health (client-caused failures never do);
 * - `retryAfterMs`: how long the upstream asked to be left alone (a 429's `Retry-After`);
 * - `condemns`: the failure rejects the BYOK credential it went through (auth and permission failures only).
 *
 * | upstream                                              | answer                                   | retry | health |
 * |-------------------------------------------------------|------------------------------------------|-------|--------|
 * | connect refused, dropped before headers               | 503 service_unavailable                  | yes   | yes    |
 * | any timeout (first token, idle, total), HTTP 408      | 503 upstream_timeout                     | yes   | yes    |
 * | 429 (and Anthropic's 529)                             | 503 upstream_rate_limited, Retry-After   | yes   | yes    |
 * | 400 / 413 / 422 saying the context length is exceeded | 400 input_too_long                       | no    | no     |
 * | 400, 404, 409, 413, 422 otherwise                     | 400 upstream_rejected                    | no    | no     |
 * | 401, 403, any other 4xx (our credentials or route)    | 500 upstream_error, x-should-retry: false| yes   | yes    |
 * | 5xx, unreadable answer                                | 500 upstream_error (retryable)           | yes   | yes    |
 * | BYOK: the address guard refused the connection        | 400 address_not_allowed                  | no    | no     |
 *
 * Through a user's credential (BYOK) a 401 or 403 (or a 400 about the key) is 400 `byok_credential_rejected` and
 * condemns the credential. A catalog deployment answering 401/403 is misconfigured: another deployment may work.
 */
import { fail, type GatewayError } from "../errors/Catalog.js"
import type { UpstreamError } from "./Upstream.js"

/** What went wrong, as the BYOK API names it; the address guard's refusal codes included. */
export type FailureKind =
  | "invalid_url"
  | "insecure_scheme"
  | "userinfo"
  | "redirect"
  | "address_not_allowed"
  | "auth_failed"
  | "permission_denied"
  | "not_found"
  | "rate_limited"
  | "upstream_rejected"
  | "upstream_error"
  | "timeout"
  | "network_error"
  | "tls_error"
  | "bad_response"

export interface Failure {
  readonly kind: FailureKind
  readonly error: GatewayError
  readonly retryable: boolean
  readonly health: boolean
  readonly retryAfterMs: number | null
  readonly condemns: boolean
}

/** Which way the call went: a catalog deployment or a user's credential. */
export type Via = "catalog" | "byok"

/** Upstream text longer than this is cut before it is logged. */
const MAX_LOGGED_DETAIL = 1_000
/** The `Retry-After` the client is told when the upstream gave none (seconds). */
const DEFAULT_RETRY_AFTER_S = 5

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

/** Auth and permission failures reject the credential they went through; nothing else does. */
export const rejectsCredential = (kind: FailureKind): boolean => kind === "auth_failed" || kind === "permission_denied"

/** The kind of a non-2xx, non-3xx answer. A 400 that talks about the key is an auth failure (Gemini does that). */
export const classifyStatus = (status: number, body: string): FailureKind => {
  if (status === 401) return "auth_failed"
  if (status === 403) return "permission_denied"
  if (status === 404) return "not_found"
  if (status === 429) return "rate_limited"
  if (status === 400 && /api[ _-]?key|invalid_api_key|unauthenticated|authenticat/i.test(body)) return "auth_failed"
  if (status >= 500) return "upstream_error"
  return "upstream_rejected"
}

export const codeOf = (error: unknown): string => {
  const e = error as { code?: unknown; cause?: { code?: unknown } } | null
  const code = e?.code ?? e?.cause?.code
  return typeof code === "string" ? code : ""
}

/** The kind of a transport error (a rejected request promise). */
export const classifyTransportError = (error: unknown): FailureKind => {
  const code = codeOf(error)
  if (code === "UND_ERR_CONNECT_TIMEOUT" || code === "UND_ERR_HEADERS_TIMEOUT" || code === "UND_ERR_BODY_TIMEOUT") {
    return "timeout"
  }
  if (
    code.startsWith("ERR_TLS_") || code.startsWith("ERR_SSL_") || code.includes("CERT") ||
    code === "DEPTH_ZERO_SELF_SIGNED_CERT" || code === "UNABLE_TO_VERIFY_LEAF_SIGNATURE" ||
    code === "SELF_SIGNED_CERT_IN_CHAIN"
  ) {
    return "tls_error"
  }
  return "network_error"
}

/** The longest `Retry-After` taken from an upstream (a day). */
const MAX_RETRY_AFTER_MS = 86_400_000

/**
 * An HTTP `Retry-After` (seconds, or an HTTP date) in milliseconds from `now`; undefined when absent or unreadable.
 * Bounded to a day.
 */
export const retryAfterMs = (header: string, now: number): number | undefined => {
  const text = header.trim()
  if (text.length === 0 || text.length > 64) return undefined
  const ms = /^\d+(\.\d+)?$/.test(text) ? Number(text) * 1000 : Date.parse(text) - now
  return Number.isFinite(ms) && ms > 0 ? Math.min(Math.ceil(ms), MAX_RETRY_AFTER_MS) : undefined
}

/** The kind of a failed upstream call. */
export const kindOf = (error: UpstreamError): FailureKind => {
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

/** GatewayErrors made here: their detail is upstream text, so request rows record the code only. */
const made = new WeakSet<GatewayError>()

/** Whether `error` was mapped from an upstream failure (its `detail` is log-only upstream text). */
export const isUpstreamFailure = (error: GatewayError): boolean => made.has(error)

const bounded = (text: string): string =>
  text.length > MAX_LOGGED_DETAIL ? `${text.slice(0, MAX_LOGGED_DETAIL)}...` : text

/** The client's seconds to wait after an upstream 429: the upstream's own figure when it gave one. */
const retryAfterSeconds = (error: UpstreamError): number =>
  error.retryAfterMs !== undefined ? Math.max(1, Math.ceil(error.retryAfterMs / 1000)) : DEFAULT_RETRY_AFTER_S

/** The client's answer, and whether another deployment may answer instead. */
const answer = (error: UpstreamError, detail: string): { error: GatewayError; retryable: boolean } => {
  switch (error.kind) {
    case "connect":
      return { error: fail("service_unavailable", { detail }), retryable: true }
    case "timeout":
      return { error: fail("upstream_timeout", { detail }), retryable: true }
    case "rate_limited":
      return { error: fail("upstream_rate_limited", { detail, retryAfter: retryAfterSeconds(error) }), retryable: true }
    case "protocol":
      return { error: fail("upstream_error", { detail }), retryable: true }
    case "address":
      return { error: fail("address_not_allowed", { detail }), retryable: false }
    case "status": {
      const status = error.status ?? 500
      if (status >= 500) return { error: fail("upstream_error", { detail }), retryable: true }
      if (status === 408) return { error: fail("upstream_timeout", { detail }), retryable: true }
      if (status === 429) {
        return { error: fail("upstream_rate_limited", { detail, retryAfter: retryAfterSeconds(error) }), retryable: true }
      }
      if (CONTEXT_STATUSES.has(status) && isContextLengthText(error.detail)) {
        return { error: fail("input_too_long", { detail }), retryable: false }
      }
      if (REJECTED.has(status)) return { error: fail("upstream_rejected", { detail }), retryable: false }
      // 401, 403 and the rest: this deployment's credentials or route are wrong; another one may be right.
      return { error: fail("upstream_error", { detail, shouldRetry: false }), retryable: true }
    }
  }
}

/** Classifies a failed upstream call made `via` a catalog deployment or a user's credential. */
export const classify = (error: UpstreamError, via: Via): Failure => {
  const detail = bounded(`${error.kind}${error.status ? ` ${error.status}` : ""}: ${error.detail}`)
  const kind = kindOf(error)
  const condemns = via === "byok" && rejectsCredential(kind)
  const mapped = condemns ? { error: fail("byok_credential_rejected", { detail }), retryable: false } : answer(error, detail)
  made.add(mapped.error)
  return {
    kind,
    error: mapped.error,
    retryable: mapped.retryable,
    // The request's own fault (refused as asked, too long, a URL the guard refuses) says nothing of the upstream.
    health: mapped.retryable,
    retryAfterMs: error.kind === "rate_limited" || error.status === 429 ? error.retryAfterMs ?? null : null,
    condemns
  }
}

/** The client's answer to a failed call through a catalog deployment. */
export const upstreamFailure = (error: UpstreamError): GatewayError => classify(error, "catalog").error

/** The client's answer to a failed call through a user's credential. */
export const byokUpstreamFailure = (error: UpstreamError): GatewayError => classify(error, "byok").error
