/** The single-flight cache of Leaderboard.ts on the TestClock, with a counting loader (no database). */
import { Deferred, Effect, Fiber } from "effect"
import { TestClock } from "effect/testing"
import { describe, expect, it } from "vitest"
import { countAbove, LEADERBOARD_TTL_MS, makeLeaderboard, standingOn } from "../../src/accounts/Leaderboard.js"

const run = <A>(effect: Effect.Effect<A>) => Effect.runPromise(effect.pipe(Effect.provide(TestClock.layer())))

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
  it("waits for one load when there is no board, then serves it for the TTL", async () => {
    const result = await run(Effect.gen(function*() {
      const gate = yield* Deferred.make<void>()
      const started = yield* Deferred.make<void>()
      let loads = 0
      const board = yield* makeLeaderboard(() =>
        Effect.suspend(() => {
          loads++
          return Deferred.succeed(started, undefined).pipe(Effect.andThen(Deferred.await(gate)), Effect.as(Float64Array.from([loads])))
        })
      )
      yield* TestClock.setTime(1_000_000)
      const waiting = yield* Effect.forkChild(Effect.all(Array.from({ length: 40 }, () => board.today), { concurrency: "unbounded" }))
      yield* Deferred.await(started)
      const whileLoading = loads
      yield* Deferred.succeed(gate, undefined)
      const boards = yield* Fiber.join(waiting)
      yield* TestClock.adjust(LEADERBOARD_TTL_MS - 1)
      yield* board.today
      return { whileLoading, loads, same: new Set(boards).size, computations: board.computations() }
    }))
    expect(result).toEqual({ whileLoading: 1, loads: 1, same: 1, computations: 1 })
  })

  it("when stale, one caller refreshes while the others get the stale board", async () => {
    const result = await run(Effect.gen(function*() {
      let gate = yield* Deferred.make<void>()
      let started = yield* Deferred.make<void>()
      let loads = 0
      const board = yield* makeLeaderboard(() =>
        Effect.suspend(() => {
          loads++
          return Deferred.succeed(started, undefined).pipe(
            Effect.andThen(Deferred.await(gate)),
            Effect.as(Float64Array.from([loads]))
          )
        })
      )
      yield* TestClock.setTime(1_000_000)
      yield* Deferred.succeed(gate, undefined)
      yield* board.today
      gate = yield* Deferred.make<void>()
      started = yield* Deferred.make<void>()
      yield* TestClock.adjust(LEADERBOARD_TTL_MS)
      const refresher = yield* Effect.forkChild(board.today)
      yield* Deferred.await(started)
      // The refresh is in flight: the others do not wait for it.
      const others = yield* Effect.all(Array.from({ length: 10 }, () => board.today), { concurrency: "unbounded" })
      yield* Deferred.succeed(gate, undefined)
      const refreshed = yield* Fiber.join(refresher)
      const after = yield* board.today
      return {
        others: others.map((b) => b.totals[0]),
        refreshed: refreshed.totals[0],
        after: after.totals[0],
        loads
      }
    }))
    expect(result).toEqual({ others: Array(10).fill(1), refreshed: 2, after: 2, loads: 2 })
  })

  it("a failed load is not cached, and a new day is never served yesterday's board", async () => {
    const result = await run(Effect.gen(function*() {
      let fail = true
      const days: Array<number> = []
      const board = yield* makeLeaderboard((dayStart) =>
        Effect.suspend(() => {
          days.push(dayStart.getTime())
          return fail ? Effect.die("database down") : Effect.succeed(Float64Array.from([1]))
        })
      )
      yield* TestClock.setTime(86_400_000 * 10 + 1_000)
      const failed = yield* Effect.exit(board.today)
      fail = false
      yield* board.today
      yield* TestClock.setTime(86_400_000 * 11)
      const next = yield* board.today
      return { failed: failed._tag, days, nextDay: next.dayStart, computations: board.computations() }
    }))
    expect(result).toEqual({
      failed: "Failure",
      days: [86_400_000 * 10, 86_400_000 * 10, 86_400_000 * 11],
      nextDay: 86_400_000 * 11,
      computations: 3
    })
  })
})
