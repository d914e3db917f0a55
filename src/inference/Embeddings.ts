/**
 * `POST /v1/embeddings`: authenticate, open the exchange, prepare (EmbeddingsRequest.ts), admit, embed, answer
 * the OpenAI list shape. Same lifecycle as chat (Exchange.ts).
 */
import { Effect } from "effect"
import { HttpRouter, HttpServerRequest } from "effect/http"
import { Auth } from "../auth/Auth.js"
import { LiveCatalog, Settings } from "../config/Live.js"
import { renderInference } from "../errors/Render.js"
import { guard as guardFailures } from "../http/FailedRequests.js"
import { handle, headersOf, json } from "../http/Respond.js"
import { Admission } from "../quota/Admission.js"
import { RequestLog } from "../telemetry/RequestLog.js"
import { Upstreams } from "../upstream/Upstream.js"
import { prepareEmbeddings, toBase64Float32, fit } from "./EmbeddingsRequest.js"
import { Exchange, finishing } from "./Exchange.js"
import { upstreamFailure } from "./UpstreamErrors.js"

/** OpenApi.ts documents the request with the schema that validates it. */
export { EMBEDDING_DIMENSIONS, EmbeddingsRequest } from "./EmbeddingsRequest.js"

export const embeddings = HttpRouter.add(
  "POST",
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
        yield* guardFailures(caller)
        const exchange = yield* Exchange.open(caller, log)
        const run = Effect.gen(function*() {
          yield* auth.gate(caller, headersOf(request))
          const { inputs, model, request: req } = yield* prepareEmbeddings(
            request,
            exchange,
            settings.config.limits,
            catalog.current().byId
          )
          exchange.routeTo(model.route.provider)
          yield* exchange.admit(admission, {
            accountId: caller.account.id,
            plan: settings.planFor(caller.account.plan),
            model,
            estimatedInputTokens: exchange.estimatedInput,
            byok: false
          })
          const adapter = yield* upstreams.get(model.route.provider).pipe(Effect.mapError(upstreamFailure))
          const result = yield* adapter.embed(model.route.model, inputs).pipe(Effect.mapError(upstreamFailure))
          exchange.setUsage({ prompt_tokens: result.prompt_tokens, completion_tokens: 0, reasoning_tokens: 0, cached_tokens: 0 })
          exchange.markFirstByte()
          yield* exchange.succeed()
          return json({
            object: "list",
            data: result.vectors.map((v, index) => ({
              object: "embedding",
              index,
              embedding: req.encoding_format === "base64" ? toBase64Float32(fit(v)) : fit(v)
            })),
            model: req.model,
            usage: { prompt_tokens: result.prompt_tokens, total_tokens: result.prompt_tokens }
          }, 200, { "x-request-id": String(exchange.rowId) })
        })
        return yield* finishing(exchange, run)
      })
    )
  })
)
