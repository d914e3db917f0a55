/**
 * `src/runtime/Timers.ts` (shared by the upstream calls; kept here next to its users): a plain timer on the
 * live clock, a fiber on a TestClock, and `stopTimer` cancelling either.
 */
import { describe, expect, it } from "@effect/vitest"
import { Clock, Effect, Fiber } from "effect"
import { TestClock } from "effect/testing"
import { liveClock, startTimer, stopTimer } from "../../src/runtime/Timers.js"

describe("clock timers", () => {
  it.effect("on a TestClock: a fiber that fires when the clock passes the delay, cancellable", () =>
    Effect.gen(function*() {
      const clock = yield* Clock.Clock
      expect(clock).not.toBe(liveClock)
      const fired: Array<string> = []
      const a = startTimer(clock, 1_000, () => fired.push("a"))
      const b = startTimer(clock, 2_000, () => fired.push("b"))
      expect(Fiber.isFiber(a)).toBe(true)
      yield* TestClock.adjust("999 millis")
      expect(fired).toEqual([])
      yield* TestClock.adjust("1 millis")
      expect(fired).toEqual(["a"])
      stopTimer(b)
      stopTimer(a) // already fired: a no-op
      yield* TestClock.adjust("10 seconds")
      expect(fired).toEqual(["a"])
    }))

  it.live("on the live clock: a plain timeout, cancellable", () =>
    Effect.gen(function*() {
      const clock = yield* Clock.Clock
      expect(clock).toBe(liveClock)
      let cancelledFired = false
      const cancelled = startTimer(clock, 5, () => (cancelledFired = true))
      expect(Fiber.isFiber(cancelled)).toBe(false)
      stopTimer(cancelled)
      stopTimer(undefined)
      const started = Date.now()
      const elapsed = yield* Effect.callback<number>((resume) => {
        startTimer(clock, 30, () => resume(Effect.succeed(Date.now() - started)), true)
      })
      expect(elapsed).toBeGreaterThanOrEqual(25)
      expect(cancelledFired).toBe(false)
    }))
})
