import { Effect } from "effect"
import { SqlClient } from "effect/sql"

/**
 * Stored responses of the OpenAI Responses API (`store`, its default): one row per response, kept per account
 * until `expires_at` (src/protocols/responses/Store.ts).
 *
 * - `previous_id`: the response it continued (`previous_response_id`); a conversation is the chain of rows.
 * - `messages`: this turn's input and output as internal chat messages (JSON text), what a continuation replays.
 * - `response`: the response object as answered (JSON text), what `GET /v1/responses/{id}` returns.
 * - `bytes`: the size of both, for the per-account bound.
 *
 * JSON is kept as text: it is never queried inside, and text costs the database no parse.
 */
export default Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`
    CREATE TABLE stored_responses (
      id text PRIMARY KEY,
      account_id text NOT NULL REFERENCES accounts (id) ON DELETE CASCADE,
      previous_id text,
      created_at timestamptz NOT NULL,
      expires_at timestamptz NOT NULL,
      bytes integer NOT NULL,
      messages text NOT NULL,
      response text NOT NULL
    )
  `
  yield* sql`CREATE INDEX stored_responses_account ON stored_responses (account_id, created_at DESC)`
  yield* sql`CREATE INDEX stored_responses_expiry ON stored_responses (expires_at)`
})
