/**
 * The OpenAI-compatible chat codec: `POST <base>/chat/completions` with `encodeChatRequest`, answers
 * decoded by `ChatNormalizer` (SSE chunks or one `chat.completion` body), error bodies by
 * `statusError`. Sent and read by the shared HTTP transport (`../http/ChatCall.ts`).
 */
import type { ChatCodec, HttpRequest } from "../http/Codec.js"
import { encodeChatRequest, requestHeaders } from "./Encode.js"
import { statusError } from "./Errors.js"
import { ChatNormalizer } from "./Normalize.js"

/** `basePath`: the provider URL's path without a trailing slash (e.g. `/v1`); `apiKey`: sent as a bearer token. */
export const openAiChatCodec = (basePath: string, apiKey: string | undefined): ChatCodec => {
  const sseHeaders = requestHeaders(apiKey, "text/event-stream")
  const jsonHeaders = requestHeaders(apiKey, "application/json")
  const path = `${basePath}/chat/completions`
  return {
    encode: (request): HttpRequest => ({
      method: "POST",
      path,
      headers: request.stream ? sseHeaders : jsonHeaders,
      body: encodeChatRequest(request)
    }),
    decoder: () => new ChatNormalizer(),
    statusError
  }
}
