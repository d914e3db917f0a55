/**
 * `POST /v1/chat/completions`: authenticate, open the exchange, prepare (ChatPrepare.ts), admit, dispatch, and
 * answer in JSON or SSE (ChatWire.ts). A `@provider/...` model goes through the caller's credential
 * (ByokRoute.ts). The exchange (Exchange.ts) completes once, whichever way this ends.
 */
import { Effect } from "effect"
import { HttpRouter } from "effect/http"
import { type PlanConfig, primaryDeployment } from "../config/GatewayConfig.js"
import { LiveCatalog, Settings } from "../config/Live.js"
import { renderInference } from "../errors/Render.js"
import { Admission } from "../quota/Admission.js"
import { completeChat } from "../upstream/Complete.js"
import type { GatewayError } from "../errors/Catalog.js"
import { type UpstreamAdapter, type UpstreamError, type UpstreamRequest } from "../upstream/Upstream.js"
import { Deployments } from "../deployments/Router.js"
import { runByok } from "./ByokRoute.js"
import { type PoolChat, prepareChat, prepareForModel } from "./ChatPrepare.js"
import { accumulate, completionResponse, sseFraming, streamHeaders } from "./ChatWire.js"
import { Exchange, exchangeRoute } from "./Exchange.js"
import { sseBody, sseResponse } from "./SseBody.js"
import { upstreamFailure } from "../upstream/Failure.js"

type MapFailure = (error: UpstreamError) => GatewayError

/** A non-stream answer: the whole answer in one call, then the exchange completes and the body is written. */
const complete = (
  exchange: Exchange,
  plan: PlanConfig,
  adapter: UpstreamAdapter,
  request: UpstreamRequest,
  mapFailure: MapFailure
) =>
  Effect.gen(function*() {
    exchange.markDispatched()
    const events = yield* Effect.mapError(completeChat(adapter, request), mapFailure)
    const answer = accumulate(events, exchange)
    exchange.markFirstByte()
    const settled = yield* exchange.succeed()
    return completionResponse(exchange, answer, plan, settled)
  })

/** A stream: the SSE body fed by the upstream call; the exchange completes from its callbacks. */
const streamed = (
  exchange: Exchange,
  plan: PlanConfig,
  adapter: UpstreamAdapter,
  request: UpstreamRequest,
  mapFailure: MapFailure
) =>
  Effect.gen(function*() {
    const context = yield* Effect.context<never>()
    const framing = sseFraming(exchange)
    exchange.markDispatched()
    // A failure before the first event (or before the wait for it ran out) is still a JSON error.
    const body = yield* sseBody(
      context,
      exchange.scope,
      (sink) => adapter.open(request, sink),
      framing.head,
      {
        started: () => exchange.markFirstEvent(),
        frames: framing.frames,
        end: Effect.map(exchange.succeed(), (settled) => framing.last(plan, settled)),
        failed: (error) =>
          Effect.suspend(() => {
            if (error.usage) exchange.setUsage(error.usage)
            return exchange.fail(mapFailure(error))
          }).pipe(Effect.asVoid),
        cancelled: Effect.asVoid(exchange.cancel())
      }
    ).pipe(Effect.mapError(mapFailure))
    return yield* sseResponse(body, streamHeaders(exchange))
  })

export const chatCompletions = HttpRouter.add(
  "POST",
  "/v1/chat/completions",
  Effect.gen(function*() {
    const catalog = yield* LiveCatalog
    const settings = yield* Settings
    const admission = yield* Admission
    const deployments = yield* Deployments

    return yield* exchangeRoute({ render: renderInference }, (exchange, request) => {
      const caller = exchange.caller
      const plan = settings.planFor(caller.account.plan)
      const respond = (adapter: UpstreamAdapter, upstream: UpstreamRequest, mapFailure: MapFailure) =>
        upstream.stream
          ? streamed(exchange, plan, adapter, upstream, mapFailure)
          : complete(exchange, plan, adapter, upstream, mapFailure)
      /** A catalog model: admitted against the pools, sent to its provider. */
      const pooled = ({ model, upstream }: PoolChat) =>
        Effect.gen(function*() {
          exchange.routeTo(primaryDeployment(model).provider)
          yield* exchange.admit(admission, {
            accountId: caller.account.id,
            plan,
            model,
            estimatedInputTokens: exchange.estimatedInput,
            byok: false
          })
          return yield* respond(deployments.forModel(model, exchange), upstream, upstreamFailure)
        })

      return Effect.gen(function*() {
        const prepared = yield* prepareChat(request, exchange, settings.config.limits, catalog.current().byId)
        if (prepared._tag === "Pool") return yield* pooled(prepared)
        return yield* runByok(exchange, caller, prepared.reference, {
          attempt: (adapter, mapFailure) => respond(adapter, prepared.upstream, mapFailure),
          fallback: (model) =>
            Effect.map(prepareForModel(exchange, prepared.request, model), pooled)
        })
      })
    })
  })
)
