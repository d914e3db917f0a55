/**
 * Replicas starting together on an empty PostgreSQL database (issue #8, finding 12): migrations serialize on an
 * advisory lock, so every replica boots and each migration is applied exactly once.
 */
import { Effect, Exit, type Layer, ManagedRuntime, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import pg from "pg"
import { afterEach, describe, expect, it } from "vitest"
import * as Sql from "../../src/store/Sql.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { serviceGate } from "../support/Services.js"
import { eventually } from "../support/Eventually.js"

const postgres = await serviceGate("postgres")

describe.skipIf(!postgres)("migrations of replicas starting together (PostgreSQL)", () => {
  const cleanups: Array<() => Promise<void>> = []
  afterEach(async () => {
    for (const c of cleanups.splice(0).reverse()) await c()
  })

  const bootTogether = async (db: FreshDatabase, replicas: number) => {
    const runtimes = Array.from({ length: replicas }, () =>
      ManagedRuntime.make(
        Sql.layerSql({ databaseUrl: Redacted.make(db.url), dataDir: "unused" }) as Layer.Layer<SqlClient.SqlClient, unknown>
      ))
    cleanups.push(async () => {
      await Promise.all(runtimes.map((r) => r.dispose()))
    })
    return Promise.all(runtimes.map((r) => r.runPromiseExit(Effect.void)))
  }

  for (let round = 1; round <= 3; round++) {
    it(`4 replicas on a fresh database all boot; every migration applied once (round ${round})`, async () => {
      const db = await freshDatabase("migrate")
      cleanups.push(db.drop)
      const exits = await bootTogether(db, 4)
      for (const exit of exits) expect(Exit.isSuccess(exit), String(Exit.isFailure(exit) ? exit.cause : "")).toBe(true)

      const client = new pg.Client({ connectionString: db.url })
      await client.connect()
      try {
        const known = await Effect.runPromise(Sql.migrations)
        const { rows } = await client.query("SELECT migration_id, name FROM wellspring_migrations ORDER BY migration_id")
        expect(rows.map((r) => [r.migration_id, r.name])).toEqual(known.map(([id, name]) => [id, name]))
        const tables = await client.query(
          "SELECT count(*)::int AS n FROM information_schema.tables WHERE table_schema = 'public' AND table_name = 'request_log'"
        )
        expect(tables.rows[0].n).toBe(1)
        // The lock is released once the replicas have booted (a later replica does not wait for it).
        const held = await client.query(
          "SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND objid = $1 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
          [Sql.MIGRATION_LOCK_KEY]
        )
        expect(held.rows[0].n).toBe(0)
      } finally {
        await client.end()
      }
    })
  }

  it("a replica waits while another holds the migration lock, then boots", async () => {
    const db = await freshDatabase("migrate_wait")
    cleanups.push(db.drop)
    const holder = new pg.Client({ connectionString: db.url })
    await holder.connect()
    cleanups.push(() => holder.end())
    await holder.query("SELECT pg_advisory_lock($1)", [Sql.MIGRATION_LOCK_KEY])
    const booting = bootTogether(db, 1)
    // The replica is blocked on the lock: its session shows up waiting for the advisory lock.
    await eventually(async () => {
      const { rows } = await holder.query(
        "SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND objid = $1 AND NOT granted",
        [Sql.MIGRATION_LOCK_KEY]
      )
      return rows[0].n === 1
    }, { timeoutMs: 10_000, everyMs: 20, what: "the replica waiting for the migration lock" })
    const before = await holder.query("SELECT to_regclass('wellspring_migrations') AS t")
    expect(before.rows[0].t).toBeNull()
    await holder.query("SELECT pg_advisory_unlock($1)", [Sql.MIGRATION_LOCK_KEY])
    const [exit] = await booting
    expect(Exit.isSuccess(exit!)).toBe(true)
    const after = await holder.query("SELECT count(*)::int AS n FROM wellspring_migrations")
    expect(after.rows[0].n).toBeGreaterThan(0)
  })
})
