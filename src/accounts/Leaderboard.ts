import { Clock, Context, Effect, Layer, type Scope } from "effect"
import { SqlClient } from "effect/sql"
import { DAY_MS } from "../quota/Policy.js"
import * as Refresh from "../runtime/Refresh.js"
import { leaderboardTotals } from "../telemetry/RequestQueries.js"

/**
 * How often today's leaderboard is re-aggregated (in the background, `runtime/Refresh.ts`). Other accounts'
 * positions may be this much behind; the caller's own figures are always fresh.
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

export class Leaderboard extends Context.Service<Leaderboard, {
  /** Today's board, from memory; waits only when there is none for today yet (first start, a new day). */
  readonly today: Effect.Effect<Board>
  /** Forgets the board; the next `today` waits for a fresh aggregate (tests, operators). */
  readonly invalidate: Effect.Effect<void>
  /** Aggregates this process ran so far (observability and tests). */
  readonly computations: () => number
}>()("wellspring/accounts/Leaderboard") {}

/** The one aggregate over every account's rows of today (telemetry/RequestQueries.ts). */
export { leaderboardTotals as loadTotals } from "../telemetry/RequestQueries.js"

/** A board is used on its own day only, and never when it comes from the future (a clock set back). */
const usable = (snapshot: Refresh.Snapshot<Board>, now: number) =>
  snapshot.value.dayStart === leaderboardDayStart(now) && now >= snapshot.value.computedAt

const codec: Refresh.Codec<Board> = {
  encode: (board) => ({ dayStart: board.dayStart, computedAt: board.computedAt, totals: Array.from(board.totals) }),
  decode: (json) => {
    const j = json as { dayStart?: unknown; computedAt?: unknown; totals?: unknown } | null
    return typeof j?.dayStart === "number" && typeof j.computedAt === "number" && Array.isArray(j.totals)
      ? { dayStart: j.dayStart, computedAt: j.computedAt, totals: Float64Array.from(j.totals as Array<number>) }
      : null
  }
}

/**
 * Today's board on the shared background-refresh helper: aggregated every `everyMs` by one fiber (one replica
 * when Redis is configured), served from memory to every snapshot. On a new day the first reader waits for
 * that day's aggregate instead of getting yesterday's board.
 */
export const makeLeaderboard = (
  load: (dayStart: Date) => Effect.Effect<Float64Array>,
  everyMs: number = LEADERBOARD_TTL_MS
): Effect.Effect<Context.Service.Shape<typeof Leaderboard>, never, Refresh.RefreshStore | Scope.Scope> =>
  Effect.gen(function*() {
    const refresher = yield* Refresh.make<Board>({
      name: "leaderboard",
      every: everyMs,
      usable,
      shared: codec,
      load: Effect.gen(function*() {
        const now = yield* Clock.currentTimeMillis
        const dayStart = leaderboardDayStart(now)
        return { dayStart, computedAt: now, totals: yield* load(new Date(dayStart)) }
      })
    })
    return Leaderboard.of({
      today: Effect.map(refresher.get, (snapshot) => snapshot.value),
      invalidate: refresher.invalidate,
      computations: refresher.loads
    })
  })

export const layer: Layer.Layer<Leaderboard, never, SqlClient.SqlClient | Refresh.RefreshStore> = Layer.effect(
  Leaderboard,
  Effect.flatMap(SqlClient.SqlClient, (sql) => makeLeaderboard((dayStart) => leaderboardTotals(sql, dayStart)))
)
