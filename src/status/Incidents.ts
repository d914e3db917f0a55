/**
 * Incidents (issue 18): stored in `incidents` / `incident_updates` (migration 0005), written by the operator
 * CLI (`incident:create`, `incident:update`, `incident:resolve`), read by the status refresh for
 * `GET /api/incidents` and the status page.
 *
 * An incident's `status` is the one its latest update set: `investigating` → `identified` → `monitoring` →
 * `resolved` (any order; an update with another status reopens a resolved incident). Update entries on the
 * wire: `{status, message, at}` (`at` ISO 8601), newest first.
 */
import { Clock, Effect } from "effect"
import type { SqlClient } from "effect/sql"

export const INCIDENT_STATUSES = ["investigating", "identified", "monitoring", "resolved"] as const
export type IncidentStatus = (typeof INCIDENT_STATUSES)[number]

export const isIncidentStatus = (value: string): value is IncidentStatus =>
  (INCIDENT_STATUSES as ReadonlyArray<string>).includes(value)

export const TITLE_MAX = 200
export const MESSAGE_MAX = 2000

/** `limit` of `GET /api/incidents`: default and cap. */
export const INCIDENTS_DEFAULT = 10
export const INCIDENTS_MAX = 50

export interface IncidentUpdate {
  readonly status: IncidentStatus
  readonly message: string
  readonly at: string
}

export interface Incident {
  readonly id: number
  readonly title: string
  readonly status: IncidentStatus
  readonly created_at: string
  readonly updated_at: string
  readonly resolved_at: string | null
  /** Newest first. */
  readonly updates: ReadonlyArray<IncidentUpdate>
}

interface IncidentRow {
  readonly id: number
  readonly title: string
  readonly status: IncidentStatus
  readonly created_at: Date
  readonly updated_at: Date
  readonly resolved_at: Date | null
}

interface UpdateRow {
  readonly incident_id: number
  readonly status: IncidentStatus
  readonly message: string
  readonly created_at: Date
}

const iso = (d: Date) => d.toISOString()

const view = (row: IncidentRow, updates: ReadonlyArray<UpdateRow>): Incident => ({
  id: Number(row.id),
  title: row.title,
  status: row.status,
  created_at: iso(row.created_at),
  updated_at: iso(row.updated_at),
  resolved_at: row.resolved_at === null ? null : iso(row.resolved_at),
  updates: updates.map((u) => ({ status: u.status, message: u.message, at: iso(u.created_at) }))
})

/** The newest `limit` incidents (newest first) with their updates, and how many are not resolved. */
export const recentIncidents = (
  sql: SqlClient.SqlClient,
  limit: number
): Effect.Effect<{ readonly incidents: ReadonlyArray<Incident>; readonly active: number }> =>
  Effect.gen(function*() {
    const rows = yield* sql<IncidentRow>`
      SELECT id, title, status, created_at, updated_at, resolved_at FROM incidents
      ORDER BY created_at DESC, id DESC LIMIT ${limit}::int`
    const ids = rows.map((r) => Number(r.id))
    const updates = ids.length === 0 ? [] : yield* sql<UpdateRow>`
      SELECT incident_id, status, message, created_at FROM incident_updates
      WHERE ${sql.in("incident_id", ids)} ORDER BY created_at DESC, id DESC`
    const [{ n }] = (yield* sql<{ n: number }>`
      SELECT count(*)::int AS n FROM incidents WHERE status <> 'resolved'`) as unknown as [{ n: number }]
    const byIncident = new Map<number, Array<UpdateRow>>()
    for (const u of updates) {
      const list = byIncident.get(Number(u.incident_id)) ?? []
      list.push(u)
      byIncident.set(Number(u.incident_id), list)
    }
    return { incidents: rows.map((r) => view(r, byIncident.get(Number(r.id)) ?? [])), active: n }
  }).pipe(Effect.orDie)

const now = Effect.map(Clock.currentTimeMillis, (ms) => new Date(ms))

const find = (sql: SqlClient.SqlClient, id: number) =>
  Effect.gen(function*() {
    const [row] = yield* sql<IncidentRow>`
      SELECT id, title, status, created_at, updated_at, resolved_at FROM incidents WHERE id = ${id}`
    if (row === undefined) return null
    const updates = yield* sql<UpdateRow>`
      SELECT incident_id, status, message, created_at FROM incident_updates
      WHERE incident_id = ${id} ORDER BY created_at DESC, id DESC`
    return view(row, updates)
  })

/** Opens an incident; with a message, its first update. */
export const createIncident = (
  sql: SqlClient.SqlClient,
  input: { readonly title: string; readonly status: IncidentStatus; readonly message?: string | undefined }
): Effect.Effect<Incident> =>
  sql.withTransaction(Effect.gen(function*() {
    const at = yield* now
    const resolvedAt = input.status === "resolved" ? at : null
    const [{ id }] = (yield* sql<{ id: number }>`
      INSERT INTO incidents (title, status, created_at, updated_at, resolved_at)
      VALUES (${input.title}, ${input.status}, ${at}, ${at}, ${resolvedAt}) RETURNING id`) as unknown as [{ id: number }]
    if (input.message !== undefined) {
      yield* sql`
        INSERT INTO incident_updates (incident_id, status, message, created_at)
        VALUES (${id}, ${input.status}, ${input.message}, ${at})`
    }
    return (yield* find(sql, Number(id)))!
  })).pipe(Effect.orDie)

/**
 * Posts an update: the message, and the incident's status (unchanged when `status` is undefined). Null when
 * there is no such incident.
 */
export const updateIncident = (
  sql: SqlClient.SqlClient,
  id: number,
  input: { readonly message: string; readonly status?: IncidentStatus | undefined }
): Effect.Effect<Incident | null> =>
  sql.withTransaction(Effect.gen(function*() {
    const [row] = yield* sql<IncidentRow>`SELECT * FROM incidents WHERE id = ${id} FOR UPDATE`
    if (row === undefined) return null
    const at = yield* now
    const status = input.status ?? row.status
    const resolvedAt = status === "resolved" ? (row.status === "resolved" ? row.resolved_at : at) : null
    yield* sql`UPDATE incidents SET status = ${status}, updated_at = ${at}, resolved_at = ${resolvedAt} WHERE id = ${id}`
    yield* sql`
      INSERT INTO incident_updates (incident_id, status, message, created_at)
      VALUES (${id}, ${status}, ${input.message}, ${at})`
    return yield* find(sql, id)
  })).pipe(Effect.orDie)

/** One incident with its updates, or null. */
export const incidentById = (sql: SqlClient.SqlClient, id: number): Effect.Effect<Incident | null> =>
  find(sql, id).pipe(Effect.orDie)
