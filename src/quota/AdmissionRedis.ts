/**
 * `Admission` over Redis (production mode, ARCHITECTURE §2, §4): every counter, window and in-flight lease lives
 * in Redis, so any number of gateway replicas share them.
 *
 * - One Lua script (`ADMIT`, one EVALSHA round trip) runs every check and the reservation atomically:
 *   abuse cooldown -> RPM -> session -> weekly -> model daily cap -> in-flight; it commits only when all pass.
 *   Time is Redis server time (`TIME`), or `now` passed by the caller when `time: "clock"` (tests drive it with
 *   `TestClock`).
 * - Keys (prefix configurable): per account a hash `a:{id}` (ss/su session start/used, wa/wu weekly anchor/used,
 *   cd cooldown, v "pools present"), the abuse window `a:{id}:abuse` and RPM windows `a:{id}:rpm:<model>`
 *   (sorted sets of admission times) with an index set; per model a hash `m:{model}:daily` (raw tokens per
 *   quota day, day = UTC day number: 09:00 KST) and a sorted set `m:{model}:lease` of lease ids scored by
 *   expiry; per admission a reservation record `r:<lease>` (what was reserved, and in which windows) that makes
 *   settle/refund/release idempotent even across retries.
 * - Leases expire after `leaseMs` (30 s) unless extended: one heartbeat fiber per layer extends every lease this
 *   replica holds every `leaseMs / 3`; a dead replica's leases lapse and are pruned by the next admission.
 * - Failure: every call has `commandTimeoutMs` (500 ms); the offline queue is disabled, so while Redis is
 *   unreachable admission fails at once with `service_unavailable` (fail closed) and ioredis keeps
 *   reconnecting in the background. Settles/releases that fail are retried by the heartbeat (idempotent).
 * - With a SqlClient: the pools and daily totals this replica touched are copied to `quota_windows` /
 *   `model_daily_usage` a `snapshotInterval` after they change (and on scope close); when an account's pool
 *   hash (or today's daily total) is missing in Redis, it is rebuilt from those rows instead of restarting at 0.
 *
 * Single-node (or primary) Redis only: the admission script touches account and model keys together.
 * Abuse counts admitted requests only (see `AdmissionMemory`).
 */
import { Clock, Context, Deferred, Duration, Effect, Layer, Queue, Redacted, Semaphore } from "effect"
import { SqlClient } from "effect/sql"
import { Redis, type RedisOptions } from "ioredis"
import type { PlanConfig } from "../config/GatewayConfig.js"
import { GatewayError } from "../errors/Catalog.js"
import { Admission, type AdmitInput, type SettleUsage, type Standing, type Ticket } from "./Admission.js"
import {
  abuseCooldown,
  type AbuseSettings,
  modelOverloaded,
  modelQuotaExceeded,
  poolStanding,
  rateLimited,
  rawTokens,
  reservationOf,
  rpmStanding,
  sessionExhausted,
  sessionMs,
  unavailable,
  WEEK_MS,
  weeklyExhausted,
  weightedCost
} from "./Policy.js"
import { type AccountWindows, type DailyUsageRow, makeQuotaRepo } from "./QuotaRepo.js"

export interface RedisAdmissionOptions {
  readonly abuse: AbuseSettings
  /** Redis URL (`redis://host:port/db`). Ignored when `client` is given. */
  readonly url?: string | Redacted.Redacted<string> | undefined
  /** Use this client instead of creating one (it is not closed by the layer). */
  readonly client?: Redis | undefined
  /** Prefix of every key. Default `ws:q:`. */
  readonly keyPrefix?: string | undefined
  /** Per-command timeout. Default 500 ms. */
  readonly commandTimeoutMs?: number | undefined
  /** In-flight lease lifetime without heartbeat. Default 30 s. */
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

// ---------------------------------------------------------------------------------------------------------------
// Lua. Numbers that may be fractional are returned as strings (Lua numbers become integer replies).

const NOW = `
local now
if ARGV[1] ~= '' then now = tonumber(ARGV[1]) else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local DAY, WEEK = 86400000, 604800000
local function fmt(x) return string.format('%.17g', x) end
`

/**
 * KEYS: 1 account hash, 2 abuse zset, 3 rpm zset, 4 rpm index, 5 model daily hash, 6 model lease zset,
 *       7 reservation record.
 * ARGV: 1 now|'', 2 lease id, 3 byok, 4 rpm limit, 5 model id, 6 abuse burst, 7 abuse window ms,
 *       8 cooldown ms, 9 session limit, 10 session ms, 11 weekly limit, 12 reserve weighted, 13 reserve raw,
 *       14 daily cap (-1 none), 15 concurrency, 16 lease ms, 17 report missing pools (1/0).
 * Returns {0, code, value[, day]} on rejection (1 abuse: resets_at, 2 rpm: retry s, 3 session: resets_at,
 * 4 weekly: resets_at, 5 daily: resets_at, 6 overloaded: retry s, 7 missing: bitmask 1 pools 2 daily),
 * else {1, now, rpm count, rpm oldest, day, ss|-1, su, wa|-1, wu}.
 */
const ADMIT = `${NOW}
local acct, abuseK, rpmK, rpmIdx, dailyK, leaseK, resK = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7]
local id, byok, rpmLimit, modelId = ARGV[2], ARGV[3] == '1', tonumber(ARGV[4]), ARGV[5]
local burst, abuseWin, cooldown = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local sLimit, sMs, wLimit = tonumber(ARGV[9]), tonumber(ARGV[10]), tonumber(ARGV[11])
local reserve, raw, cap = tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[14])
local conc, leaseMs = tonumber(ARGV[15]), tonumber(ARGV[16])
local day = math.floor(now / DAY)
local dayF = string.format('%d', day)
if ARGV[17] == '1' then
  local mask = 0
  if redis.call('HEXISTS', acct, 'v') == 0 then mask = mask + 1 end
  -- every model's total, capped or not: an uncapped total restarted at 0 would overwrite PostgreSQL's
  if redis.call('HEXISTS', dailyK, dayF) == 0 then mask = mask + 2 end
  if mask > 0 then return {0, 7, mask, day} end
end
local f = redis.call('HMGET', acct, 'ss', 'su', 'wa', 'wu', 'cd')
local ss, su, wa, wu, cd = tonumber(f[1]), tonumber(f[2]) or 0, tonumber(f[3]), tonumber(f[4]) or 0, tonumber(f[5]) or 0
if now < cd then return {0, 1, cd} end
redis.call('ZREMRANGEBYSCORE', abuseK, '-inf', now - abuseWin)
if redis.call('ZCARD', abuseK) >= burst then
  cd = now + cooldown
  redis.call('HSET', acct, 'cd', cd)
  redis.call('DEL', abuseK)
  if redis.call('PTTL', acct) < cooldown + DAY then redis.call('PEXPIRE', acct, cooldown + DAY) end
  return {0, 1, cd}
end
redis.call('ZREMRANGEBYSCORE', rpmK, '-inf', now - 60000)
local n = redis.call('ZCARD', rpmK)
if n >= rpmLimit then
  local e = redis.call('ZRANGE', rpmK, n - rpmLimit, n - rpmLimit, 'WITHSCORES')
  return {0, 2, math.max(1, math.ceil((tonumber(e[2]) + 60000 - now) / 1000))}
end
if not byok then
  if ss and now >= ss + sMs then ss = nil; su = 0 end
  if wa and now >= wa + WEEK then wa = nil; wu = 0 end
  if ss and su >= sLimit then return {0, 3, ss + sMs} end
  if wa and wu >= wLimit then return {0, 4, wa + WEEK} end
  if cap >= 0 and (tonumber(redis.call('HGET', dailyK, dayF)) or 0) >= cap then return {0, 5, (day + 1) * DAY} end
  redis.call('ZREMRANGEBYSCORE', leaseK, '-inf', now)
  if redis.call('ZCARD', leaseK) >= conc then return {0, 6, 5} end
end
redis.call('ZADD', rpmK, now, id)
redis.call('PEXPIRE', rpmK, 61000)
redis.call('SADD', rpmIdx, modelId)
redis.call('PEXPIRE', rpmIdx, 61000)
redis.call('ZADD', abuseK, now, id)
redis.call('PEXPIRE', abuseK, abuseWin + 1000)
if not byok then
  if not ss then ss = now; su = 0 end
  if not wa then wa = now; wu = 0 end
  su = su + reserve
  wu = wu + reserve
  redis.call('HSET', acct, 'ss', ss, 'su', su, 'wa', wa, 'wu', wu, 'v', 1)
  redis.call('PEXPIRE', acct, math.max(ss + sMs, wa + WEEK, cd) - now + DAY)
  if redis.call('HINCRBY', dailyK, dayF, raw) == raw and redis.call('HLEN', dailyK) > 2 then
    for _, k in ipairs(redis.call('HKEYS', dailyK)) do
      if tonumber(k) < day - 1 then redis.call('HDEL', dailyK, k) end
    end
  end
  redis.call('PEXPIRE', dailyK, 3 * DAY)
  redis.call('ZADD', leaseK, now + leaseMs, id)
  redis.call('PEXPIRE', leaseK, 2 * leaseMs)
  redis.call('HSET', resK, 'r', reserve, 'x', raw, 'ss', ss, 'wa', wa, 'd', dayF)
  redis.call('PEXPIRE', resK, DAY)
end
local o = redis.call('ZRANGE', rpmK, 0, 0, 'WITHSCORES')
return {1, now, n + 1, tonumber(o[2]), day, ss or -1, fmt(su), wa or -1, fmt(wu)}
`

/**
 * KEYS: 1 reservation record, 2 account hash, 3 model daily hash, 4 model lease zset.
 * ARGV: 1 now|'', 2 mode (settle | settle_release = settle + drop lease | refund | release = refund if pending + drop
 *       lease | unlease = drop lease),
 *       3 exact weighted, 4 exact raw, 5 lease id.
 * The reservation record is deleted by the first settle/refund, so repeats (retries) change nothing.
 * A delta goes to a window only if it is still the window the reservation went into.
 * Returns {applied, now, ss|-1, su, wa|-1, wu}.
 */
const SETTLE = `${NOW}
local mode = ARGV[2]
local applied = 0
if mode ~= 'unlease' then
  local r = redis.call('HMGET', KEYS[1], 'r', 'x', 'ss', 'wa', 'd')
  if r[1] then
    local dw, dr
    if mode == 'settle' or mode == 'settle_release' then
      dw = tonumber(ARGV[3]) - tonumber(r[1]); dr = tonumber(ARGV[4]) - tonumber(r[2])
    else
      dw = -tonumber(r[1]); dr = -tonumber(r[2])
    end
    local f = redis.call('HMGET', KEYS[2], 'ss', 'su', 'wa', 'wu')
    if f[1] and f[1] == r[3] then redis.call('HSET', KEYS[2], 'su', math.max(0, (tonumber(f[2]) or 0) + dw)) end
    if f[3] and f[3] == r[4] then redis.call('HSET', KEYS[2], 'wu', math.max(0, (tonumber(f[4]) or 0) + dw)) end
    local d = tonumber(redis.call('HGET', KEYS[3], r[5]))
    if d then redis.call('HSET', KEYS[3], r[5], math.max(0, d + dr)) end
    redis.call('DEL', KEYS[1])
    applied = 1
  end
end
if mode == 'release' or mode == 'unlease' or mode == 'settle_release' then redis.call('ZREM', KEYS[4], ARGV[5]) end
local f = redis.call('HMGET', KEYS[2], 'ss', 'su', 'wa', 'wu')
return {applied, now, tonumber(f[1]) or -1, f[2] or '0', tonumber(f[3]) or -1, f[4] or '0'}
`

/** KEYS: 1 lease zset. ARGV: 1 now|'', 2 lease ms, 3.. lease ids. Extends only leases that still exist. */
const EXTEND = `${NOW}
local exp = now + tonumber(ARGV[2])
local n = 0
for i = 3, #ARGV do n = n + redis.call('ZADD', KEYS[1], 'XX', 'CH', exp, ARGV[i]) end
redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[2]))
return n
`

/** KEYS: 1 account hash. Returns {now, ss|-1, su, wa|-1, wu, has pools}. */
const STANDING = `${NOW}
local f = redis.call('HMGET', KEYS[1], 'ss', 'su', 'wa', 'wu', 'v')
return {now, tonumber(f[1]) or -1, f[2] or '0', tonumber(f[3]) or -1, f[4] or '0', f[5] and 1 or 0}
`

/** KEYS: 1 rpm index set. ARGV: 1 now|'', 2 rpm key prefix of the account. Dynamic keys share the hash tag. */
const RPM = `${NOW}
local total = 0
for _, m in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local k = ARGV[2] .. m
  redis.call('ZREMRANGEBYSCORE', k, '-inf', now - 60000)
  local c = redis.call('ZCARD', k)
  if c == 0 then redis.call('SREM', KEYS[1], m) end
  total = total + c
end
return total
`

/** KEYS: 1 model daily hash. Returns {day, tokens|-1}. */
const DAILY = `${NOW}
local day = math.floor(now / DAY)
local v = redis.call('HGET', KEYS[1], string.format('%d', day))
return {day, v or '-1'}
`

/** KEYS: 1 account hash. ARGV: 1 now|'', 2 ss, 3 su, 4 wa, 5 wu, 6 cd ('' = none). Only if pools are absent. */
const RESTORE_ACCOUNT = `${NOW}
if redis.call('HEXISTS', KEYS[1], 'v') == 1 then return 0 end
local keep = DAY
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[1], 'ss', ARGV[2], 'su', ARGV[3])
  keep = math.max(keep, tonumber(ARGV[2]) + WEEK - now + DAY)
end
if ARGV[4] ~= '' then
  redis.call('HSET', KEYS[1], 'wa', ARGV[4], 'wu', ARGV[5])
  keep = math.max(keep, tonumber(ARGV[4]) + WEEK - now + DAY)
end
if ARGV[6] ~= '' and tonumber(ARGV[6]) > (tonumber(redis.call('HGET', KEYS[1], 'cd')) or 0) then
  redis.call('HSET', KEYS[1], 'cd', ARGV[6])
  keep = math.max(keep, tonumber(ARGV[6]) - now + DAY)
end
redis.call('HSET', KEYS[1], 'v', 1)
if redis.call('PTTL', KEYS[1]) < keep then redis.call('PEXPIRE', KEYS[1], keep) end
return 1
`

/** KEYS: 1 model daily hash. ARGV: 1 day, 2 tokens. */
const RESTORE_DAILY = `
redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], 3 * 86400000)
return 1
`

/** KEYS: 1 limiter hash. ARGV: 1 now|'', 2 max, 3 window ms. Fixed window started by the first hit. */
const LIMIT = `${NOW}
local f = redis.call('HMGET', KEYS[1], 's', 'c')
local s, c = tonumber(f[1]), tonumber(f[2]) or 0
local win, max = tonumber(ARGV[3]), tonumber(ARGV[2])
if not s or now >= s + win then s = now; c = 0 end
local allowed = 0
if c < max then
  c = c + 1
  allowed = 1
  redis.call('HSET', KEYS[1], 's', s, 'c', c)
  redis.call('PEXPIRE', KEYS[1], s + win - now)
end
return {allowed, c, s + win - now}
`

type Arg = string | number
type Reply = Array<string | number>
interface Scripts {
  wsAdmit(...args: Array<Arg>): Promise<Reply>
  wsSettle(...args: Array<Arg>): Promise<Reply>
  wsExtend(...args: Array<Arg>): Promise<number>
  wsStanding(...args: Array<Arg>): Promise<Reply>
  wsRpm(...args: Array<Arg>): Promise<number>
  wsDaily(...args: Array<Arg>): Promise<Reply>
  wsRestoreAccount(...args: Array<Arg>): Promise<number>
  wsRestoreDaily(...args: Array<Arg>): Promise<number>
  wsLimit(...args: Array<Arg>): Promise<Reply>
}
type ScriptedRedis = Redis & Scripts

const defineScripts = (redis: Redis): ScriptedRedis => {
  const define = (name: keyof Scripts, numberOfKeys: number, lua: string) => {
    if (!(name in redis)) redis.defineCommand(name, { numberOfKeys, lua })
  }
  define("wsAdmit", 7, ADMIT)
  define("wsSettle", 4, SETTLE)
  define("wsExtend", 1, EXTEND)
  define("wsStanding", 1, STANDING)
  define("wsRpm", 1, RPM)
  define("wsDaily", 1, DAILY)
  define("wsRestoreAccount", 1, RESTORE_ACCOUNT)
  define("wsRestoreDaily", 1, RESTORE_DAILY)
  define("wsLimit", 1, LIMIT)
  return redis as ScriptedRedis
}

/** ioredis options for fail-fast behaviour: bounded commands, no offline queue, background reconnects. */
export const clientOptions = (commandTimeoutMs: number): RedisOptions => ({
  lazyConnect: true,
  enableOfflineQueue: false,
  autoResendUnfulfilledCommands: false,
  maxRetriesPerRequest: 0,
  commandTimeout: commandTimeoutMs,
  connectTimeout: 2_000,
  enableAutoPipelining: true,
  retryStrategy: (times) => Math.min(times * 100, 2_000)
})

/** Settles when `promise` does or after `ms` of real time, whichever is first; never rejects. */
const within = (promise: Promise<unknown>, ms: number): Promise<void> => {
  let timer: ReturnType<typeof setTimeout> | undefined
  return Promise.race([
    promise.then(() => undefined, () => undefined),
    new Promise<void>((resolve) => {
      timer = setTimeout(resolve, ms)
    })
  ]).finally(() => clearTimeout(timer))
}

const num = (x: unknown): number => Number(x)
const time = (x: unknown): number | null => {
  const n = Number(x)
  return n < 0 ? null : n
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
  outcome: Deferred.Deferred<{ readonly standing: Standing; readonly weighted: number }> | undefined
  ticket: Ticket
}

interface Repair {
  readonly keys: ReadonlyArray<string>
  readonly args: ReadonlyArray<Arg>
}

/** Builds the service and its probe; needs a Scope (client, heartbeat, snapshot writer). */
export const make = (options: RedisAdmissionOptions) =>
  Effect.gen(function*() {
    const clock: Clock.Clock = yield* Clock.Clock
    const runFork = Effect.runForkWith(yield* Effect.context<never>())
    const prefix = options.keyPrefix ?? "ws:q:"
    const leaseMs = options.leaseMs ?? 30_000
    const commandTimeoutMs = options.commandTimeoutMs ?? 500
    const useClock = options.time === "clock"
    const repo = options.sql === undefined ? undefined : makeQuotaRepo(options.sql)
    const abuseWindowMs = options.abuse.window_seconds * 1000
    const cooldownMs = options.abuse.cooldown_seconds * 1000

    const client: Redis = options.client ?? (yield* Effect.acquireRelease(
      Effect.sync(() => {
        const url = options.url === undefined
          ? "redis://127.0.0.1:6379"
          : Redacted.isRedacted(options.url)
          ? Redacted.value(options.url)
          : options.url
        const redis = new Redis(url, clientOptions(commandTimeoutMs))
        let lastLog = 0
        redis.on("error", (error: Error) => {
          const now = Date.now()
          if (now - lastLog < 10_000) return
          lastLog = now
          runFork(Effect.logWarning("quota redis connection error", error.message))
        })
        return redis
      }),
      (redis) =>
        Effect.promise(() => within(redis.quit(), 1_000)).pipe(
          Effect.ensuring(Effect.sync(() => redis.disconnect()))
        )
    ))
    if (options.client === undefined) {
      // Wait (real time, bounded) for the first connection; if Redis is down, serve 503s and keep reconnecting.
      yield* Effect.promise(() => within(client.connect(), 2_000))
    }
    const redis = defineScripts(client)

    const nowArg = (): string => (useClock ? String(clock.currentTimeMillisUnsafe()) : "")
    const call = <A>(what: string, f: () => Promise<A>): Effect.Effect<A, GatewayError> =>
      Effect.tryPromise({
        try: f,
        catch: (cause) => unavailable(`redis ${what}: ${cause instanceof Error ? cause.message : String(cause)}`)
      })

    const key = {
      account: (id: string) => `${prefix}a:{${id}}`,
      abuse: (id: string) => `${prefix}a:{${id}}:abuse`,
      rpmPrefix: (id: string) => `${prefix}a:{${id}}:rpm:`,
      rpmIndex: (id: string) => `${prefix}a:{${id}}:rpmidx`,
      daily: (model: string) => `${prefix}m:{${model}}:daily`,
      lease: (model: string) => `${prefix}m:{${model}}:lease`,
      reservation: (lease: string) => `${prefix}r:${lease}`,
      limit: (k: string) => `${prefix}l:${k}`
    }

    const replica = Math.random().toString(36).slice(2, 10)
    let seq = 0
    /** model id -> lease ids held by this replica (extended by the heartbeat). */
    const held = new Map<string, Set<string>>()
    const repairs: Array<Repair> = []
    const MAX_REPAIRS = 10_000
    /** Signals the heartbeat that there is something to extend or repair (it sleeps only then). */
    const beat = yield* Queue.sliding<void>(1)
    const addRepair = (repair: Repair) => {
      if (repairs.length < MAX_REPAIRS) repairs.push(repair)
      Queue.offerUnsafe(beat, undefined)
    }

    // --- snapshots to PostgreSQL ---------------------------------------------------------------------------------
    const touchedAccounts = new Set<string>()
    const touchedDaily = new Map<string, { readonly modelId: string; readonly day: number }>()
    const wake = yield* Queue.sliding<void>(1)
    const touch = (accountId: string, modelId: string, day: number) => {
      if (repo === undefined) return
      touchedAccounts.add(accountId)
      touchedDaily.set(`${modelId}\u0000${day}`, { modelId, day })
      Queue.offerUnsafe(wake, undefined)
    }

    const snapshotLock = yield* Semaphore.make(1)
    const snapshot: Effect.Effect<void> = repo === undefined ? Effect.void : snapshotLock.withPermits(1)(
      Effect.suspend(() => {
        const ids = [...touchedAccounts]
        const days = [...touchedDaily.values()]
        touchedAccounts.clear()
        touchedDaily.clear()
        if (ids.length === 0 && days.length === 0) return Effect.void
        return Effect.gen(function*() {
          const fields = yield* call("snapshot", () =>
            Promise.all(ids.map((id) => redis.hmget(key.account(id), "ss", "su", "wa", "wu", "cd", "v"))))
          const rows: Array<AccountWindows> = []
          fields.forEach((f, i) => {
            if (f[5] === null) return // pools absent (expired): nothing worth keeping
            rows.push({
              accountId: ids[i]!,
              sessionStart: f[0] === null ? null : num(f[0]),
              sessionUsed: num(f[1] ?? 0),
              weeklyAnchor: f[2] === null ? null : num(f[2]),
              weeklyUsed: num(f[3] ?? 0),
              cooldownUntil: f[4] === null ? null : num(f[4])
            })
          })
          const totals = yield* call("snapshot", () =>
            Promise.all(days.map((d) => redis.hget(key.daily(d.modelId), String(d.day)))))
          const dailyRows: Array<DailyUsageRow> = []
          totals.forEach((t, i) => {
            if (t !== null) dailyRows.push({ modelId: days[i]!.modelId, day: days[i]!.day, tokens: num(t) })
          })
          yield* repo.saveAccounts(rows)
          yield* repo.saveDaily(dailyRows)
        }).pipe(
          Effect.catchCause((cause) =>
            Effect.andThen(
              Effect.sync(() => {
                for (const id of ids) touchedAccounts.add(id)
                for (const d of days) touchedDaily.set(`${d.modelId}\u0000${d.day}`, d)
              }),
              Effect.logWarning("quota snapshot to PostgreSQL failed; will retry", cause)
            )
          )
        )
      }).pipe(Effect.uninterruptible) // it takes the touched sets first: it must not stop half way
    )
    yield* Effect.addFinalizer(() => snapshot)

    // --- rebuild from PostgreSQL ---------------------------------------------------------------------------------
    const rebuild = (accountId: string, modelId: string, mask: number, day: number): Effect.Effect<void, GatewayError> =>
      repo === undefined ? Effect.void : Effect.gen(function*() {
        if (mask & 1) {
          const row = yield* repo.loadAccount(accountId).pipe(
            Effect.mapError((e) => unavailable(`quota rebuild: ${e.message}`))
          )
          const s = (x: number | null | undefined) => (x === null || x === undefined ? "" : String(x))
          yield* call("restore", () =>
            redis.wsRestoreAccount(
              key.account(accountId),
              nowArg(),
              s(row?.sessionStart),
              s(row?.sessionUsed ?? 0),
              s(row?.weeklyAnchor),
              s(row?.weeklyUsed ?? 0),
              s(row?.cooldownUntil)
            ))
        }
        if (mask & 2) {
          const tokens = yield* repo.loadDailyModel(modelId, day).pipe(
            Effect.mapError((e) => unavailable(`quota rebuild: ${e.message}`))
          )
          yield* call("restore", () => redis.wsRestoreDaily(key.daily(modelId), String(day), Math.round(tokens ?? 0)))
        }
      })

    // --- admission -----------------------------------------------------------------------------------------------
    const standingFrom = (plan: PlanConfig, now: number, r: ReadonlyArray<unknown>, at: number): Standing => {
      const ss = time(r[at])
      const wa = time(r[at + 2])
      return {
        session: poolStanding(num(r[at + 1]), plan.session_limit, ss === null ? null : ss + sessionMs(plan), now),
        weekly: poolStanding(num(r[at + 3]), plan.weekly_limit, wa === null ? null : wa + WEEK_MS, now, wa)
      }
    }

    const rejection = (code: number, value: number): GatewayError => {
      switch (code) {
        case 1:
          return abuseCooldown(value)
        case 2:
          return rateLimited(value)
        case 3:
          return sessionExhausted(value)
        case 4:
          return weeklyExhausted(value)
        case 5:
          return modelQuotaExceeded(value)
        case 6:
          return modelOverloaded()
        default:
          return new GatewayError({ code: "internal_error", detail: `quota script answered ${code}` })
      }
    }

    const settleKeys = (input: AdmitInput, leaseId: string) => [
      key.reservation(leaseId),
      key.account(input.accountId),
      key.daily(input.model.id),
      key.lease(input.model.id)
    ]

    const runAdmit = (input: AdmitInput, leaseId: string, reportMissing: boolean) => {
      const { model, plan } = input
      const reserve = input.byok ? { weighted: 0, raw: 0 } : reservationOf(model, input.estimatedInputTokens)
      return call("admit", () =>
        redis.wsAdmit(
          key.account(input.accountId),
          key.abuse(input.accountId),
          key.rpmPrefix(input.accountId) + model.id,
          key.rpmIndex(input.accountId),
          key.daily(model.id),
          key.lease(model.id),
          key.reservation(leaseId),
          nowArg(),
          leaseId,
          input.byok ? 1 : 0,
          model.rate_limit_rpm,
          model.id,
          options.abuse.burst,
          abuseWindowMs,
          cooldownMs,
          plan.session_limit,
          sessionMs(plan),
          plan.weekly_limit,
          reserve.weighted,
          reserve.raw,
          model.daily_cap ?? -1,
          model.concurrency,
          leaseMs,
          reportMissing ? 1 : 0
        ))
    }

    const hold = (modelId: string, leaseId: string) => {
      let set = held.get(modelId)
      if (set === undefined) held.set(modelId, set = new Set())
      set.add(leaseId)
      Queue.offerUnsafe(beat, undefined)
    }
    const unhold = (modelId: string, leaseId: string) => {
      const set = held.get(modelId)
      if (set === undefined) return
      set.delete(leaseId)
      if (set.size === 0) held.delete(modelId)
    }

    const settleCall = (
      t: RTicket,
      mode: "settle" | "settle_release" | "refund" | "release" | "unlease",
      usage: SettleUsage | null
    ) => {
      const keys = settleKeys(t.input, t.leaseId)
      const tail: Array<Arg> = [
        mode,
        usage === null ? 0 : weightedCost(t.input.model, usage),
        usage === null ? 0 : rawTokens(usage),
        t.leaseId
      ]
      return call("settle", () => redis.wsSettle(...keys, nowArg(), ...tail)).pipe(
        Effect.tapError((e) =>
          Effect.andThen(
            Effect.sync(() => addRepair({ keys, args: tail })),
            Effect.logWarning(`quota ${mode} of ${t.leaseId} failed; will retry`, e.detail)
          )
        )
      )
    }

    const resolve = (t: RTicket, usage: SettleUsage | null) =>
      Effect.suspend(() => {
        if (t.outcome !== undefined) return Deferred.await(t.outcome)
        const d = Deferred.makeUnsafe<{ readonly standing: Standing; readonly weighted: number }>()
        t.outcome = d
        const weighted = usage === null || t.byok ? 0 : weightedCost(t.input.model, usage)
        const plan = t.input.plan
        const work = t.byok
          ? call("standing", () => redis.wsStanding(key.account(t.input.accountId), nowArg())).pipe(
            Effect.map((r) => standingFrom(plan, num(r[0]), r, 1))
          )
          // A settle is the end of the request: it frees the in-flight slot in the same round trip.
          : settleCall(t, usage === null ? "refund" : "settle_release", usage).pipe(
            Effect.tap(() =>
              Effect.sync(() => {
                touch(t.input.accountId, t.input.model.id, t.day)
                if (usage !== null && t.leased) {
                  t.leased = false
                  unhold(t.input.model.id, t.leaseId)
                }
              })
            ),
            Effect.map((r) => standingFrom(plan, num(r[1]), r, 2))
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
          unhold(t.input.model.id, t.leaseId)
        }
        if (pendingOutcome) {
          // scope closed before settle: refund and drop the lease in one call
          const d = Deferred.makeUnsafe<{ readonly standing: Standing; readonly weighted: number }>()
          t.outcome = d
          return settleCall(t, "release", null).pipe(
            Effect.map((r) => standingFrom(t.input.plan, num(r[1]), r, 2)),
            Effect.orElseSucceed(() => t.reserved),
            Effect.flatMap((standing) => Deferred.succeed(d, { standing, weighted: 0 })),
            Effect.asVoid
          )
        }
        return Effect.ignore(settleCall(t, "unlease", null))
      })

    const admitOnce = (input: AdmitInput): Effect.Effect<RTicket, GatewayError> =>
      Effect.gen(function*() {
        const leaseId = `${replica}.${(++seq).toString(36)}`
        const attempt = (reportMissing: boolean) =>
          runAdmit(input, leaseId, reportMissing).pipe(
            Effect.tapError((e) =>
              // After a timeout the script may have run although the reply was lost: undo by lease id (a no-op
              // if it did not run). Other errors mean the command was never sent (offline queue disabled).
              input.byok || !e.detail?.includes("timed out") ? Effect.void : Effect.sync(() => {
                redis.wsSettle(...settleKeys(input, leaseId), nowArg(), "release", 0, 0, leaseId).catch(() =>
                  addRepair({ keys: settleKeys(input, leaseId), args: ["release", 0, 0, leaseId] })
                )
              })
            )
          )
        let r = yield* attempt(repo !== undefined && !input.byok)
        if (num(r[0]) === 0 && num(r[1]) === 7) {
          yield* rebuild(input.accountId, input.model.id, num(r[2]), num(r[3]))
          r = yield* attempt(false)
        }
        if (num(r[0]) === 0) return yield* Effect.fail(rejection(num(r[1]), num(r[2])))
        const now = num(r[1])
        const t: RTicket = {
          input,
          leaseId,
          byok: input.byok,
          day: num(r[4]),
          reserved: standingFrom(input.plan, now, r, 5),
          leased: !input.byok,
          outcome: undefined,
          ticket: undefined as unknown as Ticket
        }
        if (!input.byok) {
          hold(input.model.id, leaseId)
          touch(input.accountId, input.model.id, num(r[4]))
        }
        t.ticket = {
          reserved: t.reserved,
          rpm: rpmStanding(input.model.rate_limit_rpm, num(r[2]), num(r[3]), now),
          settle: (usage) => resolve(t, usage),
          refund: Effect.asVoid(resolve(t, null))
        }
        return t
      })

    // --- heartbeat: extend held leases, retry failed settles/releases --------------------------------------------
    const heartbeat: Effect.Effect<void> = Effect.suspend(() => {
      const now = nowArg()
      const extend = [...held].map(([modelId, ids]) =>
        call("extend", () => redis.wsExtend(key.lease(modelId), now, leaseMs, ...ids)).pipe(Effect.ignore)
      )
      const retry = repairs.splice(0, repairs.length).map((rep) =>
        call("repair", () => redis.wsSettle(...rep.keys, nowArg(), ...rep.args)).pipe(
          Effect.catch(() => Effect.sync(() => addRepair(rep)))
        )
      )
      return Effect.all([...extend, ...retry], { concurrency: "unbounded", discard: true })
    })
    const beatEvery = Duration.millis(Math.max(1, Math.floor(leaseMs / 3)))
    yield* Effect.suspend(() =>
      held.size === 0 && repairs.length === 0
        ? Queue.take(beat)
        : Effect.andThen(Effect.sleep(beatEvery), heartbeat)
    ).pipe(Effect.forever, Effect.forkScoped)
    if (repo) {
      yield* Queue.take(wake).pipe(
        Effect.andThen(Effect.sleep(options.snapshotInterval ?? "5 seconds")),
        Effect.andThen(snapshot),
        Effect.forever,
        Effect.forkScoped
      )
    }

    const standingOnce = (accountId: string, plan: PlanConfig) =>
      call("standing", () => redis.wsStanding(key.account(accountId), nowArg()))

    const admission = Admission.of({
      admit: (input) => Effect.map(Effect.acquireRelease(admitOnce(input), release), (t) => t.ticket),

      standing: (accountId, plan) =>
        Effect.gen(function*() {
          let r = yield* standingOnce(accountId, plan)
          if (repo !== undefined && num(r[5]) === 0) {
            yield* rebuild(accountId, "", 1, 0)
            r = yield* standingOnce(accountId, plan)
          }
          return standingFrom(plan, num(r[0]), r, 1)
        }),

      currentRpm: (accountId) =>
        call("rpm", () => redis.wsRpm(key.rpmIndex(accountId), nowArg(), key.rpmPrefix(accountId))).pipe(
          Effect.map(num)
        ),

      dailyUsage: (modelId) =>
        Effect.gen(function*() {
          let r = yield* call("daily", () => redis.wsDaily(key.daily(modelId), nowArg()))
          if (repo !== undefined && num(r[1]) < 0) {
            yield* rebuild("", modelId, 2, num(r[0]))
            r = yield* call("daily", () => redis.wsDaily(key.daily(modelId), nowArg()))
          }
          return Math.max(0, num(r[1]))
        }),

      limit: (k, max, windowSeconds) =>
        call("limit", () => redis.wsLimit(key.limit(k), nowArg(), max, windowSeconds * 1000)).pipe(
          Effect.map((r) => ({
            allowed: num(r[0]) === 1,
            remaining: Math.max(0, max - num(r[1])),
            reset_seconds: Math.max(0, Math.ceil(num(r[2]) / 1000))
          }))
        )
    })

    const probe = AdmissionRedisProbe.of({
      inFlight: (modelId) =>
        call("probe", () =>
          redis.zcount(key.lease(modelId), `(${useClock ? clock.currentTimeMillisUnsafe() : Date.now()}`, "+inf")),
      flush: snapshot,
      heartbeat,
      client,
      keyPrefix: prefix
    })

    return { admission, probe } as const
  })

export const layerRedis = (options: RedisAdmissionOptions): Layer.Layer<Admission> =>
  Layer.effect(Admission, Effect.map(make(options), (m) => m.admission))

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
