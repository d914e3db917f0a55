/**
 * The Anthropic Messages API: `POST /v1/messages` as a wire codec on the inference pipeline, and
 * `POST /v1/messages/count_tokens` (the input counted with the gateway's tokenizer; no upstream call, no charge).
 */
import { Effect, Result } from "effect"
import { HttpRouter, HttpServerRequest } from "effect/http"
import { Auth, type Caller } from "../../auth/Auth.js"
import { LiveCatalog, Settings } from "../../config/Live.js"
import { fail, InferenceMessages } from "../../errors/Catalog.js"
import { readJsonWith } from "../../http/Body.js"
import { guard as guardFailures, recordFailure } from "../../http/FailedRequests.js"
import { handle, headersOf, json } from "../../http/Respond.js"
import { checkModel } from "../../inference/ChatPrepare.js"
import type { WireCodec } from "../../inference/Codec.js"
import { lookupModel, pipelineRoute } from "../../inference/Pipeline.js"
import { countInput, measure } from "../../inference/Tokens.js"
import { decodeMessagesRequest } from "./Request.js"
import { messageFraming, messageResponse, PING_EVENT, renderAnthropic } from "./Wire.js"

export const messagesCodec: WireCodec = {
  api: "messages",
  xApiKey: true,
  render: renderAnthropic,
  decode: (body, _exchange, limits) => {
    const decoded = decodeMessagesRequest(body, limits)
    return Result.isFailure(decoded) ? Effect.fail(decoded.failure) : Effect.succeed(decoded.success)
  },
  answer: messageResponse,
  stream: messageFraming,
  ping: PING_EVENT
}

export const messages = pipelineRoute("/v1/messages", messagesCodec)

/**
 * `{input_tokens}` of a Messages body on a catalog model: the key (as `/v1/messages` takes it), the
 * failed-request guard and the account gates, the same decoding and model gates, then the o200k count of the
 * translated input, stopped at the model's input limit (400 `input_too_long` past it).
 */
export const countTokens = HttpRouter.add(
  "POST",
  "/v1/messages/count_tokens",
  Effect.gen(function*() {
    const request = yield* HttpServerRequest.HttpServerRequest
    const auth = yield* Auth
    const settings = yield* Settings
    const catalog = yield* LiveCatalog
    return yield* handle(renderAnthropic, countAnswer(request, auth, settings, catalog))
  })
)

/** `count_tokens`'s answer, made once (see "No generator function per request" in docs/decisions.md). */
const countAnswer = Effect.fnUntraced(function*(
  request: HttpServerRequest.HttpServerRequest,
  auth: typeof Auth.Service,
  settings: typeof Settings.Service,
  catalog: typeof LiveCatalog.Service
) {
  const caller = yield* auth.bearer(request, true)
  yield* guardFailures(caller)
  return yield* countChecked(request, auth, settings, catalog, caller).pipe(
    Effect.tapError((error) => recordFailure(caller, error))
  )
})

const countChecked = Effect.fnUntraced(function*(
  request: HttpServerRequest.HttpServerRequest,
  auth: typeof Auth.Service,
  settings: typeof Settings.Service,
  catalog: typeof LiveCatalog.Service,
  caller: Caller
) {
  yield* auth.gate(caller, headersOf(request))
  const limits = settings.config.limits
  const body = yield* readJsonWith(request, limits)
  const decoded = decodeMessagesRequest(body, limits, true)
  if (Result.isFailure(decoded)) return yield* Effect.fail(decoded.failure)
  const req = decoded.success.request
  // Thinking does not change the input: the effort is not checked here.
  const { reasoning_effort: _, ...input } = req
  const checked = checkModel(input, lookupModel(catalog.current(), req.model))
  if (Result.isFailure(checked)) return yield* Effect.fail(checked.failure)
  const model = checked.success.model
  const size = measure(req.messages, req.tools)
  if (size.images > 0 && !model.supports_images) return yield* Effect.fail(fail("images_not_supported"))
  const { exceeds, tokens } = yield* countInput(size, model.max_input_tokens)
  if (exceeds) {
    return yield* Effect.fail(
      fail("input_too_long", { message: InferenceMessages.inputTooLong(model.max_input_tokens, tokens) })
    )
  }
  return json({ input_tokens: tokens })
})
