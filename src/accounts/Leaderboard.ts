import { Clock, Effect, Option, Semaphore } from "effect"
import { DAY_MS } from "../quota/Policy.js"

/**
 * How long one aggregate of today's leaderboard is served. Snapshots within this time share one query;
 * other accounts' positions may be this much behind (the caller's own figures are always fresh).
 */
export const LEADERBOARD_TTL_MS = 30_000

/** Start of today's leaderboard day: 09:00 KST = 00:00 UTC. */
export const leaderboardDayStart = (now: number): number => Math.floor(now / DAY_MS) * DAY_MS

/** Today's token totals (input + output) of every non-guest account with any, largest first. */
export interface Board {
  readonly dayStart: number
  readonly computedAt: number
  readonly totals: Float64Array
}

/** Totals strictly above `tokens` (binary search over the descending array). */
export const countAbove = (totals: Float64Array, tokens: number): number => {
  let lo = 0
  let hi = totals.length
  while (lo < hi) {
    const mid = (lo + hi) >>> 1
    if (totals[mid]! > tokens) lo = mid + 1
    else hi = mid
  }
  return lo
}

/**
 * Rank and leader for an account whose own total is `tokens` (read fresh). The board may be older than the
 * caller's rows; totals only grow during a day, so the caller's own stale entry is never above `tokens` and
 * never counted as ahead, and the leader is at least the caller's fresh total.
 */
export const standingOn = (board: Board, tokens: number, ranked: boolean) => ({
  rank: ranked && tokens > 0 ? countAbove(board.totals, tokens) + 1 : null,
  leader_tokens: Math.max(board.totals.length > 0 ? board.totals[0]! : 0, ranked ? tokens : 0)
})

export interface Leaderboard {
  /** Today's board: cached for LEADERBOARD_TTL_MS (Effect clock), refreshed by one fiber at a time. */
  readonly today: Effect.Effect<Board>
  /** Forgets the cached board; the next `today` aggregates again (tests, operators). */
  readonly invalidate: Effect.Effect<void>
  /** Aggregates run so far (observability and tests). */
  readonly computations: () => number
}

/** The one aggregate over every account's rows of today (telemetry/RequestQueries.ts). */
export { leaderboardTotals as loadTotals } from "../telemetry/RequestQueries.js"

/**
 * A single-flight cache around `load`. A fresh board is returned as is. When it is stale, one caller
 * refreshes while the others keep getting the stale board of the same day; with no board for today, callers
 * wait for the one refresh. A failed refresh is not cached: the next caller tries again.
 */
export const makeLeaderboard = (
  load: (dayStart: Date) => Effect.Effect<Float64Array>,
  ttlMs: number = LEADERBOARD_TTL_MS
): Effect.Effect<Leaderboard> =>
  Effect.gen(function*() {
    const lock = yield* Semaphore.make(1)
    let current: Board | null = null
    let computations = 0

    /** Same day, not from the future (a clock set back), younger than the TTL. */
    const sameDay = (board: Board, now: number) => board.dayStart === leaderboardDayStart(now) && now >= board.computedAt
    const isFresh = (board: Board, now: number) => sameDay(board, now) && now - board.computedAt < ttlMs

    const refresh: Effect.Effect<Board> = Effect.gen(function*() {
      const now = yield* Clock.currentTimeMillis
      // Another fiber may have refreshed while this one waited for the lock.
      if (current !== null && isFresh(current, now)) return current
      const dayStart = leaderboardDayStart(now)
      computations++
      const totals = yield* load(new Date(dayStart))
      const board: Board = { dayStart, computedAt: now, totals }
      current = board
      return board
    })

    const today = Effect.gen(function*() {
      const now = yield* Clock.currentTimeMillis
      const cached = current
      if (cached !== null && isFresh(cached, now)) return cached
      if (cached !== null && sameDay(cached, now)) {
        const refreshed = yield* lock.withPermitsIfAvailable(1)(refresh)
        return Option.getOrElse(refreshed, () => cached)
      }
      return yield* lock.withPermits(1)(refresh)
    })

    return {
      today,
      invalidate: Effect.sync(() => {
        current = null
      }),
      computations: () => computations
    }
  })
