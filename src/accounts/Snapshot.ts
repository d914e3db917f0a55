import { Clock, Effect } from "effect"
import type { SqlClient } from "effect/sql"
import type { PlanConfig } from "../config/GatewayConfig.js"
import { Settings } from "../config/Live.js"
import { fail, type GatewayError } from "../errors/Catalog.js"
import { Admission, type PoolStanding } from "../quota/Admission.js"
import { DAY_MS, round2, WEEK_MS } from "../quota/Policy.js"
import { type ModelShare, snapshotRows, usageByModel, windowStart } from "../telemetry/RequestQueries.js"
import type { AccountRow } from "./AccountsRepo.js"
import { Leaderboard, leaderboardDayStart, standingOn } from "./Leaderboard.js"

/**
 * Prefix of the community-identity fields of `profile` (the spec's `<community>Id` / `<community>Type`).
 * Decision (docs/decisions.md): the literal word `community`, so the keys are `communityId` / `communityType`.
 */
export const COMMUNITY = "community"
const COMMUNITY_ID = `${COMMUNITY}Id` as const
const COMMUNITY_TYPE = `${COMMUNITY}Type` as const

/** Rows of `recentRequests`. */
export const RECENT_REQUESTS = 20

const iso = (d: Date | null): string | null => (d === null ? null : d.toISOString())

/**
 * The 403 of `GET /api/user/me` (bare `{error}`): a legacy account that still has to migrate.
 * Decision: `is_legacy && needs_migration`, the same condition as chat's `legacy_account_upgrade_required`.
 */
export const blocksSnapshot = (account: AccountRow): boolean => account.is_legacy && account.needs_migration

/** `profile`: exactly 19 camelCase fields. */
export const profileOf = (account: AccountRow) => ({
  [COMMUNITY_ID]: account.community_id,
  [COMMUNITY_TYPE]: account.community_type,
  username: account.username,
  displayName: account.display_name,
  email: account.email,
  emailVerified: account.email_verified_at !== null,
  status: account.status,
  isAdmin: account.is_admin,
  isLegacy: account.is_legacy,
  needsMigration: account.needs_migration,
  sfwMode: account.sfw_mode,
  passkeyCount: 0,
  createdAt: account.created_at.getTime(),
  lastUsedAt: account.last_used_at === null ? null : account.last_used_at.getTime(),
  livenessBlockedAt: iso(account.liveness_blocked_at),
  nextLivenessAt: iso(account.next_liveness_at),
  passwordChangedAt: iso(account.password_changed_at),
  lastNickChangedAt: iso(account.last_nick_changed_at),
  // Self-service nickname change is off in this gateway.
  nicknameCooldownUntil: null
})

/** One pool of `plan`; absolutes and per-model weights are null when the plan hides them. */
export const poolView = (
  pool: PoolStanding,
  hidden: boolean,
  byModel: ReadonlyArray<ModelShare>,
  kind: "session" | "weekly"
) => ({
  used: hidden ? null : Math.round(pool.used),
  limit: hidden ? null : pool.limit,
  remaining: hidden ? null : Math.max(0, Math.round(pool.limit - pool.used)),
  used_pct: pool.used_pct,
  resets_at: pool.resets_at === null ? null : new Date(pool.resets_at).toISOString(),
  resets_in_seconds: pool.resets_in_seconds,
  ...(kind === "session"
    ? { active: pool.resets_at !== null }
    : { anchor_at: pool.anchor_at == null ? null : new Date(pool.anchor_at).toISOString() }),
  by_model: byModel.map((row) => ({
    model_id: row.model_id,
    weighted: hidden ? null : round2(row.weighted),
    request_count: row.request_count,
    pct_of_total: row.pct_of_total
  }))
})

export { leaderboardDayStart }

/**
 * `GET /api/user/me`: the bare eleven-key snapshot. The caller's own figures are read fresh (account row,
 * request rows, quota standing) with queries on the (account_id, created_at) index; the leaderboard (today's
 * tokens, input + output, of non-guest accounts) comes from the background-refreshed board of Leaderboard.ts, so a snapshot
 * never aggregates other accounts' rows itself.
 */
export const snapshot = (
  account: AccountRow
): Effect.Effect<Record<string, unknown>, GatewayError, SqlClient.SqlClient | Settings | Admission | Leaderboard> =>
  Effect.gen(function*() {
    if (blocksSnapshot(account)) return yield* Effect.fail(fail("legacy_account_upgrade_required"))
    const settings = yield* Settings
    const admission = yield* Admission
    const leaderboard = yield* Leaderboard
    const now = yield* Clock.currentTimeMillis
    const plan: PlanConfig = settings.planFor(account.plan)
    const dayAgo = new Date(now - DAY_MS)
    const dayStart = new Date(leaderboardDayStart(now))

    const standing = yield* admission.standing(account.id, plan)
    const rpm = yield* admission.currentRpm(account.id)
    const [sessionModels, weeklyModels] = yield* Effect.all([
      usageByModel(account.id, windowStart(standing.session, plan.session_hours * 3_600_000)),
      usageByModel(account.id, windowStart(standing.weekly, WEEK_MS))
    ])

    const { models, recent, self } = yield* snapshotRows(account.id, RECENT_REQUESTS, dayAgo, dayStart)
    const board = yield* leaderboard.today
    const { leader_tokens, rank } = standingOn(board, self.tokens, !account.is_guest)

    const hidden = plan.hide_absolutes
    return {
      profile: profileOf(account),
      rebindRequest: null,
      display_id: account.is_guest ? null : account.display_id,
      plan: {
        session: poolView(standing.session, hidden, sessionModels, "session"),
        weekly: poolView(standing.weekly, hidden, weeklyModels, "weekly")
      },
      contributor: null,
      modelUsage: models.map((m) => ({
        modelId: m.model_id,
        requests: m.requests,
        successes: m.successes,
        inputTokens: m.input_tokens,
        outputTokens: m.output_tokens,
        totalTokens: m.input_tokens + m.output_tokens
      })),
      recentRequests: recent.map((r) => ({
        id: r.id,
        model_id: r.model_id,
        status: r.status,
        created_at: r.created_at.toISOString(),
        input_tokens: r.input_tokens,
        output_tokens: r.output_tokens,
        tps: r.tps,
        error: r.error
      })),
      totals: {
        totalRequests: models.reduce((sum, m) => sum + m.requests, 0),
        totalTokens: models.reduce((sum, m) => sum + m.input_tokens + m.output_tokens, 0)
      },
      rpm: { current: rpm },
      rank,
      today_self: {
        rank,
        tokens: self.tokens,
        requests: self.requests,
        attempted: self.attempted,
        leader_tokens
      }
    }
  })
