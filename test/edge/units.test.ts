/**
 * The pieces of the edge without a server: the failed-request window on the TestClock, its memory bound, which
 * errors count as a client's failures, and which defects are a store outage (503) rather than a bug (500).
 */
import { describe, expect, it } from "@effect/vitest"
import { Cause, Effect, Result } from "effect"
import { SqlError } from "effect/sql"
import { TestClock } from "effect/testing"
import { fail } from "../../src/errors/Catalog.js"
import { formatLimit } from "../../src/http/Body.js"
import { isClientFailure, make, makeCounter, MAX_TRACKED_KEYS } from "../../src/http/FailedRequests.js"
import { defectCode } from "../../src/http/Respond.js"

const invalid = fail("model_not_found")

describe("failed-request window", () => {
  it.effect("blocks a key at the limit, says when to retry, and lets it back in then", () =>
    Effect.gen(function*() {
      const failures = make(3)
      for (let i = 0; i < 3; i++) {
        expect(Result.isSuccess(yield* Effect.result(failures.check(1)))).toBe(true)
        yield* failures.record(1, invalid)
      }
      const blocked = yield* Effect.flip(failures.check(1))
      expect(blocked.code).toBe("too_many_failed_requests")
      expect(blocked.status).toBe(429)
      // Three failures at t=0: the estimate is 3 until the window ends at 60 s.
      expect(blocked.retryAfter).toBe(61)
      // Another key is not affected.
      expect(Result.isSuccess(yield* Effect.result(failures.check(2)))).toBe(true)

      yield* TestClock.adjust("30 seconds")
      expect((yield* Effect.flip(failures.check(1))).retryAfter).toBe(31)
      yield* TestClock.adjust("30 seconds")
      expect(Result.isFailure(yield* Effect.result(failures.check(1)))).toBe(true)
      yield* TestClock.adjust("1 second")
      expect(Result.isSuccess(yield* Effect.result(failures.check(1)))).toBe(true)

      // The previous minute still weighs: one more failure blocks again until its weight fades by one.
      yield* failures.record(1, invalid)
      const again = yield* Effect.flip(failures.check(1))
      // 3 * (1 - e/60) + 1 < 3  ⇔  e > 20 s; 1 s of the window has passed.
      expect(again.retryAfter).toBe(20)
      yield* TestClock.adjust("20 seconds")
      expect(Result.isSuccess(yield* Effect.result(failures.check(1)))).toBe(true)

      // Two idle minutes forget everything.
      yield* TestClock.adjust("3 minutes")
      for (let i = 0; i < 2; i++) yield* failures.record(1, invalid)
      expect(Result.isSuccess(yield* Effect.result(failures.check(1)))).toBe(true)
    }))

  it.effect("does not count failures that are not the client's own", () =>
    Effect.gen(function*() {
      const failures = make(1)
      for (const code of ["invalid_api_key", "geo_restricted", "rate_limited", "model_overloaded", "upstream_error", "service_unavailable"] as const) {
        yield* failures.record(7, fail(code))
      }
      expect(Result.isSuccess(yield* Effect.result(failures.check(7)))).toBe(true)
      expect(yield* failures.trackedKeys).toBe(0)
      yield* failures.record(7, fail("payload_too_large"))
      expect(Result.isFailure(yield* Effect.result(failures.check(7)))).toBe(true)
    }))

  it("counts 400, 413 and 415 only", () => {
    expect(["invalid_json", "model_not_found", "input_too_long", "payload_too_large", "unsupported_content_type"].every((c) =>
      isClientFailure(fail(c as never))
    )).toBe(true)
    expect(["invalid_api_key", "cross_site_request", "too_many_failed_requests", "rate_limited", "model_overloaded", "internal_error"].some((c) =>
      isClientFailure(fail(c as never))
    )).toBe(false)
  })

  it("stays bounded when a million distinct keys fail", () => {
    const counter = makeCounter(60)
    let peak = 0
    for (let id = 0; id < 1_000_000; id++) {
      counter.record(id, id)
      if ((id & 1023) === 0) peak = Math.max(peak, counter.size())
    }
    expect(Math.max(peak, counter.size())).toBeLessThanOrEqual(MAX_TRACKED_KEYS)
    // The most recent offenders are still tracked.
    for (let i = 0; i < 60; i++) counter.record(999_999, 1_000_000)
    expect(counter.retryAfter(999_999, 1_000_000)).toBeGreaterThan(0)
  })

  it("drops expired keys first", () => {
    const counter = makeCounter(1, 10)
    for (let id = 0; id < 10; id++) counter.record(id, 0)
    // Two minutes later every entry has expired: adding keys sweeps them instead of evicting live ones.
    for (let id = 100; id < 105; id++) counter.record(id, 120_000)
    expect(counter.size()).toBe(5)
  })
})

describe("defects", () => {
  const die = (error: unknown) => defectCode(Cause.die(error))

  it("a lost or refused database connection is 503, a bug is 500", () => {
    // sql-pg 4 wraps a lost or refused connection in a ConnectionError reason and a server's error response in a
    // reason chosen by its SQLSTATE (UnknownError for 57P01); the socket or server error (with its code) is the
    // reason's cause.
    const sqlError = (reason: SqlError.SqlErrorReason) => new SqlError.SqlError({ reason })
    const serverError = (cause: unknown) => sqlError(new SqlError.UnknownError({ cause }))
    const connectionError = (cause: unknown) => sqlError(new SqlError.ConnectionError({ cause }))
    expect(die(serverError(Object.assign(new Error("terminating connection"), { code: "57P01" })))).toBe("service_unavailable")
    expect(die(connectionError(Object.assign(new Error("connect ECONNREFUSED"), { code: "ECONNREFUSED" })))).toBe("service_unavailable")
    expect(die(connectionError(new Error("Connection terminated unexpectedly")))).toBe("service_unavailable")
    expect(die(Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:5432"), { code: "ECONNREFUSED" }))).toBe("service_unavailable")
    expect(die(sqlError(new SqlError.UniqueViolation({
      cause: Object.assign(new Error("duplicate key"), { code: "23505" }),
      constraint: "api_keys_key_hash_key"
    })))).toBe("internal_error")
    expect(die(sqlError(new SqlError.SqlSyntaxError({ cause: Object.assign(new Error("syntax error"), { code: "42601" }) }))))
      .toBe("internal_error")
    expect(die(new TypeError("x is undefined"))).toBe("internal_error")
    expect(defectCode(Cause.combine(Cause.die(new Error("a")), Cause.die(connectionError(null))))).toBe("service_unavailable")
  })
})

describe("413 message", () => {
  it("states the limit", () => {
    expect(formatLimit(4 * 1024 * 1024)).toBe("4 MB")
    expect(formatLimit(1.5 * 1024 * 1024)).toBe("1.5 MB")
    expect(formatLimit(64 * 1024)).toBe("64 KB")
  })
})
