/**
 * Takes waiting for a job, shared by the memory and the Redis queue: a take parks here until it is woken (a job
 * was queued) or its time runs out, then tries again. One wake-up wakes the oldest waiting take.
 */
import { type Clock, Effect } from "effect"
import { startTimer, stopTimer } from "../runtime/Timers.js"

export interface Taker {
  /** Resumes the take: true when woken for a job, false when its time ran out. */
  resume: (woken: boolean) => void
  woken: boolean
}

export const makeTakers = (clock: Clock.Clock) => {
  const takers = new Set<Taker>()
  return {
    /** Takes waiting now (a waiting take keeps its worker online). */
    waiting: (): number => takers.size,
    /** A new, not yet parked take. */
    make: (): Taker => ({ resume: () => {}, woken: false }),
    /** Wakes the oldest waiting take, if any. */
    wakeOne: (): void => {
      for (const taker of takers) {
        takers.delete(taker)
        taker.woken = true
        taker.resume(true)
        return
      }
    },
    /** Parks `taker` at most `ms`: true when woken for a job, false when the time ran out. */
    wait: (ms: number, taker: Taker): Effect.Effect<boolean> =>
      Effect.callback<boolean>((resume) => {
        const timer = startTimer(clock, ms, () => {
          if (takers.delete(taker)) resume(Effect.succeed(false))
        }, true)
        taker.resume = (woken) => {
          stopTimer(timer)
          resume(Effect.succeed(woken))
        }
        takers.add(taker)
        return Effect.sync(() => {
          stopTimer(timer)
          takers.delete(taker)
        })
      })
  }
}
