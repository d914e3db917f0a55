/**
 * The one background-refresh helper: a value (an aggregate over SQL, a figure read from Redis) recomputed every
 * period by a fiber of the layer's scope and served from memory. Readers never start the work themselves while a
 * value exists: they get the latest snapshot, however many they are. Users: the public status resources
 * (`status/Status.ts`) and the leaderboard of the account snapshot (`accounts/Leaderboard.ts`).
 *
 * - Single flight: a refresh under way is joined, never doubled, by the background tick and by readers without a
 *   value. An explicit `refresh` reflects every write made before it: it waits out a refresh that started
 *   earlier, then starts one (or joins one started since). The work runs in the helper's scope, so an
 *   interrupted reader does not interrupt it.
 * - A failed refresh keeps the previous snapshot (logged at most once a minute per resource); with none yet,
 *   readers wait for the next attempt.
 * - `usable` may reject a snapshot that is no longer right whatever its age (yesterday's leaderboard); readers
 *   then wait for a refresh.
 * - One replica's work per period (`shared`): with Redis configured (`RefreshRedis.ts`), the replica that takes
 *   the period's lock (`SET NX PX`) computes and publishes the value; the others read it. A published value
 *   older than three periods (its replica died) is not trusted: the reader computes it itself. Without Redis
 *   (`layerLocal`) every process computes its own.
 *
 * Time is the Effect clock, so a TestClock drives the ticks.
 */
import { Cause, Clock, Context, Deferred, Duration, Effect, Exit, Layer, type Scope } from "effect"

/** A value and the time (epoch ms) its computation started. */
export interface Snapshot<A> {
  readonly value: A
  readonly at: number
}

/** Where replicas agree on who refreshes a resource in a period, and share the result. */
export class RefreshStore extends Context.Service<RefreshStore, {
  readonly kind: "local" | "redis"
  /** True when this replica is to compute `name` for the period starting now (the lock lasts `ttlMs`). */
  readonly claim: (name: string, ttlMs: number) => Effect.Effect<boolean>
  /** Publishes the computed value (JSON text), kept `ttlMs`. */
  readonly publish: (name: string, text: string, ttlMs: number) => Effect.Effect<void>
  /** The value last published, or null. */
  readonly read: (name: string) => Effect.Effect<string | null>
}>()("wellspring/runtime/RefreshStore") {}

/** No sharing: every process computes its own values (embedded mode, tests). */
export const layerLocal: Layer.Layer<RefreshStore> = Layer.succeed(
  RefreshStore,
  RefreshStore.of({
    kind: "local",
    claim: () => Effect.succeed(true),
    publish: () => Effect.void,
    read: () => Effect.succeed(null)
  })
)

export interface Refresher<A> {
  /** The latest snapshot; waits only when there is none, or `usable` rejects it. */
  readonly get: Effect.Effect<Snapshot<A>>
  /** The latest snapshot, never waiting (undefined before the first). */
  readonly peek: () => Snapshot<A> | undefined
  /** A refresh that starts after this call (one under way is waited out first, not joined), and its result. */
  readonly refresh: Effect.Effect<Snapshot<A>>
  /** Forgets the snapshot: the next `get` waits for a refresh. */
  readonly invalidate: Effect.Effect<void>
  /** Computations this process ran (reads of another replica's value are not counted). */
  readonly loads: () => number
}

/** How a value travels through the store (JSON). */
export interface Codec<A> {
  readonly encode: (value: A) => unknown
  /** Null when the text is not a value of this version (then it is computed locally). */
  readonly decode: (json: unknown) => A | null
}

export interface RefreshOptions<A> {
  /** Names the resource in logs and in the store. */
  readonly name: string
  readonly every: Duration.Input
  readonly load: Effect.Effect<A>
  readonly usable?: ((snapshot: Snapshot<A>, now: number) => boolean) | undefined
  /** Share the work between replicas through the `RefreshStore` (one computation per period). */
  readonly shared?: Codec<A> | undefined
}

/** Failures of one resource are logged at most this often. */
const FAILURE_LOG_MS = 60_000
/** A published value older than this many periods is not trusted. */
const STALE_PERIODS = 3

/** Starts refreshing in the current scope (the first refresh begins at once; it is not awaited). */
export const make = <A>(options: RefreshOptions<A>): Effect.Effect<Refresher<A>, never, Scope.Scope | RefreshStore> =>
  Effect.gen(function*() {
    const store = yield* RefreshStore
    const scope = yield* Effect.scope
    const periodMs = Math.max(1, Duration.toMillis(options.every))
    const usable = options.usable
    const shared = store.kind === "local" ? undefined : options.shared
    let current: Snapshot<A> | undefined
    let inflight: Deferred.Deferred<Snapshot<A>> | undefined
    let loads = 0
    let failuresSinceLog = 0
    let lastFailureLog = Number.NEGATIVE_INFINITY

    const compute: Effect.Effect<Snapshot<A>> = Effect.gen(function*() {
      const at = yield* Clock.currentTimeMillis
      loads++
      return { value: yield* options.load, at }
    })

    const publish = (codec: Codec<A>, snapshot: Snapshot<A>) =>
      Effect.suspend(() =>
        store.publish(options.name, JSON.stringify({ at: snapshot.at, value: codec.encode(snapshot.value) }), STALE_PERIODS * periodMs)
      )

    const decodeShared = (codec: Codec<A>, text: string | null): Snapshot<A> | null => {
      if (text === null) return null
      try {
        const parsed = JSON.parse(text) as { at?: unknown; value?: unknown }
        if (typeof parsed?.at !== "number") return null
        const value = codec.decode(parsed.value)
        return value === null ? null : { value, at: parsed.at }
      } catch {
        return null
      }
    }

    /** One refresh: computed here, or read from the replica that holds this period's lock. */
    const once: Effect.Effect<Snapshot<A>> = shared === undefined ? compute : Effect.gen(function*() {
      if (yield* store.claim(options.name, Math.max(1, Math.floor(periodMs * 0.9)))) {
        const snapshot = yield* compute
        yield* publish(shared, snapshot)
        return snapshot
      }
      const now = yield* Clock.currentTimeMillis
      const theirs = decodeShared(shared, yield* store.read(options.name))
      if (theirs !== null && now - theirs.at < STALE_PERIODS * periodMs && (usable === undefined || usable(theirs, now))) {
        return theirs
      }
      const snapshot = yield* compute
      yield* publish(shared, snapshot)
      return snapshot
    })

    const install = (snapshot: Snapshot<A>) => {
      // An older result (a slow refresh overtaken by a newer one) does not replace a newer snapshot.
      if (current === undefined || snapshot.at >= current.at) current = snapshot
    }

    /** Joins the refresh under way, or starts one. */
    const joinOrStart: Effect.Effect<Snapshot<A>> = Effect.suspend(() => {
      if (inflight !== undefined) return Deferred.await(inflight)
      const done = Deferred.makeUnsafe<Snapshot<A>>()
      inflight = done
      const run = once.pipe(
        Effect.onExit((exit) =>
          Effect.suspend(() => {
            if (inflight === done) inflight = undefined
            if (Exit.isSuccess(exit)) install(exit.value)
            return Deferred.done(done, exit)
          })
        )
      )
      return Effect.andThen(Effect.forkIn(run, scope), Deferred.await(done))
    })

    const refresh: Effect.Effect<Snapshot<A>> = Effect.suspend(() => {
      const earlier = inflight
      // Whatever the earlier one's outcome; one under way once it ends started after this call.
      return earlier === undefined ? joinOrStart : Effect.andThen(Effect.exit(Deferred.await(earlier)), joinOrStart)
    })

    const get: Effect.Effect<Snapshot<A>> = Effect.suspend(() => {
      const snapshot = current
      if (snapshot === undefined) return joinOrStart
      if (usable === undefined) return Effect.succeed(snapshot)
      return Effect.flatMap(Clock.currentTimeMillis, (now) => {
        if (usable(snapshot, now)) return Effect.succeed(snapshot)
        // A refresh that started before the snapshot went out of date may bring one as old: then once more.
        return Effect.flatMap(joinOrStart, (next) => (usable(next, now) ? Effect.succeed(next) : joinOrStart))
      })
    })

    const logFailure = (cause: Cause.Cause<unknown>) =>
      Effect.flatMap(Clock.currentTimeMillis, (now) => {
        failuresSinceLog++
        if (now - lastFailureLog < FAILURE_LOG_MS) return Effect.void
        const failures = failuresSinceLog
        lastFailureLog = now
        failuresSinceLog = 0
        return Effect.logWarning("background refresh failed; serving the previous value", cause).pipe(
          Effect.annotateLogs({ resource: options.name, failures })
        )
      })

    const tick = joinOrStart.pipe(
      Effect.asVoid,
      Effect.catchCause((cause) => (Cause.hasInterruptsOnly(cause) ? Effect.failCause(cause) : logFailure(cause)))
    )
    yield* Effect.forkIn(Effect.forever(Effect.andThen(tick, Effect.sleep(periodMs))), scope)

    return {
      get,
      peek: () => current,
      refresh,
      invalidate: Effect.sync(() => {
        current = undefined
      }),
      loads: () => loads
    }
  })

/** A codec for values that are plain JSON already (checked to be an object). */
export const jsonCodec = <A extends object>(): Codec<A> => ({
  encode: (value) => value,
  decode: (json) => (typeof json === "object" && json !== null ? json as A : null)
})
