import { Effect } from "effect"
import { HttpRouter, HttpServerRequest } from "effect/http"
import { SqlClient } from "effect/sql"
import { Auth } from "../auth/Auth.js"
import { Settings } from "../config/Live.js"
import { renderInference } from "../errors/Render.js"
import { handle, json } from "../http/Respond.js"
import { Admission, type PoolStanding } from "../quota/Admission.js"
import { WEEK_MS } from "../quota/Policy.js"
import { poolView } from "./Receipt.js"

/** GET /v1/me: an explicit whitelist; the email address never leaves. */
export const me = HttpRouter.add(
  "GET",
  "/v1/me",
  Effect.gen(function*() {
    const request = yield* HttpServerRequest.HttpServerRequest
    const auth = yield* Auth
    return yield* handle(
      renderInference,
      auth.authenticateKey(request.headers.authorization).pipe(Effect.map(({ account, key }) =>
        json({
          object: "account",
          id: account.id,
          display_id: account.display_id,
          display_name: account.display_name,
          username: account.username,
          is_legacy: account.is_legacy,
          is_admin: account.is_admin,
          key_label: key?.label ?? "",
          created_at: account.created_at.getTime(),
          last_rotated_at: (account.last_rotated_at ?? account.created_at).getTime(),
          email_registered: account.email !== null && account.email_verified_at !== null
        })
      ))
    )
  })
)

export interface ModelShare {
  readonly model_id: string
  readonly request_count: number
  readonly weighted: number
  readonly pct_of_total: number
}

/** Successful requests per model since `since`, with each model's share of the weighted total. */
export const usageByModel = (accountId: string, since: number | null) =>
  Effect.gen(function*() {
    if (since === null) return [] as Array<ModelShare>
    const sql = yield* SqlClient.SqlClient
    const rows = yield* sql<{ model_id: string; request_count: number; weighted: number }>`
      SELECT model_id, count(*)::int AS request_count, coalesce(sum(weighted_cost), 0)::float8 AS weighted
      FROM request_log
      WHERE account_id = ${accountId} AND status = 'success' AND created_at >= ${new Date(since)}
      GROUP BY model_id ORDER BY weighted DESC, model_id`
    const total = rows.reduce((sum, r) => sum + r.weighted, 0)
    return rows.map((r) => ({
      model_id: r.model_id,
      request_count: r.request_count,
      weighted: r.weighted,
      pct_of_total: total > 0 ? Math.round((r.weighted / total) * 10000) / 100 : 0
    }))
  }).pipe(Effect.orDie)

/**
 * A request row is stamped when the request arrives; the window it opens starts at admission, a little
 * later. Rows this close before a window start belong to it.
 */
export const WINDOW_SLACK_MS = 5_000

/** Earliest row time counted in the window a pool standing describes, or null while inactive. */
export const windowStart = (pool: PoolStanding, lengthMs: number): number | null => {
  const start = pool.anchor_at != null ? pool.anchor_at : pool.resets_at === null ? null : pool.resets_at - lengthMs
  return start === null ? null : start - WINDOW_SLACK_MS
}

export { WEEK_MS }

/** GET /v1/usage: percentages only. */
export const usage = HttpRouter.add(
  "GET",
  "/v1/usage",
  Effect.gen(function*() {
    const request = yield* HttpServerRequest.HttpServerRequest
    const auth = yield* Auth
    const admission = yield* Admission
    const settings = yield* Settings
    const sql = yield* SqlClient.SqlClient
    return yield* handle(
      renderInference,
      Effect.gen(function*() {
        const { account } = yield* auth.authenticateKey(request.headers.authorization)
        const plan = settings.planFor(account.plan)
        const standing = yield* admission.standing(account.id, plan)
        const bucket = (pool: PoolStanding, lengthMs: number) =>
          usageByModel(account.id, windowStart(pool, lengthMs)).pipe(Effect.map((rows) => ({
            ...poolView(pool),
            by_model: rows.map(({ model_id, pct_of_total, request_count }) => ({ model_id, request_count, pct_of_total }))
          })))
        const [session, weekly] = yield* Effect.all([
          bucket(standing.session, plan.session_hours * 3600 * 1000),
          bucket(standing.weekly, WEEK_MS)
        ], { concurrency: 2 })
        return json({ object: "usage", session, weekly })
      }).pipe(Effect.provideService(SqlClient.SqlClient, sql))
    )
  })
)
