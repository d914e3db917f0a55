/**
 * PGlite runs no autovacuum, so nothing re-plans a cached statement as `request_log` grows: the embedded database
 * plans every execution with its values (`plan_cache_mode`, store/Sql.ts). The status page's idle probe, run many
 * times while the table was empty, must still take the model index once the table holds thousands of rows.
 * Without statistics the planner also misjudges how many rows a window holds: the newest rows of a busy model must
 * be read down the model index, not by reading the whole window to sort it.
 */
import { Effect, ManagedRuntime } from "effect"
import { SqlClient } from "effect/sql"
import { describe, expect, it } from "vitest"
import { fleetRows } from "../../src/telemetry/RequestQueries.js"
import { backends } from "./backends.js"

describe("embedded statements are planned with their values", () => {
  it("the idle probe, prepared while the table was empty, uses the model index on a full table", async () => {
    const opened = await backends(false)[0]!.open()
    const runtime = ManagedRuntime.make(opened.layer)
    try {
      const plan = await runtime.runPromise(Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        const now = Date.now()
        const probe = (at: number) =>
          fleetRows(sql, { models: ["ws-idle-a", "ws-idle-b"], now: at, windowMs: 15 * 60_000, recent: 10, idleMs: 86_400_000 })
        // Two probes per refresh, eight refreshes on an empty table: past the five custom plans after which
        // PostgreSQL may cache a generic one.
        for (let i = 0; i < 8; i++) yield* probe(now)
        yield* sql`INSERT INTO request_log (id, request_id, account_id, model_id, status, http_status, created_at)
          SELECT g, 'r' || g, 'acc', 'ws-busy', 'success', 200, ${new Date(now)}::timestamptz - g * interval '1 second'
          FROM generate_series(1, 30000) g`
        const seen = yield* probe(now)
        expect(seen.seen).toEqual([])
        const [statement] = yield* sql<{ name: string; generic_plans: number; custom_plans: number }>`
          SELECT name, generic_plans::int, custom_plans::int FROM pg_prepared_statements
          WHERE statement LIKE '%SELECT 1 AS one FROM request_log%' AND statement NOT LIKE '%pg_prepared_statements%'`
        expect(statement).toMatchObject({ generic_plans: 0 })
        expect(statement!.custom_plans).toBeGreaterThanOrEqual(18)
        const day = new Date(now - 86_400_000).toISOString()
        return yield* sql<{ "QUERY PLAN": string }>`${
          sql.literal(`EXPLAIN EXECUTE ${statement!.name}('ws-idle-a', '${day}', '${new Date(now).toISOString()}')`)
        }`
      }).pipe(Effect.orDie))
      expect(plan.map((row) => row["QUERY PLAN"]).join("\n")).toContain("request_log_model_time")
    } finally {
      await runtime.dispose()
      await opened.close()
    }
  })

  it("the newest rows of a busy model are read down the index, not the whole window", async () => {
    const opened = await backends(false)[0]!.open()
    const runtime = ManagedRuntime.make(opened.layer)
    try {
      await runtime.runPromise(Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        // One second past a minute: the window's partial minutes at its two edges hold a second of rows each,
        // whatever the time of day the test runs at (with up to half a minute of rows at each edge, the reads of
        // the edges alone came near the bound below).
        const now = Math.floor(Date.now() / 60_000) * 60_000 + 1_000
        // 300,000 rows of two models in the last ten minutes (500 a second each), one in fifty of the busy one's a failure.
        yield* sql`INSERT INTO request_log (id, request_id, account_id, model_id, status, http_status, created_at)
          SELECT g, 'r' || g, 'acc', CASE WHEN g % 2 = 0 THEN 'ws-busy' ELSE 'ws-other' END,
            CASE WHEN g % 50 = 2 THEN 'error' ELSE 'success' END, CASE WHEN g % 50 = 2 THEN 502 ELSE 200 END,
            ${new Date(now)}::timestamptz - g * interval '1 millisecond'
          FROM generate_series(1, 300000) g`
        /** Heap blocks of request_log read so far (cumulative statistics, flushed on demand). */
        const blocks = Effect.gen(function*() {
          yield* sql`SELECT pg_stat_force_next_flush()`
          const [row] = yield* sql<{ blocks: number }>`
            SELECT (coalesce(heap_blks_read, 0) + coalesce(heap_blks_hit, 0))::int AS blocks
            FROM pg_statio_user_tables WHERE relname = 'request_log'`
          return row!.blocks
        })
        const refresh = fleetRows(sql, { models: ["ws-busy"], now, windowMs: 10 * 60_000, recent: 20, idleMs: 86_400_000 })
        // The counters count: one pass over the table reads every block of it.
        const start = yield* blocks
        yield* sql`SELECT count(*) FROM request_log WHERE status = 'error'`
        const table = (yield* blocks) - start
        expect(table).toBeGreaterThan(100)
        // The window's sums come from the minute sums and its edges; the newest twenty from the model index.
        const before = yield* blocks
        const rows = yield* refresh
        const read = (yield* blocks) - before
        expect(rows.recent).toEqual([{ model_id: "ws-busy", attempts: 20, failures: 1 }])
        expect(read).toBeLessThan(table / 4)
      }).pipe(Effect.orDie))
    } finally {
      await runtime.dispose()
      await opened.close()
    }
  })
})
