/**
 * `Admission` over Redis (production mode, ARCHITECTURE §2, §4): every counter, window and in-flight lease lives
 * in Redis, so any number of gateway replicas share them. Composed of:
 *
 * - `AdmissionScripts.ts`: the Lua scripts and key layout behind typed wrappers. One script call (`admit`, one
 *   EVALSHA round trip) runs every check and the reservation atomically: abuse cooldown -> RPM -> session ->
 *   weekly -> model daily cap -> in-flight; it commits only when all pass. Time is Redis server time, or `now`
 *   from the Effect clock when `time: "clock"` (tests drive it with `TestClock`);
 * - the client from `store/Redis.ts` (`RedisClient`): bounded commands, no offline queue, so while Redis is
 *   unreachable admission fails at once with `service_unavailable` (fail closed);
 * - `RedisLeases.ts`: in-flight slots are leases that expire after `leaseMs` (9 s) unless extended; one
 *   heartbeat fiber per layer extends every lease this replica holds every `leaseMs / 3`, and retries
 *   settles/releases that failed (idempotent); a dead replica's leases lapse and are pruned by the next admission;
 * - `WriteBehind.ts` (with a SqlClient): the pools and daily totals this replica touched are copied to
 *   `quota_windows` / `model_daily_usage` a `snapshotInterval` after they change (and on scope close); when an
 *   account's pool hash (or today's daily total) is missing in Redis, it is rebuilt from those rows instead of
 *   restarting at 0;
 * - `RateLimitRedis.ts`: the shared limiter behind `limit`.
 *
 * Abuse counts admitted requests only (see `Transitions.admit`).
 */
import { Clock, Context, Deferred, type Duration, Effect, Layer, type Redacted, Scope } from "effect"
import { SqlClient } from "effect/sql"
import type { Redis } from "ioredis"
import type { PlanConfig } from "../config/GatewayConfig.js"
import type { GatewayError } from "../errors/Catalog.js"
import * as StoreRedis from "../store/Redis.js"
import { Admission, type AdmitInput, type SettleUsage, type Standing, type Ticket } from "./Admission.js"
import * as Scripts from "./AdmissionScripts.js"
import {
  type AbuseSettings,
  poolStanding,
  rawTokens,
  rejectionError,
  reservationOf,
  rpmStanding,
  sessionMs,
  unavailable,
  WEEK_MS,
  weightedCost
} from "./Policy.js"
import { makeQuotaRepo, type QuotaRepo } from "./QuotaRepo.js"
import { fixedWindow } from "../runtime/RateWindow.js"
import * as RateLimitRedis from "./RateLimitRedis.js"
import * as RedisLeases from "./RedisLeases.js"
import { abuseRule } from "./Transitions.js"
import * as WriteBehind from "./WriteBehind.js"

export interface RedisAdmissionOptions {
  readonly abuse: AbuseSettings
  /** Redis URL (`redis://host:port/db`). Ignored when `client` is given. */
  readonly url?: string | Redacted.Redacted<string> | undefined
  /** Use this client instead of creating one (it is not closed by the layer). */
  readonly client?: Redis | undefined
  /** Prefix of every key. Default `ws:q:`. */
  readonly keyPrefix?: string | undefined
  /** Per-command timeout of the client the layer creates from `url`. Default 500 ms. */
  readonly commandTimeoutMs?: number | undefined
  /** In-flight lease lifetime without heartbeat. Default 9 s (`RedisLeases.DEFAULT_LEASE_MS`). */
  readonly leaseMs?: number | undefined
  /** Snapshot to PostgreSQL and rebuild from it. */
  readonly sql?: SqlClient.SqlClient | undefined
  /** Delay between the first change and the snapshot write. Default 5 seconds. */
  readonly snapshotInterval?: Duration.Input | undefined
  /**
   * Time source of the scripts: `redis` (server `TIME`, production) or `clock` (the Effect `Clock` passes `now`,
   * so `TestClock` drives the windows in tests). Default `redis`.
   */
  readonly time?: "redis" | "clock" | undefined
}

/** Options when the client comes from the context's `RedisClient`. */
export type RedisAdmissionStoreOptions = Omit<RedisAdmissionOptions, "url" | "client" | "commandTimeoutMs">

/** Test and operator view into the Redis layer. */
export class AdmissionRedisProbe extends Context.Service<AdmissionRedisProbe, {
  /** Live (unexpired) leases on a model, across all replicas. */
  readonly inFlight: (modelId: string) => Effect.Effect<number, GatewayError>
  /** Writes touched pools and daily totals to PostgreSQL now (no-op without `sql`). */
  readonly flush: Effect.Effect<void>
  /** Extends this replica's leases now (what the heartbeat does every leaseMs / 3). */
  readonly heartbeat: Effect.Effect<void>
  readonly client: Redis
  readonly keyPrefix: string
}>()("wellspring/quota/AdmissionRedisProbe") {}

/** ioredis options for fail-fast behaviour (moved to `store/Redis.ts`; kept for callers of the old name). */
export const clientOptions = StoreRedis.clientOptions

interface SettleResult {
  readonly standing: Standing
  readonly weighted: number
}

interface RTicket {
  readonly input: AdmitInput
  readonly leaseId: string
  readonly byok: boolean
  /** Quota day of the reservation. */
  readonly day: number
  reserved: Standing
  /** Lease still held (removed from the heartbeat set on release). */
  leased: boolean
  outcome: Deferred.Deferred<SettleResult> | undefined
  ticket: Ticket
}

/** Builds the service and its probe on `client`; needs a Scope (heartbeat, snapshot writer). */
export const makeWithClient = Effect.fnUntraced(function*(client: Redis, options: RedisAdmissionStoreOptions) {
  const clock: Clock.Clock = yield* Clock.Clock
  const runFork = Effect.runForkWith(yield* Effect.context<never>())
  const prefix = options.keyPrefix ?? "ws:q:"
  const leaseMs = options.leaseMs ?? RedisLeases.DEFAULT_LEASE_MS
  const useClock = options.time === "clock"
  const repo = options.sql === undefined ? undefined : makeQuotaRepo(options.sql)
  const abuse = abuseRule(options.abuse)
  const scripts = Scripts.make(client, prefix)
  const limiter = RateLimitRedis.make(client, { keyPrefix: prefix, time: useClock ? "clock" : "redis" })

  /** The scripts' time: the Effect clock in `clock` mode, else undefined (Redis `TIME`). */
  const now = (): number | undefined => (useClock ? clock.currentTimeMillisUnsafe() : undefined)

  const replica = Math.random().toString(36).slice(2, 10)
  let seq = 0
  const leases = yield* RedisLeases.make({ scripts, leaseMs, now })

  // --- snapshots to PostgreSQL ---------------------------------------------------------------------------------
  const touchedAccounts = new Set<string>()
  const touchedDaily = new Map<string, { readonly modelId: string; readonly day: number }>()
  const snapshots = repo === undefined ? undefined : yield* WriteBehind.make({
    repo,
    interval: options.snapshotInterval ?? "5 seconds",
    label: "snapshot",
    take: () => {
      const ids = [...touchedAccounts]
      const days = [...touchedDaily.values()]
      touchedAccounts.clear()
      touchedDaily.clear()
      if (ids.length === 0 && days.length === 0) return undefined
      return {
        rows: Effect.flatMap(scripts.pools(ids), (pools) =>
          Effect.map(scripts.dailyTotals(days), (totals) => ({
            // pools absent (expired): nothing worth keeping
            accounts: pools.filter((row) => row !== undefined),
            daily: days.flatMap((d, i) => totals[i] == null ? [] : [{ ...d, tokens: totals[i]! }])
          }))),
        written: () => {},
        failed: () => {
          for (const id of ids) touchedAccounts.add(id)
          for (const d of days) touchedDaily.set(`${d.modelId}\u0000${d.day}`, d)
        }
      }
    }
  })
  const touch = (accountId: string, modelId: string, day: number) => {
    if (snapshots === undefined) return
    touchedAccounts.add(accountId)
    touchedDaily.set(`${modelId}\u0000${day}`, { modelId, day })
    snapshots.signal()
  }
  /** An account whose cooldown may have just started (the memory backend marks it dirty likewise). */
  const touchAccount = (accountId: string) => {
    if (snapshots === undefined) return
    touchedAccounts.add(accountId)
    snapshots.signal()
  }

  // --- rebuild from PostgreSQL ---------------------------------------------------------------------------------
  const rebuildFrom = Effect.fnUntraced(function*(
    repo: QuotaRepo,
    what: { readonly accountId?: string; readonly modelId?: string; readonly day?: number }
  ) {
    if (what.accountId !== undefined) {
      const row = yield* repo.loadAccount(what.accountId).pipe(
        Effect.mapError((e) => unavailable(`quota rebuild: ${e.message}`))
      )
      yield* scripts.restoreAccount({ accountId: what.accountId, now: now(), row })
    }
    if (what.modelId !== undefined && what.day !== undefined) {
      const tokens = yield* repo.loadDailyModel(what.modelId, what.day).pipe(
        Effect.mapError((e) => unavailable(`quota rebuild: ${e.message}`))
      )
      yield* scripts.restoreDaily({ modelId: what.modelId, day: what.day, tokens: tokens ?? 0 })
    }
  })
  const rebuild = (
    what: { readonly accountId?: string; readonly modelId?: string; readonly day?: number }
  ): Effect.Effect<void, GatewayError> => repo === undefined ? Effect.void : rebuildFrom(repo, what)

  // --- admission -----------------------------------------------------------------------------------------------
  const standingOf = (plan: PlanConfig, at: number, w: Scripts.PoolWindows): Standing => ({
    session: poolStanding(
      w.sessionUsed,
      plan.session_limit,
      w.sessionStart === null ? null : w.sessionStart + sessionMs(plan),
      at
    ),
    weekly: poolStanding(
      w.weeklyUsed,
      plan.weekly_limit,
      w.weeklyAnchor === null ? null : w.weeklyAnchor + WEEK_MS,
      at,
      w.weeklyAnchor
    )
  })

  const settleCall = (t: RTicket, mode: Scripts.SettleMode, usage: SettleUsage | null) => {
    const call: Scripts.SettleCall = {
      accountId: t.input.accountId,
      modelId: t.input.model.id,
      leaseId: t.leaseId,
      mode,
      weighted: usage === null ? 0 : weightedCost(t.input.model, usage),
      raw: usage === null ? 0 : rawTokens(usage)
    }
    return scripts.settle({ ...call, now: now() }).pipe(
      Effect.tapError((e) =>
        Effect.andThen(
          Effect.sync(() => leases.retry(call)),
          Effect.logWarning(`quota ${mode} of ${t.leaseId} failed; will retry`, e.detail)
        )
      )
    )
  }

  const resolve = (t: RTicket, usage: SettleUsage | null) =>
    Effect.suspend(() => {
      if (t.outcome !== undefined) return Deferred.await(t.outcome)
      const d = Deferred.makeUnsafe<SettleResult>()
      t.outcome = d
      const weighted = usage === null || t.byok ? 0 : weightedCost(t.input.model, usage)
      const plan = t.input.plan
      const work = t.byok
        ? scripts.standing({ accountId: t.input.accountId, now: now() }).pipe(
          Effect.map((r) => standingOf(plan, r.now, r.windows))
        )
        // A settle is the end of the request: it frees the in-flight slot in the same round trip.
        : settleCall(t, usage === null ? "refund" : "settle_release", usage).pipe(
          Effect.tap(() =>
            Effect.sync(() => {
              touch(t.input.accountId, t.input.model.id, t.day)
              if (usage !== null && t.leased) {
                t.leased = false
                leases.unhold(t.input.model.id, t.leaseId)
              }
            })
          ),
          Effect.map((r) => standingOf(plan, r.now, r.windows))
        )
      // uninterruptible (bounded by the command timeout): the outcome must be recorded for later callers
      return work.pipe(
        Effect.orElseSucceed(() => t.reserved),
        Effect.map((standing) => ({ standing, weighted })),
        Effect.tap((result) => Deferred.succeed(d, result)),
        Effect.uninterruptible
      )
    })

  const release = (t: RTicket): Effect.Effect<void> =>
    Effect.suspend(() => {
      if (t.byok) return Effect.void
      const pendingOutcome = t.outcome === undefined
      if (!pendingOutcome && !t.leased) return Effect.void // settled: the slot went with the settle
      if (t.leased) {
        t.leased = false
        leases.unhold(t.input.model.id, t.leaseId)
      }
      if (pendingOutcome) {
        // scope closed before settle: refund and drop the lease in one call
        const d = Deferred.makeUnsafe<SettleResult>()
        t.outcome = d
        return settleCall(t, "release", null).pipe(
          Effect.map((r) => standingOf(t.input.plan, r.now, r.windows)),
          Effect.orElseSucceed(() => t.reserved),
          Effect.flatMap((standing) => Deferred.succeed(d, { standing, weighted: 0 })),
          Effect.asVoid
        )
      }
      return Effect.ignore(settleCall(t, "unlease", null))
    })

  const admitOnce: (input: AdmitInput) => Effect.Effect<RTicket, GatewayError> = Effect.fnUntraced(function*(
    input: AdmitInput
  ) {
    const { model, plan } = input
    const leaseId = `${replica}.${(++seq).toString(36)}`
    const reserve = input.byok ? { weighted: 0, raw: 0 } : reservationOf(model, input.estimatedInputTokens)
    const attempt = (reportMissing: boolean) =>
      scripts.admit({
        accountId: input.accountId,
        modelId: model.id,
        leaseId,
        now: now(),
        byok: input.byok,
        rpmLimit: model.rate_limit_rpm,
        abuse,
        sessionLimit: plan.session_limit,
        sessionMs: sessionMs(plan),
        weeklyLimit: plan.weekly_limit,
        reserveWeighted: reserve.weighted,
        reserveRaw: reserve.raw,
        dailyCap: model.daily_cap,
        concurrency: model.concurrency,
        leaseMs,
        reportMissing
      }).pipe(
        Effect.tapError((e) =>
          // After a timeout the script may have run although the reply was lost: undo by lease id (a no-op
          // if it did not run). Other errors mean the command was never sent (offline queue disabled).
          input.byok || !e.detail?.includes("timed out") ? Effect.void : Effect.sync(() => {
            const undo: Scripts.SettleCall = {
              accountId: input.accountId,
              modelId: model.id,
              leaseId,
              mode: "release",
              weighted: 0,
              raw: 0
            }
            runFork(scripts.settle({ ...undo, now: now() }).pipe(Effect.catch(() => Effect.sync(() => leases.retry(undo)))))
          })
        )
      )
    let r = yield* attempt(repo !== undefined && !input.byok)
    if (r._tag === "Missing") {
      yield* rebuild({
        ...(r.pools ? { accountId: input.accountId } : {}),
        ...(r.daily ? { modelId: model.id, day: r.day } : {})
      })
      r = yield* attempt(false)
    }
    if (r._tag === "Rejected") {
      if (r.rejection.code === "abuse_cooldown") touchAccount(input.accountId)
      return yield* Effect.fail(rejectionError(r.rejection))
    }
    if (r._tag === "Invalid") return yield* Effect.fail(r.error)
    if (r._tag === "Missing") return yield* Effect.fail(unavailable("quota state missing after rebuild"))
    const t: RTicket = {
      input,
      leaseId,
      byok: input.byok,
      day: r.day,
      reserved: standingOf(plan, r.now, r.windows),
      leased: !input.byok,
      outcome: undefined,
      ticket: undefined as unknown as Ticket
    }
    if (!input.byok) {
      leases.hold(model.id, leaseId)
      touch(input.accountId, model.id, r.day)
    }
    t.ticket = {
      reserved: t.reserved,
      rpm: rpmStanding(model.rate_limit_rpm, r.rpmCount, r.rpmOldest, r.now),
      settle: (usage) => resolve(t, usage),
      refund: Effect.asVoid(resolve(t, null))
    }
    return t
  })

  const admission = Admission.of({
    // Not `acquireRelease`, which merges the whole request context into the closing fiber's per request.
    admit: (input) =>
      Effect.flatMap(Effect.scope, (scope) =>
        Effect.uninterruptible(Effect.map(
          Effect.tap(admitOnce(input), (t) => Scope.addFinalizer(scope, release(t))),
          (t) => t.ticket
        ))),

    standing: Effect.fnUntraced(function*(accountId: string, plan: PlanConfig) {
      let r = yield* scripts.standing({ accountId, now: now() })
      if (repo !== undefined && !r.hasPools) {
        yield* rebuild({ accountId })
        r = yield* scripts.standing({ accountId, now: now() })
      }
      return standingOf(plan, r.now, r.windows)
    }),

    currentRpm: (accountId) => scripts.rpm({ accountId, now: now() }),

    dailyUsage: Effect.fnUntraced(function*(modelId: string) {
      let r = yield* scripts.daily({ modelId, now: now() })
      if (repo !== undefined && r.tokens === null) {
        yield* rebuild({ modelId, day: r.day })
        r = yield* scripts.daily({ modelId, now: now() })
      }
      return Math.max(0, r.tokens ?? 0)
    }),

    limit: (key, max, windowSeconds) => limiter.take(key, fixedWindow(max, windowSeconds))
  })

  const probe = AdmissionRedisProbe.of({
    inFlight: (modelId) => scripts.liveLeases({ modelId, now: clock.currentTimeMillisUnsafe() }),
    flush: snapshots?.flush ?? Effect.void,
    heartbeat: leases.heartbeat,
    client,
    keyPrefix: prefix
  })

  return { admission, probe } as const
})

/**
 * Builds the service and its probe; the client is `options.client`, else one opened from `options.url` for the
 * layer's lifetime (`store/Redis.ts`). Needs a Scope.
 */
export const make = Effect.fnUntraced(function*(options: RedisAdmissionOptions) {
  const client = options.client ??
    (yield* StoreRedis.make({ url: options.url, commandTimeoutMs: options.commandTimeoutMs })).client
  return yield* makeWithClient(client, options)
})

/** The same, on the context's `RedisClient`. */
export const makeFromStore = (options: RedisAdmissionStoreOptions) =>
  Effect.flatMap(StoreRedis.RedisClient, ({ client }) => makeWithClient(client, options))

export const layerRedis = (options: RedisAdmissionOptions): Layer.Layer<Admission> =>
  Layer.effect(Admission, Effect.map(make(options), (m) => m.admission))

/** Redis admission on the context's `RedisClient` (the App's wiring). */
export const layerRedisFromStore = (
  options: RedisAdmissionStoreOptions
): Layer.Layer<Admission, never, StoreRedis.RedisClient> =>
  Layer.effect(Admission, Effect.map(makeFromStore(options), (m) => m.admission))

/** Redis admission that snapshots to and rebuilds from PostgreSQL through the context's SqlClient. */
export const layerRedisWithSql = (
  options: Omit<RedisAdmissionOptions, "sql">
): Layer.Layer<Admission, never, SqlClient.SqlClient> =>
  Layer.effect(
    Admission,
    Effect.flatMap(SqlClient.SqlClient, (sql) => Effect.map(make({ ...options, sql }), (m) => m.admission))
  )

export const layerRedisWithProbe = (options: RedisAdmissionOptions): Layer.Layer<Admission | AdmissionRedisProbe> =>
  Layer.effectContext(
    Effect.map(make(options), (m) => Context.make(Admission, m.admission).pipe(Context.add(AdmissionRedisProbe, m.probe)))
  )
