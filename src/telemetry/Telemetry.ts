/**
 * Prometheus metrics and the gateway's trace spans (ARCHITECTURE §3 `telemetry/`), recorded on the request path by
 * `inference/Exchange.ts` and `auth/Auth.ts`, served by `status/Operator.ts` at `/metrics`.
 *
 * Metrics are `effect` `Metric`s in a registry of their own (one per gateway, so gateways in one test process
 * never mix), rendered by `effect`'s `PrometheusMetrics`. Names follow the OpenTelemetry GenAI semantic conventions
 * where one exists (`gen_ai.client.token.usage`, `gen_ai.server.*`, translated to Prometheus as the OpenTelemetry
 * Prometheus exporter does: dots to underscores, the unit as a suffix), plus wellspring's own `wellspring_*`.
 *
 * Cheap on the hot path: label sets are bounded by design (operation, catalog model id or `byok` / `unknown`,
 * provider key, error code; never an account or a key) and each label set's metric objects are made once and kept
 * in nested maps, so recording a request is a few map lookups and counter updates, with no allocation.
 *
 * Spans are made only when `TracingEnabled` (telemetry/Tracing.ts); otherwise the span helpers return their
 * effect unchanged, and nothing is allocated for them.
 */
import { Clock, Context, Effect, Exit, Layer, Metric, Option, Tracer } from "effect"
import { PrometheusMetrics } from "effect/observability"
import type { CatalogView } from "../config/Live.js"
import { LiveCatalog, Settings } from "../config/Live.js"
import { TracingEnabled } from "./Tracing.js"

/** `image_generation`: the NAI image endpoint (model label `nai-image`). */
export type Operation = "chat" | "embeddings" | "image_generation"

/** Model label of image requests (their rows' `model_id`). */
export const IMAGE_MODEL = "nai-image"

/** Model label of requests through a user's own credential (their model names are not ours to enumerate). */
export const BYOK_MODEL = "byok"
/** Model label of requests whose model is not (or not yet) a catalog model. */
export const UNKNOWN_MODEL = "unknown"
/** Provider label of requests never routed to a provider. */
export const NO_PROVIDER = "none"

/** Bucket boundaries advised by the OpenTelemetry GenAI conventions. */
const TOKEN_BUCKETS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864]
const DURATION_BUCKETS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92]
const TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10]
const TPOT_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5]
/** Quota-store round trips: an in-process actor answers in microseconds, Redis in a fraction of a millisecond. */
const STORE_BUCKETS = [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1]
const RATIO_BUCKETS = [0, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 1]
const IMAGE_WAIT_BUCKETS = [0.1, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300]

/** Every metric the gateway exposes: Prometheus name, type and help (README: Metrics). */
export const METRICS = {
  tokenUsage: { name: "gen_ai_client_token_usage", help: "Tokens per request by type (input, output incl. reasoning, cached input, reasoning)" },
  requestDuration: { name: "gen_ai_server_request_duration_seconds", help: "Request duration from authentication to the last byte, seconds" },
  timeToFirstToken: { name: "gen_ai_server_time_to_first_token_seconds", help: "Streams: time to the first upstream event, seconds" },
  timePerOutputToken: { name: "gen_ai_server_time_per_output_token_seconds", help: "Streams: time per output token after the first, seconds" },
  requests: { name: "wellspring_requests_total", help: "Completed inference requests by model, status (success, failed, cancelled) and error code" },
  rejections: { name: "wellspring_admission_rejections_total", help: "Requests refused by admission, by reason (the error code)" },
  inFlight: { name: "wellspring_requests_in_flight", help: "Admitted requests not yet completed" },
  poolRemaining: { name: "wellspring_pool_remaining_ratio", help: "Remaining share of the account's pool after each settled pool request (1 = untouched)" },
  storeDuration: { name: "wellspring_quota_store_duration_seconds", help: "Quota store round trips (admit, settle, refund), seconds" },
  logQueue: { name: "wellspring_request_log_queue_rows", help: "Request rows queued for the batch writer" },
  logDropped: { name: "wellspring_request_log_dropped_rows_total", help: "Request rows dropped (rejected by the database, or over the buffer while it was down)" },
  keyCache: { name: "wellspring_key_cache_lookups_total", help: "API key lookups by result: hit (answered from the cache) or miss (read from the database)" },
  keyCacheRatio: { name: "wellspring_key_cache_hit_ratio", help: "Share of API key lookups answered from the cache since start" },
  imageWaiting: { name: "wellspring_image_queue_waiting_jobs", help: "Image jobs waiting for a worker" },
  imageWorkers: { name: "wellspring_image_workers_online", help: "Image workers with a fresh heartbeat" },
  imageWait: { name: "wellspring_image_queue_wait_seconds", help: "Time an image job waited for a worker, seconds" },
  busyWorking: { name: "wellspring_http_requests_working", help: "Requests that do work started within limits.busy_max_wait_ms and not yet answered (the busy gate counts them)" },
  busyHeld: { name: "wellspring_http_requests_held", help: "Requests waiting at the busy gate while the process is saturated" },
  busyPaused: { name: "wellspring_http_connections_paused", help: "Kept-alive connections the busy gate reads again once there is room" },
  saturated: { name: "wellspring_http_saturated", help: "1 while the event loop is busy past limits.busy_utilization, else 0" }
} as const

interface GenAiSeries {
  readonly input: Metric.Histogram<number>
  readonly output: Metric.Histogram<number>
  readonly cached: Metric.Histogram<number>
  readonly reasoning: Metric.Histogram<number>
  readonly duration: Metric.Histogram<number>
  readonly ttft: Metric.Histogram<number>
  readonly tpot: Metric.Histogram<number>
}

/** The metric objects of one (operation, model) pair; made once. */
export interface Series {
  readonly operation: Operation
  readonly model: string
  readonly inFlight: Metric.Gauge<number>
  readonly success: Metric.Counter<number>
  readonly cancelled: Metric.Counter<number>
  /** By error code (a bounded catalog). */
  readonly failed: Map<string, Metric.Counter<number>>
  readonly rejected: Map<string, Metric.Counter<number>>
  /** By provider key. */
  readonly genAi: Map<string, GenAiSeries>
}

/** What a completed exchange reports (`inference/Exchange.ts`). */
export interface CompletedRequest {
  readonly status: "success" | "failed" | "cancelled"
  /** The error code of a failed request. */
  readonly code: string | undefined
  readonly provider: string | null
  readonly stream: boolean
  readonly durationMs: number
  /** Milliseconds to the first upstream event (streams); null when none came. */
  readonly firstEventMs: number | null
  /** Milliseconds from the first upstream event to the end; null when none came. */
  readonly generationMs: number | null
  readonly usage: {
    readonly prompt_tokens: number
    readonly completion_tokens: number
    readonly reasoning_tokens: number
    readonly cached_tokens: number
  } | null
  /** The pools' remaining percentages after the settlement of a pool request. */
  readonly remainingPct: { readonly session: number; readonly weekly: number } | null
}

/** Values read at scrape time from the services that own them. */
export interface ScrapeSources {
  readonly logQueue: number
  readonly logDropped: number
  readonly keyCache: { readonly hits: number; readonly misses: number }
  readonly images: { readonly waiting: number; readonly workersOnline: number } | null
  /** The busy gate over every listener (http/Lifecycle.ts). */
  readonly busy: { readonly working: number; readonly held: number; readonly paused: number; readonly saturated: boolean }
}

type Attributes = Record<string, string>

const histogram = (
  metric: { readonly name: string; readonly help: string },
  boundaries: ReadonlyArray<number>,
  attributes: Attributes
) => Metric.histogram(metric.name, { description: metric.help, boundaries, attributes })

const counter = (metric: { readonly name: string; readonly help: string }, attributes: Attributes) =>
  Metric.counter(metric.name, { description: metric.help, attributes, incremental: true })

const gauge = (metric: { readonly name: string; readonly help: string }, attributes: Attributes) =>
  Metric.gauge(metric.name, { description: metric.help, attributes })

/** The recorder: metrics always (cheap), spans only with tracing on. The default (no gateway) records nothing. */
export class Telemetry {
  static readonly disabled = new Telemetry(false, false, undefined, undefined, undefined, "memory")

  readonly #context: Context.Context<never>
  readonly #byOperation: Record<Operation, Map<string, Series>> = { chat: new Map(), embeddings: new Map(), image_generation: new Map() }
  readonly #catalog: (() => CatalogView) | undefined
  readonly #tracer: Tracer.Tracer | undefined
  readonly #clock: Clock.Clock | undefined
  readonly #store: Record<"admit" | "settle" | "refund", Metric.Histogram<number>>
  readonly #pool: { readonly session: Metric.Histogram<number>; readonly weekly: Metric.Histogram<number> }
  readonly #scraped: {
    readonly logQueue: Metric.Gauge<number>
    readonly logDropped: Metric.Counter<number>
    readonly hits: Metric.Counter<number>
    readonly misses: Metric.Counter<number>
    readonly hitRatio: Metric.Gauge<number>
    readonly imageWaiting: Metric.Gauge<number>
    readonly imageWorkers: Metric.Gauge<number>
    readonly busyWorking: Metric.Gauge<number>
    readonly busyHeld: Metric.Gauge<number>
    readonly busyPaused: Metric.Gauge<number>
    readonly saturated: Metric.Gauge<number>
  }
  readonly #imageWait: Metric.Histogram<number>
  /** Totals already added to the scrape-time counters. */
  #seen = { logDropped: 0, hits: 0, misses: 0 }

  constructor(
    /** False: every method is a no-op (tests building an exchange without a gateway). */
    readonly enabled: boolean,
    /** Spans are made (an OTLP exporter is configured). */
    readonly tracing: boolean,
    catalog: (() => CatalogView) | undefined,
    tracer: Tracer.Tracer | undefined,
    clock: Clock.Clock | undefined,
    /** `memory` (in-process actors) or `redis`: the quota store's label. */
    backend: "memory" | "redis"
  ) {
    this.#context = Context.make(Metric.MetricRegistry, new Map())
    this.#catalog = catalog
    this.#tracer = tracer
    this.#clock = clock
    const store = (operation: string) =>
      histogram(METRICS.storeDuration, STORE_BUCKETS, { operation, backend })
    this.#store = { admit: store("admit"), settle: store("settle"), refund: store("refund") }
    this.#pool = {
      session: histogram(METRICS.poolRemaining, RATIO_BUCKETS, { pool: "session" }),
      weekly: histogram(METRICS.poolRemaining, RATIO_BUCKETS, { pool: "weekly" })
    }
    this.#scraped = {
      logQueue: gauge(METRICS.logQueue, {}),
      logDropped: counter(METRICS.logDropped, {}),
      hits: counter(METRICS.keyCache, { result: "hit" }),
      misses: counter(METRICS.keyCache, { result: "miss" }),
      hitRatio: gauge(METRICS.keyCacheRatio, {}),
      imageWaiting: gauge(METRICS.imageWaiting, {}),
      imageWorkers: gauge(METRICS.imageWorkers, {}),
      busyWorking: gauge(METRICS.busyWorking, {}),
      busyHeld: gauge(METRICS.busyHeld, {}),
      busyPaused: gauge(METRICS.busyPaused, {}),
      saturated: gauge(METRICS.saturated, {})
    }
    this.#imageWait = histogram(METRICS.imageWait, IMAGE_WAIT_BUCKETS, {})
  }

  // ----- labels

  /** The model label: a catalog model id, `byok`, or `unknown` (never a user's text). */
  modelLabel(modelId: string, byok: boolean): string {
    if (byok) return BYOK_MODEL
    if (modelId === IMAGE_MODEL) return IMAGE_MODEL
    return this.#catalog?.().byId.has(modelId) ? modelId : UNKNOWN_MODEL
  }

  /** The metric objects of an (operation, model label) pair, made on first use. */
  series(operation: Operation, model: string): Series {
    const byModel = this.#byOperation[operation]
    let series = byModel.get(model)
    if (series === undefined) {
      const labels = { operation, model }
      series = {
        operation,
        model,
        inFlight: gauge(METRICS.inFlight, labels),
        success: counter(METRICS.requests, { ...labels, status: "success", code: "none" }),
        cancelled: counter(METRICS.requests, { ...labels, status: "cancelled", code: "none" }),
        failed: new Map(),
        rejected: new Map(),
        genAi: new Map()
      }
      byModel.set(model, series)
    }
    return series
  }

  #genAi(series: Series, provider: string): GenAiSeries {
    let genAi = series.genAi.get(provider)
    if (genAi === undefined) {
      const base = {
        gen_ai_operation_name: series.operation,
        gen_ai_provider_name: provider,
        gen_ai_request_model: series.model
      }
      const tokens = (type: string) => histogram(METRICS.tokenUsage, TOKEN_BUCKETS, { ...base, gen_ai_token_type: type })
      genAi = {
        input: tokens("input"),
        output: tokens("output"),
        cached: tokens("cached"),
        reasoning: tokens("reasoning"),
        duration: histogram(METRICS.requestDuration, DURATION_BUCKETS, base),
        ttft: histogram(METRICS.timeToFirstToken, TTFT_BUCKETS, base),
        tpot: histogram(METRICS.timePerOutputToken, TPOT_BUCKETS, base)
      }
      series.genAi.set(provider, genAi)
    }
    return genAi
  }

  // ----- the request path

  /** Admission admitted the request after `ms`: it is in flight until `released`. */
  admitted(series: Series, ms: number): void {
    if (!this.enabled) return
    this.#store.admit.updateUnsafe(ms / 1000, this.#context)
    series.inFlight.modifyUnsafe(1, this.#context)
  }

  released(series: Series): void {
    if (!this.enabled) return
    series.inFlight.modifyUnsafe(-1, this.#context)
  }

  /** Admission refused the request with `code` after `ms`. */
  rejected(series: Series, code: string, ms: number): void {
    if (!this.enabled) return
    this.#store.admit.updateUnsafe(ms / 1000, this.#context)
    let rejected = series.rejected.get(code)
    if (rejected === undefined) {
      rejected = counter(METRICS.rejections, { operation: series.operation, model: series.model, reason: code })
      series.rejected.set(code, rejected)
    }
    rejected.updateUnsafe(1, this.#context)
  }

  /** A settle or refund round trip of `ms`. */
  storeTrip(operation: "settle" | "refund", ms: number): void {
    if (!this.enabled) return
    this.#store[operation].updateUnsafe(ms / 1000, this.#context)
  }

  completed(series: Series, request: CompletedRequest): void {
    if (!this.enabled) return
    const context = this.#context
    if (request.status === "success") series.success.updateUnsafe(1, context)
    else if (request.status === "cancelled") series.cancelled.updateUnsafe(1, context)
    else {
      const code = request.code ?? "internal_error"
      let failed = series.failed.get(code)
      if (failed === undefined) {
        failed = counter(METRICS.requests, { operation: series.operation, model: series.model, status: "failed", code })
        series.failed.set(code, failed)
      }
      failed.updateUnsafe(1, context)
    }
    const genAi = this.#genAi(series, request.provider ?? NO_PROVIDER)
    genAi.duration.updateUnsafe(request.durationMs / 1000, context)
    const usage = request.usage
    if (usage !== null) {
      genAi.input.updateUnsafe(usage.prompt_tokens, context)
      genAi.output.updateUnsafe(usage.completion_tokens, context)
      if (usage.cached_tokens > 0) genAi.cached.updateUnsafe(usage.cached_tokens, context)
      if (usage.reasoning_tokens > 0) genAi.reasoning.updateUnsafe(usage.reasoning_tokens, context)
    }
    if (request.stream && request.firstEventMs !== null) {
      genAi.ttft.updateUnsafe(request.firstEventMs / 1000, context)
      if (usage !== null && usage.completion_tokens > 1 && request.generationMs !== null) {
        genAi.tpot.updateUnsafe(request.generationMs / 1000 / (usage.completion_tokens - 1), context)
      }
    }
    const pct = request.remainingPct
    if (pct !== null) {
      this.#pool.session.updateUnsafe(pct.session / 100, context)
      this.#pool.weekly.updateUnsafe(pct.weekly / 100, context)
    }
  }

  /** For the image queue: how long a job waited for a worker. */
  imageWait(seconds: number): void {
    if (!this.enabled) return
    this.#imageWait.updateUnsafe(seconds, this.#context)
  }

  // ----- the scrape

  /** The Prometheus text exposition of everything recorded, with the scrape-time values taken first. */
  scrape(sources: ScrapeSources): string {
    const context = this.#context
    const s = this.#scraped
    s.logQueue.updateUnsafe(sources.logQueue, context)
    // Counters of totals kept elsewhere: add what is new since the last scrape.
    s.logDropped.updateUnsafe(Math.max(0, sources.logDropped - this.#seen.logDropped), context)
    s.hits.updateUnsafe(Math.max(0, sources.keyCache.hits - this.#seen.hits), context)
    s.misses.updateUnsafe(Math.max(0, sources.keyCache.misses - this.#seen.misses), context)
    this.#seen = { logDropped: sources.logDropped, hits: sources.keyCache.hits, misses: sources.keyCache.misses }
    const lookups = sources.keyCache.hits + sources.keyCache.misses
    s.hitRatio.updateUnsafe(lookups === 0 ? 0 : sources.keyCache.hits / lookups, context)
    s.busyWorking.updateUnsafe(sources.busy.working, context)
    s.busyHeld.updateUnsafe(sources.busy.held, context)
    s.busyPaused.updateUnsafe(sources.busy.paused, context)
    s.saturated.updateUnsafe(sources.busy.saturated ? 1 : 0, context)
    if (sources.images !== null) {
      s.imageWaiting.updateUnsafe(sources.images.waiting, context)
      s.imageWorkers.updateUnsafe(sources.images.workersOnline, context)
    }
    return PrometheusMetrics.formatUnsafe(context)
  }

  // ----- spans (only with tracing on)

  /** `effect` in a child span of the current one; unchanged when tracing is off. */
  span<A, E, R>(
    effect: Effect.Effect<A, E, R>,
    name: string,
    attributes?: Record<string, unknown>,
    parent?: Tracer.AnySpan
  ): Effect.Effect<A, E, R> {
    if (!this.tracing) return effect
    return Effect.withSpan(effect, name, {
      attributes,
      ...(parent === undefined ? {} : { parent }),
      captureStackTrace: false
    })
  }

  /** Starts a span outside any fiber (the upstream call, ended from a callback); null when tracing is off. */
  startSpan(
    name: string,
    parent: Tracer.AnySpan | undefined,
    kind: Tracer.SpanKind,
    attributes: Record<string, unknown>
  ): Tracer.Span | null {
    if (!this.tracing || this.#tracer === undefined) return null
    const span = this.#tracer.span({
      name,
      parent: parent === undefined ? Option.none() : Option.some(parent),
      annotations: Context.empty(),
      links: [],
      startTime: this.#clock!.currentTimeNanosUnsafe(),
      kind,
      root: parent === undefined,
      sampled: parent?.sampled ?? true
    })
    for (const key in attributes) span.attribute(key, attributes[key])
    return span
  }

  endSpan(span: Tracer.Span, failure: string | undefined): void {
    span.end(
      this.#clock!.currentTimeNanosUnsafe(),
      failure === undefined ? Exit.void : Exit.fail(failure)
    )
  }
}

/** Where the request path finds the recorder; without a gateway (unit tests) it records nothing. */
export const CurrentTelemetry = Context.Reference<Telemetry>("wellspring/telemetry/CurrentTelemetry", {
  defaultValue: () => Telemetry.disabled
})

/** The gateway's recorder: model labels from the live catalog, the tracer when tracing is on. */
export const layer = Layer.effect(
  CurrentTelemetry,
  Effect.gen(function*() {
    const catalog = yield* LiveCatalog
    const { config } = yield* Settings
    const tracing = yield* TracingEnabled
    const tracer = yield* Tracer.Tracer
    const clock = yield* Clock.Clock
    return new Telemetry(true, tracing, catalog.current, tracer, clock, config.redis_url ? "redis" : "memory")
  })
)
