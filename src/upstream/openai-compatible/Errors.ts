/** OpenAI-compatible error bodies -> `UpstreamError` (mapped for clients in src/upstream/Failure.ts). */
import { clip, noRedaction, type Redactor } from "../../telemetry/LogText.js"
import { UpstreamError } from "../Upstream.js"

/** Longest upstream error message kept in `UpstreamError.detail` (which is only ever logged). */
const MAX_ERROR_MESSAGE = 500

/**
 * A non-2xx answer. The detail keeps the upstream's `error.code` / `error.type` (e.g.
 * `context_length_exceeded`, which the gateway maps to `input_too_long`) and its message, bounded. `redact`
 * (BYOK: the caller's secret) runs on the whole message before it is bounded.
 */
export const statusError = (status: number, body: string, redact: Redactor = noRedaction): UpstreamError => {
  let message = body
  let code = ""
  try {
    const parsed = JSON.parse(body)
    const e = parsed?.error
    if (typeof e === "string") message = e
    else if (typeof e?.message === "string") message = e.message
    else if (typeof parsed?.message === "string") message = parsed.message
    const tag = [e?.code, e?.type, parsed?.code, parsed?.type].find((t) => typeof t === "string" && t.length > 0)
    if (tag !== undefined) code = ` (${clip(redact(String(tag)), 80)})`
  } catch {
    // not JSON: keep the text
  }
  message = clip(redact(message), MAX_ERROR_MESSAGE)
  return new UpstreamError({
    kind: status === 429 ? "rate_limited" : "status",
    status,
    detail: `upstream answered ${status}${code}${message ? `: ${message}` : ""}`
  })
}
