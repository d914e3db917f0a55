/**
 * The embedded database serves several connections at once (the gateway's, and the operator CLI attached to a
 * running gateway) through one PGlite session. Each extended-protocol query (Parse, Bind, Execute, Sync) keeps its
 * unnamed statement and portal from Parse to Sync, so another connection's messages must not run in between:
 * otherwise a query gets another query's rows, or fails with "portal does not exist". Two clients here run
 * queries of different shapes at once; every answer must be its own query's.
 */
import { Effect, type Layer, ManagedRuntime } from "effect"
import { SqlClient } from "effect/sql"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import * as EmbeddedLock from "../../src/store/EmbeddedLock.js"
import * as Sql from "../../src/store/Sql.js"

const tmp = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-connections-"))
afterAll(() => Fs.rmSync(tmp, { recursive: true, force: true }))

type Runtime = ManagedRuntime.ManagedRuntime<SqlClient.SqlClient, unknown>

describe("embedded database with two connections", () => {
  it("queries of two connections at once each get their own rows", async () => {
    const dataDir = Path.join(tmp, "data")
    const gateway: Runtime = ManagedRuntime.make(Sql.layerSql({ dataDir }) as Layer.Layer<SqlClient.SqlClient, unknown>)
    let attached: Runtime | undefined
    try {
      await gateway.runPromise(Effect.flatMap(SqlClient.SqlClient, (sql) => sql`SELECT 1`).pipe(Effect.orDie))
      const socket = EmbeddedLock.currentOwner(dataDir)!.socket!
      attached = ManagedRuntime.make(Sql.layerSocket(socket, 1) as Layer.Layer<SqlClient.SqlClient, unknown>)
      const N = 300
      // Different statements, parameters and row shapes on each side, so a crossed answer cannot look right.
      const one = (runtime: Runtime, side: "a" | "b", i: number) =>
        runtime.runPromise(Effect.flatMap(SqlClient.SqlClient, (sql): Effect.Effect<ReadonlyArray<unknown>, unknown> =>
          side === "a"
            ? (i % 2 === 0
              // As the status refresh runs one of its queries.
              ? sql.withTransaction(Effect.andThen(sql`SET LOCAL enable_bitmapscan = off`, sql<{ v: number }>`SELECT ${i}::int * 2 AS v`))
              : sql<{ v: number }>`SELECT ${i}::int * 2 AS v`).pipe(Effect.map((rows) => rows.map((r) => r.v)))
            : sql<{ w: string }>`SELECT repeat(${"b"}, g) AS w FROM generate_series(1, ${(i % 5) + 1}::int) g`.pipe(
              Effect.map((rows) => rows.map((r) => r.w))
            )
        ).pipe(Effect.match({ onSuccess: (rows): unknown => rows, onFailure: (e) => `error: ${String(e)}` })))
      const [a, b] = await Promise.all([
        Promise.all(Array.from({ length: N }, (_, i) => one(gateway, "a", i))),
        Promise.all(Array.from({ length: N }, (_, i) => one(attached!, "b", i)))
      ])
      expect(a).toEqual(Array.from({ length: N }, (_, i) => [i * 2]))
      expect(b).toEqual(Array.from({ length: N }, (_, i) => Array.from({ length: (i % 5) + 1 }, (_, g) => "b".repeat(g + 1))))
    } finally {
      await attached?.dispose()
      await gateway.dispose()
    }
  }, 60_000)
})
