import { Effect } from "effect"
import { SqlClient } from "effect/sql"

/**
 * Operator-visible routing columns of `request_log` (issues 19 and 20); the account-facing row shapes do not
 * include them.
 *
 * - `api`: the client protocol the request came in on (`chat`, `embeddings`, `images`, `messages`, `responses`).
 * - `deployment`: the catalog deployment that answered (or the last one tried), null when none was tried.
 * - `attempts`: upstream attempts made for the request (failover counts each one); 0 when none was sent.
 */
export default Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`ALTER TABLE request_log ADD COLUMN api text NOT NULL DEFAULT 'chat'`
  yield* sql`ALTER TABLE request_log ADD COLUMN deployment text`
  yield* sql`ALTER TABLE request_log ADD COLUMN attempts integer NOT NULL DEFAULT 0`
})
