/**
 * `POST /v1/chat/completions`: the chat wire as a codec on the inference pipeline (Pipeline.ts). The request is
 * already the internal form (ChatRequest.ts); the answer is written by ChatWire.ts.
 */
import { Effect, Result } from "effect"
import { renderInference } from "../errors/Render.js"
import { CHAT_FIELDS, decodeChatRequest } from "./ChatRequest.js"
import { completionResponse, sseFraming } from "./ChatWire.js"
import { ignoredFields, type WireCodec } from "./Codec.js"
import { pipelineRoute } from "./Pipeline.js"
import { PING_FRAME } from "./SseBody.js"

export const chatCodec: WireCodec = {
  api: "chat",
  render: renderInference,
  decode: (body, _exchange, limits) => {
    const decoded = decodeChatRequest(body, limits)
    if (Result.isFailure(decoded)) return Effect.fail(decoded.failure)
    // decodeChatRequest succeeded: `body` is an object.
    const ignored = ignoredFields(body as Record<string, unknown>, CHAT_FIELDS)
    return Effect.succeed(ignored.length > 0 ? { request: decoded.success, ignored } : { request: decoded.success })
  },
  answer: completionResponse,
  stream: sseFraming,
  ping: PING_FRAME
}

export const chatCompletions = pipelineRoute("/v1/chat/completions", chatCodec)
