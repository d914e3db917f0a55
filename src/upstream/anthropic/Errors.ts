/**
 * Anthropic Messages API failures -> `UpstreamError`. Anthropic answers errors as
 * `{"type":"error","error":{"type":"<error type>","message":"..."},"request_id":"req_..."}`, either as the body
 * of a non-2xx answer or as an `error` event inside a 200 SSE stream.
 *
 * | error type            | HTTP | UpstreamError                    | client (src/upstream/Failure.ts)  |
 * |-----------------------|------|----------------------------------|-------------------------------------------|
 * | invalid_request_error | 400  | status 400                       | 400 upstream_rejected                     |
 * |   "prompt is too long"|      | status 400, detail tagged        | 400 input_too_long                        |
 * |                       |      | `context_length_exceeded`        |                                           |
 * | authentication_error  | 401  | status 401                       | 500 upstream_error, no retry              |
 * | billing_error         | 402  | status 402                       | 500 upstream_error, no retry              |
 * | permission_error      | 403  | status 403                       | 500 upstream_error, no retry              |
 * | not_found_error       | 404  | status 404                       | 400 upstream_rejected                     |
 * | request_too_large     | 413  | status 413                       | 400 upstream_rejected                     |
 * | rate_limit_error      | 429  | rate_limited (status 429)        | 503 upstream_rate_limited                 |
 * | api_error             | 500  | status 500                       | 500 upstream_error                        |
 * | timeout_error         | 504  | timeout (status 504)             | 503 upstream_timeout                      |
 * | overloaded_error      | 529  | rate_limited (status 529)        | 503 upstream_rate_limited                 |
 *
 * The HTTP status wins over the error type for the status; the type only adds `rate_limited` (overloaded, rate
 * limit) and `timeout` (timeout_error). An `error` event mid-stream has no status of its own: it takes the status
 * of its type from the table (500 for an unknown type).
 *
 * `detail` is log-only text: the upstream message with anything shaped like an Anthropic key (`sk-ant-...`) and
 * every run of 6 characters of the caller's own secrets replaced by `[redacted]` (`telemetry/LogText.ts`), then cut
 * to `MAX_MESSAGE` characters.
 */
import { clip as cut, type Redactor, redactorOf, REDACTED } from "../../telemetry/LogText.js"
import { UpstreamError } from "../Upstream.js"

/** Longest upstream message kept in `UpstreamError.detail`. */
export const MAX_MESSAGE = 500

/** The status Anthropic documents for each error type (used for `error` events, which carry none). */
export const ERROR_TYPE_STATUS: ReadonlyMap<string, number> = new Map([
  ["invalid_request_error", 400],
  ["authentication_error", 401],
  ["billing_error", 402],
  ["permission_error", 403],
  ["not_found_error", 404],
  ["request_too_large", 413],
  ["rate_limit_error", 429],
  ["api_error", 500],
  ["timeout_error", 504],
  ["overloaded_error", 529]
])

/**
 * How Anthropic says the prompt does not fit the context window: "prompt is too long: 208310 tokens > 200000
 * maximum", "input length and `max_tokens` exceed context limit: 188240 + 21333 > 200000, ...".
 */
const CONTEXT = /prompt is too long|exceeds? (?:the )?context (?:limit|window)|input length and `?max_tokens`? exceed/i

/** The tag `src/upstream/Failure.ts` recognises as a context-length refusal (as OpenAI's error code). */
const CONTEXT_TAG = "context_length_exceeded"

const ANTHROPIC_KEY = /sk-ant-[A-Za-z0-9_-]+/g

/** The caller's secrets (or their redactor), as given to the functions below. */
export type Secrets = ReadonlyArray<string> | Redactor

/** Redacted first (at most 64 KiB is read), then cut to `max`: a cut first could leave part of a secret. */
const clip = (text: string, max: number, redact: Redactor): string =>
  cut(redact(text).replace(ANTHROPIC_KEY, REDACTED), max)

const str = (u: unknown): string | undefined => (typeof u === "string" && u.length > 0 ? u : undefined)

type Kind = UpstreamError["kind"]

const classify = (status: number, type: string | undefined): Kind =>
  status === 429 || status === 529 || type === "rate_limit_error" || type === "overloaded_error"
    ? "rate_limited"
    : type === "timeout_error"
    ? "timeout"
    : "status"

const make = (
  status: number,
  type: string | undefined,
  message: string,
  what: string,
  secrets: Redactor
): UpstreamError => {
  const tags: Array<string> = []
  if (type !== undefined) tags.push(clip(type, 80, secrets))
  if ((status === 400 || status === 413) && CONTEXT.test(message)) tags.push(CONTEXT_TAG)
  const text = clip(message, MAX_MESSAGE, secrets)
  return new UpstreamError({
    kind: classify(status, type),
    status,
    detail: `${what}${tags.length > 0 ? ` (${tags.join(", ")})` : ""}${text ? `: ${text}` : ""}`
  })
}

/**
 * A non-2xx answer: `status` and the body text (read by the transport up to its error-body bound). `secrets`
 * (the credential sent) are removed from the detail should the upstream echo them.
 */
export const mapError = (status: number, body: string, given: Secrets = []): UpstreamError => {
  const secrets = redactorOf(given)
  let type: string | undefined
  let message = body
  let requestId: string | undefined
  try {
    const parsed = JSON.parse(body)
    const e = parsed?.error
    type = str(e?.type)
    if (typeof e?.message === "string") message = e.message
    else if (typeof e === "string") message = e
    else if (typeof parsed?.message === "string") message = parsed.message
    requestId = str(parsed?.request_id)
  } catch {
    // not JSON (a proxy's HTML page, say): keep the text
  }
  const what = `upstream answered ${status}${requestId ? ` [${clip(requestId, 64, secrets)}]` : ""}`
  return make(status, type, message, what, secrets)
}

/** An `error` event inside a streamed answer (its `error` member). */
export const errorFromEvent = (error: unknown, given: Secrets = []): UpstreamError => {
  const secrets = redactorOf(given)
  const e = typeof error === "object" && error !== null ? (error as Record<string, unknown>) : {}
  const type = str(e.type)
  const message = typeof e.message === "string" ? e.message : typeof error === "string" ? error : ""
  const status = (type !== undefined ? ERROR_TYPE_STATUS.get(type) : undefined) ?? 500
  return make(status, type, message, "upstream error event", secrets)
}

export const protocolError = (detail: string): UpstreamError => new UpstreamError({ kind: "protocol", detail })
