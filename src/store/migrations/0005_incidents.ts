import { Effect } from "effect"
import { SqlClient } from "effect/sql"

/**
 * Public status (issue 18).
 *
 * - `incidents`: created, updated and resolved with the operator CLI (`incident:*`); `status` is the latest
 *   update's; `resolved_at` is set while it is `resolved`.
 * - `incident_updates`: one row per message posted on an incident, with the status it set.
 */
export default Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`
    CREATE TABLE incidents (
      id bigserial PRIMARY KEY,
      title text NOT NULL CHECK (char_length(title) BETWEEN 1 AND 200),
      status text NOT NULL CHECK (status IN ('investigating', 'identified', 'monitoring', 'resolved')),
      created_at timestamptz NOT NULL DEFAULT now(),
      updated_at timestamptz NOT NULL DEFAULT now(),
      resolved_at timestamptz
    )
  `
  yield* sql`CREATE INDEX incidents_recent ON incidents (created_at DESC, id DESC)`
  yield* sql`CREATE INDEX incidents_open ON incidents (id) WHERE status <> 'resolved'`
  yield* sql`
    CREATE TABLE incident_updates (
      id bigserial PRIMARY KEY,
      incident_id bigint NOT NULL REFERENCES incidents(id) ON DELETE CASCADE,
      status text NOT NULL CHECK (status IN ('investigating', 'identified', 'monitoring', 'resolved')),
      message text NOT NULL CHECK (char_length(message) BETWEEN 1 AND 2000),
      created_at timestamptz NOT NULL DEFAULT now()
    )
  `
  yield* sql`CREATE INDEX incident_updates_incident ON incident_updates (incident_id, created_at DESC, id DESC)`
})
