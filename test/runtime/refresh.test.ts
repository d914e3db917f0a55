/**
 * The background-refresh helper (runtime/Refresh.ts) on the TestClock: one load per period whoever reads, single
 * flight, a failure keeps the previous value; shared between "replicas" through a store (a fake one here, and
 * Redis when it is up): the period's claimer computes, the others read its value unless it is stale.
 */
import { Deferred, Effect, Fiber, Layer, type Scope } from "effect"
import { TestClock } from "effect/testing"
import { afterAll, describe, expect, it } from "vitest"
import * as Refresh from "../../src/runtime/Refresh.js"
import * as RefreshRedis from "../../src/runtime/RefreshRedis.js"
import { deleteByPrefix, uniquePrefix } from "../support/Redis.js"
import { REDIS_URL, serviceGate } from "../support/Services.js"

const redisUp = await serviceGate("redis")

const run = <A>(effect: Effect.Effect<A, never, Scope.Scope | Refresh.RefreshStore>, store = Refresh.layerLocal) =>
  Effect.runPromise(effect.pipe(Effect.scoped, Effect.provide(Layer.merge(TestClock.layer(), store))))

describe("Refresh.make", () => {
  it("loads at start and once per period; readers never load while a value exists", async () => {
    const result = await run(Effect.gen(function*() {
      let loads = 0
      const r = yield* Refresh.make({ name: "t", every: 5_000, load: Effect.sync(() => ++loads) })
      const first = yield* r.get
      yield* Effect.all(Array.from({ length: 100 }, () => r.get), { concurrency: "unbounded" })
      const afterReads = loads
      yield* TestClock.adjust(4_999)
      const beforePeriod = (yield* r.get).value
      yield* TestClock.adjust(1)
      const afterPeriod = (yield* r.get).value
      yield* TestClock.adjust(5_000 * 10)
      return { first: first.value, afterReads, beforePeriod, afterPeriod, after10: r.loads(), at: (yield* r.get).at }
    }))
    expect(result).toEqual({ first: 1, afterReads: 1, beforePeriod: 1, afterPeriod: 2, after10: 12, at: 55_000 })
  })

  it("single flight: readers without a value join the refresh under way; an explicit refresh waits it out and loads again", async () => {
    const result = await run(Effect.gen(function*() {
      const gate = yield* Deferred.make<void>()
      let loads = 0
      const r = yield* Refresh.make({
        name: "t",
        every: 60_000,
        load: Effect.suspend(() => {
          loads++
          return Effect.as(Deferred.await(gate), loads)
        })
      })
      const waiting = yield* Effect.forkChild(Effect.all([r.get, r.get, r.refresh, r.get], { concurrency: "unbounded" }))
      yield* Effect.yieldNow
      yield* Deferred.succeed(gate, undefined)
      const values = (yield* Fiber.join(waiting)).map((s) => s.value)
      return { values, loads }
    }))
    // The explicit refresh's load started after the call: it sees what was written before it.
    expect(result).toEqual({ values: [1, 1, 2, 1], loads: 2 })
  })

  it("a failed refresh keeps the previous value; the next period tries again", async () => {
    const result = await run(Effect.gen(function*() {
      let fail = false
      let loads = 0
      const r = yield* Refresh.make({
        name: "t",
        every: 1_000,
        load: Effect.suspend(() => (++loads, fail ? Effect.die("down") : Effect.succeed(loads)))
      })
      const first = (yield* r.get).value
      fail = true
      yield* TestClock.adjust(3_000)
      const during = (yield* r.get).value
      fail = false
      yield* TestClock.adjust(1_000)
      return { first, during, after: (yield* r.get).value, loads }
    }))
    expect(result).toEqual({ first: 1, during: 1, after: 5, loads: 5 })
  })

  it("usable: a value it rejects makes readers wait for a new one", async () => {
    const result = await run(Effect.gen(function*() {
      let loads = 0
      const r = yield* Refresh.make({
        name: "t",
        every: 1_000_000,
        usable: (snapshot, now) => now - snapshot.at < 10_000,
        load: Effect.sync(() => ++loads)
      })
      yield* r.get
      yield* TestClock.adjust(10_000)
      return { value: (yield* r.get).value, loads }
    }))
    expect(result).toEqual({ value: 2, loads: 2 })
  })
})

/** A store shared by fake replicas: the first to claim a name holds it for `ttlMs` of the TestClock. */
const fakeShared = () => {
  const locks = new Map<string, number>()
  const values = new Map<string, string>()
  let now = 0
  const store = (): Refresh.RefreshStore["Service"] => ({
    kind: "redis",
    claim: (name, ttlMs) =>
      Effect.sync(() => {
        const until = locks.get(name)
        if (until !== undefined && until > now) return false
        locks.set(name, now + ttlMs)
        return true
      }),
    publish: (name, text) => Effect.sync(() => void values.set(name, text)),
    read: (name) => Effect.sync(() => values.get(name) ?? null)
  })
  return { store, values, setNow: (ms: number) => void (now = ms) }
}

describe("Refresh.make shared between replicas", () => {
  it("the period's claimer computes; the other replica reads its value; a stale value is computed again", async () => {
    const shared = fakeShared()
    const result = await Effect.runPromise(Effect.gen(function*() {
      let loadsA = 0
      let loadsB = 0
      const make = (store: Refresh.RefreshStore["Service"], load: Effect.Effect<string>) =>
        Refresh.make({ name: "fleet", every: 10_000, shared: Refresh.jsonCodec<{ v: string }>(), load: Effect.map(load, (v) => ({ v })) })
          .pipe(Effect.provideService(Refresh.RefreshStore, store))
      const a = yield* make(shared.store(), Effect.sync(() => `a${++loadsA}`))
      yield* a.get
      const b = yield* make(shared.store(), Effect.sync(() => `b${++loadsB}`))
      const fromB = yield* b.get
      const fromA = yield* a.get
      // A's replica dies: its value ages past three periods, the lock expires; B computes.
      shared.values.set("fleet", JSON.stringify({ at: fromA.at, value: { v: "a1" } }))
      yield* TestClock.setTime(40_000)
      shared.setNow(40_000)
      const loadsBefore = loadsB
      const later = yield* b.refresh
      return { fromA: fromA.value.v, fromB: fromB.value.v, sameAt: fromA.at === fromB.at, loadsB: loadsBefore, later: later.value.v }
    }).pipe(Effect.scoped, Effect.provide(TestClock.layer())))
    expect(result.fromA).toBe("a1")
    expect(result.fromB).toBe("a1")
    expect(result.sameAt).toBe(true)
    expect(result.loadsB).toBe(0)
    expect(result.later).toMatch(/^b/)
  })

  describe.skipIf(!redisUp)("over Redis", () => {
    const prefix = uniquePrefix("refresh")
    afterAll(() => deleteByPrefix(REDIS_URL, prefix))

    it("two replicas on one Redis: one computes, the other serves the same snapshot", async () => {
      const result = await Effect.runPromise(Effect.gen(function*() {
        let loadsA = 0
        let loadsB = 0
        // Each replica has its own Redis client (and lock owner id), open for the whole test.
        const make = (label: string, load: () => number) =>
          Effect.flatMap(Layer.build(RefreshRedis.layer(REDIS_URL, prefix)), (store) =>
            Refresh.make({
              name: "fleet",
              every: 60_000,
              shared: Refresh.jsonCodec<{ n: number; by: string }>(),
              load: Effect.sync(() => ({ n: load(), by: label }))
            }).pipe(Effect.provideContext(store)))
        const a = yield* make("a", () => ++loadsA)
        const first = yield* a.get
        const b = yield* make("b", () => ++loadsB)
        const seenByB = yield* b.get
        // Within the period the lock is A's: an explicit refresh on B reads A's value again.
        const again = yield* b.refresh
        return { first, seenByB, again, loadsA, loadsB }
      }).pipe(Effect.scoped))
      expect(result.loadsA).toBe(1)
      expect(result.loadsB).toBe(0)
      expect(result.seenByB).toEqual(result.first)
      expect(result.again).toEqual(result.first)
      expect(result.first.value.by).toBe("a")
    })
  })
})
