/**
 * The write-behind loop both admission backends use to copy quota state to PostgreSQL (`QuotaRepo`):
 *
 * - memory: the account actors' state and the model gates' daily totals are the truth; this persists them
 *   (`quota_windows`, `model_daily_usage`) so a restart and a passivated actor find them again;
 * - Redis: Redis is the truth; this snapshots the pools and totals the replica touched, so a Redis that lost
 *   its keys can be rebuilt from PostgreSQL.
 *
 * One shape for both, on the one batched writer (`runtime/Batcher.ts`): a change calls `signal`; the writer sleeps
 * only while nothing is pending, waits `interval` after the first signal (so a burst of changes becomes one batch),
 * then flushes. A flush takes what changed (the backend's `take`, which clears its marks), reads the rows, writes
 * them, and on any failure (or interruption) hands the marks back (`failed`), logs, and retries `interval` later.
 * Flushes are serialized; the scope's close runs a last flush.
 */
import { type Duration, Effect, type Scope } from "effect"
import * as Batcher from "../runtime/Batcher.js"
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

/** `signal` a change; `flush` writes what is pending now (never fails). */
export type WriteBehind = Batcher.Batcher

/**
 * Starts the writer in the current scope and registers the final flush as a finalizer: create it before anything
 * whose own finalizers still produce changes (the memory backend's actors), so it runs after them.
 */
export const make = <E>(options: WriteBehindOptions<E>): Effect.Effect<WriteBehind, never, Scope.Scope> =>
  Batcher.make({
    label: `quota ${options.label}`,
    interval: options.interval,
    take: () => {
      const taken = options.take()
      if (taken === undefined) return undefined
      return {
        write: Effect.flatMap(taken.rows, (batch) =>
          batch.accounts.length === 0 && batch.daily.length === 0
            ? Effect.void
            : Effect.andThen(options.repo.saveAccounts(batch.accounts), options.repo.saveDaily(batch.daily))),
        written: taken.written,
        failed: taken.failed
      }
    }
  })
