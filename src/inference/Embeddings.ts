/**
 * `POST /v1/embeddings`: authenticate, open the exchange, prepare (EmbeddingsRequest.ts), admit, embed, answer
 * the OpenAI list shape. Same lifecycle as chat (Exchange.ts); `@provider/...` models as chat's (ByokRoute.ts).
 */
import { Effect } from "effect"
import { HttpRouter } from "effect/http"
import { LiveCatalog, Settings } from "../config/Live.js"
import { renderInference } from "../errors/Render.js"
import { json } from "../http/Respond.js"
import { Admission } from "../quota/Admission.js"
import type { GatewayError } from "../errors/Catalog.js"
import { type UpstreamAdapter, type UpstreamError } from "../upstream/Upstream.js"
import { Deployments } from "../deployments/Router.js"
import { primaryDeployment } from "../config/GatewayConfig.js"
import { runByok } from "./ByokRoute.js"
import {
  type EmbeddingsRequest,
  embeddingsForModel,
  fit,
  type PoolEmbeddings,
  prepareEmbeddings,
  toBase64Float32
} from "./EmbeddingsRequest.js"
import { type Exchange, exchangeRoute } from "./Exchange.js"
import { upstreamFailure } from "../upstream/Failure.js"

/**
 * The OpenAI list shape; vectors of catalog models fitted to the spec's fixed size, BYOK vectors as they came.
 * `model` is the model that answered (a BYOK request that fell back names the pool model).
 */
const answer = (
  exchange: Exchange,
  model: string,
  req: EmbeddingsRequest,
  result: { readonly vectors: ReadonlyArray<ReadonlyArray<number>>; readonly prompt_tokens: number },
  fitted: boolean
) =>
  json({
    object: "list",
    data: result.vectors.map((v, index) => {
      const vector = fitted ? fit(v) : v
      return {
        object: "embedding",
        index,
        embedding: req.encoding_format === "base64" ? toBase64Float32(vector) : vector
      }
    }),
    model,
    usage: { prompt_tokens: result.prompt_tokens, total_tokens: result.prompt_tokens }
  }, 200, { "x-request-id": String(exchange.rowId) })

export const embeddings = HttpRouter.add(
  "POST",
  "/v1/embeddings",
  Effect.gen(function*() {
    const catalog = yield* LiveCatalog
    const settings = yield* Settings
    const admission = yield* Admission
    const deployments = yield* Deployments
    return yield* exchangeRoute({ render: renderInference, operation: "embeddings" }, (exchange, request) => {
      const caller = exchange.caller
      /** One call; the exchange completes with its usage. */
      const embed = (
        adapter: UpstreamAdapter,
        model: string,
        inputs: ReadonlyArray<string>,
        mapFailure: (error: UpstreamError) => GatewayError
      ) =>
        Effect.gen(function*() {
          exchange.markDispatched()
          const result = yield* adapter.embed(model, inputs).pipe(Effect.mapError(mapFailure))
          exchange.setUsage({ prompt_tokens: result.prompt_tokens, completion_tokens: 0, reasoning_tokens: 0, cached_tokens: 0 })
          exchange.markFirstByte()
          yield* exchange.succeed()
          return result
        })
      const pooled = ({ inputs, model, request: req }: PoolEmbeddings) =>
        Effect.gen(function*() {
          const primary = primaryDeployment(model)
          exchange.routeTo(primary.provider)
          yield* exchange.admit(admission, {
            accountId: caller.account.id,
            plan: settings.planFor(caller.account.plan),
            model,
            estimatedInputTokens: exchange.estimatedInput,
            byok: false
          })
          const adapter = deployments.forModel(model, exchange)
          return answer(exchange, model.id, req, yield* embed(adapter, primary.model, inputs, upstreamFailure), true)
        })
      return Effect.gen(function*() {
        const prepared = yield* prepareEmbeddings(request, exchange, settings.config.limits, catalog.current().byId)
        if (prepared._tag === "Pool") return yield* pooled(prepared)
        return yield* runByok(exchange, caller, prepared.reference, {
          attempt: (adapter, mapFailure) =>
            Effect.map(
              embed(adapter, prepared.reference.model, prepared.inputs, mapFailure),
              (result) => answer(exchange, prepared.request.model, prepared.request, result, false)
            ),
          fallback: (model) => Effect.map(embeddingsForModel(exchange, prepared.request, model), pooled)
        })
      })
    })
  })
)
