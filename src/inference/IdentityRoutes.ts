import { Effect } from "effect"
import { HttpRouter, HttpServerRequest } from "effect/http"
import { SqlClient } from "effect/sql"
import { Auth } from "../auth/Auth.js"
import { Settings } from "../config/Live.js"
import { renderInference } from "../errors/Render.js"
import { handle, json } from "../http/Respond.js"
import { Admission, type PoolStanding } from "../quota/Admission.js"
import { WEEK_MS } from "../quota/Policy.js"
import { usageByModel, windowStart } from "../telemetry/RequestQueries.js"
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
      auth.bearer(request).pipe(Effect.map(({ account, key }) =>
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
      usageAnswer(request, auth, admission, settings).pipe(Effect.provideService(SqlClient.SqlClient, sql))
    )
  })
)

/** `/v1/usage`'s answer, made once (see "No generator function per request" in docs/decisions.md). */
const usageAnswer = Effect.fnUntraced(function*(
  request: HttpServerRequest.HttpServerRequest,
  auth: typeof Auth.Service,
  admission: typeof Admission.Service,
  settings: typeof Settings.Service
) {
  const { account } = yield* auth.bearer(request)
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
})
