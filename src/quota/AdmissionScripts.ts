/**
 * The admission's Redis scripts and key layout, behind typed wrappers: named arguments in, decoded and tagged
 * replies out. Nothing outside this file knows a KEYS/ARGV position or a reply index.
 *
 * Keys (prefix configurable): per account a hash `a:{id}` (ss/su session start/used, wa/wu weekly anchor/used,
 * cd cooldown, v "pools present"), the abuse window `a:{id}:abuse` and RPM windows `a:{id}:rpm:<model>` (sorted
 * sets of admission times) with an index set `a:{id}:rpmidx`; per model a hash `m:{model}:daily` (raw tokens per
 * quota day, day = UTC day number: 09:00 KST) and a sorted set `m:{model}:lease` of lease ids scored by expiry;
 * per admission a reservation record `r:<lease>` (what was reserved, and in which windows) that makes
 * settle/refund/release idempotent even across retries.
 *
 * Time is Redis server time (`TIME`) when `now` is undefined, else the given epoch ms (tests drive it with
 * `TestClock`). Single-node (or primary) Redis only: the admission script touches account and model keys together.
 */
import { Effect } from "effect"
import type { Redis } from "ioredis"
import { GatewayError, unavailable } from "../errors/Catalog.js"
import * as StoreRedis from "../store/Redis.js"
import type { Rejection } from "./Policy.js"
import type { AccountWindows } from "./QuotaRepo.js"
import type { AbuseRule } from "./Transitions.js"

/** One Redis command; no answer is 503 `service_unavailable`. */
const command = <A>(what: string, f: () => Promise<A>) => Effect.mapError(StoreRedis.command(what, f), unavailable)

// ---------------------------------------------------------------------------------------------------------------
// Lua. Numbers that may be fractional are returned as strings (Lua numbers become integer replies).

const NOW = `
${StoreRedis.LUA_NOW}local DAY, WEEK = 86400000, 604800000
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

type Arg = string | number
type RawReply = Array<string | number>
interface Commands {
  wsAdmit(...args: Array<Arg>): Promise<RawReply>
  wsSettle(...args: Array<Arg>): Promise<RawReply>
  wsExtend(...args: Array<Arg>): Promise<number>
  wsStanding(...args: Array<Arg>): Promise<RawReply>
  wsRpm(...args: Array<Arg>): Promise<number>
  wsDaily(...args: Array<Arg>): Promise<RawReply>
  wsRestoreAccount(...args: Array<Arg>): Promise<number>
  wsRestoreDaily(...args: Array<Arg>): Promise<number>
}

/** Registers the scripts on the client once (EVALSHA, with EVAL on a script-cache miss). */
const defineScripts = (redis: Redis): Redis & Commands => {
  const define = (name: keyof Commands, numberOfKeys: number, lua: string) => {
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
  return redis as Redis & Commands
}

// ---------------------------------------------------------------------------------------------------------------
// Typed arguments and replies

/** An account's session and weekly windows as stored in Redis. */
export interface PoolWindows {
  /** Epoch ms; null while no session window is active. */
  readonly sessionStart: number | null
  readonly sessionUsed: number
  readonly weeklyAnchor: number | null
  readonly weeklyUsed: number
}

export interface AdmitArgs {
  readonly accountId: string
  readonly modelId: string
  readonly leaseId: string
  /** Epoch ms, or undefined for Redis server time. */
  readonly now: number | undefined
  /** BYOK: abuse and RPM only. */
  readonly byok: boolean
  readonly rpmLimit: number
  readonly abuse: AbuseRule
  readonly sessionLimit: number
  readonly sessionMs: number
  readonly weeklyLimit: number
  readonly reserveWeighted: number
  readonly reserveRaw: number
  /** Raw tokens per quota day, or null for none. */
  readonly dailyCap: number | null
  readonly concurrency: number
  readonly leaseMs: number
  /** Answer `Missing` instead of admitting when the account's pools or today's daily total are absent. */
  readonly reportMissing: boolean
}

export type AdmitReply =
  | {
    readonly _tag: "Admitted"
    /** The script's time. */
    readonly now: number
    readonly rpmCount: number
    readonly rpmOldest: number
    /** Quota day of the reservation. */
    readonly day: number
    /** The windows after the reservation. */
    readonly windows: PoolWindows
  }
  | { readonly _tag: "Rejected"; readonly rejection: Rejection }
  /** Something to rebuild from PostgreSQL first (only with `reportMissing`). */
  | { readonly _tag: "Missing"; readonly pools: boolean; readonly daily: boolean; readonly day: number }
  /** A reply this decoder does not know (a script of another version): an internal error. */
  | { readonly _tag: "Invalid"; readonly error: GatewayError }

/**
 * - `settle`: replace the reservation by the exact charge; `settle_release`: the same and drop the lease;
 * - `refund`: give the reservation back; `release`: refund if not yet settled, and drop the lease;
 * - `unlease`: only drop the lease.
 */
export type SettleMode = "settle" | "settle_release" | "refund" | "release" | "unlease"

/** A settle without its time: what a failed settle keeps for its retry. */
export interface SettleCall {
  readonly accountId: string
  readonly modelId: string
  readonly leaseId: string
  readonly mode: SettleMode
  /** Exact weighted charge (settle modes; else 0). */
  readonly weighted: number
  /** Exact raw tokens (settle modes; else 0). */
  readonly raw: number
}

export interface SettleArgs extends SettleCall {
  readonly now: number | undefined
}

export interface SettleReply {
  /** False when the reservation was already settled or refunded (a repeat). */
  readonly applied: boolean
  readonly now: number
  readonly windows: PoolWindows
}

export interface StandingReply {
  readonly now: number
  readonly windows: PoolWindows
  /** False when the account's pools are absent (never seen, or lost by Redis). */
  readonly hasPools: boolean
}

export interface DailyReply {
  /** Quota day of `now`. */
  readonly day: number
  /** Raw tokens, or null when today's total is absent. */
  readonly tokens: number | null
}

const num = (x: unknown): number => Number(x)
const time = (x: unknown): number | null => {
  const n = Number(x)
  return n < 0 ? null : n
}
const nowArg = (now: number | undefined): string => (now === undefined ? "" : String(now))
const optional = (x: number | null | undefined): string => (x === null || x === undefined ? "" : String(x))

/** Windows at reply positions `at`..`at + 3` (ss|-1, su, wa|-1, wu). */
const windowsAt = (r: RawReply, at: number): PoolWindows => ({
  sessionStart: time(r[at]),
  sessionUsed: num(r[at + 1]),
  weeklyAnchor: time(r[at + 2]),
  weeklyUsed: num(r[at + 3])
})

const rejectedWith = (rejection: Rejection): AdmitReply => ({ _tag: "Rejected", rejection })

const decodeAdmit = (r: RawReply): AdmitReply => {
  if (num(r[0]) === 1) {
    return {
      _tag: "Admitted",
      now: num(r[1]),
      rpmCount: num(r[2]),
      rpmOldest: num(r[3]),
      day: num(r[4]),
      windows: windowsAt(r, 5)
    }
  }
  const value = num(r[2])
  switch (num(r[1])) {
    case 1:
      return rejectedWith({ code: "abuse_cooldown", resetsAt: value })
    case 2:
      return rejectedWith({ code: "rate_limited", retryAfter: value })
    case 3:
      return rejectedWith({ code: "session_exhausted", resetsAt: value })
    case 4:
      return rejectedWith({ code: "weekly_exhausted", resetsAt: value })
    case 5:
      return rejectedWith({ code: "model_quota_exceeded", resetsAt: value })
    case 6:
      return rejectedWith({ code: "model_overloaded" })
    case 7:
      return { _tag: "Missing", pools: (value & 1) !== 0, daily: (value & 2) !== 0, day: num(r[3]) }
    default:
      return {
        _tag: "Invalid",
        error: new GatewayError({ code: "internal_error", detail: `quota admit script answered ${JSON.stringify(r)}` })
      }
  }
}

// ---------------------------------------------------------------------------------------------------------------

export interface AdmissionScripts {
  readonly keyPrefix: string
  readonly admit: (args: AdmitArgs) => Effect.Effect<AdmitReply, GatewayError>
  readonly settle: (args: SettleArgs) => Effect.Effect<SettleReply, GatewayError>
  /** Extends the given leases of a model that still exist; returns how many were extended. */
  readonly extend: (
    args: { readonly modelId: string; readonly now: number | undefined; readonly leaseMs: number; readonly leaseIds: ReadonlyArray<string> }
  ) => Effect.Effect<number, GatewayError>
  readonly standing: (
    args: { readonly accountId: string; readonly now: number | undefined }
  ) => Effect.Effect<StandingReply, GatewayError>
  /** Requests in the account's RPM windows, summed over models (prunes what left the window). */
  readonly rpm: (args: { readonly accountId: string; readonly now: number | undefined }) => Effect.Effect<number, GatewayError>
  readonly daily: (args: { readonly modelId: string; readonly now: number | undefined }) => Effect.Effect<DailyReply, GatewayError>
  /** Writes an account's pools and cooldown from PostgreSQL if its pools are absent (`row` undefined: empty). */
  readonly restoreAccount: (
    args: { readonly accountId: string; readonly now: number | undefined; readonly row: AccountWindows | undefined }
  ) => Effect.Effect<boolean, GatewayError>
  /** Writes a day's total from PostgreSQL if it is absent. */
  readonly restoreDaily: (
    args: { readonly modelId: string; readonly day: number; readonly tokens: number }
  ) => Effect.Effect<void, GatewayError>
  /** The pools of these accounts as stored (undefined where they are absent), for the PostgreSQL snapshot. */
  readonly pools: (accountIds: ReadonlyArray<string>) => Effect.Effect<Array<AccountWindows | undefined>, GatewayError>
  /** Daily totals (null where absent), for the PostgreSQL snapshot. */
  readonly dailyTotals: (
    days: ReadonlyArray<{ readonly modelId: string; readonly day: number }>
  ) => Effect.Effect<Array<number | null>, GatewayError>
  /** Unexpired leases on a model, across all replicas. */
  readonly liveLeases: (args: { readonly modelId: string; readonly now: number }) => Effect.Effect<number, GatewayError>
}

export const keys = (prefix: string) => ({
  account: (id: string) => `${prefix}a:{${id}}`,
  abuse: (id: string) => `${prefix}a:{${id}}:abuse`,
  rpmPrefix: (id: string) => `${prefix}a:{${id}}:rpm:`,
  rpmIndex: (id: string) => `${prefix}a:{${id}}:rpmidx`,
  daily: (model: string) => `${prefix}m:{${model}}:daily`,
  lease: (model: string) => `${prefix}m:{${model}}:lease`,
  reservation: (lease: string) => `${prefix}r:${lease}`
})

export const make = (client: Redis, keyPrefix: string): AdmissionScripts => {
  const redis = defineScripts(client)
  const key = keys(keyPrefix)

  return {
    keyPrefix,

    admit: (a) =>
      command("admit", () =>
        redis.wsAdmit(
          key.account(a.accountId),
          key.abuse(a.accountId),
          key.rpmPrefix(a.accountId) + a.modelId,
          key.rpmIndex(a.accountId),
          key.daily(a.modelId),
          key.lease(a.modelId),
          key.reservation(a.leaseId),
          nowArg(a.now),
          a.leaseId,
          a.byok ? 1 : 0,
          a.rpmLimit,
          a.modelId,
          a.abuse.burst,
          a.abuse.windowMs,
          a.abuse.cooldownMs,
          a.sessionLimit,
          a.sessionMs,
          a.weeklyLimit,
          a.reserveWeighted,
          a.reserveRaw,
          a.dailyCap ?? -1,
          a.concurrency,
          a.leaseMs,
          a.reportMissing ? 1 : 0
        )).pipe(Effect.map(decodeAdmit)),

    settle: (a) =>
      command("settle", () =>
        redis.wsSettle(
          key.reservation(a.leaseId),
          key.account(a.accountId),
          key.daily(a.modelId),
          key.lease(a.modelId),
          nowArg(a.now),
          a.mode,
          a.weighted,
          a.raw,
          a.leaseId
        )).pipe(Effect.map((r) => ({ applied: num(r[0]) === 1, now: num(r[1]), windows: windowsAt(r, 2) }))),

    extend: (a) =>
      command("extend", () => redis.wsExtend(key.lease(a.modelId), nowArg(a.now), a.leaseMs, ...a.leaseIds)).pipe(
        Effect.map(num)
      ),

    standing: (a) =>
      command("standing", () => redis.wsStanding(key.account(a.accountId), nowArg(a.now))).pipe(
        Effect.map((r) => ({ now: num(r[0]), windows: windowsAt(r, 1), hasPools: num(r[5]) === 1 }))
      ),

    rpm: (a) =>
      command("rpm", () => redis.wsRpm(key.rpmIndex(a.accountId), nowArg(a.now), key.rpmPrefix(a.accountId))).pipe(
        Effect.map(num)
      ),

    daily: (a) =>
      command("daily", () => redis.wsDaily(key.daily(a.modelId), nowArg(a.now))).pipe(
        Effect.map((r) => ({ day: num(r[0]), tokens: num(r[1]) < 0 ? null : num(r[1]) }))
      ),

    restoreAccount: (a) =>
      command("restore", () =>
        redis.wsRestoreAccount(
          key.account(a.accountId),
          nowArg(a.now),
          optional(a.row?.sessionStart),
          optional(a.row?.sessionUsed ?? 0),
          optional(a.row?.weeklyAnchor),
          optional(a.row?.weeklyUsed ?? 0),
          optional(a.row?.cooldownUntil)
        )).pipe(Effect.map((n) => num(n) === 1)),

    restoreDaily: (a) =>
      command("restore", () => redis.wsRestoreDaily(key.daily(a.modelId), String(a.day), Math.round(a.tokens))).pipe(
        Effect.asVoid
      ),

    pools: (accountIds) =>
      command("snapshot", () =>
        Promise.all(accountIds.map((id) => redis.hmget(key.account(id), "ss", "su", "wa", "wu", "cd", "v")))).pipe(
          Effect.map((all) =>
            all.map((f, i): AccountWindows | undefined =>
              f[5] === null ? undefined : {
                accountId: accountIds[i]!,
                sessionStart: f[0] === null ? null : num(f[0]),
                sessionUsed: num(f[1] ?? 0),
                weeklyAnchor: f[2] === null ? null : num(f[2]),
                weeklyUsed: num(f[3] ?? 0),
                cooldownUntil: f[4] === null ? null : num(f[4])
              }
            )
          )
        ),

    dailyTotals: (days) =>
      command("snapshot", () => Promise.all(days.map((d) => redis.hget(key.daily(d.modelId), String(d.day))))).pipe(
        Effect.map((all) => all.map((t) => (t === null ? null : num(t))))
      ),

    liveLeases: (a) => command("probe", () => redis.zcount(key.lease(a.modelId), `(${a.now}`, "+inf"))
  }
}
