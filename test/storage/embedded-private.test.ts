/**
 * `npm start` as its own process (issue #8, findings 5 and 12):
 * - embedded mode serves its database on a Unix socket inside the data folder, never on a TCP port; the folder
 *   and everything the gateway keeps in it are owner-only (also a folder left 0755/0644 by an older version);
 *   another OS user can neither connect nor read; the CLI still attaches; queued request rows (hostile ones
 *   included) are in the database after SIGTERM;
 * - production mode (DATABASE_URL) never creates the dev account nor prints a key.
 */
import { Effect, type Layer, ManagedRuntime } from "effect"
import { SqlClient } from "effect/sql"
import * as ChildProcess from "node:child_process"
import * as Crypto from "node:crypto"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import pg from "pg"
import { afterAll, describe, expect, it } from "vitest"
import * as Yaml from "yaml"
import * as Sql from "../../src/store/Sql.js"
import { freshDatabase } from "../support/Db.js"
import { defaultConfigDoc } from "../support/Gateway.js"
import { serviceGate } from "../support/Services.js"
import { cleanEnv, closedPort, runTs, startTs } from "../foundation/spawn.js"

const postgres = await serviceGate("postgres")

const tmp = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-private-"))
// Readable by everyone, so only the data folder's own modes keep other users out.
Fs.chmodSync(tmp, 0o755)
afterAll(() => Fs.rmSync(tmp, { recursive: true, force: true }))

/** TCP ports process `pid` listens on (Linux: its socket inodes matched against /proc/net/tcp{,6}). */
const tcpListenPorts = (pid: number): Array<number> => {
  const inodes = new Set<string>()
  for (const fd of Fs.readdirSync(`/proc/${pid}/fd`)) {
    try {
      const m = /^socket:\[(\d+)\]$/.exec(Fs.readlinkSync(`/proc/${pid}/fd/${fd}`))
      if (m) inodes.add(m[1]!)
    } catch {
      // fd closed meanwhile
    }
  }
  const ports: Array<number> = []
  for (const table of ["/proc/net/tcp", "/proc/net/tcp6"]) {
    if (!Fs.existsSync(table)) continue
    for (const line of Fs.readFileSync(table, "utf8").split("\n").slice(1)) {
      const cols = line.trim().split(/\s+/)
      if (cols.length < 10) continue
      if (cols[3] === "0A" && inodes.has(cols[9]!)) ports.push(parseInt(cols[1]!.split(":")[1]!, 16))
    }
  }
  return ports.sort((a, b) => a - b)
}

/** Every path under `root` whose mode lets group or others in (symlinks excluded). */
const openToOthers = (root: string): Array<string> => {
  const found: Array<string> = []
  const walk = (p: string) => {
    const st = Fs.lstatSync(p)
    if (st.isSymbolicLink()) return
    if ((st.mode & 0o077) !== 0) found.push(`${p} ${(st.mode & 0o777).toString(8)}`)
    if (st.isDirectory()) for (const n of Fs.readdirSync(p)) walk(Path.join(p, n))
  }
  walk(root)
  return found
}

/**
 * A copy of this Node binary that `nobody` can run. The project's own binary lives inside the checkout, which may
 * sit in a folder other users cannot enter (a 0700 home, `mktemp -d`); the copy lives in `tmp`, which is 0755.
 */
let nodeForOthers: string | null = null
const nodeBinaryForOthers = () => {
  if (nodeForOthers === null) {
    nodeForOthers = Path.join(tmp, "node")
    Fs.copyFileSync(process.execPath, nodeForOthers)
    Fs.chmodSync(nodeForOthers, 0o755)
  }
  return nodeForOthers
}

/** Runs a snippet as the unprivileged user `nobody` (only possible when the tests run as root). */
const asNobody = (code: string) =>
  new Promise<string>((resolve, reject) => {
    const child = ChildProcess.spawn(nodeBinaryForOthers(), ["-e", code], { uid: 65534, gid: 65534, stdio: ["ignore", "pipe", "pipe"], cwd: "/" })
    let out = ""
    child.stdout.on("data", (d: Buffer) => (out += d.toString()))
    child.stderr.on("data", (d: Buffer) => (out += d.toString()))
    child.on("error", reject)
    child.on("close", () => resolve(out.trim()))
  })

const chat = (port: number, key: string, model: string) =>
  fetch(`http://127.0.0.1:${port}/v1/chat/completions`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify({ model, messages: [{ role: "user", content: "안녕" }] })
  })

describe("embedded database is private", () => {
  it("Unix socket in a 0700 folder, no TCP port for the database, CLI attaches, rows flushed on SIGTERM", async () => {
    const dataDir = Path.join(tmp, "data")
    // A data folder as an older version left it: world-readable folders and key file.
    Fs.mkdirSync(Path.join(dataDir, "pglite"), { recursive: true, mode: 0o755 })
    Fs.chmodSync(dataDir, 0o755)
    Fs.chmodSync(Path.join(dataDir, "pglite"), 0o755)
    Fs.writeFileSync(Path.join(dataDir, "encryption.key"), Crypto.randomBytes(32).toString("base64") + "\n")
    Fs.chmodSync(Path.join(dataDir, "encryption.key"), 0o644)
    const configFile = Path.join(tmp, "gateway.yaml")
    const doc = defaultConfigDoc()
    // Rows wait in the queue until shutdown.
    doc.request_log = { batch_size: 500, flush_ms: 600_000 }
    Fs.writeFileSync(configFile, Yaml.stringify(doc))

    const port = await closedPort()
    const env = cleanEnv({ WELLSPRING_PORT: String(port), WELLSPRING_DATA_DIR: dataDir, WELLSPRING_CONFIG: configFile })
    const gw = startTs("src/main.ts", [], env)
    let sent = 0
    try {
      const key = (await gw.waitFor(/^API key: (\S+)$/m, 120_000))[1]!
      await gw.waitFor(/ready in \d+ ms/)

      // The lock names the socket, not a port; the socket is in the data folder.
      const lock = JSON.parse(Fs.readFileSync(Path.join(dataDir, "embedded.lock"), "utf8")) as Record<string, unknown>
      const socket = Path.join(Path.resolve(dataDir), ".s.PGSQL.5432")
      expect(lock).toEqual({ pid: gw.pid, socket })
      const st = Fs.statSync(socket)
      expect(st.isSocket()).toBe(true)
      expect(st.mode & 0o077).toBe(0)

      // The only TCP port the gateway listens on is its HTTP listener's (on `limits.accept_sockets` sockets).
      expect([...new Set(tcpListenPorts(gw.pid))]).toEqual([port])

      // The folder and everything in it (the old key file too) is owner-only.
      expect(Fs.statSync(dataDir).mode & 0o777).toBe(0o700)
      expect(openToOthers(dataDir)).toEqual([])

      if (process.getuid?.() === 0) {
        // Another local user can neither reach the socket nor read the key.
        const connect = await asNobody(
          `require("net").connect(${JSON.stringify(socket)}).on("connect", () => { console.log("CONNECTED"); process.exit(0) })` +
            `.on("error", (e) => { console.log(e.code); process.exit(0) })`
        )
        expect(connect).toBe("EACCES")
        const read = await asNobody(
          `try { require("fs").readFileSync(${JSON.stringify(Path.join(dataDir, "encryption.key"))}); console.log("READ") } catch (e) { console.log(e.code) }`
        )
        expect(read).toBe("EACCES")
      }

      // The operator CLI attaches through the socket.
      const listed = await runTs("src/cli.ts", ["key:list", "--username", "dev"], env)
      expect(listed.code, listed.stderr).toBe(0)
      expect(listed.stdout).toContain(key.slice(0, 16))

      for (const model of ["ws-lite", "x\u0000y", "ws-lite", "m".repeat(6_000), "ws-lite"]) {
        const res = await chat(port, key, model)
        expect(res.status).toBeLessThan(500)
        await res.text()
        sent++
      }
    } finally {
      expect(await gw.stop()).toBe(0)
    }
    expect(Fs.existsSync(Path.join(dataDir, "embedded.lock"))).toBe(false)
    expect(Fs.existsSync(Path.join(dataDir, ".s.PGSQL.5432"))).toBe(false)

    // Every queued row was written on SIGTERM.
    const store = ManagedRuntime.make(Sql.layerSql({ dataDir }) as Layer.Layer<SqlClient.SqlClient, unknown>)
    try {
      const rows = await store.runPromise(Effect.flatMap(SqlClient.SqlClient, (sql) =>
        sql<{ model_id: string }>`SELECT model_id FROM request_log ORDER BY id`).pipe(Effect.orDie))
      expect(rows).toHaveLength(sent)
      expect(rows.filter((r) => r.model_id === "ws-lite")).toHaveLength(3)
      for (const r of rows) expect(r.model_id.length).toBeLessThanOrEqual(128)
    } finally {
      await store.dispose()
    }
  })
})

describe.skipIf(!postgres)("production first start (PostgreSQL)", () => {
  it("creates no account and prints no key, even with dev_account: true", async () => {
    const db = await freshDatabase("prod_boot")
    const port = await closedPort()
    const gw = startTs("src/main.ts", [], cleanEnv({
      DATABASE_URL: db.url,
      WELLSPRING_PORT: String(port),
      WELLSPRING_DATA_DIR: Path.join(tmp, "prod-data")
    }))
    try {
      await gw.waitFor(/ready in \d+ ms/, 120_000)
      // A full round trip after "ready": anything printed at startup is in the output by now.
      const res = await fetch(`http://127.0.0.1:${port}/v1/models`)
      expect(res.status).toBe(401)
      expect(gw.output()).not.toContain("API key:")
      expect(gw.output()).not.toMatch(/sk-ws-[0-9A-Za-z]{43}/)
      const admin = new pg.Client({ connectionString: db.url })
      await admin.connect()
      try {
        expect((await admin.query("SELECT count(*)::int AS n FROM accounts")).rows[0].n).toBe(0)
        expect((await admin.query("SELECT count(*)::int AS n FROM api_keys")).rows[0].n).toBe(0)
      } finally {
        await admin.end()
      }
      // Production mode keeps nothing in the data folder.
      expect(Fs.existsSync(Path.join(tmp, "prod-data"))).toBe(false)
    } finally {
      expect(await gw.stop()).toBe(0)
      await db.drop()
    }
  })
})
