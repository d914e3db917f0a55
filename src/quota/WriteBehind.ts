/**
 * The write-behind loop both admission backends use to copy quota state to PostgreSQL (`QuotaRepo`):
 *
 * - memory: the account actors' state and the model gates' daily totals are the truth; this persists them
 *   (`quota_windows`, `model_daily_usage`) so a restart and a passivated actor find them again;
 * - Redis: Redis is the truth; this snapshots the pools and totals the replica touched, so a Redis that lost
 *   its keys can be rebuilt from PostgreSQL.
 *
 * One shape for both: a change calls `signal`; the loop sleeps only while something is pending, waits `interval`
 * after the first signal (so a burst of changes becomes one batch), then `flush`es. `flush` takes what changed
 * (the backend's `take`, which clears its marks), reads the rows, writes them, and on any failure hands the marks
 * back (`failed`) and logs; the next signal retries. Flushes are serialized and uninterruptible (marks are
 * cleared before the write, so a flush must not stop half way); the scope's close runs a last flush.
 */
import { type Duration, Effect, Queue, Semaphore } from "effect"
import type { AccountWindows, DailyUsageRow, QuotaRepo } from "./QuotaRepo.js"

export interface Batch {
  readonly accounts: ReadonlyArray<AccountWindows>
  readonly daily: ReadonlyArray<DailyUsageRow>
}

/** What one flush took. */
export interface Taken<E> {
  /** The rows to write (the Redis backend reads them from Redis). */
  readonly rows: Effect.Effect<Batch, E>
  /** After the rows were written. */
  readonly written: () => void
  /** After reading or writing failed: mark what was taken as changed again. */
  readonly failed: () => void
}

export interface WriteBehindOptions<E> {
  readonly repo: QuotaRepo
  /** Delay between the first change and the write. */
  readonly interval: Duration.Input
  /** Names the loop in the failure log. */
  readonly label: string
  /** Takes what changed since the last flush (clearing its marks), or `undefined` when nothing did. */
  readonly take: () => Taken<E> | undefined
}

export interface WriteBehind {
  /** Something changed: a flush follows within `interval`. Safe to call from synchronous code. */
  readonly signal: () => void
  /** Writes what is pending now. Never fails (failures are logged and retried). */
  readonly flush: Effect.Effect<void>
}

/**
 * Starts the loop in the current scope and registers the final flush as a finalizer: create it before anything
 * whose own finalizers still produce changes (the memory backend's actors), so it runs after them.
 */
export const make = <E>(options: WriteBehindOptions<E>) =>
  Effect.gen(function*() {
    const { repo } = options
    const wake = yield* Queue.sliding<void>(1)
    const lock = yield* Semaphore.make(1)

    const flush: Effect.Effect<void> = lock.withPermits(1)(Effect.suspend(() => {
      const taken = options.take()
      if (taken === undefined) return Effect.void
      return taken.rows.pipe(
        Effect.flatMap((batch) =>
          batch.accounts.length === 0 && batch.daily.length === 0
            ? Effect.void
            : Effect.andThen(repo.saveAccounts(batch.accounts), repo.saveDaily(batch.daily))
        ),
        Effect.matchCauseEffect({
          onSuccess: () => Effect.sync(taken.written),
          onFailure: (cause) =>
            Effect.andThen(
              Effect.sync(taken.failed),
              Effect.logWarning(`quota ${options.label} to PostgreSQL failed; will retry`, cause)
            )
        })
      )
    })).pipe(Effect.uninterruptible)

    yield* Effect.addFinalizer(() => flush)
    yield* Queue.take(wake).pipe(
      Effect.andThen(Effect.sleep(options.interval)),
      Effect.andThen(flush),
      Effect.forever,
      Effect.forkScoped
    )

    const writeBehind: WriteBehind = {
      signal: () => {
        Queue.offerUnsafe(wake, undefined)
      },
      flush
    }
    return writeBehind
  })
