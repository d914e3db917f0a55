/**
 * Pending image slots in Redis (production): shared by every replica, so an account holds at most
 * `pending_per_account` across all of them.
 *
 * - Each account's slots are a sorted set `<prefix>slots:{account}` of lease ids scored by expiry. One script takes a
 *   slot atomically: it drops expired leases, counts, and adds one unless the account is full (429).
 * - A lease expires `leaseMs` (default 9 s) after it was taken or last renewed. One renewal fiber per replica renews
 *   every lease it holds every `leaseMs / 3`; a dead replica's slots come back within `leaseMs`.
 * - Closing the acquiring scope removes the lease; if Redis cannot be reached then, the lease lapses by itself.
 *
 * Time is Redis `TIME`, or the Effect clock with `time: "clock"` (tests drive it with `TestClock`).
 */
import { type Context, Duration, Effect, Fiber, Queue, type Scope } from "effect"
import type { Redis } from "ioredis"
import { type GatewayError, unavailable } from "../errors/Catalog.js"
import * as StoreRedis from "../store/Redis.js"
import type { ImagesConfig } from "../config/Images.js"
import { ImageSlots } from "./Contracts.js"
import { pendingFull } from "./Slots.js"

/** One Redis command; no answer is 503 `service_unavailable`. */
const command = <A>(what: string, f: () => Promise<A>) => Effect.mapError(StoreRedis.command(what, f), unavailable)


/** KEYS: 1 slot set. ARGV: 1 now|'', 2 lease id, 3 max, 4 lease ms. Returns 1 taken, 0 full. */
const ACQUIRE = `${StoreRedis.LUA_NOW}
local key, id, max, lease = KEYS[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
if redis.call('ZCARD', key) >= max then return 0 end
redis.call('ZADD', key, now + lease, id)
redis.call('PEXPIRE', key, lease + 60000)
return 1
`

/** KEYS: 1 slot set. ARGV: 1 now|'', 2 lease ms, 3.. lease ids. Renews the ids still present; returns how many. */
const RENEW = `${StoreRedis.LUA_NOW}
local key, lease, n = KEYS[1], tonumber(ARGV[2]), 0
for i = 3, #ARGV do
  local score = redis.call('ZSCORE', key, ARGV[i])
  if score and tonumber(score) > now then
    redis.call('ZADD', key, 'XX', now + lease, ARGV[i])
    n = n + 1
  end
end
if n > 0 then redis.call('PEXPIRE', key, lease + 60000) end
return n
`

/** KEYS: 1 slot set. ARGV: 1 now|''. Unexpired leases. */
const HELD = `${StoreRedis.LUA_NOW}
return redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
`

interface Commands {
  wsImgSlotAcquire(key: string, now: string, id: string, max: number, leaseMs: number): Promise<number>
  wsImgSlotRenew(key: string, now: string, leaseMs: number, ...ids: Array<string>): Promise<number>
  wsImgSlotHeld(key: string, now: string): Promise<number>
}

const defineScripts = (redis: Redis): Redis & Commands => {
  const define = (name: keyof Commands, lua: string) => {
    if (!(name in redis)) redis.defineCommand(name, { numberOfKeys: 1, lua })
  }
  define("wsImgSlotAcquire", ACQUIRE)
  define("wsImgSlotRenew", RENEW)
  define("wsImgSlotHeld", HELD)
  return redis as Redis & Commands
}

export interface RedisSlotsOptions {
  readonly config: () => ImagesConfig
  /** Prefix of the keys (the layer passes `<redis_key_prefix>img:`). */
  readonly keyPrefix: string
  /** Lease lifetime without renewal. Default 9 s. */
  readonly leaseMs?: number | undefined
  /** `redis` (server TIME, production) or `clock` (the Effect clock, tests). Default `redis`. */
  readonly time?: "redis" | "clock" | undefined
}

export interface RedisSlots {
  readonly slots: Context.Service.Shape<typeof ImageSlots>
  /** Renews this replica's leases now (what the renewal fiber does every `leaseMs / 3`). */
  readonly renew: Effect.Effect<void>
  /** Stops renewing without releasing anything: what a replica that died looks like to the others (tests). */
  readonly stopRenewing: Effect.Effect<void>
}

/** Builds the service on `client` in the current scope (the renewal fiber lives in it). */
export const makeRedis = (client: Redis, options: RedisSlotsOptions): Effect.Effect<RedisSlots, never, Scope.Scope> =>
  Effect.gen(function*() {
    const redis = defineScripts(client)
    const leaseMs = options.leaseMs ?? 9_000
    const clock = yield* Effect.clockWith(Effect.succeed)
    const now = () => (options.time === "clock" ? String(clock.currentTimeMillisUnsafe()) : "")
    const keyOf = (accountId: string) => `${options.keyPrefix}slots:{${accountId}}`
    const replica = Math.random().toString(36).slice(2, 10)
    let seq = 0
    /** account -> lease ids this replica holds. */
    const held = new Map<string, Set<string>>()
    const wake = yield* Queue.sliding<void>(1)

    const renew: Effect.Effect<void> = Effect.suspend(() =>
      Effect.all(
        [...held].map(([accountId, ids]) =>
          command("image slot renew", () => redis.wsImgSlotRenew(keyOf(accountId), now(), leaseMs, ...ids)).pipe(
            Effect.catch((error) => Effect.logWarning("image slot renewal failed", error.detail))
          )
        ),
        { concurrency: "unbounded", discard: true }
      )
    )

    const every = Duration.millis(Math.max(1, Math.floor(leaseMs / 3)))
    const renewal = yield* Effect.suspend(() =>
      held.size === 0 ? Queue.take(wake) : Effect.andThen(Effect.sleep(every), renew)
    ).pipe(Effect.forever, Effect.forkScoped)

    const unhold = (accountId: string, id: string) => {
      const ids = held.get(accountId)
      if (ids === undefined) return
      ids.delete(id)
      if (ids.size === 0) held.delete(accountId)
    }

    const acquire = (accountId: string): Effect.Effect<void, GatewayError, Scope.Scope> =>
      Effect.acquireRelease(
        Effect.suspend(() => {
          const id = `${replica}.${++seq}`
          const max = options.config().pending_per_account
          return command("image slot acquire", () => redis.wsImgSlotAcquire(keyOf(accountId), now(), id, max, leaseMs)).pipe(
            Effect.flatMap((taken) => {
              if (taken !== 1) return Effect.fail(pendingFull())
              let ids = held.get(accountId)
              if (ids === undefined) held.set(accountId, ids = new Set())
              ids.add(id)
              Queue.offerUnsafe(wake, undefined)
              return Effect.succeed(id)
            })
          )
        }),
        (id) =>
          Effect.suspend(() => {
            unhold(accountId, id)
            // a failed removal is harmless: the lease is no longer renewed and lapses within leaseMs
            return command("image slot release", () => redis.zrem(keyOf(accountId), id)).pipe(Effect.ignore)
          })
      ).pipe(Effect.asVoid)

    return {
      slots: ImageSlots.of({
        acquire,
        held: (accountId) =>
          command("image slots held", () => redis.wsImgSlotHeld(keyOf(accountId), now())).pipe(
            Effect.orElseSucceed(() => 0)
          )
      }),
      renew,
      stopRenewing: Fiber.interrupt(renewal)
    }
  })
