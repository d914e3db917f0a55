/** The background-refreshed board of Leaderboard.ts (runtime/Refresh.ts) on the TestClock, with a counting loader (no database). */
import { Deferred, Effect, Fiber, Layer } from "effect"
import { TestClock } from "effect/testing"
import { describe, expect, it } from "vitest"
import { countAbove, LEADERBOARD_TTL_MS, makeLeaderboard, standingOn } from "../../src/accounts/Leaderboard.js"
import * as Refresh from "../../src/runtime/Refresh.js"

const run = <A>(effect: Effect.Effect<A, never, Refresh.RefreshStore | import("effect").Scope.Scope>) =>
  Effect.runPromise(effect.pipe(Effect.scoped, Effect.provide(Layer.merge(TestClock.layer(), Refresh.layerLocal))))

describe("countAbove and standingOn", () => {
  const totals = Float64Array.from([900, 500, 500, 300, 10])
  const board = { dayStart: 0, computedAt: 0, totals }
  it("counts strictly larger totals by binary search", () => {
    expect([1000, 900, 899, 500, 499, 300, 10, 9, 0].map((t) => countAbove(totals, t))).toEqual([0, 0, 1, 1, 3, 3, 4, 5, 5])
    expect(countAbove(new Float64Array(0), 5)).toBe(0)
  })
  it("ranks a non-guest with tokens; the leader is at least the caller's fresh total", () => {
    expect(standingOn(board, 500, true)).toEqual({ rank: 2, leader_tokens: 900 })
    expect(standingOn(board, 950, true)).toEqual({ rank: 1, leader_tokens: 950 })
    expect(standingOn(board, 0, true)).toEqual({ rank: null, leader_tokens: 900 })
    expect(standingOn(board, 5000, false)).toEqual({ rank: null, leader_tokens: 900 })
    expect(standingOn({ ...board, totals: new Float64Array(0) }, 0, true)).toEqual({ rank: null, leader_tokens: 0 })
  })
})

describe("makeLeaderboard", () => {
  it("loads once in the background; every caller meanwhile waits for that one load, then it is served until the next period", async () => {
    const result = await run(Effect.gen(function*() {
      const gate = yield* Deferred.make<void>()
      const started = yield* Deferred.make<void>()
      let loads = 0
      yield* TestClock.setTime(1_000_000)
      const board = yield* makeLeaderboard(() =>
        Effect.suspend(() => {
          loads++
          return Deferred.succeed(started, undefined).pipe(Effect.andThen(Deferred.await(gate)), Effect.as(Float64Array.from([loads])))
        })
      )
      const waiting = yield* Effect.forkChild(Effect.all(Array.from({ length: 40 }, () => board.today), { concurrency: "unbounded" }))
      yield* Deferred.await(started)
      const whileLoading = loads
      yield* Deferred.succeed(gate, undefined)
      const boards = yield* Fiber.join(waiting)
      yield* TestClock.adjust(LEADERBOARD_TTL_MS - 1)
      yield* Effect.all(Array.from({ length: 40 }, () => board.today))
      const beforePeriod = board.computations()
      yield* TestClock.adjust(1)
      const next = yield* board.today
      return { whileLoading, same: new Set(boards).size, beforePeriod, afterPeriod: board.computations(), next: next.totals[0] }
    }))
    expect(result).toEqual({ whileLoading: 1, same: 1, beforePeriod: 1, afterPeriod: 2, next: 2 })
  })

  it("while a refresh is slow, callers get the previous board without waiting", async () => {
    const result = await run(Effect.gen(function*() {
      let gate = yield* Deferred.make<void>()
      let loads = 0
      yield* TestClock.setTime(1_000_000)
      const board = yield* makeLeaderboard(() =>
        Effect.suspend(() => {
          loads++
          return Deferred.await(gate).pipe(Effect.as(Float64Array.from([loads])))
        })
      )
      yield* Deferred.succeed(gate, undefined)
      const first = yield* board.today
      gate = yield* Deferred.make<void>()
      // The background refresh starts and hangs on the gate.
      yield* TestClock.adjust(LEADERBOARD_TTL_MS)
      const others = yield* Effect.all(Array.from({ length: 10 }, () => board.today), { concurrency: "unbounded" })
      const during = loads
      yield* Deferred.succeed(gate, undefined)
      yield* Effect.yieldNow
      const after = yield* board.today
      return { first: first.totals[0], others: others.map((b) => b.totals[0]), during, after: after.totals[0], loads }
    }))
    expect(result).toEqual({ first: 1, others: Array(10).fill(1), during: 2, after: 2, loads: 2 })
  })

  it("a failed load keeps nothing; the next reader loads again; a new day is never served yesterday's board", async () => {
    const result = await run(Effect.gen(function*() {
      let fail = true
      const days: Array<number> = []
      yield* TestClock.setTime(86_400_000 * 10 + 1_000)
      const board = yield* makeLeaderboard((dayStart) =>
        Effect.suspend(() => {
          days.push(dayStart.getTime())
          return fail ? Effect.die("database down") : Effect.succeed(Float64Array.from([1]))
        }), 30 * 86_400_000)
      // The first (background) load fails, and so does the reader that waited for it; the next reader loads again.
      yield* Effect.yieldNow
      const failed = yield* Effect.exit(board.today)
      fail = false
      yield* board.today
      // Past midnight UTC (09:00 KST), long before the next tick (period: 30 days): the reader waits for the new
      // day's board instead of getting yesterday's.
      yield* TestClock.setTime(86_400_000 * 11)
      const next = yield* board.today
      return { failed: failed._tag, days: [...days], nextDay: next.dayStart }
    }))
    expect(result.failed).toBe("Failure")
    expect(result.days).toEqual([86_400_000 * 10, 86_400_000 * 10, 86_400_000 * 11])
    expect(result.nextDay).toBe(86_400_000 * 11)
  })
})
