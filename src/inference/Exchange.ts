/**
 * One inference request's record and lifecycle (chat completions on every wire, embeddings, images): opened in
 * the request's scope, it ends with exactly one completion -- success, failed or cancelled -- that settles or
 * refunds the admission ticket, releases its slot, records the request row and closes its scope. Whoever
 * completes first wins; later completions are no-ops.
 *
 * What it holds comes in three ways, each through its own door:
 * - the results of the pipeline's steps (requested and resolved model, description, input estimate, route,
 *   fallback), recorded by the pipeline alone (Pipeline.ts, and `exchangeHandler` here for the route's own);
 * - what accumulates while the upstream call runs and the answer flows, through `AnswerMeter` (the answer
 *   writers, the deployment router, the image job);
 * - the ticket, through `admit`.
 * Codecs and answer writers read it through `ExchangeView`.
 */
import { Cause, Clock, Context, Effect, Exit, Option, Scope, type Tracer } from "effect"
import { HttpServerRequest, HttpServerResponse } from "effect/http"
import { Auth, type Caller } from "../auth/Auth.js"
import { fail, type GatewayError } from "../errors/Catalog.js"
import { renderInference } from "../errors/Render.js"
import { FailedRequests, recordFailure } from "../http/FailedRequests.js"
import { currentRequestId, defectCode, handle, headersOf } from "../http/Respond.js"
import type { Admission, AdmitInput, Standing, Ticket } from "../quota/Admission.js"
import { RequestLog } from "../telemetry/RequestLog.js"
import { type Completion, requestRow, type RowSource, tokensPerSecond } from "../telemetry/RequestRow.js"
import { CurrentTelemetry, type Operation, type Series, type Telemetry } from "../telemetry/Telemetry.js"
import type { AttemptObserver } from "../deployments/Router.js"
import type { Usage } from "../upstream/Upstream.js"
import { UNKNOWN_MODEL_ID } from "./JsonGuard.js"
import { isUpstreamFailure } from "../upstream/Failure.js"

/** Streams measured from first event to end over less than this (one burst) measure tps from dispatch. */
export const MIN_STREAM_SPAN_MS = 50

/** What a successful completion settled: the standing after the charge and the weighted cost. */
export type Settled = { readonly standing: Standing; readonly weighted: number } | null

const SUCCESS: Completion = { status: "success" }
const CANCELLED: Completion = { status: "cancelled" }

type Log = Context.Service.Shape<typeof RequestLog>

/** What codecs and answer writers read of a request; nothing here changes it. */
export interface ExchangeView {
  readonly caller: Caller
  readonly accountId: string
  readonly rowId: number
  readonly requestId: string
  readonly createdAt: Date
  /** The model the row records: the body's, then the resolved one (the pool model after a fallback). */
  readonly modelId: string
  /** The input estimate that admission reserves. */
  readonly estimatedInput: number
  /** The admission ticket, once admitted. */
  readonly ticket: Ticket | null
  /** Usage to charge: the upstream's figures, else an estimate of what was delivered. */
  chargeable(): Usage
}

/**
 * What accumulates while the upstream call runs and its answer flows: the dispatch, first-byte and first-event
 * times, the output delivered, the upstream's usage, the deployment router's attempts. The only way the answer
 * writers (`accumulate`, a codec's stream framing), the deployment router and the image job change the exchange.
 */
export interface AnswerMeter extends AttemptObserver {
  /** The upstream request (or image job) was sent. */
  markDispatched(): void
  /** The answer's first byte is ready (a whole answer: when it came). */
  markFirstByte(): void
  /** The first upstream events are being written (a stream's time to first token). */
  markFirstEvent(): void
  /** Characters of output handed to the client (content, reasoning, tool arguments). */
  addDelivered(chars: number): void
  /** The upstream's usage figures (what is charged). */
  setUsage(usage: Usage): void
}

/** Admission into the exchange's scope, where the ticket and its slot live. */
export interface Admitter {
  admit(admission: Context.Service.Shape<typeof Admission>, input: AdmitInput): Effect.Effect<Ticket, GatewayError>
}

export class Exchange implements RowSource, ExchangeView, AnswerMeter, Admitter {
  readonly startedAt = performance.now()

  #modelId = UNKNOWN_MODEL_ID
  #stream = false
  #hadTools = false
  #toolChoice: string | null = null
  #provider: string | null = null
  #byok = false
  #fellBack = false
  #api: string
  #deployment: string | null = null
  #attempts = 0
  #estimatedInput = 0
  #ticket: Ticket | null = null
  #ttfbMs: number | null = null
  /** When the upstream request was sent, and when its first event came (performance.now()). */
  #dispatchedAt: number | null = null
  #firstEventAt: number | null = null
  #deliveredChars = 0
  #usage: Usage | null = null
  /** Set once, by the first completion. */
  #completed = false
  #endedAt = 0
  #counted: Usage | null = null
  #weighted = 0
  /** The metrics series counting this request in flight (admitted, not yet completed or fallen back). */
  #inFlight: Series | null = null
  /** The upstream call's span (tracing on only). */
  #upstreamSpan: Tracer.Span | null = null

  private constructor(
    readonly caller: Caller,
    readonly rowId: number,
    readonly requestId: string,
    readonly createdAt: Date,
    /** Owns the admission ticket (its slot); closed by the completion. */
    readonly scope: Scope.Closeable,
    private readonly log: Log,
    private readonly telemetry: Telemetry,
    readonly operation: Operation,
    /** The request's server span, parent of the spans made outside its fiber (tracing on only). */
    private readonly traceParent: Tracer.AnySpan | undefined
  ) {
    this.#api = operation
  }

  /**
   * `open` as a plain call, for the hot path (`exchangeRoute`): tracing off, the row id at hand. The caller
   * registers the cancel backstop on the request's scope.
   */
  static openNow(
    caller: Caller,
    log: Log,
    operation: Operation,
    rowId: number,
    requestId: string,
    now: number,
    telemetry: Telemetry
  ): Exchange {
    return new Exchange(caller, rowId, requestId, new Date(now), Scope.makeUnsafe(), log, telemetry, operation, undefined)
  }

  /**
   * Opens the exchange of an authenticated request: allocates its row id and registers, on the request's
   * scope (which closes after the response is written), the backstop that completes it as cancelled.
   */
  static open(caller: Caller, log: Log, operation: Operation = "chat"): Effect.Effect<Exchange, never, Scope.Scope> {
    return Exchange.opening(caller, log, operation)
  }

  /**
   * `open`'s steps, made once: a generator function made per request would keep the request alive
   * (docs/decisions.md, "No generator function per request").
   */
  private static readonly opening = Effect.fnUntraced(function*(caller: Caller, log: Log, operation: Operation) {
    const rowId = yield* log.nextId
    const requestId = yield* currentRequestId
    const now = yield* Clock.currentTimeMillis
    const scope = yield* Scope.make()
    const telemetry = yield* CurrentTelemetry
    const parent = telemetry.tracing ? Option.getOrUndefined(yield* Effect.option(Effect.currentParentSpan)) : undefined
    const exchange = new Exchange(caller, rowId, requestId, new Date(now), scope, log, telemetry, operation, parent)
    // Not `Effect.addFinalizer`, which merges the request's whole context back in when the scope closes.
    yield* Scope.addFinalizer(yield* Effect.scope, Effect.suspend(() => exchange.cancel()))
    return exchange
  })

  // ----- what the row and the answer read

  get accountId(): string {
    return this.caller.account.id
  }
  get keyId(): number | null {
    return this.caller.key?.id ?? null
  }
  get modelId(): string {
    return this.#modelId
  }
  get stream(): boolean {
    return this.#stream
  }
  get hadTools(): boolean {
    return this.#hadTools
  }
  get toolChoice(): string | null {
    return this.#toolChoice
  }
  get provider(): string | null {
    return this.#provider
  }
  /** Routed through one of the caller's own credentials. */
  get byok(): boolean {
    return this.#byok
  }
  /** A BYOK request that fell back to its pool model. */
  get fellBack(): boolean {
    return this.#fellBack
  }
  /** The client protocol the request came in on (the row's operator-visible `api`). */
  get api(): string {
    return this.#api
  }
  /** The deployment that answered, or the last one tried. */
  get deployment(): string | null {
    return this.#deployment
  }
  /** Upstream attempts made so far. */
  get attempts(): number {
    return this.#attempts
  }
  get estimatedInput(): number {
    return this.#estimatedInput
  }
  get ttfbMs(): number | null {
    return this.#ttfbMs
  }
  /** The admission ticket, once admitted. */
  get ticket(): Ticket | null {
    return this.#ticket
  }
  /** Tokens recorded on the row (set by the completion): null when nothing was delivered. */
  get counted(): Usage | null {
    return this.#counted
  }
  get weighted(): number {
    return this.#weighted
  }
  get durationMs(): number {
    return Math.max(0, Math.round(this.#endedAt - this.startedAt))
  }
  get tps(): number {
    const counted = this.#counted
    return counted ? tokensPerSecond(counted.completion_tokens, this.generationMs(this.#endedAt)) : 0
  }

  /** Milliseconds of upstream generation up to `now` (see `tokensPerSecond`); null if never dispatched. */
  generationMs(now: number): number | null {
    const first = this.#firstEventAt
    const from = this.#stream && first !== null && now - first >= MIN_STREAM_SPAN_MS ? first : this.#dispatchedAt
    return from === null ? null : now - from
  }

  chargeable(): Usage {
    return this.#usage ?? {
      prompt_tokens: this.#estimatedInput,
      completion_tokens: Math.ceil(this.#deliveredChars / 4),
      reasoning_tokens: 0,
      cached_tokens: 0
    }
  }

  // ----- step results, recorded by the pipeline alone (Pipeline.ts; `exchangeHandler` for the route's own)

  /** The body's bounded `model`, recorded while the request has not resolved it to a catalog model. */
  requestedModel(modelId: string): void {
    this.#modelId = modelId
  }

  /** The request came in on another client protocol than its operation's own (Messages, Responses). */
  setApi(api: string): void {
    this.#api = api
  }

  describe(request: { readonly stream: boolean; readonly hadTools: boolean; readonly toolChoice: string | null }): void {
    this.#stream = request.stream
    this.#hadTools = request.hadTools
    this.#toolChoice = request.toolChoice
  }

  /** The catalog model (or credential reference) the request resolved to. */
  resolveModel(modelId: string): void {
    this.#modelId = modelId
  }

  /** The input estimate that admission reserves, and that is charged when the upstream reports no usage. */
  setEstimatedInput(tokens: number): void {
    this.#estimatedInput = tokens
  }

  /** The pool request goes to `provider` (its model's first deployment's). */
  routeTo(provider: string): void {
    this.#provider = provider
  }

  /** The request goes through the caller's credential of `provider` (the row's `byok` and `provider`). */
  routeByok(provider: string): void {
    this.#provider = provider
    this.#byok = true
  }

  /**
   * A BYOK request falls back to the pool model `modelId`, before anything was delivered: the row records that
   * model, its input estimate and `fell_back`, keeping the credential's provider. The BYOK ticket is given back
   * (its RPM count stays).
   */
  fallBack(modelId: string, estimatedInput: number): Effect.Effect<void> {
    return Effect.suspend(() => {
      this.#release()
      if (this.#upstreamSpan !== null) {
        this.telemetry.endSpan(this.#upstreamSpan, "fell_back")
        this.#upstreamSpan = null
      }
      this.#fellBack = true
      this.#modelId = modelId
      this.#estimatedInput = estimatedInput
      this.#dispatchedAt = null
      this.#firstEventAt = null
      const ticket = this.#ticket
      this.#ticket = null
      return ticket === null ? Effect.void : ticket.refund
    })
  }

  // ----- the meter (AnswerMeter)

  /** One more upstream attempt, sent to `deployment` (failover makes several). */
  attempt(deployment: string): void {
    this.#deployment = deployment
    this.#attempts += 1
  }

  markDispatched(): void {
    this.#dispatchedAt = performance.now()
    if (this.telemetry.tracing) {
      this.#upstreamSpan = this.telemetry.startSpan(`${this.operation} ${this.#modelId}`, this.traceParent, "client", {
        "gen_ai.operation.name": this.operation,
        "gen_ai.provider.name": this.#provider ?? "none",
        "gen_ai.request.model": this.#modelId,
        "wellspring.byok": this.#byok,
        "wellspring.request_row": this.rowId
      })
    }
  }

  markFirstByte(): void {
    if (this.#ttfbMs === null) this.#ttfbMs = Math.round(performance.now() - this.startedAt)
  }

  markFirstEvent(): void {
    if (this.#firstEventAt === null) this.#firstEventAt = performance.now()
    this.markFirstByte()
  }

  addDelivered(chars: number): void {
    this.#deliveredChars += chars
  }

  setUsage(usage: Usage): void {
    this.#usage = usage
  }

  // ----- admission

  /** Reserves through admission; the ticket (and its slot) lives in this exchange's scope. */
  admit(admission: Context.Service.Shape<typeof Admission>, input: AdmitInput): Effect.Effect<Ticket, GatewayError> {
    const telemetry = this.telemetry
    if (!telemetry.enabled) {
      return Effect.map(Scope.provide(admission.admit(input), this.scope), (ticket) => (this.#ticket = ticket))
    }
    const started = performance.now()
    const admitted = Scope.provide(admission.admit(input), this.scope).pipe(
      Effect.map((ticket) => {
        this.#ticket = ticket
        const series = telemetry.series(this.operation, this.#modelLabel())
        telemetry.admitted(series, performance.now() - started)
        this.#inFlight = series
        return ticket
      }),
      Effect.tapError((error) =>
        Effect.sync(() =>
          telemetry.rejected(telemetry.series(this.operation, this.#modelLabel()), error.code, performance.now() - started)
        )
      )
    )
    return telemetry.span(admitted, "wellspring.admission", {
      "gen_ai.request.model": this.#modelId,
      "wellspring.byok": input.byok
    })
  }

  /** The bounded model label of the metrics (telemetry/Telemetry.ts). */
  #modelLabel(): string {
    return this.telemetry.modelLabel(this.#modelId, this.#byok && !this.#fellBack)
  }

  /** No longer in flight (completed, or fallen back before its new admission). */
  #release(): void {
    if (this.#inFlight === null) return
    this.telemetry.released(this.#inFlight)
    this.#inFlight = null
  }

  // ----- the one completion

  /** Completes as a success: settles the ticket for what was used; the settlement (for the receipt) or null. */
  succeed(): Effect.Effect<Settled> {
    return this.complete(SUCCESS)
  }

  fail(error: GatewayError): Effect.Effect<Settled> {
    return this.complete({ status: "failed", error })
  }

  /** The client went away (or the response was dropped) before a completion. */
  cancel(): Effect.Effect<Settled> {
    return this.complete(CANCELLED)
  }

  /**
   * Settles the ticket (charged when anything was delivered, else refunded), records the row and closes the
   * exchange's scope (releasing the slot). Only the first call has an effect; later ones return null.
   */
  private complete(completion: Completion): Effect.Effect<Settled> {
    return Effect.suspend(() => {
      if (this.#completed) return Effect.succeed(null)
      this.#completed = true
      const usage = this.chargeable()
      const delivered = completion.status === "success" || this.#deliveredChars > 0 || this.#usage !== null
      const ticket = this.#ticket
      const settleUsage = usage.cached_tokens > 0
        ? { inputTokens: usage.prompt_tokens, cachedInputTokens: usage.cached_tokens, outputTokens: usage.completion_tokens }
        : { inputTokens: usage.prompt_tokens, outputTokens: usage.completion_tokens }
      // Settled on the spot when the backend can (in-process admission, account idle): the row is recorded in
      // this same step and only the scope's close remains.
      const now = delivered && ticket !== null && ticket.settleNow !== undefined && !this.telemetry.tracing
        ? this.#settleNow(ticket.settleNow, settleUsage)
        : undefined
      const settle: Effect.Effect<Settled> = now !== undefined
        ? now
        : ticket === null
        ? Effect.succeed(null)
        : this.#timed(
          delivered ? "settle" : "refund",
          delivered ? ticket.settle(settleUsage) : Effect.as(ticket.refund, null)
        )
      const error = completion.status === "failed" ? completion.error : undefined
      // The row's `error` is shown to the account (`recentRequests`): a server-side failure records its code and
      // status only; its detail (upstream answer text, addresses) goes to the log, as `detail` is meant to.
      // So is an upstream's refusal text (4xx), whatever its status, and why the address guard refused a user's URL
      // (the answer never says whether a name resolved, nor to what).
      const detailIsPrivate = error !== undefined && error.detail !== undefined &&
        (error.status >= 500 || isUpstreamFailure(error) || error.code === "address_not_allowed")
      const record = (settled: Settled): Settled => {
        this.#endedAt = performance.now()
        this.#counted = delivered ? usage : null
        this.#weighted = settled?.weighted ?? 0
        this.log.record(requestRow(this, completion, detailIsPrivate))
        if (this.telemetry.enabled) this.#report(completion, settled)
        return settled
      }
      const close = Scope.close(this.scope, Exit.void)
      if (!detailIsPrivate && Exit.isExit(settle)) {
        const exit = settle as Exit.Exit<Settled>
        if (Exit.isSuccess(exit)) return Effect.as(close, record(exit.value))
      }
      return (detailIsPrivate ? Effect.andThen(Effect.logWarning("request failed", error.detail), settle) : settle).pipe(
        Effect.map(record),
        Effect.ensuring(close)
      )
    })
  }

  /** `settleNow`, timed for the quota-store metric when it completed on the spot; otherwise as `#timed`. */
  #settleNow(
    settleNow: NonNullable<Ticket["settleNow"]>,
    usage: Parameters<NonNullable<Ticket["settleNow"]>>[0]
  ): Effect.Effect<Settled> {
    const started = this.telemetry.enabled ? performance.now() : 0
    const settled = settleNow(usage)
    if (!Exit.isExit(settled)) return this.#timed("settle", settled)
    if (this.telemetry.enabled) this.telemetry.storeTrip("settle", performance.now() - started)
    return settled
  }

  /** Settle or refund, timed for the quota-store metric and traced. */
  #timed(operation: "settle" | "refund", effect: Effect.Effect<Settled>): Effect.Effect<Settled> {
    const telemetry = this.telemetry
    if (!telemetry.enabled) return effect
    const timed = Effect.suspend(() => {
      const started = performance.now()
      return Effect.map(effect, (settled) => {
        telemetry.storeTrip(operation, performance.now() - started)
        return settled
      })
    })
    return telemetry.span(timed, "wellspring.settle", { "wellspring.operation": operation }, this.traceParent)
  }

  /** Metrics and the upstream span of the completion. */
  #report(completion: Completion, settled: Settled): void {
    const telemetry = this.telemetry
    const series = this.#inFlight ?? telemetry.series(this.operation, this.#modelLabel())
    this.#release()
    const counted = this.#counted
    const first = this.#firstEventAt
    const code = completion.status === "failed" ? completion.error.code : undefined
    const pooled = !(this.#byok && !this.#fellBack)
    telemetry.completed(series, {
      status: completion.status,
      code,
      provider: this.#provider,
      stream: this.#stream,
      durationMs: this.#endedAt - this.startedAt,
      firstEventMs: first === null ? null : first - this.startedAt,
      generationMs: first === null ? null : this.#endedAt - first,
      usage: counted,
      remainingPct: settled !== null && pooled
        ? { session: settled.standing.session.remaining_pct, weekly: settled.standing.weekly.remaining_pct }
        : null
    })
    const span = this.#upstreamSpan
    if (span !== null) {
      this.#upstreamSpan = null
      if (counted !== null) {
        span.attribute("gen_ai.usage.input_tokens", counted.prompt_tokens)
        span.attribute("gen_ai.usage.output_tokens", counted.completion_tokens)
      }
      span.attribute("wellspring.status", completion.status)
      if (code !== undefined) span.attribute("error.type", code)
      telemetry.endSpan(span, code ?? (completion.status === "cancelled" ? "cancelled" : undefined))
    }
  }
}

/** What a failed request's row records: its GatewayError, `internal_error` for a defect, null when interrupted. */
const failureOf = (cause: Cause.Cause<GatewayError>): GatewayError | null => {
  const failure = Cause.findErrorOption(cause)
  if (failure._tag === "Some") return failure.value
  if (Cause.hasInterruptsOnly(cause)) return null
  // The defect itself is logged by `handle`; the row records the code it answered with.
  return fail(defectCode(cause))
}

type Renderer = (error: GatewayError) => HttpServerResponse.HttpServerResponse

const renderWithRow = (render: Renderer, error: GatewayError, rowId: number) =>
  HttpServerResponse.setHeader(render(error), "x-request-id", String(rowId))

/**
 * Runs a request's work so that its exchange always completes: an error (or a defect, rendered by `handle`
 * as 500 internal_error) completes it as failed, an interruption as cancelled. Errors are rendered by `render`
 * (the inference envelope unless told) with the request row id.
 */
export const finishing = <R>(
  exchange: Exchange,
  run: Effect.Effect<HttpServerResponse.HttpServerResponse, GatewayError, R>,
  render: Renderer = renderInference
) =>
  run.pipe(
    // Two steps on every request (the completion of a failure, then the answer to an error), not four.
    Effect.onExit((exit) => {
      if (exit._tag === "Success") return Effect.void
      const error = failureOf(exit.cause)
      return error ? exchange.fail(error) : Cause.hasInterrupts(exit.cause) ? exchange.cancel() : Effect.void
    }),
    Effect.catch((error) =>
      Effect.as(recordFailure(exchange.caller, error), renderWithRow(render, error, exchange.rowId))
    )
  )

export interface ExchangeRouteOptions<RA = never> {
  /** The error envelope: `renderInference`, or `renderImage` for the image endpoint. */
  readonly render: Renderer
  /**
   * How the caller authenticates (default: the bearer key of `Auth.bearer`). The dashboard's generate form uses
   * the account API's cookie-or-key authentication, with its cross-site check.
   */
  readonly authenticate?: Effect.Effect<Caller, GatewayError, RA>
  /** The row's model id from the start (a route with one fixed id); otherwise the route records it when known. */
  readonly modelId?: string
  /** What metrics and spans call the request (default `chat`). */
  readonly operation?: Operation
  /** The key may come in `x-api-key` when there is no `Authorization` header (Anthropic clients). */
  readonly xApiKey?: boolean
  /** The row's `api` when it is not the operation's name (`messages`, `responses`), set as the exchange opens. */
  readonly api?: string
}

/** What `exchangeHandler` needs besides the request: resolved once per route, not per request. */
export interface ExchangeServices {
  readonly auth: Context.Service.Shape<typeof Auth>
  readonly log: Log
  readonly failed: Context.Service.Shape<typeof FailedRequests>
}

export const exchangeServices: Effect.Effect<ExchangeServices, never, Auth | RequestLog | FailedRequests> = Effect.gen(
  function*() {
    return { auth: yield* Auth, log: yield* RequestLog, failed: yield* FailedRequests }
  }
)

/** `exchangeServices` from a context that holds them. */
export const exchangeServicesOf = (context: Context.Context<Auth | RequestLog | FailedRequests>): ExchangeServices => ({
  auth: Context.get(context, Auth),
  log: Context.get(context, RequestLog),
  failed: Context.get(context, FailedRequests)
})

/**
 * The skeleton every spending `/v1` route shares (chat completions, embeddings, images), in this order: the bearer
 * key (401, counted against the client address), the failed-request guard (429, before the body), the exchange
 * opened on the request's scope (from here on every outcome leaves a request row), the account gates (403), then
 * `run`. Everything is answered through `handle` (request id header, defects as 500/503) with `render`.
 */
export const exchangeRoute = <R, RA = never>(
  options: ExchangeRouteOptions<RA>,
  run: (exchange: Exchange, request: HttpServerRequest.HttpServerRequest) => Effect.Effect<
    HttpServerResponse.HttpServerResponse,
    GatewayError,
    R
  >
) => Effect.flatMap(exchangeServices, (services) => exchangeHandler(services, options, run))

/** `exchangeRoute` with its services at hand (`pipelineRoute` resolves them when the route is added). */
export const exchangeHandler = <R, RA = never>(
  services: ExchangeServices,
  options: ExchangeRouteOptions<RA>,
  run: (exchange: Exchange, request: HttpServerRequest.HttpServerRequest) => Effect.Effect<
    HttpServerResponse.HttpServerResponse,
    GatewayError,
    R
  >
) => {
  const { auth, failed, log } = services
  const xApiKey = options.xApiKey === true
  const operation = options.operation ?? "chat"
  const opened = (exchange: Exchange) => {
    if (options.modelId !== undefined) exchange.requestedModel(options.modelId)
    if (options.api !== undefined) exchange.setApi(options.api)
  }
  const general = Effect.fnUntraced(function*(request: HttpServerRequest.HttpServerRequest) {
    const caller = options.authenticate === undefined ? yield* auth.bearer(request, xApiKey) : yield* options.authenticate
    if (caller.key !== null) yield* failed.check(caller.key.id)
    const exchange = yield* Exchange.open(caller, log, operation)
    opened(exchange)
    return yield* finishing(
      exchange,
      Effect.andThen(auth.gate(caller, headersOf(request)), Effect.suspend(() => run(exchange, request))),
      options.render
    )
  })
  // The same steps as plain calls in one Effect step when nothing has to wait: a key cached as valid, tracing
  // off, a row id at hand. Anything else takes the general path above.
  const hot = Effect.withFiber((fiber) => {
    const request = Context.getUnsafe(fiber.context, HttpServerRequest.HttpServerRequest)
    const now = fiber.getRef(Clock.Clock).currentTimeMillisUnsafe()
    const caller = options.authenticate === undefined ? auth.cachedBearer(request, xApiKey, now) : undefined
    if (caller === undefined) return general(request)
    const refused = caller.key === null ? undefined : failed.refusal(caller.key.id, now)
    if (refused !== undefined) return Effect.fail(refused)
    const telemetry = fiber.getRef(CurrentTelemetry)
    const rowId = telemetry.tracing ? undefined : log.nextIdNow()
    if (rowId === undefined) return general(request)
    const requestId = fiber.getRef(currentRequestId)
    const exchange = Exchange.openNow(caller, log, operation, rowId, requestId, now, telemetry)
    opened(exchange)
    const refusal = auth.gateError(caller, headersOf(request), now)
    return Effect.andThen(
      Scope.addFinalizer(Context.getUnsafe(fiber.context, Scope.Scope), Effect.suspend(() => exchange.cancel())),
      finishing(
        exchange,
        refusal === undefined ? Effect.suspend(() => run(exchange, request)) : Effect.fail(refusal),
        options.render
      )
    )
  })
  return handle(options.render, hot)
}
