/**
 * Where the embedded database's Unix socket lives (issue #8, finding 5): inside the data folder; in a private
 * temporary folder when the data folder's path is too long for a socket address; a socket file left by a
 * process that died does not block the next start.
 */
import { Effect, type Layer, ManagedRuntime } from "effect"
import { SqlClient } from "effect/sql"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import * as EmbeddedLock from "../../src/store/EmbeddedLock.js"
import * as Sql from "../../src/store/Sql.js"

const tmp = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-socket-"))
afterAll(() => Fs.rmSync(tmp, { recursive: true, force: true }))

const open = (dataDir: string) => ManagedRuntime.make(Sql.layerSql({ dataDir }) as Layer.Layer<SqlClient.SqlClient, unknown>)
const count = (runtime: ManagedRuntime.ManagedRuntime<SqlClient.SqlClient, unknown>) =>
  runtime.runPromise(Effect.flatMap(SqlClient.SqlClient, (sql) => sql<{ n: number }>`SELECT count(*)::int AS n FROM accounts`).pipe(Effect.orDie))

describe("embedded database socket", () => {
  it("a data folder too deep for a socket address gets its socket in a private temporary folder, removed on close", async () => {
    const dataDir = Path.join(tmp, "d".repeat(60), "e".repeat(60))
    expect(Buffer.byteLength(Path.join(dataDir, ".s.PGSQL.5432"))).toBeGreaterThan(108)
    const runtime = open(dataDir)
    let socket: string
    try {
      expect(await count(runtime)).toEqual([{ n: 0 }])
      socket = EmbeddedLock.currentOwner(dataDir)!.socket!
      expect(socket.startsWith(Os.tmpdir())).toBe(true)
      expect(Path.basename(socket)).toBe(".s.PGSQL.5432")
      expect(Fs.statSync(socket).isSocket()).toBe(true)
      expect(Fs.statSync(Path.dirname(socket)).mode & 0o777).toBe(0o700)
      expect(Fs.statSync(dataDir).mode & 0o777).toBe(0o700)
    } finally {
      await runtime.dispose()
    }
    expect(Fs.existsSync(Path.dirname(socket!))).toBe(false)
  })

  it("a socket file and lock left by a dead process do not block the next start", async () => {
    const dataDir = Path.join(tmp, "crashed")
    Fs.mkdirSync(dataDir, { recursive: true })
    // What a killed gateway leaves: its lock (pid gone) and the socket path taken by a file.
    Fs.writeFileSync(EmbeddedLock.lockFile(dataDir), JSON.stringify({ pid: 2 ** 22 + 4321, socket: Path.join(dataDir, ".s.PGSQL.5432") }))
    Fs.writeFileSync(Path.join(dataDir, ".s.PGSQL.5432"), "")
    const runtime = open(dataDir)
    try {
      expect(await count(runtime)).toEqual([{ n: 0 }])
      const owner = EmbeddedLock.currentOwner(dataDir)
      expect(owner).toEqual({ pid: process.pid, socket: Path.join(Path.resolve(dataDir), ".s.PGSQL.5432") })
      expect(Fs.statSync(owner!.socket!).isSocket()).toBe(true)
      expect(Fs.statSync(owner!.socket!).mode & 0o077).toBe(0)
      // Files from the database's own creation are private too, even without the gateway's umask.
      const loose: Array<string> = []
      const walk = (p: string) => {
        const st = Fs.lstatSync(p)
        if ((st.mode & 0o077) !== 0 && !st.isSymbolicLink()) loose.push(p)
        if (st.isDirectory()) for (const n of Fs.readdirSync(p)) walk(Path.join(p, n))
      }
      walk(Path.join(dataDir, "pglite"))
      expect(loose).toEqual([])
    } finally {
      await runtime.dispose()
    }
    expect(Fs.existsSync(Path.join(dataDir, ".s.PGSQL.5432"))).toBe(false)
  })
})
