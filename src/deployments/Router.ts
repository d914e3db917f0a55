/**
 * The `Deployments` service: sends a catalog model's requests to its deployments. For each request it hands out an
 * `UpstreamAdapter` whose `open` and `embed` pick a deployment (`Balancer.ts`), call it through its provider's
 * adapter (`Upstreams`) and, when the call fails before anything reached the client, try the next one:
 *
 * - only failures `upstream/Failure.ts` calls retryable move on (a refusal of the request itself is answered as it
 *   is); never to a deployment this request already tried; at most `routing.failover.max_attempts` attempts, and no
 *   new one `budget_seconds` after the first started. Each attempt waits for its first byte as long as its
 *   provider's own timeouts allow.
 * - an upstream `Retry-After` cools that deployment (no request waits for it).
 * - the outcome of every attempt feeds the deployment's health (`Health.ts`): the first-byte failure, or, for the
 *   attempt that answered, how its answer ended. A failure after the first byte is never retried.
 * - a model with one deployment always tries it: with nothing to fail over to, health does not keep it out.
 *
 * The request's admission (quota, RPM, the model's in-flight cap) happens once, before; attempts share its ticket,
 * so failover neither charges twice nor takes a second slot of the model.
 *
 * Per-deployment `concurrency` (attempts in flight) and `rate_limit_rpm` (attempts started per minute) are checked
 * per attempt; a deployment at a cap is skipped like an unhealthy one (not an attempt: the balancer moves on; with
 * none left the answer is 503 `service_unavailable`, or the last failure).
 * - Production (`caps`, `CapsRedis.ts`): counted for the whole fleet. An attempt on a deployment with a cap takes a
 *   slot and a start in Redis (one script call) before it starts; a deployment without one costs no Redis call.
 *   This replica's own in-flight count and a minute the fleet reported full (until it has room, for the same cap)
 *   rule deployments out without asking. The slot goes back once, when the attempt ends (answer, failure, failover,
 *   abort, interruption, a stream's end or cut); a dead replica's slots lapse within 9 s.
 * - Embedded (no `caps`): counted in this process, over the same sliding 60 s as the fleet's count.
 * The balancer weighs this replica's own in-flight counts in both modes.
 *
 * The `routing` settings are read at each request and outcome (`LiveRouting.ts`: they reload live); circuits keep
 * their state across a change.
 */
import { Clock, Context, Effect, Layer } from "effect"
import {
  deploymentsOf,
  type ModelConfig,
  type ResolvedDeployment,
  type RoutingConfig
} from "../config/GatewayConfig.js"
import { classify, type Failure } from "../upstream/Failure.js"
import {
  type UpstreamAdapter,
  type UpstreamCall,
  UpstreamError,
  type UpstreamRequest,
  Upstreams,
  type UpstreamSink
} from "../upstream/Upstream.js"
import { type Candidate, pick } from "./Balancer.js"
import { type CircuitState, HealthBook, type HealthEvent } from "./Health.js"
import type { SharedCaps } from "./SharedCaps.js"

/** What the request learns of its attempts (the exchange: its row's `deployment` and `attempts`). */
export interface AttemptObserver {
  readonly attempt: (deployment: string) => void
}

/** One deployment as the operator sees it. */
export interface DeploymentStatus {
  readonly model: string
  readonly deployment: string
  readonly provider: string
  readonly upstreamModel: string
  readonly weight: number
  readonly priority: number
  readonly state: CircuitState
  /** Seconds until an open circuit's trial, or until a `Retry-After` ends; 0 when neither. */
  readonly retryInSeconds: number
  readonly cooling: boolean
  /** Attempts in flight from this replica. */
  readonly inFlight: number
  /**
   * Attempts in flight from the whole fleet (production, deployments with a `concurrency`); null where the fleet
   * does not count them (embedded mode, no cap) or the shared store did not answer.
   */
  readonly fleetInFlight: number | null
  /**
   * Attempts started in the last 60 s, for a deployment with a `rate_limit_rpm`: the fleet's in production, this
   * process's in embedded mode; null without the cap (or when the shared store did not answer).
   */
  readonly startsLastMinute: number | null
  /** Answers counted in the health window (counting starts at the deployment's first failure). */
  readonly recentRequests: number
  readonly recentFailures: number
  readonly consecutiveFailures: number
}

export class Deployments extends Context.Service<Deployments, {
  /** The adapter for one request on `model`: balanced over its deployments, with failover before the first byte. */
  readonly forModel: (model: ModelConfig, observer: AttemptObserver) => UpstreamAdapter
  /** Every deployment of the given models, with its health and load on this replica. */
  readonly status: (models: ReadonlyArray<ModelConfig>) => Effect.Effect<ReadonlyArray<DeploymentStatus>>
  /** Applies a health change made by another replica (on this service's clock). */
  readonly apply: (event: HealthEvent) => void
}>()("wellspring/deployments/Deployments") {}

/** Where health changes go to reach the other replicas (a no-op without Redis). */
export type ShareHealth = (event: HealthEvent) => void

export interface RouterOptions {
  /** The `routing` settings in force, read at each request and outcome (`LiveRouting.ts` keeps it current). */
  readonly routing: () => RoutingConfig
  /** The balancer's chance, in [0, 1); a seeded one makes choices repeatable. */
  readonly random?: (() => number) | undefined
  readonly share?: ShareHealth | undefined
  /**
   * Per-deployment `concurrency` and `rate_limit_rpm` counted for the whole fleet (production); absent, this
   * process counts them alone (embedded mode).
   */
  readonly caps?: SharedCaps | undefined
}

/** The window of `rate_limit_rpm`: the last 60 s, sliding (as the fleet's count in `CapsRedis.ts`). */
const RPM_WINDOW_MS = 60_000

/** Requests in flight and recent attempt starts, per deployment key (this replica). */
interface Load {
  inFlight: number
  /**
   * Start times of this replica's attempts, oldest first from `head`, recorded only while the deployment has a
   * `rate_limit_rpm` and no shared caps count it (embedded mode); at most `rate_limit_rpm` of them stay.
   */
  starts: Array<number>
  head: number
  /** Shared caps: the fleet's minute was full until then (epoch ms), for the `rate_limit_rpm` it was full at. */
  fullUntil: number
  fullAt: number
}

/** One attempt's call on the deployment `attempts` picked, through its provider's adapter. */
type Attempt<A> = (
  deployment: ResolvedDeployment,
  adapter: UpstreamAdapter,
  end: (outcome: Outcome) => void
) => Effect.Effect<A, UpstreamError>

/** `Effect.uninterruptibleMask`'s `restore`. */
type Restore = <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>

/** How an attempt ended, for its deployment's health. */
type Outcome = "success" | "neutral" | Failure

const keyOf = (model: ModelConfig, deployment: ResolvedDeployment): string => `${model.id}/${deployment.id}`

const NO_DEPLOYMENT = (model: string) =>
  new UpstreamError({ kind: "connect", detail: `no deployment of ${model} is available` })

export const makeRouter = Effect.fnUntraced(function*(options: RouterOptions) {
  const upstreams = yield* Upstreams
  const layerClock = yield* Clock.Clock
  const random = options.random ?? Math.random
  const routing = options.routing
  const shared = options.caps
  const book = new HealthBook(() => routing().health, options.share)
  const loads = new Map<string, Load>()
  let lastUnavailableLog = Number.NEGATIVE_INFINITY

  /** Starts of `load` within the last minute at `now` (older ones are dropped). */
  const startsInWindow = (load: Load, now: number): number => {
    const starts = load.starts
    let head = load.head
    while (head < starts.length && starts[head]! <= now - RPM_WINDOW_MS) head++
    if (head > 1024 && head * 2 > starts.length) {
      starts.splice(0, head)
      head = 0
    }
    load.head = head
    return starts.length - head
  }

  const loadOf = (key: string): Load => {
    let load = loads.get(key)
    if (load === undefined) {
      load = { inFlight: 0, starts: [], head: 0, fullUntil: 0, fullAt: 0 }
      loads.set(key, load)
    }
    return load
  }

  interface Choice extends Candidate {
    readonly key: string
    readonly load: Load
  }

  /**
   * The deployments that may take an attempt now, leaving out those this request already tried or found full.
   * With shared caps, what this replica knows is a first filter (its own in-flight requests hold fleet slots; a
   * minute the fleet reported full stays full until its oldest start leaves it); the fleet decides at `take`.
   */
  const candidates = (model: ModelConfig, tried: ReadonlySet<string>, now: number): Array<Choice> => {
    const all = deploymentsOf(model)
    const alone = all.length === 1
    const out: Array<Choice> = []
    for (const deployment of all) {
      if (tried.has(deployment.id)) continue
      const key = keyOf(model, deployment)
      const load = loadOf(key)
      if (!alone && book.availability(key, now) === "no") continue
      if (deployment.concurrency !== null && load.inFlight >= deployment.concurrency) continue
      const rpm = deployment.rate_limit_rpm
      if (rpm !== null) {
        if (shared === undefined ? startsInWindow(load, now) >= rpm : load.fullUntil > now && load.fullAt === rpm) {
          continue
        }
      }
      out.push({ deployment, key, load, inFlight: load.inFlight })
    }
    return out
  }

  /** Counts an attempt on `choice` here; with shared caps, true when it took the half-open trial. */
  const begin = (choice: Choice, now: number): boolean => {
    const load = choice.load
    if (shared === undefined && choice.deployment.rate_limit_rpm !== null) load.starts.push(now)
    load.inFlight += 1
    const trial = shared !== undefined && book.availability(choice.key, now) === "trial"
    book.begin(choice.key, now)
    return trial
  }

  /** Undoes `begin` for an attempt that the fleet's caps refused before it started. */
  const unbegin = (choice: Choice, trial: boolean): void => {
    choice.load.inFlight -= 1
    if (trial) book.neutral(choice.key)
  }

  /**
   * Asks the fleet for a slot on a capped deployment (shared caps only); null when it may not go. A refusal is
   * remembered for `rate_limit_rpm` until the minute has room, so this replica stops asking until then.
   */
  const takeShared = (choice: Choice, caps: SharedCaps, clock: Clock.Clock) =>
    Effect.flatMap(caps.take(choice.key, choice.deployment), (taken): Effect.Effect<{ slot: string | null } | null> => {
      switch (taken._tag) {
        case "Taken":
          return Effect.succeed({ slot: taken.slot })
        case "Full":
          return Effect.succeed(null)
        case "RateLimited":
          choice.load.fullUntil = clock.currentTimeMillisUnsafe() + taken.retryMs
          choice.load.fullAt = choice.deployment.rate_limit_rpm ?? 0
          return Effect.succeed(null)
        case "Unavailable": {
          const now = clock.currentTimeMillisUnsafe()
          if (now - lastUnavailableLog < 10_000) return Effect.succeed(null)
          lastUnavailableLog = now
          return Effect.as(
            Effect.logWarning("deployment caps unavailable; skipping the capped deployment").pipe(
              Effect.annotateLogs({ deployment: choice.key, detail: taken.detail })
            ),
            null
          )
        }
      }
    })

  /** Ends one attempt's hold on its deployment (and its fleet slot), with its outcome for health; idempotent. */
  const ender = (choice: Choice, clock: Clock.Clock, slot: string | null) => {
    let ended = false
    return (outcome: Outcome): void => {
      if (ended) return
      ended = true
      choice.load.inFlight -= 1
      if (slot !== null) shared!.release(choice.key, slot)
      if (outcome === "neutral") return book.neutral(choice.key)
      const now = clock.currentTimeMillisUnsafe()
      if (outcome === "success") return book.success(choice.key, now)
      if (outcome.health) book.failure(choice.key, now, outcome.retryAfterMs)
      else book.neutral(choice.key)
    }
  }

  /**
   * Runs `call` on deployments in turn until one succeeds, a failure is not retryable, or the attempts or the
   * budget run out; the last failure is the answer then.
   */
  const attempts = <A>(
    model: ModelConfig,
    observer: AttemptObserver,
    call: Attempt<A>
  ): Effect.Effect<A, UpstreamError> =>
    // Interruptible only while an attempt is under way: a call that was opened is returned (or ended) without an
    // interruption point in between, so it is never lost with its deployment's in-flight count.
    Effect.uninterruptibleMask((restore) =>
      attemptLoop(restore, model, observer, call) as Effect.Effect<A, UpstreamError>
    )

  /**
   * The loop of `attempts`, made once per router: a generator function made per request keeps what it captures
   * alive until the next full collection (docs/decisions.md, "No generator function per request").
   */
  const attemptLoop = Effect.fnUntraced(function*(
    restore: Restore,
    model: ModelConfig,
    observer: AttemptObserver,
    call: Attempt<unknown>
  ) {
    const clock = yield* Clock.Clock
    const failover = routing().failover
    const started = clock.currentTimeMillisUnsafe()
    /** Deployments this request tried, or found full: never asked again. */
    const tried = new Set<string>()
    let failed: string | null = null
    let made = 0
    let last: UpstreamError | null = null
    while (made < failover.max_attempts) {
      const now = clock.currentTimeMillisUnsafe()
      if (made > 0 && now - started >= failover.budget_seconds * 1000) break
      const choice = pick(candidates(model, tried, now), random)
      if (choice === null) break
      tried.add(choice.deployment.id)
      const trial = begin(choice, now)
      let slot: string | null = null
      if (shared !== undefined && (choice.deployment.concurrency !== null || choice.deployment.rate_limit_rpm !== null)) {
        // Uninterruptible (bounded by the Redis command timeout): a slot taken is always handed to `ender`.
        const taken = yield* takeShared(choice, shared, clock)
        if (taken === null) {
          // Full across the fleet: skipped as a full deployment always was; not an attempt.
          unbegin(choice, trial)
          continue
        }
        slot = taken.slot
      }
      made += 1
      if (last !== null) {
        yield* Effect.logInfo("deployment failed before the first byte; trying another").pipe(
          Effect.annotateLogs({ model: model.id, failed, next: choice.deployment.id, kind: last.kind })
        )
      }
      failed = choice.deployment.id
      observer.attempt(choice.deployment.id)
      const end = ender(choice, clock, slot)
      const result = yield* restore(
        Effect.flatMap(upstreams.get(choice.deployment.provider), (adapter) => call(choice.deployment, adapter, end))
      ).pipe(
        Effect.onInterrupt(() => Effect.sync(() => end("neutral"))),
        Effect.result
      )
      if (result._tag === "Success") return result.success
      const error = result.failure
      const failure = classify(error, "catalog")
      end(failure)
      last = error
      if (!failure.retryable) break
    }
    return yield* Effect.fail(last ?? NO_DEPLOYMENT(model.id))
  })

  /** The sink of one attempt: passes everything on, and ends the attempt's hold with how the answer ended. */
  const watched = (sink: UpstreamSink, end: (outcome: Outcome) => void): UpstreamSink => ({
    onEvents: (events) => sink.onEvents(events),
    onEnd: () => {
      end("success")
      sink.onEnd()
    },
    onError: (error) => {
      end(classify(error, "catalog"))
      sink.onError(error)
    }
  })

  const forModel = (model: ModelConfig, observer: AttemptObserver): UpstreamAdapter => ({
    open: (request: UpstreamRequest, sink: UpstreamSink) =>
      attempts(model, observer, (deployment, adapter, end) =>
        Effect.map(
          adapter.open({ ...request, model: deployment.model }, watched(sink, end)),
          (call): UpstreamCall => ({
            first: call.first,
            resume: call.resume,
            abort: () => {
              end("neutral")
              call.abort()
            }
          })
        )),
    embed: (_model, input) =>
      attempts(model, observer, (deployment, adapter, end) =>
        Effect.tap(adapter.embed(deployment.model, input), () => Effect.sync(() => end("success"))))
  })

  const status = Effect.fnUntraced(function*(models: ReadonlyArray<ModelConfig>) {
    const now = yield* Clock.currentTimeMillis
    const out: Array<DeploymentStatus> = []
    for (const model of models) {
      for (const deployment of deploymentsOf(model)) {
        const key = keyOf(model, deployment)
        const view = book.view(key, now)
        const until = Math.max(view.openUntil ?? 0, view.coolUntil ?? 0)
        const load = loads.get(key)
        const capped = deployment.concurrency !== null || deployment.rate_limit_rpm !== null
        const fleet = shared !== undefined && capped ? yield* shared.usage(key) : null
        out.push({
          model: model.id,
          deployment: deployment.id,
          provider: deployment.provider,
          upstreamModel: deployment.model,
          weight: deployment.weight,
          priority: deployment.priority,
          state: view.state,
          retryInSeconds: until > now ? Math.ceil((until - now) / 1000) : 0,
          cooling: view.coolUntil !== null,
          inFlight: load?.inFlight ?? 0,
          fleetInFlight: deployment.concurrency !== null && fleet !== null ? fleet.inFlight : null,
          startsLastMinute: deployment.rate_limit_rpm === null
            ? null
            : shared === undefined
            ? (load === undefined ? 0 : startsInWindow(load, now))
            : fleet?.startsLastMinute ?? null,
          recentRequests: view.recent,
          recentFailures: view.recentFailures,
          consecutiveFailures: view.streak
        })
      }
    }
    return out as ReadonlyArray<DeploymentStatus>
  })

  return Deployments.of({
    forModel,
    status,
    apply: (event) => book.apply(event, layerClock.currentTimeMillisUnsafe())
  })
})

/** The router with health local to this process. */
export const layer = (options: RouterOptions): Layer.Layer<Deployments, never, Upstreams> =>
  Layer.effect(Deployments, makeRouter(options))
