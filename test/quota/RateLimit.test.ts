/**
 * The rate-limit primitive: one table of hits and answers, run against the in-process limiter and the Redis
 * limiter (its Lua script given `now` from the TestClock), so both follow the same window arithmetic; and the
 * Redis limiter shared by two replicas (two clients on one prefix).
 */
import { afterAll, describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import { makeMemory, type RateLimiter } from "../../src/quota/RateLimit.js"
import {
  fixedWindow,
  makeWindowStore,
  type RateRule,
  slidingWindow,
  type Verdict
} from "../../src/runtime/RateWindow.js"
import * as RateLimitRedis from "../../src/quota/RateLimitRedis.js"
import * as StoreRedis from "../../src/store/Redis.js"
import { deleteByPrefix, uniquePrefix } from "../support/Redis.js"
import { REDIS_URL, serviceGate } from "../support/Services.js"
import { T0 } from "./fixtures.js"

type Step =
  | { readonly at: number; readonly take: Verdict; readonly key?: string }
  | { readonly at: number; readonly record: true; readonly key?: string }
  | { readonly at: number; readonly wait: number; readonly key?: string }

interface Scenario {
  readonly name: string
  readonly rule: RateRule
  readonly steps: ReadonlyArray<Step>
}

const v = (allowed: boolean, remaining: number, reset_seconds: number): Verdict => ({ allowed, remaining, reset_seconds })

const scenarios: ReadonlyArray<Scenario> = [
  {
    name: "fixed 2 / 60 s: the window starts at the first hit; refused hits are not counted",
    rule: fixedWindow(2, 60),
    steps: [
      { at: 0, take: v(true, 1, 60) },
      { at: 0, take: v(true, 0, 60) },
      { at: 0, take: v(false, 0, 60) },
      { at: 0, wait: 60 },
      { at: 0, take: v(true, 1, 60), key: "other" },
      { at: 30_000, take: v(false, 0, 30) },
      { at: 59_999, take: v(false, 0, 1) },
      { at: 59_999, wait: 1 },
      // window over at exactly 60 s: the next hit opens the next window
      { at: 60_000, wait: 0 },
      { at: 60_000, take: v(true, 1, 60) },
      { at: 90_000, take: v(true, 0, 30) },
      { at: 90_000, take: v(false, 0, 30) },
      // idle past the window: the next window starts at the next hit, not on a grid
      // (not within a few ms of the window's end: Redis expires the key in real time, the steps run on TestClock)
      { at: 150_000, take: v(true, 1, 60) },
      { at: 200_000, take: v(true, 0, 10) },
      { at: 200_000, take: v(false, 0, 10) }
    ]
  },
  {
    name: "fixed: record counts even over the limit",
    rule: fixedWindow(1, 10),
    steps: [
      { at: 0, record: true },
      { at: 0, record: true },
      { at: 5_000, wait: 5 },
      { at: 5_000, take: v(false, 0, 5) },
      { at: 10_000, take: v(true, 0, 10) }
    ]
  },
  {
    name: "sliding 3 / 60 s: the previous minute weighs until it has slid out (failed requests)",
    rule: slidingWindow(3, 60),
    steps: [
      { at: 0, wait: 0 },
      { at: 0, record: true },
      { at: 0, record: true },
      { at: 0, wait: 0 },
      { at: 0, record: true },
      // three at t=0: the estimate is 3 until the window ends at 60 s
      { at: 0, wait: 61 },
      { at: 30_000, wait: 31 },
      { at: 60_000, wait: 1 },
      { at: 61_000, wait: 0 },
      // 3 × (1 − e/60) + 1 < 3 ⇔ e > 20 s; 1 s of the window has passed
      { at: 61_000, record: true },
      { at: 61_000, wait: 20 },
      // (the estimate reaches 3 − 1 at 80 s; Retry-After rounds up, so it was 20 s from 61 s)
      { at: 79_999, wait: 1 },
      { at: 80_001, wait: 0 },
      // idle for two windows: forgotten, the next failure starts a new window
      { at: 261_000, record: true },
      { at: 261_000, record: true },
      { at: 261_000, wait: 0 },
      { at: 261_000, record: true },
      { at: 261_000, wait: 61 },
      { at: 261_000, wait: 0, key: "other" }
    ]
  },
  {
    name: "sliding 2 / 60 s: take counts only allowed hits",
    rule: slidingWindow(2, 60),
    steps: [
      { at: 0, take: v(true, 1, 0) },
      { at: 0, take: v(true, 0, 61) },
      { at: 0, take: v(false, 0, 61) },
      { at: 60_000, take: v(false, 0, 1) },
      { at: 61_000, take: v(true, 0, 30) },
      { at: 61_000, take: v(false, 0, 30) }
    ]
  }
]

const play = (limiter: RateLimiter["Service"], scenario: Scenario, tag: string) =>
  Effect.gen(function*() {
    for (const [i, step] of scenario.steps.entries()) {
      yield* TestClock.setTime(T0 + step.at)
      const key = `${tag}:${step.key ?? "k"}`
      const label = `step ${i} at ${step.at} ms`
      if ("take" in step) expect(yield* limiter.take(key, scenario.rule), label).toEqual(step.take)
      else if ("record" in step) yield* limiter.record(key, scenario.rule)
      else expect(yield* limiter.retryAfter(key, scenario.rule), label).toBe(step.wait)
    }
  })

describe("rate limiter: in-process", () => {
  for (const [n, scenario] of scenarios.entries()) {
    it.effect(scenario.name, () => play(makeMemory(), scenario, `mem${n}`))
  }

  it("the store stays bounded: idle keys are swept first, then the least recently hit", () => {
    const store = makeWindowStore(10)
    const rule = fixedWindow(1, 60)
    for (let k = 0; k < 10; k++) store.take(k, rule, 0)
    expect(store.size()).toBe(10)
    // a minute later every window has ended: new keys sweep them instead of evicting live ones
    for (let k = 100; k < 105; k++) store.take(k, rule, 60_000)
    expect(store.size()).toBe(5)
    // full of live keys: the least recently hit go first, a recent one stays counted
    for (let k = 200; k < 205; k++) store.take(k, rule, 60_001)
    expect(store.take(204, rule, 60_002).allowed).toBe(false)
    store.take(999, rule, 60_003)
    expect(store.size()).toBeLessThanOrEqual(10)
    expect(store.take(204, rule, 60_004).allowed).toBe(false)
  })
})

const redisUp = await serviceGate("redis")
const prefix = uniquePrefix("ratelimit")

describe.skipIf(!redisUp)("rate limiter: Redis", () => {
  afterAll(async () => {
    await deleteByPrefix(REDIS_URL, prefix)
  })

  const redisLimiter = Effect.map(
    StoreRedis.make({ url: REDIS_URL }),
    ({ client }) => RateLimitRedis.make(client, { keyPrefix: prefix, time: "clock" })
  )

  for (const [n, scenario] of scenarios.entries()) {
    it.effect(scenario.name, () => Effect.scoped(Effect.flatMap(redisLimiter, (limiter) => play(limiter, scenario, `redis${n}`))))
  }

  it.effect("two replicas share one budget (two clients, one prefix): 15 a minute across seven endpoints", () =>
    Effect.scoped(Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const one = yield* redisLimiter
      const two = yield* redisLimiter
      const rule = fixedWindow(15, 60)
      const answers: Array<boolean> = []
      for (let i = 0; i < 21; i++) {
        // seven endpoints, one key per account: the endpoint does not matter, the replica alternates
        const replica = i % 2 === 0 ? one : two
        answers.push((yield* replica.take("acct:byok:acc_1", rule)).allowed)
      }
      expect(answers.filter(Boolean)).toHaveLength(15)
      expect(answers.slice(0, 15).every(Boolean)).toBe(true)
      expect(yield* two.take("acct:byok:acc_2", rule)).toEqual(v(true, 14, 60))
      yield* TestClock.adjust("60 seconds")
      expect((yield* one.take("acct:byok:acc_1", rule)).allowed).toBe(true)
    })))

  it.live("Redis unreachable: every call fails fast with service_unavailable", () =>
    Effect.scoped(Effect.gen(function*() {
      const { client } = yield* StoreRedis.make({ url: "redis://127.0.0.1:1", connectWaitMs: 200 })
      const limiter = RateLimitRedis.make(client, { keyPrefix: prefix, time: "redis" })
      const rule = fixedWindow(1, 60)
      const errors = yield* Effect.all([
        Effect.flip(limiter.take("k", rule)),
        Effect.flip(limiter.record("k", rule)),
        Effect.flip(limiter.retryAfter("k", rule))
      ])
      for (const e of errors) {
        expect(e.code).toBe("service_unavailable")
        expect(e.status).toBe(503)
      }
    })))
})
