/**
 * Every column of every request row comes back as written (after `sanitizeRow`), whatever the text holds, on
 * embedded PGlite and PostgreSQL alike; both store the same rows; rows the writer flushed survive a restart of
 * the embedded database, clean or not.
 */
import { Effect, Layer, ManagedRuntime } from "effect"
import { SqlClient } from "effect/sql"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import type { GatewayConfig } from "../../src/config/GatewayConfig.js"
import { Settings } from "../../src/config/Live.js"
import { startEmbeddedServer } from "../../src/store/EmbeddedWorker.js"
import * as Sql from "../../src/store/Sql.js"
import * as RequestLog from "../../src/telemetry/RequestLog.js"
import { REQUEST_ROW_TYPES, type RequestRow, sanitizeRow } from "../../src/telemetry/RequestRow.js"
import { serviceGate } from "../support/Services.js"
import { backends, settingsFor } from "./backends.js"

const postgres = await serviceGate("postgres")

/** Rows wait until the test flushes; a flush writes them 500 at a time. */
const quiet = (config: GatewayConfig): GatewayConfig => ({ ...config, request_log: { batch_size: 500, flush_ms: 600_000 } })

const COLUMNS = Object.keys(REQUEST_ROW_TYPES) as Array<keyof RequestRow>

/** Texts a hand-made literal, a CSV or an array literal would mangle, and texts the sanitizer must change. */
const ODD = [
  "it's \"quoted\"",
  "back\\slash \\N \\x00 \\\\",
  "{a,b} {\"c\"}",
  "NULL",
  "",
  " leading and trailing ",
  "한국어 😀 ünïcödé ∑",
  "tab\there\nnewline\r\nend",
  "bell\u0007 esc\u001b[31m del\u007f",
  "comma,separated;semi|pipe",
  "$1 ::text ' OR 1=1 --",
  "half \ud83d surrogate",
  "\u2028line\u2029separators"
]

/** `n` rows with every column varied: nulls, odd texts, extreme numbers, booleans both ways. */
const rows = (ids: ReadonlyArray<number>): Array<RequestRow> =>
  ids.map((id, i) => {
    const odd = (k: number) => ODD[(i + k) % ODD.length]!
    return {
      id,
      request_id: `req_${i}_${odd(0)}`,
      account_id: `acc ${odd(1)}`,
      key_id: i % 4 === 0 ? null : i % 4 === 1 ? Number.MAX_SAFE_INTEGER - i : i + 1,
      model_id: odd(2),
      status: (["success", "error", "cancelled"] as const)[i % 3]!,
      error_code: i % 2 === 0 ? null : odd(3),
      http_status: [200, 429, 502, 499][i % 4]!,
      stream: i % 2 === 0,
      input_tokens: i % 5 === 0 ? 2_147_483_647 : i * 7,
      output_tokens: i * 3,
      reasoning_tokens: i % 3,
      prompt_cached_tokens: i % 11,
      weighted_cost: i % 6 === 0 ? 0 : (i * 0.1) + 0.2,
      ttfb_ms: i % 3 === 0 ? null : i,
      duration_ms: i * 13,
      tps: i % 7 === 0 ? 0 : 1 / (i + 3),
      had_tools: i % 3 === 0,
      tool_choice: i % 3 === 0 ? odd(4) : null,
      byok: i % 5 === 0,
      provider: i % 5 === 0 ? odd(5) : null,
      fell_back: i % 10 === 0,
      error: i % 2 === 0 ? null : odd(6),
      created_at: new Date(Date.UTC(2026, 10, 20, 12, 0, 0, i)),
      api: (["chat", "responses", "messages"] as const)[i % 3]!,
      deployment: i % 4 === 0 ? null : odd(7),
      attempts: i % 4
    }
  })

/** The stored rows with `ids`, every column, as plain values. */
const storedRows = (ids: ReadonlyArray<number>) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql<Record<string, unknown>>`SELECT ${sql.literal(COLUMNS.join(", "))} FROM request_log
      WHERE id IN ${sql.in(ids)} ORDER BY id`).pipe(
    Effect.map((found) => found.map((row) => Object.fromEntries(COLUMNS.map((c) => [c, row[c]])))),
    Effect.orDie
  )

const expected = (input: ReadonlyArray<RequestRow>) =>
  input.map((row) => {
    const clean = sanitizeRow(row)!
    return Object.fromEntries(COLUMNS.map((c) => [c, clean[c]]))
  })

/** What each backend stored, compared across backends at the end. */
const storedBy = new Map<string, ReadonlyArray<Record<string, unknown>>>()

for (const backend of backends(postgres)) {
  describe(`request rows, every column (${backend.name})`, () => {
    it("a batch of 1,203 rows (three writes) comes back column for column", async () => {
      const opened = await backend.open(quiet)
      const runtime = ManagedRuntime.make(Layer.provideMerge(RequestLog.layer, opened.layer))
      try {
        const input = await runtime.runPromise(Effect.flatMap(RequestLog.RequestLog, (log) =>
          Effect.gen(function*() {
            const ids = yield* Effect.all(Array.from({ length: 1203 }, () => log.nextId))
            const input = rows(ids)
            for (const row of input) log.record(row)
            yield* log.flush
            expect([log.pending(), log.dropped()]).toEqual([0, 0])
            return input
          })))
        const stored = await runtime.runPromise(storedRows(input.map((r) => r.id)))
        expect(stored).toHaveLength(1203)
        expect(stored).toEqual(expected(input))
        // The sanitizer did change some of them: the test covers texts that reach the database cleaned.
        expect(stored.some((row) => row["model_id"] === "bell esc[31m del")).toBe(true)
        storedBy.set(backend.name, stored)
      } finally {
        await runtime.dispose()
        await opened.close()
      }
    })
  })
}

describe.skipIf(!postgres)("request rows on both backends", () => {
  it("embedded PGlite and PostgreSQL store the same rows", () => {
    const [embedded, server] = [storedBy.get("embedded PGlite"), storedBy.get("PostgreSQL")]
    expect(embedded).toBeDefined()
    expect(server).toEqual(embedded)
  })
})

describe("request rows across restarts of the embedded database", () => {
  const dirs: Array<string> = []
  const fresh = () => {
    const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-rows-"))
    dirs.push(dir)
    return dir
  }
  afterAll(() => {
    for (const dir of dirs) Fs.rmSync(dir, { recursive: true, force: true })
  })

  const settings = Layer.succeed(Settings, settingsFor(true, quiet))

  /** Writes rows through the writer on `sql` and flushes them; returns what it wrote. */
  const writeRows = (sql: Layer.Layer<SqlClient.SqlClient, unknown>, n: number) => {
    const runtime = ManagedRuntime.make(Layer.provideMerge(RequestLog.layer, Layer.merge(sql, settings)))
    return runtime.runPromise(Effect.flatMap(RequestLog.RequestLog, (log) =>
      Effect.gen(function*() {
        const input = rows(yield* Effect.all(Array.from({ length: n }, () => log.nextId)))
        for (const row of input) log.record(row)
        yield* log.flush
        return input
      }))).finally(() => runtime.dispose())
  }

  const readRows = async (sql: Layer.Layer<SqlClient.SqlClient, unknown>, ids: ReadonlyArray<number>) => {
    const runtime = ManagedRuntime.make(sql)
    try {
      return await runtime.runPromise(storedRows(ids))
    } finally {
      await runtime.dispose()
    }
  }

  it("after a clean shutdown, the gateway's store reopens with every row", async () => {
    const dir = fresh()
    const input = await writeRows(Sql.layerSql({ dataDir: dir }), 700)
    expect(await readRows(Sql.layerSql({ dataDir: dir }), input.map((r) => r.id))).toEqual(expected(input))
  })

  it("after the database worker dies without a shutdown, flushed rows are there when it restarts", async () => {
    const dir = fresh()
    const options = {
      dir: Path.join(dir, "pglite"),
      socketPath: Path.join(dir, ".s.PGSQL.5432"),
      postgresqlConf: ["shared_buffers=16MB"],
      maxConnections: 4
    }
    const migrated = (socketPath: string) =>
      Layer.provideMerge(Layer.effectDiscard(Effect.orDie(Sql.runMigrations)), Sql.layerSocket(socketPath, 1))
    const first = await startEmbeddedServer(options)
    let input: ReadonlyArray<RequestRow>
    try {
      input = await writeRows(migrated(options.socketPath), 700)
    } finally {
      // As a crash would: no checkpoint, no clean close of the database.
      await first.terminate()
    }
    const second = await startEmbeddedServer(options)
    try {
      expect(await readRows(migrated(options.socketPath), input.map((r) => r.id))).toEqual(expected(input))
    } finally {
      await second.stop()
    }
  })
})
