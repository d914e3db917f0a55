/** Embedded mode: sql-pg 4 (own wire protocol, binary results) against PGlite 0.5.14 via pglite-socket 0.2.17. */
import { NodeRuntime } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { Duration, Effect, Exit } from "effect"
import { Migrator, SqlClient } from "effect/sql"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"

const program = Effect.gen(function*() {
  const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "v4map-pglite-"))
  const { PGlite } = yield* Effect.promise(() => import("@electric-sql/pglite"))
  const { PGLiteSocketServer } = yield* Effect.promise(() => import("@electric-sql/pglite-socket"))
  const db = yield* Effect.acquireRelease(Effect.promise(() => PGlite.create(Path.join(dir, "pglite"))), (db) => Effect.promise(() => db.close()))
  const socketPath = Path.join(dir, ".s.PGSQL.5432")
  const server = new PGLiteSocketServer({ db, path: socketPath, maxConnections: 8 })
  yield* Effect.acquireRelease(Effect.promise(() => server.start()), () => Effect.promise(() => server.stop()))
  for (const maxConnections of [1, 4]) {
    const result = yield* Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      yield* Migrator.make({})({ loader: Migrator.fromRecord({ "0001_t": Effect.gen(function*() {
        const sql = yield* SqlClient.SqlClient
        yield* sql`CREATE TABLE t (id serial PRIMARY KEY, n int8, at timestamptz DEFAULT now(), j jsonb)`
      }) }), table: "mig" })
      yield* sql`INSERT INTO t (n, j) VALUES (${42}, ${JSON.stringify({ a: 1 })}::jsonb)`
      const rows = yield* sql`SELECT id, n, at, j, count(*) OVER ()::int AS c FROM t`
      const many = yield* Effect.all(Array.from({ length: 20 }, (_, i) => sql`SELECT ${i}::int AS i`), { concurrency: "unbounded" })
      const bad = yield* Effect.exit(sql`SELECT * FROM missing_table`)
      const after = yield* sql`SELECT 1 AS ok`
      return { rows, concurrent: many.length, badIsFailure: Exit.isFailure(bad), after }
    }).pipe(Effect.provide(PgClient.layer({ host: dir, port: 5432, username: "postgres", database: "postgres", maxConnections, connectTimeout: Duration.seconds(5) })))
    console.log(`maxConnections=${maxConnections}`, JSON.stringify(result, (_k, v) => typeof v === "bigint" ? `${v}n` : v))
    yield* Effect.promise(() => db.exec("DROP TABLE t; DROP TABLE mig;"))
  }
  Fs.rmSync(dir, { recursive: true, force: true })
}).pipe(Effect.scoped)

NodeRuntime.runMain(program)
