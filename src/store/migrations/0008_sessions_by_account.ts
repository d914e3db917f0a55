import { Effect } from "effect"
import { SqlClient } from "effect/sql"

/**
 * Dashboard sessions (issue 21): a sign-in prunes and caps the account's sessions, and the settings page lists and
 * revokes them, all by account; without this index each of those scanned the whole table.
 */
export default Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE INDEX sessions_by_account ON sessions (account_id, created_at DESC)`
})
