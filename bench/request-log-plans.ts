/**
 * Plans and CPU of the request_log reads (copies of the statements in `telemetry/RequestQueries.ts`) on a table of
 * realistic size, as embedded mode runs them: PostgreSQL in PGlite, no statistics (no autovacuum, so no ANALYZE).
 * The schema comes from the real migrations (through the embedded store); the rows are generated in SQL.
 *
 *   node --liftoff-only --import tsx bench/request-log-plans.ts
 *
 * Env: DIR (data folder, kept and reused; default a fresh temporary one), ROWS (200000), SPAN seconds the rows
 * cover, ending now (86400), ACCOUNTS (200), MODELS (5), BYOK (share, 0.05); DROP="index ..." drops indexes
 * first; ANALYZE=1 analyses the table first; ONLY=text runs the queries whose name contains it; PLANS=0 prints
 * the CPU only. CPU is the best of three runs, in ms, measured in this thread (PGlite runs in process here).
 */
import { PGlite } from "@electric-sql/pglite"
import { Effect, ManagedRuntime } from "effect"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import * as Sql from "../src/store/Sql.js"

const env = (name: string, fallback: string) => process.env[name] ?? fallback
const ROWS = Number(env("ROWS", "200000"))
const SPAN = Number(env("SPAN", "86400"))
const dataDir = process.env["DIR"] ?? Fs.mkdtempSync(Path.join(Os.tmpdir(), "ws-plans-"))
const fresh = !Fs.existsSync(Path.join(dataDir, "pglite", "PG_VERSION"))

if (fresh) {
  // The schema, through the store as the gateway opens it.
  const store = ManagedRuntime.make(Sql.layerSql({ dataDir }))
  await store.runPromise(Effect.void)
  await store.dispose()
}
const db = await PGlite.create(Path.join(dataDir, "pglite"), {
  postgresqlconf: ["shared_buffers=16MB", "work_mem=4MB", "plan_cache_mode=force_custom_plan"]
})
if (fresh) {
  const accounts = Number(env("ACCOUNTS", "200"))
  await db.exec(`INSERT INTO accounts (id, username, display_name)
    SELECT 'acc_' || g, 'user' || g, 'User ' || g FROM generate_series(0, ${accounts - 1}) g`)
  // Ordered by time; accounts and models skewed (a few busy ones), some BYOK, 3 % upstream failures.
  const now = Date.now() / 1000
  await db.exec(`INSERT INTO request_log (id, request_id, account_id, model_id, status, http_status, input_tokens,
      output_tokens, created_at, byok, ttfb_ms, duration_ms, tps, weighted_cost)
    SELECT g, 'req_' || g, 'acc_' || floor(pow(random(), 3) * ${accounts})::int,
      (ARRAY['ws-pro','ws-lite','gpt-4o-mini','ws-code','@openai/gpt-4o','ws-vision'])[1 + floor(pow(random(), 2) * ${
    Number(env("MODELS", "5"))
  })::int],
      'success', 200, 100, 50, to_timestamp(${now} - ${SPAN} + g * ${SPAN}.0 / ${ROWS}), random() < ${
    Number(env("BYOK", "0.05"))
  },
      10, 100, 50, 1
    FROM generate_series(1, ${ROWS}) g`)
  await db.exec(`UPDATE request_log SET status = 'error', http_status = 502 WHERE random() < 0.03`)
  await db.exec("CHECKPOINT")
}
if (process.env["ANALYZE"]) await db.exec("ANALYZE request_log")
for (const index of (process.env["DROP"] ?? "").split(/\s+/).filter(Boolean)) await db.exec(`DROP INDEX ${index}`)

const now = new Date()
const hoursAgo = (x: number) => new Date(now.getTime() - x * 3_600_000)
const dayStart = new Date(Math.floor(now.getTime() / 86_400_000) * 86_400_000)
const models = ["ws-pro", "ws-lite", "gpt-4o-mini", "ws-code", "ws-vision", "ws-idle"]
const modelList = models.map((_, i) => `$${i + 3}`).join(",")
const FAILURE = "status = 'error' AND http_status >= 500 AND http_status <> 529"
const QUERIES: ReadonlyArray<readonly [string, string, ReadonlyArray<unknown>]> = [
  ["usage by model (account)", `SELECT model_id, count(*)::int AS request_count, coalesce(sum(weighted_cost), 0)::float8 AS weighted
    FROM request_log WHERE account_id = $1 AND status = 'success' AND created_at >= $2
    GROUP BY model_id ORDER BY weighted DESC, model_id`, ["acc_3", hoursAgo(5)]],
  ["metrics totals (account, 24 h)", `SELECT count(*), coalesce(sum(input_tokens), 0)::bigint FROM request_log
    WHERE account_id = $1 AND created_at >= $2 AND created_at <= $3 AND ($4::text IS NULL OR model_id = $4::text)`,
    ["acc_3", hoursAgo(24), now, null]],
  ["recent requests (account)", `SELECT id, created_at FROM request_log WHERE account_id = $1
    ORDER BY created_at DESC, id DESC LIMIT 50`, ["acc_3"]],
  ["leaderboard (day)", `SELECT sum(r.input_tokens::bigint + r.output_tokens)::bigint AS tokens
    FROM request_log r JOIN accounts a ON a.id = r.account_id WHERE r.created_at >= $1 AND NOT a.is_guest
    GROUP BY r.account_id HAVING sum(r.input_tokens::bigint + r.output_tokens) > 0 ORDER BY tokens DESC`, [dayStart]],
  ["fleet health (70 min)", `SELECT model_id,
      count(*) FILTER (WHERE created_at > $2 AND status = 'success')::int AS window_successes,
      count(*) FILTER (WHERE created_at > $2 AND ${FAILURE})::int AS window_failures,
      avg(ttfb_ms) FILTER (WHERE created_at > $9 AND status = 'success' AND ttfb_ms IS NOT NULL)::float8 AS ttfb_ms
    FROM request_log WHERE model_id IN (${modelList}) AND NOT byok AND created_at <= $1 AND created_at > $10
    GROUP BY model_id`, [now, hoursAgo(0.25), ...models, hoursAgo(1), hoursAgo(70 / 60)]],
  ["fleet recent (newest 10 per model)", `SELECT m.model_id, count(*)::int AS attempts,
      count(*) FILTER (WHERE newest.failed)::int AS failures
    FROM (SELECT DISTINCT unnest($3::text[]) AS model_id) m
    CROSS JOIN LATERAL (
      SELECT (${FAILURE}) AS failed FROM request_log
      WHERE model_id = m.model_id AND NOT byok AND created_at <= $1 AND created_at > $2 AND (status = 'success' OR (${FAILURE}))
      ORDER BY created_at DESC, id DESC LIMIT 10
    ) newest GROUP BY m.model_id`, [now, hoursAgo(0.25), models]],
  ["fleet buckets (70 min)", `SELECT model_id, floor(extract(epoch FROM ($1::timestamptz - created_at)) * 1000 / 600000)::int AS age,
      coalesce(sum(output_tokens), 0)::bigint FROM request_log
    WHERE model_id IN (${modelList}) AND NOT byok AND created_at <= $1 AND created_at > $2 GROUP BY 1, 2`,
    [now, hoursAgo(70 / 60), ...models]],
  ["idle probe (one model, 24 h)", `SELECT 1 AS one FROM request_log
    WHERE model_id = $1 AND NOT byok AND created_at > $2 AND created_at <= $3 LIMIT 1`, ["ws-idle", hoursAgo(24), now]],
  ["requests since (day)", `SELECT count(*)::int AS n FROM request_log
    WHERE model_id IN (${models.map((_, i) => `$${i + 2}`).join(",")}) AND NOT byok AND status = 'success' AND created_at >= $1`,
    [dayStart, ...models]],
  ["active accounts (24 h)", `WITH RECURSIVE seen(account_id) AS (
      (SELECT account_id FROM request_log ORDER BY account_id LIMIT 1)
      UNION ALL
      SELECT (SELECT r.account_id FROM request_log r WHERE r.account_id > seen.account_id ORDER BY r.account_id LIMIT 1)
      FROM seen WHERE seen.account_id IS NOT NULL)
    SELECT count(*)::int AS users FROM seen CROSS JOIN LATERAL (
      SELECT 1 FROM request_log r WHERE r.account_id = seen.account_id AND r.created_at >= $1 AND r.created_at <= $2 LIMIT 1
    ) active WHERE seen.account_id IS NOT NULL`, [hoursAgo(24), now]],
  ["output (10 min)", `SELECT coalesce(sum(output_tokens), 0)::bigint AS output_tokens FROM request_log
    WHERE created_at > $1 AND created_at <= $2`, [hoursAgo(1 / 6), now]]
]

const only = process.env["ONLY"]
for (const [name, text, params] of QUERIES) {
  if (only !== undefined && !name.includes(only)) continue
  let best = Number.POSITIVE_INFINITY
  for (let i = 0; i < 3; i++) {
    const start = process.threadCpuUsage()
    await db.query(text, [...params])
    const used = process.threadCpuUsage(start)
    best = Math.min(best, used.user + used.system)
  }
  console.log(`== ${name}: ${(best / 1000).toFixed(1)} ms CPU`)
  if (process.env["PLANS"] === "0") continue
  const plan = await db.query<{ "QUERY PLAN": string }>(`EXPLAIN ${text}`, [...params])
  for (const row of plan.rows) console.log(`   ${row["QUERY PLAN"]}`)
}
await db.close()
if (process.env["DIR"] === undefined) Fs.rmSync(dataDir, { recursive: true, force: true })
