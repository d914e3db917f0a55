import { afterAll, describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Scope } from "effect"
import { TestClock } from "effect/testing"
import * as Slots from "../../src/images/Slots.js"
import * as SlotsRedis from "../../src/images/SlotsRedis.js"
import * as StoreRedis from "../../src/store/Redis.js"
import { eventually } from "../support/Eventually.js"
import { deleteByPrefix, uniquePrefix } from "../support/Redis.js"
import { REDIS_URL, serviceGate } from "../support/Services.js"
import { liveConfig, slotsContract, T0 } from "./contract.js"

const redisUp = await serviceGate("redis")
const runPrefix = uniquePrefix("img-slots")
let backends = 0

slotsContract({
  name: "memory",
  make: (config) =>
    Effect.map(Slots.makeMemory({ config }), (slots) => ({ slots }))
})

/** One replica: its own connection, on the backend named by `keyPrefix`. */
const replica = (keyPrefix: string, options: Partial<SlotsRedis.RedisSlotsOptions> = {}) =>
  Effect.gen(function*() {
    const { client } = yield* StoreRedis.make({ url: REDIS_URL })
    return yield* SlotsRedis.makeRedis(client, { config: liveConfig().get, keyPrefix, time: "clock", ...options })
  })

describe.skipIf(!redisUp)("Image slots in Redis", () => {
  afterAll(async () => {
    await deleteByPrefix(REDIS_URL, runPrefix)
  })

  slotsContract({
    name: "redis",
    make: (config) =>
      replica(`${runPrefix}${++backends}:`, { config })
  })

  it.effect("two replicas share each account's count", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const prefix = `${runPrefix}${++backends}:`
      const one = yield* replica(prefix)
      const two = yield* replica(prefix)
      const held = yield* Scope.make()
      yield* one.slots.acquire("acct").pipe(Scope.provide(held))
      yield* two.slots.acquire("acct")
      expect((yield* Effect.flip(Effect.scoped(one.slots.acquire("acct")))).code).toBe("image_pending_full")
      expect((yield* Effect.flip(Effect.scoped(two.slots.acquire("acct")))).code).toBe("image_pending_full")
      expect(yield* one.slots.held("acct")).toBe(2)
      expect(yield* two.slots.held("acct")).toBe(2)
      yield* Scope.close(held, Exit.void)
      expect(yield* two.slots.held("acct")).toBe(1)
      yield* Effect.scoped(two.slots.acquire("acct"))
    }).pipe(Effect.scoped))

  it.effect("a dead replica's slots come back after leaseMs (9 s); a live replica's are renewed", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const prefix = `${runPrefix}${++backends}:`
      const dead = yield* replica(prefix)
      const live = yield* replica(prefix)
      // the dead replica took both slots of `acct` and stops renewing without releasing them
      yield* dead.slots.acquire("acct")
      yield* dead.slots.acquire("acct")
      yield* dead.stopRenewing
      // the live one holds both of `other` and keeps renewing
      yield* live.slots.acquire("other")
      yield* live.slots.acquire("other")
      for (let second = 3; second <= 9; second += 3) {
        yield* TestClock.adjust("3 seconds")
        yield* live.renew
        if (second < 9) expect((yield* Effect.flip(Effect.scoped(live.slots.acquire("acct")))).code).toBe("image_pending_full")
      }
      expect(yield* live.slots.held("acct")).toBe(0)
      yield* Effect.scoped(live.slots.acquire("acct"))
      expect(yield* live.slots.held("other")).toBe(2)
      expect((yield* Effect.flip(Effect.scoped(live.slots.acquire("other")))).code).toBe("image_pending_full")
    }).pipe(Effect.scoped))

  it.live("on Redis time, with a 1 s lease: a dead replica's slots lapse, a renewing replica's stays", () =>
    Effect.gen(function*() {
      const prefix = `${runPrefix}${++backends}:`
      const dead = yield* replica(prefix, { time: "redis", leaseMs: 1_000 })
      const live = yield* replica(prefix, { time: "redis", leaseMs: 1_000 })
      yield* dead.slots.acquire("acct")
      yield* dead.slots.acquire("acct")
      yield* dead.stopRenewing
      yield* live.slots.acquire("other")
      const started = Date.now()
      yield* Effect.promise(() =>
        eventually(() => Effect.runPromise(Effect.map(live.slots.held("acct"), (n) => n === 0)), {
          timeoutMs: 5_000,
          what: "the dead replica's slots lapsing"
        })
      )
      expect(Date.now() - started).toBeLessThan(3_000)
      yield* Effect.scoped(live.slots.acquire("acct"))
      // what is tested here is real time passing: the renewed slot outlives three lease times
      yield* Effect.sleep(Math.max(0, 3_300 - (Date.now() - started)))
      expect(yield* live.slots.held("other")).toBe(1)
    }).pipe(Effect.scoped))
})
