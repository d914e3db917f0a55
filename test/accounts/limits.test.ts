/**
 * Rate windows of the account endpoints on the TestClock, against the real in-memory admission limiter
 * (the same primitive the Redis engine serves across replicas). No real sleeps.
 */
import { afterAll, describe, expect, it } from "@effect/vitest"
import { Effect, Layer, Result } from "effect"
import { TestClock } from "effect/testing"
import { endpointLimit, enforce, limitKey, READ_LIMIT, REVEAL_LIMIT } from "../../src/accounts/Limits.js"
import { parseLimit, parseModel, parseRange } from "../../src/accounts/Metrics.js"
import { parseKeyId, labelFrom } from "../../src/accounts/Keys.js"
import { poolView } from "../../src/accounts/Snapshot.js"
import { Admission } from "../../src/quota/Admission.js"
import { layerMemory } from "../../src/quota/AdmissionMemory.js"
import { layerRedis } from "../../src/quota/AdmissionRedis.js"
import { deleteByPrefix, uniquePrefix } from "../support/Redis.js"
import { REDIS_URL, serviceGate } from "../support/Services.js"

const admission = layerMemory({ abuse: { burst: 300, window_seconds: 10, cooldown_seconds: 60 } })

const hits = (n: number, effect: Effect.Effect<void, unknown, any>) =>
  Effect.forEach(Array.from({ length: n }), () => Effect.result(effect))

describe("account endpoint rate windows (TestClock)", () => {
  it.effect("reveal: 30 per 60 s window, the 31st is 429 with the seconds left, the next window is fresh", () =>
    Effect.gen(function*() {
      const results = yield* hits(31, enforce(REVEAL_LIMIT, "acc_a"))
      expect(results.slice(0, 30).every(Result.isSuccess)).toBe(true)
      const over = results[30]!
      expect(Result.isFailure(over)).toBe(true)
      if (Result.isFailure(over)) {
        const error = over.failure as { code: string; retryAfter: number; status: number }
        expect(error.code).toBe("rate_limited")
        expect(error.status).toBe(429)
        expect(error.retryAfter).toBe(60)
      }
      yield* TestClock.adjust("45 seconds")
      const still = yield* Effect.result(enforce(REVEAL_LIMIT, "acc_a"))
      expect(Result.isFailure(still) && (still.failure as { retryAfter: number }).retryAfter).toBe(15)
      yield* TestClock.adjust("15 seconds")
      const fresh = yield* hits(30, enforce(REVEAL_LIMIT, "acc_a"))
      expect(fresh.every(Result.isSuccess)).toBe(true)
      expect(Result.isFailure(yield* Effect.result(enforce(REVEAL_LIMIT, "acc_a")))).toBe(true)
    }).pipe(Effect.provide(admission)))

  it.effect("metrics and requests share one budget of 120 per minute, per account", () =>
    Effect.gen(function*() {
      // Both endpoints call enforce(READ_LIMIT, ...): one key per account.
      expect(limitKey(READ_LIMIT, "acc_b")).toBe("acct:metrics:acc_b")
      const first = yield* hits(120, enforce(READ_LIMIT, "acc_b"))
      expect(first.every(Result.isSuccess)).toBe(true)
      expect(Result.isFailure(yield* Effect.result(enforce(READ_LIMIT, "acc_b")))).toBe(true)
      // Other accounts and the reveal budget are independent.
      expect(Result.isSuccess(yield* Effect.result(enforce(READ_LIMIT, "acc_c")))).toBe(true)
      expect(Result.isSuccess(yield* Effect.result(enforce(REVEAL_LIMIT, "acc_b")))).toBe(true)
      yield* TestClock.adjust("59999 millis")
      expect(Result.isFailure(yield* Effect.result(enforce(READ_LIMIT, "acc_b")))).toBe(true)
      yield* TestClock.adjust("1 millis")
      expect(Result.isSuccess(yield* Effect.result(enforce(READ_LIMIT, "acc_b")))).toBe(true)
    }).pipe(Effect.provide(admission)))
})

// A family of seven endpoints sharing 15 requests a minute per account: one constant, one line per endpoint.
const BYOK_LIMIT = endpointLimit("byok", 15, 60, "BYOK 요청이 너무 많습니다. 1분에 15회까지 가능합니다.")
const byokEndpoints = Array.from({ length: 7 }, () => (accountId: string) => enforce(BYOK_LIMIT, accountId))

const retryAfterOf = (r: Result.Result<void, unknown>) =>
  Result.isFailure(r) ? (r.failure as { code: string; status: number; retryAfter: number; userMessage: string }) : null

describe("a shared endpoint family on the one limiter", () => {
  it.effect("15 a minute across seven endpoints: the 16th call on any of them is 429 with the seconds left", () =>
    Effect.gen(function*() {
      const results = yield* Effect.forEach(Array.from({ length: 16 }, (_, i) => i), (i) =>
        Effect.result(byokEndpoints[i % 7]!("acc_byok")))
      expect(results.slice(0, 15).every(Result.isSuccess)).toBe(true)
      const over = retryAfterOf(results[15]!)
      expect(over).toMatchObject({ code: "rate_limited", status: 429, retryAfter: 60 })
      expect(over!.userMessage).toBe(BYOK_LIMIT.message)
      // the family's budget is its own
      expect(Result.isSuccess(yield* Effect.result(enforce(REVEAL_LIMIT, "acc_byok")))).toBe(true)
      yield* TestClock.adjust("59 seconds")
      expect(retryAfterOf(yield* Effect.result(byokEndpoints[3]!("acc_byok")))?.retryAfter).toBe(1)
      yield* TestClock.adjust("1 second")
      expect(Result.isSuccess(yield* Effect.result(byokEndpoints[6]!("acc_byok")))).toBe(true)
    }).pipe(Effect.provide(admission)))
})

const redisUp = await serviceGate("redis")
const redisPrefix = uniquePrefix("limits")

describe.skipIf(!redisUp)("a shared endpoint family across replicas (Redis admission)", () => {
  afterAll(async () => {
    await deleteByPrefix(REDIS_URL, redisPrefix)
  })

  const replica = () =>
    layerRedis({
      abuse: { burst: 300, window_seconds: 10, cooldown_seconds: 60 },
      url: REDIS_URL,
      keyPrefix: redisPrefix,
      time: "clock"
    })

  it.effect("two replicas, seven endpoints: 15 a minute in total", () =>
    Effect.scoped(Effect.gen(function*() {
      yield* TestClock.setTime(Date.UTC(2026, 0, 5, 3))
      const one = yield* Layer.build(replica())
      const two = yield* Layer.build(replica())
      const results = yield* Effect.forEach(Array.from({ length: 20 }, (_, i) => i), (i) =>
        Effect.result(byokEndpoints[i % 7]!("acc_replicas").pipe(Effect.provide(i % 2 === 0 ? one : two))))
      expect(results.filter(Result.isSuccess)).toHaveLength(15)
      expect(results.slice(0, 15).every(Result.isSuccess)).toBe(true)
      expect(retryAfterOf(results[19]!)).toMatchObject({ code: "rate_limited", retryAfter: 60 })
      // the same budget seen through the Admission service of either replica
      const seen = yield* Effect.flatMap(Admission, (a) => a.limit(limitKey(BYOK_LIMIT, "acc_replicas"), 15, 60)).pipe(
        Effect.provide(two)
      )
      expect(seen).toEqual({ allowed: false, remaining: 0, reset_seconds: 60 })
    })))
})

describe("request parsing rules", () => {
  it("limit: non-number, negative, zero or empty -> 20; above 50 -> 50", () => {
    expect(parseLimit(null)).toBe(20)
    expect(parseLimit("")).toBe(20)
    expect(parseLimit("  ")).toBe(20)
    expect(parseLimit("abc")).toBe(20)
    expect(parseLimit("10abc")).toBe(20)
    expect(parseLimit("-1")).toBe(20)
    expect(parseLimit("0")).toBe(20)
    expect(parseLimit("Infinity")).toBe(20)
    expect(parseLimit("1")).toBe(1)
    expect(parseLimit("49.9")).toBe(49)
    expect(parseLimit("50")).toBe(50)
    expect(parseLimit("51")).toBe(50)
  })

  it.effect("range: default 24h, the five allowed values, anything else 400 listing them", () =>
    Effect.gen(function*() {
      expect(yield* parseRange(null)).toBe("24h")
      expect(yield* parseRange("")).toBe("24h")
      for (const r of ["1h", "4h", "24h", "7d", "30d"]) expect(yield* parseRange(r)).toBe(r)
      for (const bad of ["toString", "__proto__", "2h", "24"]) {
        const result = yield* Effect.result(parseRange(bad))
        expect(Result.isFailure(result)).toBe(true)
        if (Result.isFailure(result)) {
          expect(result.failure.status).toBe(400)
          expect(result.failure.userMessage).toContain("1h, 4h, 24h, 7d, 30d")
        }
      }
    }))

  it("model: truncated to 128 characters (code points), empty is unset", () => {
    expect(parseModel(null)).toBeNull()
    expect(parseModel("")).toBeNull()
    expect(parseModel("x".repeat(200))).toBe("x".repeat(128))
    expect(Array.from(parseModel("가".repeat(200))!)).toHaveLength(128)
    // Cleaned as stored rows are: a NUL would be refused by the database (it answered 500 before).
    expect(parseModel("x\u0000y\u0007")).toBe("xy")
    expect(parseModel("\u0000")).toBe("")
    expect(parseModel("a\ud800b")).toBe("a\ufffdb")
  })

  it.effect("key ids: positive integers only", () =>
    Effect.gen(function*() {
      expect(yield* parseKeyId("1")).toBe(1)
      expect(yield* parseKeyId("123456")).toBe(123456)
      for (const bad of [undefined, "", "0", "-3", "+3", "01", "1.0", "1e2", " 1", "99999999999999999"]) {
        expect(Result.isFailure(yield* Effect.result(parseKeyId(bad)))).toBe(true)
      }
    }))

  it("labels: default 새 키, trimmed, truncated to 40 code points", () => {
    expect(labelFrom(undefined)).toBe("새 키")
    expect(labelFrom({})).toBe("새 키")
    expect(labelFrom({ label: 5 })).toBe("새 키")
    expect(labelFrom({ label: "  " })).toBe("새 키")
    expect(labelFrom({ label: " ci " })).toBe("ci")
    expect(labelFrom({ label: "🔑".repeat(45) })).toBe("🔑".repeat(40))
  })
})

describe("plan pool view", () => {
  const pool = { used: 1234.4, limit: 5000, used_pct: 24.69, remaining_pct: 75.31, resets_at: 1_800_000_000_000, resets_in_seconds: 100 }
  const byModel = [{ model_id: "ws-pro", request_count: 3, weighted: 1234.567, pct_of_total: 100 }]

  it("visible absolutes", () => {
    expect(poolView(pool, false, byModel, "session")).toEqual({
      used: 1234,
      limit: 5000,
      remaining: 3766,
      used_pct: 24.69,
      resets_at: new Date(1_800_000_000_000).toISOString(),
      resets_in_seconds: 100,
      active: true,
      by_model: [{ model_id: "ws-pro", weighted: 1234.57, request_count: 3, pct_of_total: 100 }]
    })
  })

  it("hidden absolutes: used, limit, remaining and weighted are all null; used_pct stays", () => {
    const view = poolView({ ...pool, anchor_at: 1_799_000_000_000 }, true, byModel, "weekly")
    expect(view).toMatchObject({ used: null, limit: null, remaining: null, used_pct: 24.69 })
    expect(view.by_model[0]!.weighted).toBeNull()
    expect("active" in view).toBe(false)
    expect((view as { anchor_at: string }).anchor_at).toBe(new Date(1_799_000_000_000).toISOString())
  })
})
