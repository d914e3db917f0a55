/**
 * The OpenAI-compatible chat codec: `POST <base>/chat/completions` with `encodeChatRequest`, answers
 * decoded by `ChatNormalizer` (SSE chunks or one `chat.completion` body), error bodies by
 * `statusError`. Sent and read by the shared HTTP transport (`../http/ChatCall.ts`).
 */
import type { Redactor } from "../../telemetry/LogText.js"
import type { ChatCodec, HttpRequest } from "../http/Codec.js"
import type { UpstreamError } from "../Upstream.js"
import { encodeChatRequest, requestHeaders } from "./Encode.js"
import { statusError } from "./Errors.js"
import { ChatNormalizer } from "./Normalize.js"

/** `basePath`: the provider URL's path without a trailing slash (e.g. `/v1`); `apiKey`: sent as a bearer token. */
export const openAiChatCodec = (basePath: string, apiKey: string | undefined): ChatCodec => {
  const path = `${basePath}/chat/completions`
  return openAiChatCodecWith({
    path: () => path,
    sseHeaders: requestHeaders(apiKey, "text/event-stream"),
    jsonHeaders: requestHeaders(apiKey, "application/json")
  })
}

export interface OpenAiChatTarget {
  /** The request path (with any query) for an upstream model id. */
  readonly path: (model: string) => string
  readonly sseHeaders: Readonly<Record<string, string>>
  readonly jsonHeaders: Readonly<Record<string, string>>
  /** OpenAI's own API wants `max_completion_tokens` (its reasoning models refuse `max_tokens`). */
  readonly maxTokensField?: "max_tokens" | "max_completion_tokens"
  /** Applied to every error the codec reports (BYOK: removes the user's secret from upstream text). */
  readonly mapError?: (error: UpstreamError) => UpstreamError
  /** Removes secrets from upstream text before it is bounded (BYOK: the user's secret). */
  readonly redact?: Redactor
}

/** The codec over any target: a per-model path and fixed header sets (BYOK credentials, Azure deployments). */
export const openAiChatCodecWith = (target: OpenAiChatTarget): ChatCodec => {
  const field = target.maxTokensField ?? "max_tokens"
  const mapError = target.mapError
  const redact = target.redact
  return {
    encode: (request): HttpRequest => ({
      method: "POST",
      path: target.path(request.model),
      headers: request.stream ? target.sseHeaders : target.jsonHeaders,
      body: encodeChatRequest(request, field)
    }),
    decoder: () => new ChatNormalizer(),
    statusError: mapError === undefined
      ? (status, body) => statusError(status, body, redact)
      : (status, body) => mapError(statusError(status, body, redact)),
    ...(redact !== undefined ? { redact } : {})
  }
}
