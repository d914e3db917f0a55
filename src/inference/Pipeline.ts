/**
 * The life of one inference request, whatever wire it came in on (chat completions, Anthropic Messages, OpenAI
 * Responses), top to bottom; the wire codec (Codec.ts) translates at the edges:
 *
 * 1. `exchangeRoute`: the key (`Authorization: Bearer`, or `x-api-key` for a codec that asks), the failed-request
 *    guard, the exchange (from here every outcome leaves a request row), the account gates;
 * 2. the body, read under the body bounds (http/Body.ts), decoded by the codec into the internal `ChatRequest`;
 * 3. the model (aliases resolved), its capability gates and `input_too_long` (ChatPrepare.ts);
 * 4. admission (RPM, quotas, in-flight cap) -- or, for a `@provider/...` model, the caller's credential
 *    (ByokRoute.ts);
 * 5. the upstream call through `adapterFor`, answered whole (the codec's `answer`) or streamed (the codec's
 *    framing on SseBody.ts), the exchange completing once, whichever way this ends.
 */
import { Context, Effect } from "effect"
import { HttpRouter, type HttpServerRequest } from "effect/http"
import { type ModelConfig, type PlanConfig, primaryDeployment } from "../config/GatewayConfig.js"
import { type CatalogView, LiveCatalog, Settings } from "../config/Live.js"
import type { GatewayError } from "../errors/Catalog.js"
import { readJsonWith } from "../http/Body.js"
import { Admission } from "../quota/Admission.js"
import { completeChat } from "../upstream/Complete.js"
import type { UpstreamAdapter, UpstreamError, UpstreamRequest } from "../upstream/Upstream.js"
import { Deployments } from "../deployments/Router.js"
import { isByokModel } from "../byok/Reference.js"
import type { ReasoningEffort } from "../wire/ChatSchemas.js"
import { runByok } from "./ByokRoute.js"
import { runPlan, type Step } from "./Plan.js"
import type { ChatRequest } from "./ChatRequest.js"
import { type PoolChat, prepareForModel, prepareRequest } from "./ChatPrepare.js"
import { accumulate, emptyAnswer, foldEvents, safeReceipt, settledHeaders, streamHeaders } from "./ChatWire.js"
import type { Decoded, WireCodec } from "./Codec.js"
import { type AnswerMeter, type Exchange, exchangeHandler, exchangeServicesOf } from "./Exchange.js"
import type { Auth } from "../auth/Auth.js"
import type { FailedRequests } from "../http/FailedRequests.js"
import type { RequestLog } from "../telemetry/RequestLog.js"
import { modelIdOfBody } from "./JsonGuard.js"
import { sseBody, sseResponse } from "./SseBody.js"
import { upstreamFailure } from "../upstream/Failure.js"

type MapFailure = (error: UpstreamError) => GatewayError

/**
 * The adapter that serves a catalog model: the deployment router (balanced over the model's deployments, with
 * failover before the first byte; its attempts counted on the meter). The one place the pool path picks its
 * upstream.
 */
export const adapterFor = (
  deployments: Context.Service.Shape<typeof Deployments>,
  model: ModelConfig,
  meter: AnswerMeter
): UpstreamAdapter => deployments.forModel(model, meter)

/** The catalog model a client's `model` names: a model id, else an alias of one (`catalog.aliases`). */
export const lookupModel = (view: CatalogView, id: string): ModelConfig | undefined => {
  const model = view.byId.get(id)
  if (model !== undefined) return model
  const aliases = view.catalog.aliases
  return Object.hasOwn(aliases, id) ? view.byId.get(aliases[id]!) : undefined
}

const EFFORT_RANK: ReadonlyArray<string> = ["none", "low", "high", "max"]

/**
 * The allowed effort nearest to `wanted` (the higher one on a tie); undefined when the model allows none. An
 * unknown `wanted` ranks as `high`.
 */
export const nearestEffort = (wanted: string, model: ModelConfig | undefined): ReasoningEffort | undefined => {
  const allowed = model !== undefined && model.supports_reasoning ? model.reasoning_efforts : []
  const exact = allowed.find((e) => e === wanted)
  if (exact !== undefined) return exact
  const rank = EFFORT_RANK.indexOf(wanted) === -1 ? 2 : EFFORT_RANK.indexOf(wanted)
  let best: ReasoningEffort | undefined
  let distance = Number.POSITIVE_INFINITY
  for (const effort of allowed) {
    const d = Math.abs(EFFORT_RANK.indexOf(effort) - rank)
    if (d < distance || (d === distance && best !== undefined && EFFORT_RANK.indexOf(effort) > EFFORT_RANK.indexOf(best))) {
      best = effort
      distance = d
    }
  }
  return best
}

/** The request with a preferred effort settled against its model (see `Decoded.effortPreference`). */
const settleEffort = (decoded: Decoded, view: CatalogView): ChatRequest => {
  const request = decoded.request
  if (decoded.effortPreference !== true || request.reasoning_effort === undefined || isByokModel(request.model)) {
    return request
  }
  const effort = nearestEffort(request.reasoning_effort, lookupModel(view, request.model))
  const { reasoning_effort: _, ...rest } = request
  return effort === undefined ? rest : { ...rest, reasoning_effort: effort }
}

/** Headers every success of this request carries besides the quota ones. */
const extraHeaders = (decoded: Decoded): Record<string, string> =>
  decoded.ignored !== undefined && decoded.ignored.length > 0
    ? { "x-wellspring-ignored-fields": decoded.ignored.join(", ") }
    : {}

/** The step of a catalog model (Plan.ts): routed to its first deployment's provider for the row, admitted. */
export const poolStep = <A, R>(
  exchange: Exchange,
  admission: Context.Service.Shape<typeof Admission>,
  plan: PlanConfig,
  model: ModelConfig,
  run: Effect.Effect<A, GatewayError, R>
): Step<A, R> => ({
  admit: Effect.suspend(() => {
    exchange.routeTo(primaryDeployment(model).provider)
    return Effect.asVoid(exchange.admit(admission, {
      accountId: exchange.caller.account.id,
      plan,
      model,
      estimatedInputTokens: exchange.estimatedInput,
      byok: false
    }))
  }),
  run
})

/** What every answer of one request is written with: its codec, exchange, plan and extra headers. */
interface Answering {
  readonly codec: WireCodec
  readonly exchange: Exchange
  readonly plan: PlanConfig
  readonly extra: Record<string, string>
}

/** A non-stream answer: the whole answer in one call, then the exchange completes and the body is written. */
const complete = (
  { codec, exchange, extra, plan }: Answering,
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
    if (codec.completed !== undefined) yield* codec.completed(exchange, answer)
    const headers = { ...settledHeaders(exchange, settled), ...extra }
    return codec.answer(exchange, answer, { receipt: safeReceipt(exchange, plan, settled), headers })
  })

/** A stream: the SSE body fed by the upstream call; the exchange completes from its callbacks. */
const streamed = (
  { codec, exchange, extra, plan }: Answering,
  adapter: UpstreamAdapter,
  request: UpstreamRequest,
  mapFailure: MapFailure
) =>
  Effect.gen(function*() {
    const context = yield* Effect.context<never>()
    // The same exchange, read through its view and counted through its meter.
    const framing = codec.stream(exchange, exchange)
    // A codec that keeps the finished answer gets a copy of the events folded alongside the frames.
    const hook = codec.completed
    const kept = hook === undefined ? null : emptyAnswer()
    const frames = kept === null ? framing.frames : (events: Parameters<typeof framing.frames>[0]) => {
      foldEvents(kept, events)
      return framing.frames(events)
    }
    exchange.markDispatched()
    // A failure before the first event (or before the wait for it ran out) is still an error in the codec's envelope.
    const body = yield* sseBody(
      context,
      exchange.scope,
      (sink) => adapter.open(request, sink),
      framing.head,
      {
        started: () => exchange.markFirstEvent(),
        frames,
        end: Effect.flatMap(exchange.succeed(), (settled) =>
          Effect.as(
            hook === undefined || kept === null ? Effect.void : hook(exchange, kept),
            framing.last(safeReceipt(exchange, plan, settled))
          )),
        failed: (error) =>
          Effect.suspend(() => {
            if (error.usage) exchange.setUsage(error.usage)
            const mapped = mapFailure(error)
            return Effect.as(exchange.fail(mapped), framing.failed(mapped))
          }),
        cancelled: Effect.asVoid(exchange.cancel()),
        ping: codec.ping
      }
    ).pipe(Effect.mapError(mapFailure))
    return yield* sseResponse(body, { ...streamHeaders(exchange), ...extra })
  })

/** Runs one request of `codec` on an opened exchange (step 2 on). */
const run = (
  codec: WireCodec,
  exchange: Exchange,
  request: HttpServerRequest.HttpServerRequest,
  services: {
    readonly catalog: Context.Service.Shape<typeof LiveCatalog>
    readonly settings: Context.Service.Shape<typeof Settings>
    readonly admission: Context.Service.Shape<typeof Admission>
    readonly deployments: Context.Service.Shape<typeof Deployments>
  }
) =>
  Effect.gen(function*() {
    const { admission, catalog, deployments, settings } = services
    const caller = exchange.caller
    const plan = settings.planFor(caller.account.plan)
    const limits = settings.config.limits

    const body = yield* readJsonWith(request, limits)
    exchange.requestedModel(modelIdOfBody(body))
    const decoded = yield* codec.decode(body, exchange, limits)
    const answering: Answering = { codec, exchange, plan, extra: extraHeaders(decoded) }

    const respond = (adapter: UpstreamAdapter, upstream: UpstreamRequest, mapFailure: MapFailure) =>
      upstream.stream
        ? streamed(answering, adapter, upstream, mapFailure)
        : complete(answering, adapter, upstream, mapFailure)

    /** A catalog model's step: admitted against the pools, sent to its deployments. */
    const pooled = ({ model, upstream }: PoolChat) =>
      poolStep(exchange, admission, plan, model, respond(adapterFor(deployments, model, exchange), upstream, upstreamFailure))

    const view = catalog.current()
    const prepared = yield* prepareRequest(exchange, settleEffort(decoded, view), (id) => lookupModel(view, id))
    if (prepared._tag === "Pool") return yield* runPlan([() => Effect.succeed(pooled(prepared))])
    return yield* runByok(exchange, caller, prepared.reference, {
      attempt: (adapter, mapFailure) => respond(adapter, prepared.upstream, mapFailure),
      fallback: (model) => Effect.map(prepareForModel(exchange, prepared.request, model), pooled)
    })
  })

/** What a pipeline route requires of the app: its services, resolved once per router (see `pipelineRoute`). */
type RouteServices = LiveCatalog | Settings | Admission | Deployments | Auth | RequestLog | FailedRequests

/**
 * The `POST` route of one wire codec on the pipeline. Its services are taken from the first request's context
 * and kept for this router (one gateway: the app's services do not change between requests), instead of seven
 * lookups on every request; building the route needs no service (`listRoutes` records routes with none).
 */
export const pipelineRoute = <R = never>(
  path: `/${string}`,
  /** The codec, or how to make it from the app's services (made once per router, with the handler). */
  codec: WireCodec | ((context: Context.Context<R>) => WireCodec)
) =>
  HttpRouter.use((router) =>
    Effect.suspend(() => {
      let handler: ReturnType<typeof routeHandler> | undefined
      const route = Effect.withFiber((fiber) =>
        handler ??= routeHandler(
          typeof codec === "function" ? codec(fiber.context as Context.Context<R>) : codec,
          fiber.context as Context.Context<RouteServices>
        )
      )
      // The services are read from the request's context: the route still requires them.
      type Required = Effect.Services<typeof route> | RouteServices | R
      return router.add("POST", path, route as Effect.Effect<Effect.Success<typeof route>, never, Required>)
    })
  )

/** One codec's per-request handler with its services at hand. */
const routeHandler = (codec: WireCodec, context: Context.Context<RouteServices>) => {
  const services = {
    catalog: Context.get(context, LiveCatalog),
    settings: Context.get(context, Settings),
    admission: Context.get(context, Admission),
    deployments: Context.get(context, Deployments)
  }
  return exchangeHandler(
    exchangeServicesOf(context),
    { render: codec.render, xApiKey: codec.xApiKey === true, api: codec.api },
    (exchange, request) => run(codec, exchange, request, services)
  )
}
