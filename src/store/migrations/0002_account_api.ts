import { Effect } from "effect"
import { SqlClient } from "effect/sql"

/** Account API: today's leaderboard scans every account's rows since 00:00 UTC (09:00 KST). */
export default Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE INDEX IF NOT EXISTS request_log_time ON request_log (created_at)`
})
