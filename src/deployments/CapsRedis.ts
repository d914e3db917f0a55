/**
 * Per-deployment caps shared by every replica through Redis (production mode): `SharedCaps` over one Lua script.
 *
 * - Keys, per deployment (`<model>/<deployment>`, which has no braces: the catalog's id patterns forbid them, so the
 *   hash tag is the pair): `<prefix>d:{<model>/<deployment>}:slots`, a sorted set of slot ids scored by lease
 *   expiry, and `<prefix>d:{<model>/<deployment>}:rpm`, a sorted set of attempt starts (ids scored by start time).
 * - `take` is one EVALSHA: it drops lapsed slots and starts older than 60 s, refuses when the slots are all held or
 *   the last 60 s already hold `rate_limit_rpm` starts, else records both. A refusal writes nothing.
 * - A slot is a lease like the admission's in-flight leases, kept by the same lease keeper
 *   (`runtime/LeaseKeeper.ts`): it lapses `leaseMs` (9 s) after it was taken or last extended; the keeper's
 *   heartbeat extends every slot this replica holds every `leaseMs / 3`, at a fixed rate, so a dead replica's slots
 *   are free at most 9 s after its last beat. The heartbeat sleeps while nothing is held.
 * - `release` is one ZREM, not awaited by the request; a failed one is retried on the next beat, and the slot lapses
 *   anyway once it is no longer extended.
 * - After a `take` that got no answer (a timeout: the script may have run), the slot is released by id at once (a
 *   no-op if it did not run); its start stays counted in the minute, as the admission's RPM entries do.
 *
 * Redis is not trusted: replies are shape-checked and bounded; anything else is `Unavailable` (the deployment is
 * skipped). Time is Redis server time, or the Effect clock with `time: "clock"` (TestClock in tests).
 */
import { Clock, Effect } from "effect"
import type { Redis } from "ioredis"
import * as Crypto from "node:crypto"
import { DEFAULT_LEASE_MS } from "../quota/RedisLeases.js"
import * as LeaseKeeper from "../runtime/LeaseKeeper.js"
import * as StoreRedis from "../store/Redis.js"
import type { Caps, FleetUsage, SharedCaps, TakeResult } from "./SharedCaps.js"

/** The minute of `rate_limit_rpm`. */
const WINDOW_MS = 60_000
/** In-flight counts above this in a reply are not believed. */
const MAX_COUNT = 10_000_000

/**
 * KEYS: 1 slots zset, 2 starts zset. ARGV: 1 now|'', 2 slot id, 3 concurrency (0: none), 4 rpm (0: none),
 * 5 lease ms. Returns {1, slots held after} when taken, {0, 1} when every slot is held, {0, 2, ms until the oldest
 * start leaves the window} when the minute is full.
 */
const TAKE = `
${StoreRedis.LUA_NOW}local id, conc, rpm, leaseMs = ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local held = 0
if conc > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
  held = redis.call('ZCARD', KEYS[1])
  if held >= conc then return {0, 1} end
end
if rpm > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - ${WINDOW_MS})
  local n = redis.call('ZCARD', KEYS[2])
  if n >= rpm then
    local e = redis.call('ZRANGE', KEYS[2], n - rpm, n - rpm, 'WITHSCORES')
    local wait = (tonumber(e[2]) or now) + ${WINDOW_MS} - now
    if wait ~= wait or wait > ${WINDOW_MS} then wait = ${WINDOW_MS} end
    if wait < 1 then wait = 1 end
    return {0, 2, math.floor(wait)}
  end
  redis.call('ZADD', KEYS[2], now, id)
  redis.call('PEXPIRE', KEYS[2], ${WINDOW_MS + 1_000})
end
if conc > 0 then
  redis.call('ZADD', KEYS[1], now + leaseMs, id)
  redis.call('PEXPIRE', KEYS[1], 2 * leaseMs)
  held = held + 1
end
return {1, held}
`

/** KEYS: 1 slots zset. ARGV: 1 now|'', 2 lease ms, 3.. slot ids. Extends only slots that still exist. */
const EXTEND = `
${StoreRedis.LUA_NOW}local exp = now + tonumber(ARGV[2])
local n = 0
for i = 3, #ARGV do n = n + redis.call('ZADD', KEYS[1], 'XX', 'CH', exp, ARGV[i]) end
redis.call('PEXPIRE', KEYS[1], 2 * tonumber(ARGV[2]))
return n
`

/** KEYS: 1 slots zset, 2 starts zset. ARGV: 1 now|''. Returns {slots not lapsed, starts in the last 60 s}. */
const USAGE = `
${StoreRedis.LUA_NOW}return {redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf'), redis.call('ZCOUNT', KEYS[2], '(' .. (now - ${WINDOW_MS}), '+inf')}
`

interface Commands {
  wsDeploymentTake(slots: string, starts: string, now: string, id: string, conc: number, rpm: number, leaseMs: number): Promise<unknown>
  wsDeploymentExtend(slots: string, now: string, leaseMs: number, ...ids: Array<string>): Promise<unknown>
  wsDeploymentUsage(slots: string, starts: string, now: string): Promise<unknown>
}

/** The two keys of deployment `key` (`<model>/<deployment>`). */
export const keysOf = (prefix: string, key: string) => ({
  slots: `${prefix}d:{${key}}:slots`,
  starts: `${prefix}d:{${key}}:rpm`
})

const isCount = (x: unknown): x is number => typeof x === "number" && Number.isInteger(x) && x >= 0 && x <= MAX_COUNT

/** The script's reply, shape-checked; anything unexpected is `Unavailable`. */
export const decodeTake = (reply: unknown, slot: string, concurrency: boolean): TakeResult => {
  const bad: TakeResult = { _tag: "Unavailable", detail: "unexpected reply from the deployment slot script" }
  if (!Array.isArray(reply) || reply.length < 2 || reply.length > 3) return bad
  const [ok, second, third] = reply as Array<unknown>
  if (ok === 1 && isCount(second) && reply.length === 2) return { _tag: "Taken", slot: concurrency ? slot : null }
  if (ok !== 0) return bad
  if (second === 1 && reply.length === 2) return { _tag: "Full" }
  if (second === 2 && isCount(third)) return { _tag: "RateLimited", retryMs: Math.min(Math.max(third, 1), WINDOW_MS) }
  return bad
}

export interface CapsRedisOptions {
  /** Slot lifetime without a heartbeat. Default 9 s (`quota/RedisLeases.ts` `DEFAULT_LEASE_MS`). */
  readonly leaseMs?: number | undefined
  /** `redis`: server time (production); `clock`: the Effect clock (TestClock in tests). Default `redis`. */
  readonly time?: "redis" | "clock" | undefined
}

/** The shared caps on `client` under `prefix`; its heartbeat runs in the current scope. */
export const make = (client: Redis, prefix: string, options: CapsRedisOptions = {}) =>
  Effect.gen(function*() {
    if (!("wsDeploymentTake" in client)) client.defineCommand("wsDeploymentTake", { numberOfKeys: 2, lua: TAKE })
    if (!("wsDeploymentExtend" in client)) client.defineCommand("wsDeploymentExtend", { numberOfKeys: 1, lua: EXTEND })
    if (!("wsDeploymentUsage" in client)) client.defineCommand("wsDeploymentUsage", { numberOfKeys: 2, lua: USAGE })
    const redis = client as Redis & Commands
    const leaseMs = options.leaseMs ?? DEFAULT_LEASE_MS
    const clock = yield* Clock.Clock
    const nowArg = (): string => (options.time === "clock" ? String(clock.currentTimeMillisUnsafe()) : "")
    const replica = Crypto.randomBytes(6).toString("hex")
    let seq = 0

    /** One released slot, retried when its ZREM failed. */
    interface Release {
      readonly key: string
      readonly slot: string
    }
    const zrem = ({ key, slot }: Release) => redis.zrem(keysOf(prefix, key).slots, slot)
    // The heartbeat (the admission's lease keeper): extends the slots held here per deployment, retries releases.
    const keeper = yield* LeaseKeeper.make<Release>({
      leaseMs,
      extend: (key, ids) =>
        StoreRedis.command("deployment slots extend", () =>
          redis.wsDeploymentExtend(keysOf(prefix, key).slots, nowArg(), leaseMs, ...ids)
        ),
      redo: (release) => StoreRedis.command("deployment slot release", () => zrem(release))
    })

    /** Releases a slot without waiting for Redis; a failed release is retried on the next beat. */
    const drop = (key: string, slot: string): void => {
      zrem({ key, slot }).catch(() => keeper.retry({ key, slot }))
    }

    const take = (key: string, caps: Caps): Effect.Effect<TakeResult> =>
      Effect.suspend(() => {
        const slot = `${replica}.${(++seq).toString(36)}`
        const { slots, starts } = keysOf(prefix, key)
        const concurrency = caps.concurrency !== null
        return StoreRedis.command("deployment slot", () =>
          redis.wsDeploymentTake(slots, starts, nowArg(), slot, caps.concurrency ?? 0, caps.rate_limit_rpm ?? 0, leaseMs)
        ).pipe(
          Effect.map((reply) => decodeTake(reply, slot, concurrency)),
          Effect.catch((error) => Effect.succeed<TakeResult>({ _tag: "Unavailable", detail: error.detail })),
          Effect.tap((result) =>
            Effect.sync(() => {
              if (result._tag === "Taken" && result.slot !== null) keeper.hold(key, result.slot)
              // No answer, or one not understood: the script may have taken the slot. It is dropped by id (a no-op
              // if it did not).
              else if (result._tag === "Unavailable" && concurrency) drop(key, slot)
            })
          )
        )
      })

    const usage = (key: string): Effect.Effect<FleetUsage | null> =>
      Effect.suspend(() => {
        const { slots, starts } = keysOf(prefix, key)
        return StoreRedis.command("deployment usage", () => redis.wsDeploymentUsage(slots, starts, nowArg())).pipe(
          Effect.map((reply) => {
            if (!Array.isArray(reply) || reply.length !== 2 || !isCount(reply[0]) || !isCount(reply[1])) return null
            return { inFlight: reply[0], startsLastMinute: reply[1] }
          }),
          Effect.catch(() => Effect.succeed(null))
        )
      })

    const caps: SharedCaps = {
      take,
      release: (key, slot) => {
        keeper.unhold(key, slot)
        drop(key, slot)
      },
      usage
    }
    return caps
  })
