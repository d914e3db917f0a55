/**
 * The embedded database's cost per request row, alone: PGlite in a worker thread (as `store/EmbeddedWorker.ts`
 * runs it), request rows inserted in batches by one of several methods, the worker thread's CPU time per row.
 *
 *   node --liftoff-only --import tsx bench/db-rows.ts [method] [batches] [batch size] [prefill]
 *
 * method: values (sql-pg's VALUES list, 27 parameters per row, over the socket), json (one JSON parameter through
 * `json_populate_recordset`, over the socket), unnest (one typed array per column, over the socket, as
 * `telemetry/RequestLog.ts` writes), direct-json (the worker runs the JSON insert itself, no socket), direct-copy
 * (`COPY ... FROM '/dev/blob'` in the worker, CSV).
 * The table is first filled with `prefill` rows spread over the last day. Prints one JSON line: the worker's CPU
 * µs per row (user+sys, `process.threadCpuUsage` in the worker), the main thread's, wall ms per batch.
 * Env: DROP="idx1 idx2 trigger:name" drops indexes (and triggers on request_log) first; CONF="a=b c=d" adds
 * postgresql.conf lines; ACCOUNTS / MODELS: how many distinct account and model ids the rows spread over (50 / 4);
 * PROFILE=file.cpuprofile profiles the worker over the measured batches. Pin it (`taskset -c 1`) and pass
 * `--liftoff-only` as the gateway runs.
 */
import { PgTypes } from "@effect/sql-pg"
import { Effect, Layer, ManagedRuntime, Result } from "effect"
import { SqlClient } from "effect/sql"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { Worker } from "node:worker_threads"
import * as Sql from "../src/store/Sql.js"

const [method = "values", batchesArg = "40", sizeArg = "500", prefillArg = "50000"] = process.argv.slice(2)
const batches = Number(batchesArg)
const size = Number(sizeArg)
const prefill = Number(prefillArg)

const WORKER = `
import { parentPort, workerData } from "node:worker_threads"
const { PGlite } = await import(workerData.pglite)
const { PGLiteSocketServer } = await import(workerData.socket)
const db = await PGlite.create(workerData.dir, { postgresqlconf: workerData.conf })
const server = new PGLiteSocketServer({ db, path: workerData.socketPath, maxConnections: 8 })
await server.start()
parentPort.on("message", async (m) => {
  try {
    if (m.type === "profile-start") {
      const { Session } = await import("node:inspector/promises")
      globalThis.session = new Session(); globalThis.session.connect()
      await globalThis.session.post("Profiler.enable"); await globalThis.session.post("Profiler.start")
      return parentPort.postMessage({ id: m.id })
    }
    if (m.type === "profile-stop") {
      const { profile } = await globalThis.session.post("Profiler.stop")
      const fs = await import("node:fs"); fs.writeFileSync(m.path, JSON.stringify(profile))
      return parentPort.postMessage({ id: m.id })
    }
    if (m.type === "cpu") return parentPort.postMessage({ id: m.id, cpu: process.threadCpuUsage(), mem: process.memoryUsage() })
    if (m.type === "query") {
      const r = await db.query(m.sql, m.params ?? [], m.blob ? { blob: new Blob([m.blob]) } : undefined)
      return parentPort.postMessage({ id: m.id, rows: r.rows, affected: r.affectedRows })
    }
    if (m.type === "stop") { await server.stop(); await db.close(); return parentPort.postMessage({ id: m.id }) }
  } catch (e) { parentPort.postMessage({ id: m.id, error: String(e && e.message || e), code: e && e.code }) }
})
parentPort.postMessage({ ready: true })
`

const COLUMNS = [
  "id", "request_id", "account_id", "key_id", "model_id", "status", "error_code", "http_status", "stream",
  "input_tokens", "output_tokens", "reasoning_tokens", "prompt_cached_tokens", "weighted_cost", "ttfb_ms",
  "duration_ms", "tps", "had_tools", "tool_choice", "byok", "provider", "fell_back", "error", "created_at", "api",
  "deployment", "attempts"
]

let nextId = 1
const accounts = Array.from({ length: Number(process.env["ACCOUNTS"] ?? 50) }, (_, i) => `acct_${i.toString(36).padStart(8, "0")}`)
const models = ["gpt-4o-mini", "ws-lite", "ws-pro", "mock-chunks20-delay10"].slice(0, Number(process.env["MODELS"] ?? 4))
const row = (at: number) => {
  const id = nextId++
  const ok = id % 50 !== 0
  return {
    id,
    request_id: `req_${id.toString(16).padStart(24, "0")}`,
    account_id: accounts[id % accounts.length]!,
    key_id: (id % accounts.length) + 1,
    model_id: models[id % models.length]!,
    status: ok ? "success" : "error",
    error_code: ok ? null : "upstream_error",
    http_status: ok ? 200 : 502,
    stream: id % 3 === 0,
    input_tokens: 40 + (id % 13),
    output_tokens: 20 + (id % 7),
    reasoning_tokens: 0,
    prompt_cached_tokens: 0,
    weighted_cost: 0.00123 * (id % 17),
    ttfb_ms: 3 + (id % 5),
    duration_ms: 5 + (id % 11),
    tps: 1234.56,
    had_tools: false,
    tool_choice: null,
    byok: false,
    provider: null,
    fell_back: false,
    error: ok ? null : "upstream_error (502)",
    created_at: new Date(at),
    api: "chat",
    deployment: "d0",
    attempts: 1
  }
}
type Row = ReturnType<typeof row>

const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "ws-dbrows-"))
const socketPath = Path.join(dir, ".s.PGSQL.5432")
Fs.mkdirSync(Path.join(dir, "pglite"))
const worker = new Worker(new URL(`data:text/javascript,${encodeURIComponent(WORKER)}`), {
  execArgv: [],
  resourceLimits: { maxYoungGenerationSizeMb: 8, maxOldGenerationSizeMb: 128 },
  workerData: {
    pglite: import.meta.resolve("@electric-sql/pglite"),
    socket: import.meta.resolve("@electric-sql/pglite-socket"),
    dir: Path.join(dir, "pglite"),
    socketPath,
    conf: ["shared_buffers=16MB", "work_mem=4MB", "maintenance_work_mem=16MB", "wal_buffers=1MB",
      ...(process.env["CONF"] ?? "").split(/\s+/).filter(Boolean)]
  }
})
let seq = 0
const pending = new Map<number, (m: any) => void>()
const ready = new Promise<void>((resolve) => {
  worker.on("message", (m) => {
    if (m.ready) return resolve()
    pending.get(m.id)?.(m)
    pending.delete(m.id)
  })
})
const ask = (m: Record<string, unknown>): Promise<any> =>
  new Promise((resolve, reject) => {
    const id = ++seq
    pending.set(id, (r) => (r.error ? reject(new Error(`${r.code}: ${r.error}`)) : resolve(r)))
    worker.postMessage({ ...m, id })
  })
await ready

const runtime = ManagedRuntime.make(Layer.provideMerge(Layer.effectDiscard(Sql.runMigrations), Sql.layerSocket(socketPath, 1)))
const run = <A>(e: Effect.Effect<A, unknown, SqlClient.SqlClient>) => runtime.runPromise(e)
await run(Effect.void)

for (const index of (process.env["DROP"] ?? "").split(/\s+/).filter(Boolean)) {
  const statement = index.startsWith("trigger:") ? `DROP TRIGGER ${index.slice(8)} ON request_log` : `DROP INDEX ${index}`
  await run(Effect.flatMap(SqlClient.SqlClient, (sql) => sql.unsafe(statement)))
}

const INSERT_JSON = `INSERT INTO request_log (${COLUMNS.join(", ")})
  SELECT ${COLUMNS.join(", ")} FROM json_populate_recordset(NULL::request_log, $1::json)
  ON CONFLICT (id) DO NOTHING`

const TYPES: Record<string, [number, string]> = {
  id: [PgTypes.OID.int8, "int8"], request_id: [PgTypes.OID.text, "text"], account_id: [PgTypes.OID.text, "text"],
  key_id: [PgTypes.OID.int8, "int8"], model_id: [PgTypes.OID.text, "text"], status: [PgTypes.OID.text, "text"],
  error_code: [PgTypes.OID.text, "text"], http_status: [PgTypes.OID.int4, "int4"], stream: [PgTypes.OID.bool, "bool"],
  input_tokens: [PgTypes.OID.int4, "int4"], output_tokens: [PgTypes.OID.int4, "int4"],
  reasoning_tokens: [PgTypes.OID.int4, "int4"], prompt_cached_tokens: [PgTypes.OID.int4, "int4"],
  weighted_cost: [PgTypes.OID.float8, "float8"], ttfb_ms: [PgTypes.OID.int4, "int4"],
  duration_ms: [PgTypes.OID.int4, "int4"], tps: [PgTypes.OID.float8, "float8"], had_tools: [PgTypes.OID.bool, "bool"],
  tool_choice: [PgTypes.OID.text, "text"], byok: [PgTypes.OID.bool, "bool"], provider: [PgTypes.OID.text, "text"],
  fell_back: [PgTypes.OID.bool, "bool"], error: [PgTypes.OID.text, "text"],
  created_at: [PgTypes.OID.timestamptz, "timestamptz"], api: [PgTypes.OID.text, "text"],
  deployment: [PgTypes.OID.text, "text"], attempts: [PgTypes.OID.int4, "int4"]
}
const INSERT_UNNEST = `INSERT INTO request_log (${COLUMNS.join(", ")})
  SELECT * FROM unnest(${COLUMNS.map((c, i) => `$${i + 1}::${TYPES[c]![1]}[]`).join(", ")})
  ON CONFLICT (id) DO NOTHING`
const unnestParams = (rows: ReadonlyArray<Row>) =>
  COLUMNS.map((c) => Result.getOrThrow(PgTypes.array(rows.map((r) => (r as any)[c]), TYPES[c]![0])))

const csvText = (v: unknown): string => {
  if (v === null || v === undefined) return ""
  if (v instanceof Date) return v.toISOString()
  if (typeof v === "string") return `"${v.replaceAll("\"", "\"\"")}"`
  return String(v)
}

const insert = (rows: ReadonlyArray<Row>): Promise<unknown> => {
  switch (method) {
    case "values":
      return run(Effect.flatMap(SqlClient.SqlClient, (sql) =>
        sql`INSERT INTO request_log ${sql.insert(rows as any)} ON CONFLICT (id) DO NOTHING`))
    case "json":
      return run(Effect.flatMap(SqlClient.SqlClient, (sql) => sql.unsafe(INSERT_JSON, [JSON.stringify(rows)])))
    case "unnest":
      return run(Effect.flatMap(SqlClient.SqlClient, (sql) => sql.unsafe(INSERT_UNNEST, unnestParams(rows) as any)))
    case "direct-json":
      return ask({ type: "query", sql: INSERT_JSON, params: [JSON.stringify(rows)] })
    case "direct-copy": {
      const text = rows.map((r) => COLUMNS.map((c) => csvText((r as any)[c])).join(",")).join("\n") + "\n"
      return ask({ type: "query", sql: `COPY request_log (${COLUMNS.join(", ")}) FROM '/dev/blob' WITH (FORMAT csv)`, blob: text })
    }
    default:
      throw new Error(`unknown method ${method}`)
  }
}

// Prefill: a realistically sized table (rows over the last day), with the fastest method.
const day = 86_400_000
const t0 = Date.now() - day
for (let done = 0; done < prefill; done += 5000) {
  const rows = Array.from({ length: Math.min(5000, prefill - done) }, (_, i) => row(t0 + ((done + i) / prefill) * day))
  await ask({ type: "query", sql: INSERT_JSON, params: [JSON.stringify(rows)] })
}
await ask({ type: "query", sql: "CHECKPOINT" })

// Warm-up, then the measured batches.
for (let b = 0; b < 5; b++) await insert(Array.from({ length: size }, () => row(Date.now())))
if (process.env["PROFILE"]) await ask({ type: "profile-start" })
const before = await ask({ type: "cpu" })
const main0 = process.threadCpuUsage()
const wall0 = performance.now()
for (let b = 0; b < batches; b++) await insert(Array.from({ length: size }, () => row(Date.now())))
const wall = performance.now() - wall0
const main1 = process.threadCpuUsage(main0)
const after = await ask({ type: "cpu" })
if (process.env["PROFILE"]) await ask({ type: "profile-stop", path: process.env["PROFILE"] })
const rowsDone = batches * size
const workerUs = after.cpu.user + after.cpu.system - before.cpu.user - before.cpu.system
const count = await ask({ type: "query", sql: "SELECT count(*)::int AS n FROM request_log" })
console.log(JSON.stringify({
  method, batches, size, prefill, drop: process.env["DROP"] ?? "", conf: process.env["CONF"] ?? "",
  worker_us_per_row: +(workerUs / rowsDone).toFixed(2),
  worker_sys_us_per_row: +((after.cpu.system - before.cpu.system) / rowsDone).toFixed(2),
  main_us_per_row: +((main1.user + main1.system) / rowsDone).toFixed(2),
  wall_ms_per_batch: +(wall / batches).toFixed(1),
  rows: count.rows[0].n,
  worker_rss_mb: Math.round(after.mem.rss / 1048576)
}))
await runtime.dispose()
await ask({ type: "stop" })
await worker.terminate()
Fs.rmSync(dir, { recursive: true, force: true })
