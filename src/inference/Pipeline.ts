/**
 * The life of one inference request, top to bottom: chat on every wire (chat completions, Anthropic Messages,
 * OpenAI Responses; the wire codec, Codec.ts, translates at the edges) and embeddings, in the order of checks
 * (ARCHITECTURE §5):
 *
 * 1. `exchangeHandler` (Exchange.ts): the key (`Authorization: Bearer`, or `x-api-key` for a codec that asks),
 *    the failed-request guard, the exchange (from here every outcome leaves a request row), the account gates;
 * 2. the body, read under the body bounds (http/Body.ts), and decoded (a chat request by the codec, into the
 *    internal `ChatRequest`);
 * 3. the model (aliases resolved; `@provider/...` is a credential reference), its capability gates, the size and
 *    `input_too_long` (ChatPrepare.ts, EmbeddingsRequest.ts);
 * 4. admission (RPM, quotas, in-flight cap) -- or, for a `@provider/...` model, the caller's credential, then
 *    its fallback to a pool model (ByokRoute.ts, Plan.ts);
 * 5. the upstream call through `adapterFor`, answered whole (the codec's `answer`) or streamed (the codec's
 *    framing on SseBody.ts), the exchange completing once, whichever way this ends.
 *
 * Each step returns its result and this module records it on the exchange, as the steps run: the body's model,
 * the description (stream, tools, tool_choice), the resolved model, the input estimate, the route (provider,
 * BYOK, fallback). Steps and codecs do not change those themselves. While the answer flows, the answer writers
 * and the deployment router count through the exchange's `AnswerMeter`; codecs read it through `ExchangeView`.
 *
 * The steps written as generators are `Effect.fnUntraced` bodies made once here, never `Effect.gen` made per
 * request: each generator function made per request kept the whole request alive in the old generation until the
 * next mark-compact (docs/decisions.md, "No generator function per request").
 */
import { Context, Effect, Result } from "effect"
import { HttpRouter, type HttpServerRequest, type HttpServerResponse } from "effect/http"
import { type ModelConfig, type PlanConfig, primaryDeployment } from "../config/GatewayConfig.js"
import { type CatalogView, LiveCatalog, Settings } from "../config/Live.js"
import { GatewayError } from "../errors/Catalog.js"
import { renderInference } from "../errors/Render.js"
import { readJsonWith } from "../http/Body.js"
import { Admission } from "../quota/Admission.js"
import { completeChat } from "../upstream/Complete.js"
import type { UpstreamAdapter, UpstreamError, UpstreamRequest } from "../upstream/Upstream.js"
import { Deployments } from "../deployments/Router.js"
import { isByokModel, parseReference } from "../byok/Reference.js"
import type { ReasoningEffort } from "../wire/ChatSchemas.js"
import { byokSteps } from "./ByokRoute.js"
import { runPlan, type Step } from "./Plan.js"
import type { ChatRequest } from "./ChatRequest.js"
import { badReference, chatForModel, chatOnModel, chatThroughCredential, checkModel, describeChat } from "./ChatPrepare.js"
import { accumulate, emptyAnswer, foldEvents, safeReceipt, settledHeaders, streamHeaders } from "./ChatWire.js"
import type { Decoded, WireCodec } from "./Codec.js"
import {
  checkEmbeddingsModel,
  decodeEmbeddingsRequest,
  embeddingsAnswer,
  embeddingsForModel,
  embeddingsOnModel,
  type EmbeddingsRequest,
  embeddingsThroughCredential
} from "./EmbeddingsRequest.js"
import { type AnswerMeter, type Exchange, exchangeHandler, exchangeServicesOf } from "./Exchange.js"
import type { Auth } from "../auth/Auth.js"
import type { FailedRequests } from "../http/FailedRequests.js"
import type { RequestLog } from "../telemetry/RequestLog.js"
import { modelIdOfBody } from "./JsonGuard.js"
import { sseBody, sseResponse } from "./SseBody.js"
import { upstreamFailure } from "../upstream/Failure.js"

type MapFailure = (error: UpstreamError) => GatewayError

/** The app's services the pipeline uses, resolved once per router (`postOnce`). */
interface PipelineServices {
  readonly catalog: Context.Service.Shape<typeof LiveCatalog>
  readonly settings: Context.Service.Shape<typeof Settings>
  readonly admission: Context.Service.Shape<typeof Admission>
  readonly deployments: Context.Service.Shape<typeof Deployments>
}

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

// ----- step 4, shared by chat and embeddings

/** A catalog model's admission against the pools; the ticket lives on the exchange. */
const admitToPool = (
  exchange: Exchange,
  admission: Context.Service.Shape<typeof Admission>,
  plan: PlanConfig,
  model: ModelConfig
) =>
  exchange.admit(admission, {
    accountId: exchange.caller.account.id,
    plan,
    model,
    estimatedInputTokens: exchange.estimatedInput,
    byok: false
  })

/**
 * The step a BYOK request falls back to (ByokRoute.ts), for the request prepared on its pool model: recorded as
 * the fallback (row: `fell_back`, the pool model and its input estimate; the credential's provider stays), then
 * admitted as a pool request.
 */
const fallbackStep = <A, R>(
  exchange: Exchange,
  admission: Context.Service.Shape<typeof Admission>,
  plan: PlanConfig,
  prepared: { readonly model: ModelConfig; readonly estimatedInput: number },
  run: Effect.Effect<A, GatewayError, R>
): Step<A, R> => ({
  admit: Effect.andThen(
    exchange.fallBack(prepared.model.id, prepared.estimatedInput),
    Effect.suspend(() => Effect.asVoid(admitToPool(exchange, admission, plan, prepared.model)))
  ),
  run
})

// ----- step 5 of a chat request

/** What every answer of one request is written with: its codec, exchange, plan and extra headers. */
interface Answering {
  readonly codec: WireCodec
  readonly exchange: Exchange
  readonly plan: PlanConfig
  readonly extra: Record<string, string>
}

/** A non-stream answer: the whole answer in one call, then the exchange completes and the body is written. */
const complete = Effect.fnUntraced(function*(
  { codec, exchange, extra, plan }: Answering,
  adapter: UpstreamAdapter,
  request: UpstreamRequest,
  mapFailure: MapFailure
) {
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
const streamed = Effect.fnUntraced(function*(
  { codec, exchange, extra, plan }: Answering,
  adapter: UpstreamAdapter,
  request: UpstreamRequest,
  mapFailure: MapFailure
) {
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

const respond = (answering: Answering, adapter: UpstreamAdapter, request: UpstreamRequest, mapFailure: MapFailure) =>
  request.stream ? streamed(answering, adapter, request, mapFailure) : complete(answering, adapter, request, mapFailure)

// ----- the two lives

/** One chat request of `codec` on an opened exchange (steps 2 to 5), each step's result recorded as it comes. */
const runChat = Effect.fnUntraced(function*(
  codec: WireCodec,
  exchange: Exchange,
  request: HttpServerRequest.HttpServerRequest,
  { admission, catalog, deployments, settings }: PipelineServices
) {
  const plan = settings.planFor(exchange.caller.account.plan)
  const limits = settings.config.limits

  // 2. The body; its decoding; the description.
  const body = yield* readJsonWith(request, limits)
  exchange.requestedModel(modelIdOfBody(body))
  const decoded = yield* codec.decode(body, exchange, limits)
  const view = catalog.current()
  const req = settleEffort(decoded, view)
  exchange.describe(describeChat(req))
  const answering: Answering = { codec, exchange, plan, extra: extraHeaders(decoded) }

  if (isByokModel(req.model)) {
    // 3. The credential reference; the size.
    const reference = parseReference(req.model)
    if (reference === null) return yield* Effect.fail(badReference())
    exchange.resolveModel(req.model)
    const prepared = yield* chatThroughCredential(req, reference)
    exchange.setEstimatedInput(prepared.estimatedInput)
    // 4. The credential, then its fallback to a pool model; 5. the call.
    const byok = yield* byokSteps(exchange, reference, {
      attempt: (adapter, mapFailure) => respond(answering, adapter, prepared.upstream, mapFailure),
      fallback: (model) =>
        Effect.map(chatForModel(req, model), (pool) =>
          fallbackStep(
            exchange,
            admission,
            plan,
            pool,
            respond(answering, adapterFor(deployments, pool.model, exchange), pool.upstream, upstreamFailure)
          ))
    })
    exchange.routeByok(byok.provider)
    return yield* runPlan(byok.steps)
  }

  // 3. The catalog model and its gates; the size.
  const checked = checkModel(req, lookupModel(view, req.model))
  if (Result.isFailure(checked)) return yield* Effect.fail(checked.failure)
  exchange.resolveModel(checked.success.model.id)
  const prepared = yield* chatOnModel(req, checked.success)
  exchange.setEstimatedInput(prepared.estimatedInput)
  // 4. Admission, routed to the model's first deployment's provider; 5. the call.
  exchange.routeTo(primaryDeployment(prepared.model).provider)
  yield* admitToPool(exchange, admission, plan, prepared.model)
  return yield* respond(answering, adapterFor(deployments, prepared.model, exchange), prepared.upstream, upstreamFailure)
})

/**
 * Step 5 of an embeddings request: one call, the exchange completed with its usage, the list answer. `pool` is the
 * catalog model that answers (vectors fitted, named by its id); null through a credential (vectors as they came,
 * named as requested).
 */
const embed = Effect.fnUntraced(function*(
  exchange: Exchange,
  req: EmbeddingsRequest,
  adapter: UpstreamAdapter,
  upstreamModel: string,
  inputs: ReadonlyArray<string>,
  mapFailure: MapFailure,
  pool: ModelConfig | null
) {
  exchange.markDispatched()
  const result = yield* adapter.embed(upstreamModel, inputs).pipe(Effect.mapError(mapFailure))
  exchange.setUsage({ prompt_tokens: result.prompt_tokens, completion_tokens: 0, reasoning_tokens: 0, cached_tokens: 0 })
  exchange.markFirstByte()
  yield* exchange.succeed()
  return embeddingsAnswer(exchange.rowId, pool === null ? req.model : pool.id, req, result, pool !== null)
})

/** The embeddings call on a catalog model, through its deployments. */
const embedOnPool = (
  exchange: Exchange,
  req: EmbeddingsRequest,
  deployments: Context.Service.Shape<typeof Deployments>,
  prepared: { readonly model: ModelConfig; readonly inputs: ReadonlyArray<string> }
) =>
  embed(
    exchange,
    req,
    adapterFor(deployments, prepared.model, exchange),
    primaryDeployment(prepared.model).model,
    prepared.inputs,
    upstreamFailure,
    prepared.model
  )

/** One embeddings request on an opened exchange (steps 2 to 5), each step's result recorded as it comes. */
const runEmbeddings = Effect.fnUntraced(function*(
  exchange: Exchange,
  request: HttpServerRequest.HttpServerRequest,
  { admission, catalog, deployments, settings }: PipelineServices
) {
  const plan = settings.planFor(exchange.caller.account.plan)
  const limits = settings.config.limits

  // 2. The body; its decoding.
  const body = yield* readJsonWith(request, limits)
  exchange.requestedModel(modelIdOfBody(body))
  const decoded = decodeEmbeddingsRequest(body, limits)
  if (Result.isFailure(decoded)) return yield* Effect.fail(decoded.failure)
  const req = decoded.success

  if (isByokModel(req.model)) {
    // 3. The credential reference; the size.
    const reference = parseReference(req.model)
    if (reference === null) return yield* Effect.fail(badReference())
    exchange.resolveModel(req.model)
    const prepared = yield* embeddingsThroughCredential(req)
    exchange.setEstimatedInput(prepared.estimatedInput)
    // 4. The credential, then its fallback to a pool model; 5. the call.
    const byok = yield* byokSteps(exchange, reference, {
      attempt: (adapter, mapFailure) => embed(exchange, req, adapter, reference.model, prepared.inputs, mapFailure, null),
      fallback: (model) =>
        Effect.map(embeddingsForModel(req, model), (pool) =>
          fallbackStep(exchange, admission, plan, pool, embedOnPool(exchange, req, deployments, pool)))
    })
    exchange.routeByok(byok.provider)
    return yield* runPlan(byok.steps)
  }

  // 3. The catalog model and its gates; the size.
  const model = checkEmbeddingsModel(lookupModel(catalog.current(), req.model))
  if (model instanceof GatewayError) return yield* Effect.fail(model)
  exchange.resolveModel(model.id)
  const prepared = yield* embeddingsOnModel(req, model)
  exchange.setEstimatedInput(prepared.estimatedInput)
  // 4. Admission, routed to the model's first deployment's provider; 5. the call.
  exchange.routeTo(primaryDeployment(model).provider)
  yield* admitToPool(exchange, admission, plan, model)
  return yield* embedOnPool(exchange, req, deployments, prepared)
})

// ----- routes

/** What a pipeline route requires of the app: its services, resolved once per router (see `postOnce`). */
type RouteServices = LiveCatalog | Settings | Admission | Deployments | Auth | RequestLog | FailedRequests

/** The pipeline's services from a context that holds them. */
const servicesOf = (context: Context.Context<RouteServices>): PipelineServices => ({
  catalog: Context.get(context, LiveCatalog),
  settings: Context.get(context, Settings),
  admission: Context.get(context, Admission),
  deployments: Context.get(context, Deployments)
})

/**
 * Adds a `POST` route on the pipeline to `router` (for `HttpRouter.use`). Its handler is made from the first
 * request's context and kept for this router (one gateway: the app's services do not change between requests),
 * instead of seven service lookups on every request; building the route needs no service (`listRoutes` records
 * routes with none).
 */
const postOnce = <H extends Effect.Effect<HttpServerResponse.HttpServerResponse, never, any>, C = never>(
  path: `/${string}`,
  handlerOf: (context: Context.Context<RouteServices | C>) => H
) =>
(router: HttpRouter.HttpRouter) =>
  Effect.suspend(() => {
    let handler: H | undefined
    const route = Effect.withFiber((fiber) => handler ??= handlerOf(fiber.context as Context.Context<RouteServices | C>))
    // The services are read from the request's context: the route still requires them.
    type Required = Effect.Services<typeof route> | RouteServices | C
    return router.add("POST", path, route as Effect.Effect<Effect.Success<typeof route>, never, Required>)
  })

/** A chat codec's per-request handler with its services at hand. */
const chatHandler = (codec: WireCodec, context: Context.Context<RouteServices>) => {
  const services = servicesOf(context)
  return exchangeHandler(
    exchangeServicesOf(context),
    { render: codec.render, xApiKey: codec.xApiKey === true, api: codec.api },
    (exchange, request) => runChat(codec, exchange, request, services)
  )
}

/** The `POST` route of one wire codec on the pipeline. */
export const pipelineRoute = <R = never>(
  path: `/${string}`,
  /** The codec, or how to make it from the app's services (made once per router, with the handler). */
  codec: WireCodec | ((context: Context.Context<R>) => WireCodec)
) =>
  HttpRouter.use(postOnce<ReturnType<typeof chatHandler>, R>(path, (context) =>
    chatHandler(typeof codec === "function" ? codec(context as Context.Context<R>) : codec, context)))

/** The embeddings handler with its services at hand. */
const embeddingsHandler = (context: Context.Context<RouteServices>) => {
  const services = servicesOf(context)
  return exchangeHandler(
    exchangeServicesOf(context),
    { render: renderInference, operation: "embeddings" },
    (exchange, request) => runEmbeddings(exchange, request, services)
  )
}

/** `POST /v1/embeddings` on the pipeline. */
export const embeddingsRoute = (path: `/${string}`) => HttpRouter.use(postOnce(path, embeddingsHandler))
