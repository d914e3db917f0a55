/**
 * The Anthropic Messages codec: pure, transport-free functions an adapter plugs into the shared upstream
 * transport. `encodeRequest` builds the request, `AnthropicSse` / `StreamDecoder` decode a streamed answer,
 * `decodeResponse` a whole one, `mapError` a non-2xx answer.
 */
export {
  ANTHROPIC_VERSION,
  type EncodedRequest,
  encodeRequest,
  type EncodeOptions,
  MESSAGES_PATH,
  MIN_THINKING_BUDGET,
  THINKING_BUDGETS,
  thinkingBudget,
  wireToolId
} from "./Encode.js"
export {
  AnthropicSse,
  decodeResponse,
  MAX_BLOCKS,
  MAX_EVENT_CHARS,
  MAX_TOOL_CALLS,
  mapStopReason,
  StreamDecoder
} from "./Decode.js"
export { ERROR_TYPE_STATUS, errorFromEvent, mapError, MAX_MESSAGE } from "./Errors.js"
