/**
 * Timers on the Effect clock for code that runs in plain callbacks (socket reads, timer ticks), where
 * forking a fiber per timer would cost more than the work it times.
 *
 * On the default live clock a timer is a plain `setTimeout` (what `Effect.sleep` does underneath,
 * without a fiber). On any other clock (a `TestClock`) it is a fiber sleeping on that clock, so tests
 * drive it with `TestClock.adjust`. Either way the callback runs outside any fiber and must not throw.
 */
import { Clock, Context, Duration, Effect, Fiber } from "effect"

/** The default clock: `===` the `Clock` of every fiber not given another one (a `TestClock` is not it). */
export const liveClock: Clock.Clock = Context.get(Context.empty(), Clock.Clock)

/** A pending timer from `startTimer`: a Node timeout on the live clock, else the sleeping fiber. */
export type Timer = ReturnType<typeof setTimeout> | Fiber.Fiber<void>

/**
 * Calls `fire` once after `ms` milliseconds of `clock`. `unref`: on the live clock, do not keep the process
 * alive for it (a TestClock timer never does).
 */
export const startTimer = (clock: Clock.Clock, ms: number, fire: () => void, unref = false): Timer => {
  if (clock === liveClock) {
    const timeout = setTimeout(fire, ms)
    if (unref) timeout.unref()
    return timeout
  }
  return Effect.runFork(Effect.provideService(Effect.andThen(Effect.sleep(ms), Effect.sync(fire)), Clock.Clock, clock))
}

/** Cancels `timer` (a no-op when undefined or already fired). */
export const stopTimer = (timer: Timer | undefined): void => {
  if (timer === undefined) return
  if (Fiber.isFiber(timer)) timer.interruptUnsafe()
  else clearTimeout(timer)
}

/**
 * Waits for `register`'s callback at most `wait` on the Effect clock: the value, or null when the time ran out (a
 * `startTimer`, so a TestClock drives it). Interruption and the timeout both call `unregister`.
 */
export const awaitAtMost = <A>(
  wait: Duration.Input,
  register: (resume: (value: A) => void) => void,
  unregister: () => void
): Effect.Effect<A | null> =>
  Effect.clockWith((clock) =>
    Effect.callback<A | null>((resume) => {
      const timer = startTimer(clock, Duration.toMillis(wait), () => {
        unregister()
        resume(Effect.succeed(null))
      }, true)
      register((value) => {
        stopTimer(timer)
        resume(Effect.succeed(value))
      })
      return Effect.sync(() => {
        stopTimer(timer)
        unregister()
      })
    })
  )
