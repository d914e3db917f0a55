import { HttpRouter, HttpServerRequest } from "@effect/platform"
import { Effect, Either, FiberRef, Schema } from "effect"
import { Auth } from "../auth/Auth.js"
import { LiveCatalog, Settings } from "../config/Live.js"
import { fail } from "../errors/Catalog.js"
import { renderInference } from "../errors/Render.js"
import { currentRequestId, handle, headersOf, json } from "../http/Respond.js"
import { Admission } from "../quota/Admission.js"
import { RequestLog } from "../telemetry/RequestLog.js"
import { Upstreams } from "../upstream/Upstream.js"
import { Exchange, finishing, parseBody, upstreamFailure } from "./Chat.js"
import { exceedsLimit } from "./Tokens.js"

/** Output dimension fixed by the spec. */
export const EMBEDDING_DIMENSIONS = 1024

const EmbeddingsRequest = Schema.Struct({
  model: Schema.String,
  input: Schema.Union(Schema.String, Schema.Array(Schema.String).pipe(Schema.minItems(1), Schema.maxItems(2048))),
  encoding_format: Schema.optionalWith(Schema.Literal("float"), { exact: true })
})
const decode = Schema.decodeUnknownEither(EmbeddingsRequest)

/** Pads or truncates to exactly 1024 dimensions, then re-normalizes. */
const fit = (vector: ReadonlyArray<number>): Array<number> => {
  const out = vector.slice(0, EMBEDDING_DIMENSIONS)
  while (out.length < EMBEDDING_DIMENSIONS) out.push(0)
  const norm = Math.sqrt(out.reduce((s, v) => s + v * v, 0)) || 1
  return out.map((v) => v / norm)
}

export const embeddings = HttpRouter.post(
  "/v1/embeddings",
  Effect.gen(function*() {
    const request = yield* HttpServerRequest.HttpServerRequest
    const auth = yield* Auth
    const catalog = yield* LiveCatalog
    const settings = yield* Settings
    const admission = yield* Admission
    const upstreams = yield* Upstreams
    const log = yield* RequestLog
    return yield* handle(
      renderInference,
      Effect.gen(function*() {
        const caller = yield* auth.authenticateKey(request.headers.authorization)
        const exchange = new Exchange(caller, yield* log.nextId, yield* FiberRef.get(currentRequestId), log)
        const run = Effect.gen(function*() {
          yield* auth.gate(caller, headersOf(request))
          const body = yield* parseBody(yield* request.text.pipe(Effect.mapError(() => fail("invalid_json"))))
          const req = yield* Either.mapLeft(decode(body), () =>
            fail("invalid_request", { message: "model(문자열)과 input(문자열 또는 문자열 배열)이 필요합니다." }))
          exchange.modelId = req.model
          const model = catalog.current().byId.get(req.model)
          if (!model || model.disabled) return yield* Effect.fail(fail("model_not_found"))
          if (!model.supports_embeddings) return yield* Effect.fail(fail("model_not_embedding"))
          const inputs = typeof req.input === "string" ? [req.input] : req.input
          const bytes = inputs.reduce((n, s) => n + Buffer.byteLength(s), 0)
          const { exceeds, tokens } = yield* exceedsLimit({ bytes, images: 0, texts: inputs }, model.max_input_tokens)
          if (exceeds) return yield* Effect.fail(fail("input_too_long"))
          exchange.estimatedInput = tokens
          exchange.provider = model.route.provider
          yield* exchange.admit(admission, {
            accountId: caller.account.id,
            plan: settings.planFor(caller.account.plan),
            model,
            estimatedInputTokens: tokens,
            byok: false
          })
          const adapter = yield* upstreams.get(model.route.provider).pipe(Effect.mapError(upstreamFailure))
          const result = yield* adapter.embed(model.route.model, inputs).pipe(Effect.mapError(upstreamFailure))
          exchange.usage = { prompt_tokens: result.prompt_tokens, completion_tokens: 0, reasoning_tokens: 0, cached_tokens: 0 }
          exchange.markFirstByte()
          yield* exchange.finish({ status: "success" })
          return json({
            object: "list",
            data: result.vectors.map((v, index) => ({ object: "embedding", index, embedding: fit(v) })),
            model: req.model,
            usage: { prompt_tokens: result.prompt_tokens, total_tokens: result.prompt_tokens }
          }, 200, { "x-request-id": String(exchange.rowId) })
        })
        return yield* finishing(exchange, run)
      })
    )
  })
)
