import { Migrator, SqlClient } from "@effect/sql"
import { PgClient } from "@effect/sql-pg"
import { Data, Duration, Effect, Layer, Redacted } from "effect"
import * as Fs from "node:fs"
import * as Path from "node:path"
import migration0001 from "./migrations/0001_init.js"

export class StoreError extends Data.TaggedError("StoreError")<{ readonly message: string; readonly cause?: unknown }> {}

export const migrations = Migrator.fromRecord({
  "0001_init": migration0001
})

export const runMigrations = Migrator.make({})({ loader: migrations, table: "wellspring_migrations" })

/** `int8` and `numeric` come back as JS numbers; our counters stay far below 2^53. */
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
/** Connects to a real PostgreSQL server. */
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
  )

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
    const { PGlite } = yield* Effect.promise(() => import("@electric-sql/pglite"))
    const { PGLiteSocketServer } = yield* Effect.promise(() => import("@electric-sql/pglite-socket"))
    const db = yield* Effect.acquireRelease(
      Effect.tryPromise({
        try: () => PGlite.create(dir),
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
    const types = yield* Effect.promise(pgTypes)
    return PgClient.layer({
      host: "127.0.0.1",
      port,
      username: "postgres",
      database: "postgres",
      maxConnections: 1,
      connectTimeout: Duration.seconds(5),
      types
    })
  }))

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
