/**
 * `POST /v1/embeddings`: the same life as chat's (Pipeline.ts): the exchange route, the body (EmbeddingsRequest.ts),
 * then the same plan (Plan.ts): a catalog model's pool step over its deployments, or a BYOK request's credential
 * then its fallback pool step. Answered in the OpenAI list shape.
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
import { runPlan } from "./Plan.js"
import { adapterFor, lookupModel, poolStep } from "./Pipeline.js"
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
      /** A catalog model's step: admitted against the pools, sent to its deployments. */
      const pooled = ({ inputs, model, request: req }: PoolEmbeddings) =>
        poolStep(
          exchange,
          admission,
          settings.planFor(caller.account.plan),
          model,
          Effect.map(
            embed(adapterFor(deployments, model, exchange), primaryDeployment(model).model, inputs, upstreamFailure),
            (result) => answer(exchange, model.id, req, result, true)
          )
        )
      return Effect.gen(function*() {
        const view = catalog.current()
        const prepared = yield* prepareEmbeddings(request, exchange, settings.config.limits, (id) => lookupModel(view, id))
        if (prepared._tag === "Pool") return yield* runPlan([() => Effect.succeed(pooled(prepared))])
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
