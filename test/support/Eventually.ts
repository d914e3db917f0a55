/**
 * Polling for effects that complete after a response (write-behind rows, NOTIFY delivery, batched stamps, a
 * reloaded file): the one place tests wait for an observable condition. Never a fixed sleep.
 */

export interface PollOptions {
  /** Give up after this long (default 10 s). */
  readonly timeoutMs?: number
  /** Pause between attempts (default 25 ms). */
  readonly everyMs?: number
  /** Named in the error when time runs out. */
  readonly what?: string
}

type Truthy<A> = Exclude<A, false | undefined | null | 0 | "">

const pause = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms))

/** Polls `check` until it returns a truthy value, and returns that value; throws when time runs out. */
export const eventually = async <A>(check: () => A | Promise<A>, options: PollOptions = {}): Promise<Truthy<A>> => {
  const timeoutMs = options.timeoutMs ?? 10_000
  const started = Date.now()
  for (;;) {
    const value = await check()
    if (value) return value as Truthy<A>
    if (Date.now() - started > timeoutMs) throw new Error(`${options.what ?? "condition"} not met within ${timeoutMs} ms`)
    await pause(options.everyMs ?? 25)
  }
}

/** Polls `check` until it stops throwing (assertions); rethrows its last error when time runs out. */
export const eventuallyPasses = async (check: () => void | Promise<void>, timeoutMs = 5_000): Promise<void> => {
  const started = Date.now()
  for (;;) {
    try {
      await check()
      return
    } catch (error) {
      if (Date.now() - started > timeoutMs) throw error
      await pause(20)
    }
  }
}
