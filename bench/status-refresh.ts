/**
 * What one status refresh costs the database (the aggregate queries of `status/Status.ts`), alone: embedded PGlite
 * in this process (run it with `--liftoff-only`, as the gateway runs the database), a request log filled as a busy
 * gateway fills it: `rate` rows a second over the last `minutes` minutes, up to a moment `offset` seconds into the
 * current minute. Prints one JSON line: ms per refresh (median of `runs`) and the rows the table holds.
 *
 *   node --liftoff-only --import tsx bench/status-refresh.ts [rate] [minutes] [offset] [runs]
 */
import { Effect, Layer, ManagedRuntime } from "effect"
import { SqlClient } from "effect/sql"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import * as Sql from "../src/store/Sql.js"
import { fleetRows, requestsSince, serverRow } from "../src/telemetry/RequestQueries.js"

const [rate = 3000, minutes = 15, offset = 45, runs = 9] = process.argv.slice(2).map(Number)
const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-status-refresh-"))
const runtime = ManagedRuntime.make(Layer.provideMerge(Layer.effectDiscard(Sql.runMigrations), Sql.layerSql({ dataDir: dir })))
const MINUTE = 60_000
const now = (Math.floor(Date.now() / MINUTE) * MINUTE) + offset! * 1000
const rows = Math.round(rate! * (minutes! * 60 + offset!))

const program = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  // Rows evenly spread up to `now`, in batches as the writer sends them (the minute sums' trigger runs per batch).
  const step = (minutes! * 60 + offset!) * 1000 / rows
  for (let from = 0; from < rows; from += 20_000) {
    const to = Math.min(rows, from + 20_000)
    yield* sql.unsafe(`INSERT INTO request_log (id, request_id, account_id, model_id, status, http_status, stream,
        input_tokens, output_tokens, ttfb_ms, tps, created_at)
      SELECT g, 'req_' || g, 'acc_' || (g % 50), CASE WHEN g % 2 = 0 THEN 'gpt-4o-mini' ELSE 'mock' END,
        CASE WHEN g % 100 = 0 THEN 'error' ELSE 'success' END, CASE WHEN g % 100 = 0 THEN 502 ELSE 200 END, false,
        100, 20, 150, 40.5, to_timestamp(($1::float8 - ($2::float8 - g) * $3::float8) / 1000)
      FROM generate_series($4::bigint, $5::bigint) g`, [now, rows, step, from + 1, to])
  }
  const models = ["gpt-4o-mini", "mock"]
  const parts = {
    fleet: fleetRows(sql, { models, now, windowMs: 10 * MINUTE, recent: 20, idleMs: 24 * 3_600_000 }),
    quota: requestsSince(sql, models, new Date(Math.floor(now / 86_400_000) * 86_400_000)),
    server: serverRow(sql, new Date(now - 24 * 3_600_000), new Date(now))
  }
  const times: Record<string, Array<number>> = { fleet: [], quota: [], server: [] }
  for (let i = 0; i <= runs!; i++) {
    for (const [name, part] of Object.entries(parts)) {
      const t0 = performance.now()
      yield* part
      // The first round warms the caches and is not counted.
      if (i > 0) times[name]!.push(performance.now() - t0)
    }
  }
  const median = (xs: Array<number>) => Math.round(xs.sort((a, b) => a - b)[xs.length >> 1]! * 10) / 10
  const ms = Object.fromEntries(Object.entries(times).map(([k, v]) => [k, median(v)]))
  return { rate, minutes, offset, rows, ms_per_refresh: ms }
})

try {
  console.log(JSON.stringify(await runtime.runPromise(program)))
} finally {
  await runtime.dispose()
  Fs.rmSync(dir, { recursive: true, force: true })
}
