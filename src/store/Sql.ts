import { Migrator, SqlClient } from "@effect/sql"
import { PgClient } from "@effect/sql-pg"
import { Data, Duration, Effect, Layer, Redacted } from "effect"
import * as Fs from "node:fs"
import * as Path from "node:path"
import * as EmbeddedLock from "./EmbeddedLock.js"
import migration0001 from "./migrations/0001_init.js"
import migration0002 from "./migrations/0002_account_api.js"

export class StoreError extends Data.TaggedError("StoreError")<{ readonly message: string; readonly cause?: unknown }> {}

export const migrations = Migrator.fromRecord({
  "0001_init": migration0001,
  "0002_account_api": migration0002
})

export const runMigrations = Migrator.make({})({ loader: migrations, table: "wellspring_migrations" })

/** `int8` and `numeric` come back as JS numbers; our counters stay far below 2^53. */
const EMBEDDED_POSTGRES_CONF = ["shared_buffers=16MB", "work_mem=4MB", "maintenance_work_mem=16MB", "wal_buffers=1MB"]

const pgTypes = async () => {
  const pg = await import("pg")
  const base = pg.default.types
  return {
    getTypeParser: ((oid: number, format?: "text" | "binary") =>
      oid === 20 || oid === 1700
        ? (value: string) => Number(value)
        : base.getTypeParser(oid, format as "text")) as typeof base.getTypeParser
  }
}
/** `host:port/database` of a connection URL, without credentials (for messages). */
export const describeDatabaseUrl = (url: string): string => {
  try {
    const parsed = new URL(url)
    return `${parsed.hostname}:${parsed.port || "5432"}${parsed.pathname}`
  } catch {
    return "(unparseable DATABASE_URL)"
  }
}

/** The innermost message of an error's `cause` chain, e.g. `connect ECONNREFUSED 127.0.0.1:5432`. */
export const rootMessage = (error: unknown): string => {
  let current = error
  for (let depth = 0; depth < 8; depth++) {
    const next = (current as { cause?: unknown } | null)?.cause
    if (next === undefined || next === null) break
    current = next
  }
  const message = (current as { message?: unknown } | null)?.message
  return typeof message === "string" && message ? message : String(current)
}

/** Connects to a real PostgreSQL server; an unreachable server fails with one clear StoreError. */
export const layerPostgres = (url: Redacted.Redacted<string>, maxConnections = 10) =>
  Layer.unwrapEffect(
    Effect.promise(pgTypes).pipe(Effect.map((types) =>
      PgClient.layer({
        url,
        maxConnections,
        connectTimeout: Duration.seconds(5),
        types
      })
    ))
  ).pipe(Layer.mapError((cause) =>
    new StoreError({
      message: `cannot connect to PostgreSQL at ${describeDatabaseUrl(Redacted.value(url))}: ${rootMessage(cause)}`,
      cause
    })
  ))

/**
 * Embedded mode: PGlite with its data under `dataDir/pglite`, served on a loopback port by
 * pglite-socket and reached through the same PgClient as production.
 */
export const layerEmbedded = (dataDir: string) =>
  Layer.unwrapScoped(Effect.gen(function*() {
    const dir = Path.resolve(dataDir, "pglite")
    yield* Effect.try({
      try: () => Fs.mkdirSync(dir, { recursive: true }),
      catch: (cause) => new StoreError({ message: `cannot create data folder ${dir}`, cause })
    })
    // PGlite does not lock its folder; a second process would corrupt it.
    yield* EmbeddedLock.acquire(dataDir).pipe(
      Effect.mapError((cause) => new StoreError({ message: cause.message, cause }))
    )
    const { PGlite } = yield* Effect.promise(() => import("@electric-sql/pglite"))
    const { PGLiteSocketServer } = yield* Effect.promise(() => import("@electric-sql/pglite-socket"))
    const db = yield* Effect.acquireRelease(
      Effect.tryPromise({
        // Small buffers: the gateway's tables are small and hot rows live in its own caches (~140 MB less RSS).
        try: () => PGlite.create(dir, { postgresqlconf: EMBEDDED_POSTGRES_CONF }),
        catch: (cause) => new StoreError({ message: `cannot open embedded database in ${dir}`, cause })
      }),
      (db) => Effect.promise(() => db.close()).pipe(Effect.ignore)
    )
    const server = new PGLiteSocketServer({ db, host: "127.0.0.1", port: 0, maxConnections: 8 })
    yield* Effect.acquireRelease(
      Effect.tryPromise({
        try: () => server.start(),
        catch: (cause) => new StoreError({ message: "cannot start embedded database socket", cause })
      }),
      () => Effect.promise(() => server.stop()).pipe(Effect.ignore)
    )
    const port = Number(server.getServerConn().split(":").pop())
    // Lets the operator CLI attach to this process instead of opening the folder itself.
    EmbeddedLock.publishPort(dataDir, port)
    return layerLoopback(port)
  }))

/** PgClient for a pglite-socket on a loopback port: our own embedded store, or a running gateway's (CLI). */
export const layerLoopback = (port: number, maxConnections = 1) =>
  Layer.unwrapEffect(
    Effect.promise(pgTypes).pipe(Effect.map((types) =>
      PgClient.layer({
        host: "127.0.0.1",
        port,
        username: "postgres",
        database: "postgres",
        maxConnections,
        connectTimeout: Duration.seconds(5),
        types
      })
    ))
  )

/**
 * `NOTIFY channel, payload` with the payload bound as a parameter. `PgClient.notify` of sql-pg 0.53 sends
 * `NOTIFY "channel", $1`, which PostgreSQL rejects (NOTIFY takes no parameters); `pg_notify` does.
 */
export const notify = (sql: SqlClient.SqlClient, channel: string, payload: string) =>
  sql`SELECT pg_notify(${channel}, ${payload})`.pipe(Effect.asVoid)

/** SqlClient with migrations applied. */
export const layerSql = (options: { readonly databaseUrl?: Redacted.Redacted<string> | undefined; readonly dataDir: string }) => {
  const client = options.databaseUrl ? layerPostgres(options.databaseUrl) : layerEmbedded(options.dataDir)
  const migrated = Layer.effectDiscard(
    runMigrations.pipe(
      Effect.mapError((cause) => new StoreError({ message: `database migration failed: ${String(cause)}`, cause }))
    )
  )
  return Layer.provideMerge(migrated, client)
}

export type Sql = SqlClient.SqlClient
