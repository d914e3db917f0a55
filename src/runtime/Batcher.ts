/**
 * The one batched writer: request rows (`telemetry/RequestLog.ts`), API key last-used stamps (`auth/Auth.ts`) and
 * the quota write-behind (`quota/WriteBehind.ts`) all write through it.
 *
 * - Nothing runs while nothing is pending: the first change `signal`s, the loop waits `interval` (so a burst becomes
 *   one batch), then flushes.
 * - The loop's own flush writes what was pending when it began; changes made while it writes wait for the next
 *   flush, an interval later (they `signal`). Without `begin` that is one `take` (a take of everything changed, as
 *   the quota write-behind's); with it, the take bounds itself (`queue`). So a steady stream of changes is one write
 *   per interval, not writes back to back.
 * - `flush` takes batches and writes them one after the other until `take` has none. Flushes run one at a time,
 *   so `flush` returns once everything pending when it was called has been written (or has failed).
 * - A failed write (or one interrupted) gives its batch back (`failed`), logs one warning, and is retried
 *   `interval` later; `flush` itself never fails.
 * - The scope's close runs a last flush, and logs what could not be written.
 *
 * `queue` is the common case on top: items appended in order, written `batchSize` at a time, bounded while the
 * store is away (the oldest dropped past `maxPending`), with items the store refuses for good dropped, not retried.
 * The loop's own flush of a queue takes the items pending when it began, `batchSize` at a time.
 */
import { type Duration, Effect, Queue, Semaphore } from "effect"

/** One batch taken from what is pending. */
export interface Taken {
  readonly write: Effect.Effect<void, unknown>
  /** After `write` succeeded. */
  readonly written?: () => void
  /** After `write` failed or was interrupted (once): what was taken is pending again. May return a log to run. */
  readonly failed?: () => void | Effect.Effect<void>
}

export interface BatcherOptions {
  /** Names the writer in logs (`request rows`, `quota snapshot`). */
  readonly label: string
  /** Delay between the first change and the write. */
  readonly interval: Duration.Input
  /** The next batch, or undefined when nothing is pending. */
  readonly take: () => Taken | undefined
  /**
   * Called as a flush begins, before its first `take`: `interval` for the loop's own flush, `all` for `flush` and
   * the last flush. Given, the loop's flush takes until `take` has none (the take bounds itself); absent, it
   * makes one take.
   */
  readonly begin?: (flush: "interval" | "all") => void
  /** How many items are pending, for the shutdown log; absent: not reported. */
  readonly pending?: () => number
}

export interface Batcher {
  /** Something is pending: a flush follows within `interval`. Safe to call from synchronous code. */
  readonly signal: () => void
  /** Writes everything pending now. Never fails (failures are logged and retried). */
  readonly flush: Effect.Effect<void>
}

/**
 * Starts the loop in the current scope and registers the last flush as a finalizer: create it before anything whose
 * own finalizers still produce changes (the memory admission's actors), so it runs after them.
 */
export const make = (options: BatcherOptions) =>
  Effect.gen(function*() {
    const wake = yield* Queue.sliding<void>(1)
    const lock = yield* Semaphore.make(1)
    const signal = () => {
      Queue.offerUnsafe(wake, undefined)
    }

    /**
     * Writes batches until `take` has none (one batch for the loop's flush without `begin`); stops at the first
     * failure (its batch is pending again).
     */
    const drain = (kind: "interval" | "all"): Effect.Effect<void> => Effect.suspend(() => {
      const taken = options.take()
      if (taken === undefined) return Effect.void
      let settled = false
      const giveBack = Effect.suspend(() => {
        if (settled) return Effect.void
        settled = true
        signal()
        const log = taken.failed?.()
        return log === undefined ? Effect.void : log
      })
      return taken.write.pipe(
        Effect.onInterrupt(() => giveBack),
        Effect.matchCauseEffect({
          onSuccess: () =>
            Effect.andThen(
              Effect.sync(() => taken.written?.()),
              kind === "all" || options.begin !== undefined ? drain(kind) : Effect.void
            ),
          onFailure: (cause) =>
            Effect.andThen(giveBack, Effect.logWarning(`${options.label} not written; will retry`, cause))
        })
      )
    })
    const flushAs = (kind: "interval" | "all") =>
      lock.withPermit(Effect.suspend(() => {
        options.begin?.(kind)
        return drain(kind)
      }))
    const flush = flushAs("all")

    yield* Effect.addFinalizer(() =>
      flush.pipe(Effect.andThen(Effect.suspend(() => {
        const left = options.pending?.() ?? 0
        return left === 0 ? Effect.void : Effect.logError(`${options.label} lost at shutdown: ${left} (database unreachable)`)
      })))
    )
    yield* Queue.take(wake).pipe(
      Effect.andThen(Effect.sleep(options.interval)),
      Effect.andThen(flushAs("interval")),
      Effect.forever,
      Effect.forkScoped
    )
    const batcher: Batcher = { signal, flush }
    return batcher
  })

export interface QueueOptions<A> {
  readonly label: string
  readonly interval: Duration.Input
  /** Most items per write. */
  readonly batchSize: number
  /** Items kept while writes fail; past it the oldest are dropped (and logged). */
  readonly maxPending: number
  /**
   * Writes one batch, in order. `drop(item)` marks an item the store refuses for good: it is not retried and
   * counts as dropped. A failure gives the rest of the batch back for the next attempt.
   */
  readonly write: (batch: ReadonlyArray<A>, drop: (item: A) => void) => Effect.Effect<void, unknown>
}

export interface BatchQueue<A> {
  /** Queues an item; written by the loop, never on the caller's path. */
  readonly add: (item: A) => void
  /** Writes everything queued so far. Never fails. */
  readonly flush: Effect.Effect<void>
  readonly pending: () => number
  /** Items dropped since start: refused by the store, or over `maxPending` while it was away. */
  readonly dropped: () => number
}

/** A batched writer over a queue of items (see the module comment). */
export const queue = <A>(options: QueueOptions<A>) =>
  Effect.gen(function*() {
    let buffer: Array<A> = []
    let dropped = 0
    /** Items the flush under way may still take: those pending when the loop's flush began, or all. */
    let flushable = 0
    const batcher: Batcher = yield* make({
      label: options.label,
      interval: options.interval,
      pending: () => buffer.length,
      begin: (kind) => {
        flushable = kind === "all" ? Number.POSITIVE_INFINITY : buffer.length
      },
      take: () => {
        if (buffer.length === 0) return undefined
        if (flushable === 0) {
          // Items added while the loop's flush wrote: its next flush, an interval from now, takes them.
          batcher.signal()
          return undefined
        }
        const batch = buffer.splice(0, Math.min(options.batchSize, flushable))
        flushable -= batch.length
        const refused = new Set<A>()
        return {
          write: options.write(batch, (item) => {
            if (!refused.has(item)) dropped++
            refused.add(item)
          }),
          failed: () => {
            buffer = (refused.size === 0 ? batch : batch.filter((item) => !refused.has(item))).concat(buffer)
            const over = buffer.length - options.maxPending
            if (over <= 0) return
            buffer.splice(0, over)
            dropped += over
            return Effect.logError(`${options.label} dropped: ${over} (database unreachable, buffer full)`)
          }
        }
      }
    })
    const batchQueue: BatchQueue<A> = {
      add: (item) => {
        buffer.push(item)
        // One wake-up per batch, not per item.
        if (buffer.length === 1) batcher.signal()
      },
      flush: batcher.flush,
      pending: () => buffer.length,
      dropped: () => dropped
    }
    return batchQueue
  })
