/**
 * The Exchange's one completion (src/inference/Exchange.ts), without a server: a counting admission (each
 * settle, refund and release counted, never deduplicated, so a second settlement would show) and a request log
 * that keeps the rows it is given. The request's scope is a real Scope, closed by the test.
 */
import { Cause, Effect, Exit, Fiber, Scope } from "effect"
import { HttpServerResponse } from "effect/http"
import { TestClock } from "effect/testing"
import { describe, expect, it } from "vitest"
import type { AccountRow } from "../../src/accounts/AccountsRepo.js"
import type { Caller } from "../../src/auth/Auth.js"
import { fail } from "../../src/errors/Catalog.js"
import { FailedRequests, make as makeFailedRequests } from "../../src/http/FailedRequests.js"
import { Exchange, finishing } from "../../src/inference/Exchange.js"
import { upstreamFailure } from "../../src/upstream/Failure.js"
import { Admission, type Standing, type Ticket } from "../../src/quota/Admission.js"
import type { RequestRow } from "../../src/telemetry/RequestRow.js"
import { UpstreamError } from "../../src/upstream/Upstream.js"
import { input, model, plan } from "../quota/fixtures.js"

const account: AccountRow = {
  id: "acc_exchange",
  display_id: 1,
  username: "exchange",
  display_name: "exchange",
  community_id: null,
  community_type: null,
  email: null,
  email_verified_at: null,
  status: "active",
  is_guest: false,
  guest_expires_at: null,
  is_admin: false,
  is_legacy: false,
  needs_migration: false,
  plan: null,
  sfw_mode: false,
  byok_fallback_override: null,
  created_at: new Date(0),
  last_used_at: null,
  last_rotated_at: null,
  liveness_blocked_at: null,
  next_liveness_at: null,
  password_changed_at: null,
  last_nick_changed_at: null
}
const caller: Caller = { account, key: null }

const pool = { used: 0, limit: 1, used_pct: 0, remaining_pct: 100, resets_at: null, resets_in_seconds: 0 }
const standing: Standing = { session: pool, weekly: { ...pool, anchor_at: null } }

const harness = () => {
  const rows: Array<RequestRow> = []
  const counts = { admitted: 0, released: 0, settles: [] as Array<{ inputTokens: number; outputTokens: number }>, refunds: 0 }
  let nextId = 100
  const log: Parameters<typeof Exchange.open>[1] = {
    nextId: Effect.sync(() => nextId++),
    nextIdNow: () => nextId++,
    record: (row) => void rows.push(row),
    flush: Effect.void,
    pending: () => 0,
    dropped: () => 0
  }
  const ticket: Ticket = {
    reserved: standing,
    rpm: { limit: 10, remaining: 9, reset_seconds: 60 },
    settle: (usage) =>
      Effect.sync(() => {
        counts.settles.push(usage)
        return { standing, weighted: usage.inputTokens + 3 * usage.outputTokens }
      }),
    refund: Effect.sync(() => void counts.refunds++)
  }
  const unused = Effect.die(new Error("not used by the exchange"))
  const admission = Admission.of({
    admit: () =>
      Effect.acquireRelease(
        Effect.sync(() => {
          counts.admitted++
          return ticket
        }),
        () => Effect.sync(() => void counts.released++)
      ),
    standing: () => unused,
    currentRpm: () => unused,
    dailyUsage: () => unused,
    limit: () => unused
  })
  const m = model()
  const admit = (exchange: Exchange) => exchange.admit(admission, input(account.id, m, plan(), 40))
  return { rows, counts, log, admit }
}

/** Runs `body` with a request scope of its own, then closes that scope (as the server does after the response). */
const inRequest = <A, E, R>(body: () => Effect.Effect<A, E, R>) =>
  Effect.gen(function*() {
    const scope = yield* Scope.make()
    const exit = yield* Effect.exit(Scope.provide(body(), scope))
    yield* Scope.close(scope, Exit.void)
    return exit
  })

const run = <A>(effect: Effect.Effect<A, never, FailedRequests>) =>
  Effect.runPromise(Effect.provideService(effect, FailedRequests, makeFailedRequests(1_000)))

describe("Exchange: one completion", () => {
  it("completing twice writes one row and settles once; the second completion returns null", async () => {
    const h = harness()
    const results = await run(inRequest(() =>
      Effect.gen(function*() {
        const exchange = yield* Exchange.open(caller, h.log)
        yield* h.admit(exchange)
        exchange.setUsage({ prompt_tokens: 7, completion_tokens: 5, reasoning_tokens: 1, cached_tokens: 2 })
        const first = yield* exchange.succeed()
        const second = yield* exchange.succeed()
        const third = yield* exchange.fail(fail("upstream_error"))
        return [first, second, third]
      })
    ))
    expect(Exit.isSuccess(results)).toBe(true)
    const [first, second, third] = Exit.isSuccess(results) ? results.value : []
    expect(first).toEqual({ standing, weighted: 7 + 15 })
    expect(second).toBeNull()
    expect(third).toBeNull()
    expect(h.counts.settles).toEqual([{ inputTokens: 7, cachedInputTokens: 2, outputTokens: 5 }])
    expect(h.counts.refunds).toBe(0)
    expect(h.rows).toHaveLength(1)
    expect(h.rows[0]).toMatchObject({
      id: 100,
      status: "success",
      error_code: null,
      http_status: 200,
      input_tokens: 7,
      output_tokens: 5,
      reasoning_tokens: 1,
      prompt_cached_tokens: 2,
      weighted_cost: 22,
      error: null
    })
  })

  it("a cancellation after success (the request scope closing) is a no-op; the slot is released by the success", async () => {
    const h = harness()
    let releasedBeforeScopeClosed = -1
    await run(inRequest(() =>
      Effect.gen(function*() {
        const exchange = yield* Exchange.open(caller, h.log)
        yield* h.admit(exchange)
        yield* exchange.succeed()
        releasedBeforeScopeClosed = h.counts.released
        yield* exchange.cancel()
      })
    ))
    // Released when the exchange completed, before the request's scope closed.
    expect(releasedBeforeScopeClosed).toBe(1)
    expect(h.rows.map((r) => r.status)).toEqual(["success"])
    expect(h.counts.settles).toHaveLength(1)
    expect(h.counts.refunds).toBe(0)
    expect(h.counts.released).toBe(1)
  })

  it("an exchange nobody completed is cancelled when the request's scope closes: refunded, released, row 499", async () => {
    const h = harness()
    let rowsBeforeScopeClosed = -1
    await run(inRequest(() =>
      Effect.gen(function*() {
        const exchange = yield* Exchange.open(caller, h.log)
        exchange.resolveModel("m-a")
        yield* h.admit(exchange)
        rowsBeforeScopeClosed = h.rows.length
      })
    ))
    expect(rowsBeforeScopeClosed).toBe(0)
    expect(h.rows).toHaveLength(1)
    expect(h.rows[0]).toMatchObject({ status: "cancelled", error_code: "cancelled", http_status: 499, model_id: "m-a" })
    expect(h.counts.refunds).toBe(1)
    expect(h.counts.settles).toHaveLength(0)
    expect(h.counts.released).toBe(1)
  })

  it("a failure after output was delivered charges what was delivered (estimate), not a refund", async () => {
    const h = harness()
    await run(inRequest(() =>
      Effect.gen(function*() {
        const exchange = yield* Exchange.open(caller, h.log)
        exchange.setEstimatedInput(40)
        yield* h.admit(exchange)
        exchange.addDelivered(10)
        yield* exchange.fail(upstreamFailure(new UpstreamError({ kind: "protocol", detail: "secret upstream text" })))
      })
    ))
    expect(h.counts.settles).toEqual([{ inputTokens: 40, outputTokens: 3 }])
    expect(h.counts.refunds).toBe(0)
    // The upstream's own text never reaches the row the account sees.
    expect(h.rows[0]).toMatchObject({ status: "error", error_code: "upstream_error", http_status: 500, error: "upstream_error (500)" })
    expect(h.rows[0]!.error).not.toContain("secret")
  })
})

describe("finishing", () => {
  it("a GatewayError completes as failed: one row with its code, rendered with the row id", async () => {
    const h = harness()
    const exit = await run(inRequest(() =>
      Effect.gen(function*() {
        const exchange = yield* Exchange.open(caller, h.log)
        return yield* finishing(exchange, Effect.fail(fail("tools_not_supported")))
      })
    ))
    expect(Exit.isSuccess(exit)).toBe(true)
    const response = Exit.isSuccess(exit) ? exit.value : HttpServerResponse.empty()
    expect(response.status).toBe(400)
    expect(response.headers["x-request-id"]).toBe("100")
    expect(h.rows).toHaveLength(1)
    expect(h.rows[0]).toMatchObject({ status: "error", error_code: "tools_not_supported", http_status: 400 })
  })

  it("a defect records internal_error (500) and refunds the reservation once", async () => {
    const h = harness()
    const exit = await run(inRequest(() =>
      Effect.gen(function*() {
        const exchange = yield* Exchange.open(caller, h.log)
        yield* h.admit(exchange)
        return yield* finishing(exchange, Effect.die(new Error("boom")))
      })
    ))
    // The defect itself goes on to `handle`, which renders it.
    expect(Exit.isFailure(exit) && Cause.hasDies(exit.cause)).toBe(true)
    expect(h.rows).toHaveLength(1)
    expect(h.rows[0]).toMatchObject({ status: "error", error_code: "internal_error", http_status: 500, error: "내부 오류가 발생했습니다." })
    expect(h.counts.refunds).toBe(1)
    expect(h.counts.settles).toHaveLength(0)
    expect(h.counts.released).toBe(1)
  })

  it("an interruption completes as cancelled, once", async () => {
    const h = harness()
    await run(Effect.gen(function*() {
      const scope = yield* Scope.make()
      const fiber = yield* Effect.forkChild(Scope.provide(
        Effect.gen(function*() {
          const exchange = yield* Exchange.open(caller, h.log)
          yield* h.admit(exchange)
          return yield* finishing(exchange, Effect.never)
        }),
        scope
      ))
      yield* Effect.yieldNow
      yield* Fiber.interrupt(fiber)
      yield* Scope.close(scope, Exit.void)
    }))
    expect(h.rows).toHaveLength(1)
    expect(h.rows[0]).toMatchObject({ status: "cancelled", error_code: "cancelled", http_status: 499 })
    expect(h.counts.refunds).toBe(1)
    expect(h.counts.released).toBe(1)
  })
})

describe("Exchange: the row's time", () => {
  it("created_at is the Effect clock's time when the exchange opened", async () => {
    const h = harness()
    const at = Date.UTC(2026, 0, 5, 3, 0, 0)
    await Effect.runPromise(Effect.gen(function*() {
      yield* TestClock.setTime(at)
      yield* inRequest(() =>
        Effect.gen(function*() {
          const exchange = yield* Exchange.open(caller, h.log)
          yield* TestClock.adjust("1 minute")
          yield* exchange.succeed()
        })
      )
    }).pipe(Effect.provide(TestClock.layer())))
    expect(h.rows[0]!.created_at.getTime()).toBe(at)
  })
})
