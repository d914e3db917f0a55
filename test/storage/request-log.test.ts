/**
 * The request-row writer against hostile rows (issue #8, finding 1), on embedded PGlite and PostgreSQL:
 * every value is bounded and valid before the INSERT; a batch the database still rejects is split until only
 * the bad rows are dropped (counted, logged once per batch); an unreachable database keeps the rows for later;
 * queued rows are written on shutdown.
 */
import { Effect, Layer, Logger, ManagedRuntime, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import * as Net from "node:net"
import pg from "pg"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { GatewayConfig } from "../../src/config/GatewayConfig.js"
import { Settings } from "../../src/config/Live.js"
import * as Sql from "../../src/store/Sql.js"
import * as RequestLog from "../../src/telemetry/RequestLog.js"
import type { RequestRow } from "../../src/telemetry/RequestRow.js"
import { freshDatabase } from "../support/Db.js"
import { serviceGate } from "../support/Services.js"
import { backends, settingsFor, type StoreServices } from "./backends.js"

const postgres = await serviceGate("postgres")

/** The periodic flush never fires during a test: rows wait until the test flushes. */
const quiet = (batch_size = 500) => (config: GatewayConfig): GatewayConfig => ({
  ...config,
  request_log: { batch_size, flush_ms: 600_000 }
})

let seq = 0
const row = (id: number, extra: Partial<RequestRow> = {}): RequestRow => ({
  id,
  request_id: `req_${++seq}`,
  account_id: "acc_test",
  key_id: 1,
  model_id: "ws-lite",
  status: "success",
  error_code: null,
  http_status: 200,
  stream: false,
  input_tokens: 10,
  output_tokens: 20,
  reasoning_tokens: 0,
  prompt_cached_tokens: 0,
  weighted_cost: 50,
  ttfb_ms: 12,
  duration_ms: 40,
  tps: 500,
  had_tools: false,
  tool_choice: null,
  byok: false,
  provider: "sim",
  fell_back: false,
  error: null,
  created_at: new Date(),
  api: "chat",
  deployment: "sim",
  attempts: 1,
  ...extra
})

interface Stored {
  readonly id: number
  readonly model_id: string
  readonly request_id: string
  readonly error: string | null
  readonly error_code: string | null
  readonly tool_choice: string | null
  readonly provider: string | null
  readonly status: string
  readonly http_status: number
  readonly input_tokens: number
  readonly output_tokens: number
  readonly ttfb_ms: number | null
  readonly duration_ms: number
  readonly tps: number
  readonly weighted_cost: number
  readonly key_id: number | null
  readonly created_at: Date
}

const rowsById = (ids: ReadonlyArray<number>) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql<Stored>`SELECT * FROM request_log WHERE id IN ${sql.in(ids)} ORDER BY id`).pipe(Effect.orDie)

const CONTROL = /[\u0000-\u0008\u000b-\u001f\u007f]/
const LONE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/

for (const backend of backends(postgres)) {
  describe(`request log writer (${backend.name})`, () => {
    type R = StoreServices | RequestLog.RequestLog
    let runtime: ManagedRuntime.ManagedRuntime<R, unknown>
    let close: () => Promise<void>
    const logs: Array<string> = []
    const capture = Logger.layer([Logger.make(({ message }) => {
      logs.push((Array.isArray(message) ? message : [message]).map(String).join(" "))
    })])
    const run = <A>(effect: Effect.Effect<A, unknown, R>) => runtime.runPromise(effect.pipe(Effect.provide(capture)))
    const log = RequestLog.RequestLog
    const ids = (n: number) => run(Effect.flatMap(log, (l) => Effect.all(Array.from({ length: n }, () => l.nextId))))

    beforeAll(async () => {
      const opened = await backend.open(quiet(500))
      close = opened.close
      runtime = ManagedRuntime.make(Layer.provideMerge(RequestLog.layer, opened.layer))
      await runtime.runPromise(Effect.void)
    })
    afterAll(async () => {
      await runtime?.dispose()
      await close?.()
    })

    it("hostile texts and numbers are cleaned and bounded, and stored", async () => {
      const [a, b, c, d] = await ids(4)
      const rows = [
        row(a!, { model_id: "x\u0000y", request_id: "r\u0000" + "q".repeat(200), error: "line1\nline2\u0000\u0007 \ud800 end" }),
        row(b!, {
          model_id: "m".repeat(6_000),
          tool_choice: "function:" + "f".repeat(1_000),
          provider: "p\u001b[31m".repeat(100),
          error: "e".repeat(100_000),
          error_code: "c".repeat(1_000)
        }),
        // Out of range for `integer` / not finite for `double precision`.
        row(c!, {
          http_status: 1e12,
          input_tokens: Number.POSITIVE_INFINITY,
          output_tokens: 2 ** 40,
          duration_ms: -5,
          ttfb_ms: Number.NaN,
          tps: Number.NaN,
          weighted_cost: Number.NEGATIVE_INFINITY,
          key_id: 2 ** 60,
          created_at: new Date(Number.NaN)
        }),
        // A surrogate pair cut in half by the length bound, and a lone low surrogate.
        row(d!, { model_id: "a".repeat(127) + "😀" + "z", error: "\udc00tail" })
      ]
      const before = await run(Effect.map(log, (l) => l.dropped()))
      await run(Effect.flatMap(log, (l) => Effect.sync(() => rows.forEach((r) => l.record(r)))))
      await run(Effect.flatMap(log, (l) => l.flush))
      expect(await run(Effect.map(log, (l) => [l.pending(), l.dropped() - before]))).toEqual([0, 0])

      const stored = await run(rowsById([a!, b!, c!, d!]))
      expect(stored.map((s) => Number(s.id))).toEqual([a, b, c, d])
      const [sa, sb, sc, sd] = stored as [Stored, Stored, Stored, Stored]
      expect(sa.model_id).toBe("xy")
      // Cut to 64 first (bounded work), then cleaned.
      expect(sa.request_id).toBe("r" + "q".repeat(62))
      expect(sa.error).toBe("line1\nline2 \ufffd end")
      expect(sb.model_id).toBe("m".repeat(128))
      expect(sb.tool_choice).toHaveLength(80)
      expect(sb.provider!.length).toBeLessThanOrEqual(64)
      expect(sb.provider).not.toMatch(CONTROL)
      expect(sb.error).toBe("e".repeat(500))
      expect(sb.error_code).toHaveLength(64)
      expect(sc).toMatchObject({ http_status: 999, input_tokens: 0, output_tokens: 2_147_483_647, duration_ms: 0, ttfb_ms: 0, tps: 0, weighted_cost: 0, key_id: null })
      expect(Math.abs(sc.created_at.getTime() - Date.now())).toBeLessThan(60_000)
      expect(sd.model_id).toBe("a".repeat(127))
      expect(sd.error).toBe("\ufffdtail")
      for (const s of stored) {
        for (const text of [s.model_id, s.request_id, s.error ?? "", s.provider ?? "", s.tool_choice ?? ""]) {
          expect(text).not.toMatch(LONE)
          expect(text).not.toContain("\u0000")
        }
      }
    })

    it("a batch the database rejects is split: only the bad rows are dropped, counted and logged once", async () => {
      // A rule the sanitizer knows nothing about, so the rejection happens in the database itself (23514).
      await run(Effect.flatMap(SqlClient.SqlClient, (sql) =>
        sql`ALTER TABLE request_log ADD CONSTRAINT test_reject CHECK (model_id <> 'reject-me') NOT VALID`).pipe(Effect.orDie))
      try {
        const batch = await ids(120)
        const bad = new Set([batch[0]!, batch[57]!, batch[58]!, batch[119]!])
        const before = await run(Effect.map(log, (l) => l.dropped()))
        logs.length = 0
        await run(Effect.flatMap(log, (l) =>
          Effect.sync(() => batch.forEach((id) => l.record(row(id, { model_id: bad.has(id) ? "reject-me" : "ws-lite" }))))))
        await run(Effect.flatMap(log, (l) => l.flush))
        expect(await run(Effect.map(log, (l) => [l.pending(), l.dropped() - before]))).toEqual([0, 4])
        const stored = await run(rowsById(batch))
        expect(stored.map((s) => Number(s.id))).toEqual(batch.filter((id) => !bad.has(id)))
        const dropLines = logs.filter((l) => l.includes("request rows dropped"))
        expect(dropLines).toEqual(["request rows dropped: 4 rejected by the database"])
        expect(logs.some((l) => l.includes("will retry"))).toBe(false)

        // The log did not stop: the next flush writes the next rows, and nothing is retried.
        const [next] = await ids(1)
        await run(Effect.flatMap(log, (l) => Effect.sync(() => l.record(row(next!)))))
        await run(Effect.flatMap(log, (l) => l.flush))
        expect((await run(rowsById([next!]))).map((s) => Number(s.id))).toEqual([next])
        expect(await run(Effect.map(log, (l) => l.dropped() - before))).toBe(4)
      } finally {
        await run(Effect.flatMap(SqlClient.SqlClient, (sql) =>
          sql`ALTER TABLE request_log DROP CONSTRAINT test_reject`).pipe(Effect.orDie))
      }
    })

    it("a failure that is not about the rows keeps them for the next flush", async () => {
      // A missing table is not the rows' fault (e.g. a migration in progress): nothing is dropped.
      await run(Effect.flatMap(SqlClient.SqlClient, (sql) =>
        sql`ALTER TABLE request_log RENAME TO request_log_away`).pipe(Effect.orDie))
      const batch = await ids(3)
      const before = await run(Effect.map(log, (l) => l.dropped()))
      try {
        await run(Effect.flatMap(log, (l) => Effect.sync(() => batch.forEach((id) => l.record(row(id))))))
        await run(Effect.flatMap(log, (l) => l.flush))
        await run(Effect.flatMap(log, (l) => l.flush))
        expect(await run(Effect.map(log, (l) => [l.pending(), l.dropped() - before]))).toEqual([3, 0])
      } finally {
        await run(Effect.flatMap(SqlClient.SqlClient, (sql) =>
          sql`ALTER TABLE request_log_away RENAME TO request_log`).pipe(Effect.orDie))
      }
      await run(Effect.flatMap(log, (l) => l.flush))
      expect(await run(Effect.map(log, (l) => l.pending()))).toBe(0)
      expect((await run(rowsById(batch))).map((s) => Number(s.id))).toEqual(batch)
    })
  })
}

describe("classifying write failures", () => {
  it("row rejections are data, constraint and limit errors; network errors and others are not", () => {
    const db = (code: string) => ({ cause: Object.assign(new Error("x"), { code, severity: "ERROR" }) })
    expect(RequestLog.isRowRejection(db("22021"))).toBe(true)
    expect(RequestLog.isRowRejection(db("22P02"))).toBe(true)
    expect(RequestLog.isRowRejection(db("54000"))).toBe(true)
    expect(RequestLog.isRowRejection(db("23514"))).toBe(true)
    expect(RequestLog.isRowRejection(db("08006"))).toBe(false)
    expect(RequestLog.isRowRejection(db("57P01"))).toBe(false)
    expect(RequestLog.isRowRejection(db("42P01"))).toBe(false)
    expect(RequestLog.isRowRejection({ cause: Object.assign(new Error("x"), { code: "EPIPE" }) })).toBe(false)
    expect(RequestLog.isRowRejection({ cause: Object.assign(new Error("x"), { code: "ECONNREFUSED" }) })).toBe(false)
  })
})

/** A TCP relay to PostgreSQL that can be cut (connections reset, port refused) and restored on the same port. */
const relay = async (target: { host: string; port: number }) => {
  const sockets = new Set<Net.Socket>()
  let server: Net.Server | null = null
  let port = 0
  const open = () =>
    new Promise<void>((resolve, reject) => {
      const s = Net.createServer((client) => {
        const upstream = Net.connect(target)
        sockets.add(client).add(upstream)
        const drop = () => {
          client.destroy()
          upstream.destroy()
          sockets.delete(client)
          sockets.delete(upstream)
        }
        client.on("error", drop).on("close", drop)
        upstream.on("error", drop).on("close", drop)
        client.pipe(upstream).pipe(client)
      })
      s.once("error", reject)
      s.listen(port, "127.0.0.1", () => {
        port = (s.address() as Net.AddressInfo).port
        server = s
        resolve()
      })
    })
  await open()
  return {
    port: () => port,
    cut: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy()
        sockets.clear()
        server!.close(() => resolve())
      }),
    restore: open
  }
}

describe.skipIf(!postgres)("request log writer while PostgreSQL is unreachable", () => {
  it("rows are kept (not dropped) while the connection is down, and written once it is back", async () => {
    const db = await freshDatabase("rl_down")
    const migrated = ManagedRuntime.make(Sql.layerSql({ databaseUrl: Redacted.make(db.url), dataDir: "unused" }))
    await migrated.runPromise(Effect.void)
    await migrated.dispose()
    const path = new URL(db.url)
    const proxy = await relay({ host: path.hostname, port: Number(path.port) })
    const viaProxy = `postgres://${path.username}@127.0.0.1:${proxy.port()}${path.pathname}`
    const runtime = ManagedRuntime.make(
      Layer.provideMerge(
        RequestLog.layer,
        Layer.merge(Sql.layerPostgres(Redacted.make(viaProxy), 2), Layer.succeed(Settings, settingsFor(false, quiet())))
      )
    )
    const admin = new pg.Client({ connectionString: db.url })
    await admin.connect()
    try {
      const run = <A>(effect: Effect.Effect<A, unknown, RequestLog.RequestLog>) => runtime.runPromise(effect)
      const log = RequestLog.RequestLog
      const batch = await run(Effect.flatMap(log, (l) => Effect.all(Array.from({ length: 6 }, () => l.nextId))))
      await run(Effect.flatMap(log, (l) => Effect.sync(() => batch.slice(0, 5).forEach((id) => l.record(row(id))))))

      await proxy.cut()
      await run(Effect.flatMap(log, (l) => l.flush))
      await run(Effect.flatMap(log, (l) => Effect.sync(() => l.record(row(batch[5]!)))))
      await run(Effect.flatMap(log, (l) => l.flush))
      expect(await run(Effect.map(log, (l) => [l.pending(), l.dropped()]))).toEqual([6, 0])

      await proxy.restore()
      await run(Effect.flatMap(log, (l) => l.flush))
      expect(await run(Effect.map(log, (l) => [l.pending(), l.dropped()]))).toEqual([0, 0])
      const { rows } = await admin.query("SELECT id FROM request_log ORDER BY id")
      expect(rows.map((r) => Number(r.id))).toEqual(batch)
    } finally {
      await admin.end()
      await runtime.dispose()
      await proxy.cut()
      await db.drop()
    }
  })
})

describe("queued rows are written on shutdown", () => {
  for (const backend of backends(postgres)) {
    it(`closing the writer flushes what is queued (${backend.name})`, async () => {
      const opened = await backend.open(quiet())
      try {
        const store = ManagedRuntime.make(opened.layer)
        const context = await store.context()
        const writer = ManagedRuntime.make(
          RequestLog.layer.pipe(Layer.provide(Layer.succeedContext(context)))
        )
        const ids = await writer.runPromise(Effect.flatMap(RequestLog.RequestLog, (l) =>
          Effect.all(Array.from({ length: 7 }, () => l.nextId)).pipe(
            Effect.tap((ids) => Effect.sync(() => ids.forEach((id, i) => l.record(row(id, { model_id: i === 0 ? "x\u0000y" : "ws-lite" })))))
          )))
        expect(await writer.runPromise(Effect.map(RequestLog.RequestLog, (l) => l.pending()))).toBe(7)
        await writer.dispose()
        const stored = await store.runPromise(rowsById(ids))
        expect(stored.map((s) => Number(s.id))).toEqual(ids)
        await store.dispose()
      } finally {
        await opened.close()
      }
    })
  }
})
