/**
 * The operator CLI against a fresh PostgreSQL database and a gateway on the same database; plus embedded mode.
 * `spawned` runs it as its own process (`node --import tsx src/cli.ts`, what `npm run cli` runs): exit codes,
 * stdout/stderr, and the NOTIFY reaching a gateway in another process. `inProcess` calls the same `run`
 * (argv, output and env in, exit code out) to keep the many argument cases cheap on a shared CPU.
 */
import { Effect } from "effect"
import * as ChildProcess from "node:child_process"
import * as Crypto from "node:crypto"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import pg from "pg"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as Yaml from "yaml"
import { Auth } from "../../src/auth/Auth.js"
import { run as runCli } from "../../src/cli.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { authed, defaultConfigDoc, startGateway, type TestGateway } from "../support/Gateway.js"
import { POSTGRES, serviceGate } from "../support/Services.js"
import { cleanEnv, closedPort, type Finished, runTs } from "./spawn.js"
import { eventually } from "../support/Eventually.js"

const postgres = await serviceGate("postgres")

const spawned = (args: ReadonlyArray<string>, env: Record<string, string> = {}) =>
  runTs("src/cli.ts", args, cleanEnv(env))

const inProcess = async (args: ReadonlyArray<string>, env: Record<string, string> = {}): Promise<Finished> => {
  let stdout = ""
  let stderr = ""
  const code = await runCli(args, { out: (s) => (stdout += s), err: (s) => (stderr += s) }, cleanEnv(env))
  return { code, stdout, stderr }
}

const status = async (gw: TestGateway, key: string) =>
  (await fetch(`${gw.url}/v1/models`, { headers: authed(key) })).status


const expectUsageError = (r: Finished, message: RegExp) => {
  expect(r.code, r.stderr).toBe(2)
  expect(r.stdout).toBe("")
  expect(r.stderr).toMatch(message)
  expect(r.stderr.split("\n")[0]).toMatch(/^wellspring-cli: /)
  expect(r.stderr).not.toMatch(/^\s+at /m)
}

const keyOf = (r: Finished) => {
  const lines = r.stdout.split("\n").filter((l) => l.startsWith("API key: "))
  expect(lines).toHaveLength(1)
  return lines[0]!.slice("API key: ".length)
}

const tmp = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-cli-"))
afterAll(() => Fs.rmSync(tmp, { recursive: true, force: true }))

describe("CLI without a database", () => {
  it("--help prints the commands and exits 0; a command's --help shows its flags", async () => {
    const [all, one] = await Promise.all([spawned(["--help"]), inProcess(["key:create", "--help"])])
    expect(all.code).toBe(0)
    for (const command of ["account:create", "account:status", "key:create", "key:list", "key:revoke", "session:create"]) {
      expect(all.stdout).toContain(command)
    }
    expect(one.code).toBe(0)
    expect(one.stdout).toMatch(/key:create \(--account ID \| --username U\) \[--label L\] \[--legacy\]/)
  })

  it("runs as `npm run cli`", async () => {
    const r = await new Promise<Finished>((resolve) =>
      ChildProcess.execFile("npm", ["run", "--silent", "cli", "--", "--help"], { env: cleanEnv() }, (error, stdout, stderr) =>
        resolve({ code: error ? (error.code as number) : 0, stdout, stderr }))
    )
    expect(r.code).toBe(0)
    expect(r.stdout).toMatch(/^Usage: npm run cli -- <command>/)
  })

  it("bad arguments exit 2 with a one-line reason, before touching any database", async () => {
    const down = `postgres://root@127.0.0.1:${await closedPort()}/x`
    const cases: ReadonlyArray<[ReadonlyArray<string>, RegExp]> = [
      [[], /missing command/],
      [["acount:create"], /unknown command "acount:create"/],
      [["key:list", "--bogus", "1"], /unknown flag --bogus for key:list/],
      [["key:revoke", "--id"], /flag --id needs a value/],
      [["key:create", "--legacy=yes", "--username", "a"], /--legacy takes no value/],
      [["key:list", "--username", "a", "--username", "b"], /given twice/],
      [["key:list", "stray"], /unexpected argument "stray"/],
      [["key:list", "--config", Path.join(tmp, "missing.yaml")], /cannot read config file/]
    ]
    // A database that is down: had any of these tried to connect, it would exit 1, not 2.
    const results = await Promise.all(cases.map(([args]) => inProcess([...args, "--database-url", down])))
    results.forEach((r, i) => expectUsageError(r, cases[i]![1]))
    // The same through a real process: exit status 2.
    expectUsageError(await spawned(["acount:create", "--database-url", down]), /unknown command/)
  })

  it("a bad config file exits 2 naming the field", async () => {
    const doc = defaultConfigDoc()
    doc.catalog.models[1].rate_limit_rpm = 0
    const file = Path.join(tmp, "bad.yaml")
    Fs.writeFileSync(file, Yaml.stringify(doc))
    expectUsageError(await inProcess(["key:list", "--username", "a", "--config", file]), /catalog\.models\.1\.rate_limit_rpm/)
  })

  it("a database that is down gives one clear line and exit 1", async () => {
    const port = await closedPort()
    const r = await spawned(["key:list", "--username", "dev", "--database-url", `postgres://root:pw@127.0.0.1:${port}/x`])
    expect(r.code).toBe(1)
    expect(r.stdout).toBe("")
    expect(r.stderr.trim().split("\n")).toHaveLength(1)
    expect(r.stderr).toContain(`wellspring-cli: cannot connect to PostgreSQL at 127.0.0.1:${port}/x`)
    expect(r.stderr).toContain("ECONNREFUSED")
    expect(r.stderr).not.toContain("pw")
  })
})

describe.skipIf(!postgres)("CLI on PostgreSQL with a running gateway", () => {
  let db: FreshDatabase
  let gw: TestGateway
  let admin: pg.Client
  const kek = Crypto.randomBytes(32).toString("base64")
  const run = (args: ReadonlyArray<string>, env: Record<string, string> = {}) =>
    inProcess([...args, "--database-url", db.url], env)
  // DATABASE_URL from the environment, as an operator's shell would have it.
  const runSpawned = (args: ReadonlyArray<string>, env: Record<string, string> = {}) =>
    spawned(args, { DATABASE_URL: db.url, ...env })

  beforeAll(async () => {
    db = await freshDatabase("cli")
    admin = new pg.Client({ ...POSTGRES, database: db.name })
    await admin.connect()
    gw = await startGateway({ databaseUrl: db.url })
  })
  afterAll(async () => {
    await gw?.stop()
    await admin?.end()
    await db?.drop()
  })

  it("account:create prints the id and stores every flag", async () => {
    const r = await runSpawned([
      "account:create",
      "--username", "alice",
      "--display-name", "앨리스",
      "--community-id", "c-42",
      "--community-type", "discord",
      "--email", "alice@example.com",
      "--admin",
      "--plan", "community",
      "--guest-expires", "2030-01-01T00:00:00Z"
    ])
    expect(r.code, r.stderr).toBe(0)
    const id = r.stdout.trim()
    expect(id).toMatch(/^acc_[0-9a-f]{20}$/)
    // Which database it wrote to, without credentials.
    expect(r.stderr).toBe(`wellspring-cli: database: PostgreSQL at 127.0.0.1:5432/${db.name}\n`)
    const { rows } = await admin.query("SELECT * FROM accounts WHERE id = $1", [id])
    expect(rows[0]).toMatchObject({
      username: "alice",
      display_name: "앨리스",
      community_id: "c-42",
      community_type: "discord",
      email: "alice@example.com",
      status: "active",
      is_admin: true,
      is_legacy: false,
      is_guest: true,
      plan: "community"
    })
    expect(rows[0].guest_expires_at.toISOString()).toBe("2030-01-01T00:00:00.000Z")
    expect(rows[0].email_verified_at).toBeInstanceOf(Date)

    const legacy = await run(["account:create", "--username", "old", "--display-name", "Old", "--legacy", "--status", "unlinked"])
    expect(legacy.code, legacy.stderr).toBe(0)
    const { rows: old } = await admin.query("SELECT status, is_legacy FROM accounts WHERE username = 'old'")
    expect(old[0]).toEqual({ status: "unlinked", is_legacy: true })
  })

  it("account:create rejects bad values and a taken username with exit 2", async () => {
    const base = ["account:create", "--display-name", "X"]
    const results = await Promise.all([
      run([...base, "--username", "alice"]),
      run([...base, "--username", "z1", "--status", "banned"]),
      run([...base, "--username", "z2", "--plan", "gold"]),
      run([...base, "--username", "z3", "--guest-expires", "tomorrow"]),
      run([...base, "--username", "z4", "--email", "not-an-email"]),
      run(["account:create", "--username", "z5"])
    ])
    expectUsageError(results[0]!, /username "alice" is taken/)
    expectUsageError(results[1]!, /--status must be one of active, unlinked, revoked/)
    expectUsageError(results[2]!, /no plan named "gold"/)
    expectUsageError(results[3]!, /--guest-expires must be an ISO date-time/)
    expectUsageError(results[4]!, /--email is not an email address/)
    expectUsageError(results[5]!, /missing required flag --display-name/)
    const { rows } = await admin.query("SELECT count(*)::int AS n FROM accounts WHERE username LIKE 'z%'")
    expect(rows[0].n).toBe(0)
  })

  it("key:create prints the key once; it works on the gateway; key:list shows it without the secret", async () => {
    const created = await runSpawned(["key:create", "--username", "alice", "--label", "노트북"], {
      WELLSPRING_ENCRYPTION_KEY: kek
    })
    expect(created.code, created.stderr).toBe(0)
    const key = keyOf(created)
    expect(key).toMatch(/^sk-ws-[0-9A-Za-z]{43}$/)
    expect(await status(gw, key)).toBe(200)

    const legacy = keyOf(await run(["key:create", "--username", "alice", "--legacy"]))
    expect(legacy).toMatch(/^ws-/)
    expect(await status(gw, legacy)).toBe(200)

    const listed = await run(["key:list", "--username", "alice"], { WELLSPRING_ENCRYPTION_KEY: kek })
    expect(listed.code, listed.stderr).toBe(0)
    const lines = listed.stdout.trim().split("\n")
    expect(lines[0]).toMatch(/^ID\s+LABEL\s+PREFIX\s+CREATED\s+LAST USED\s+REVEALABLE\s+LEGACY$/)
    expect(lines).toHaveLength(3)
    expect(lines[1]).toMatch(new RegExp(`^\\d+\\s+노트북\\s+${key.slice(0, 16)}\\s+\\d{4}-\\d\\d-\\d\\dT[\\d:]+Z\\s+\\S+\\s+yes\\s+no$`))
    expect(lines[2]).toMatch(new RegExp(`^\\d+\\s+새 키\\s+${legacy.slice(0, 16)}\\s+.*\\s+no\\s+yes$`))
    expect(listed.stdout).not.toContain(key.slice(16))
    // Without the key-encryption key the same row is not revealable.
    const blind = await run(["key:list", "--username", "alice"])
    expect(blind.stdout.trim().split("\n")[1]).toMatch(/\s+no\s+no$/)
    // The accounts API's cap applies: at most 5 active keys.
    const { rows } = await admin.query("SELECT id FROM accounts WHERE username = 'alice'")
    for (let i = 0; i < 3; i++) expect((await run(["key:create", "--account", rows[0].id])).code).toBe(0)
    expectUsageError(await run(["key:create", "--account", rows[0].id]), /already holds 5 active keys/)
    expectUsageError(await run(["key:create", "--account", rows[0].id, "--legacy"]), /already holds 5 active keys/)
  })

  it("key:revoke: the running gateway rejects the key shortly after (NOTIFY), and list/revoke agree", async () => {
    const key = keyOf(await run(["key:create", "--username", "old"]))
    expect(await status(gw, key)).toBe(200) // cached by the gateway now
    const { rows } = await admin.query("SELECT id FROM api_keys WHERE key_prefix = $1", [key.slice(0, 16)])
    const id = String(rows[0].id)
    const revoked = await runSpawned(["key:revoke", "--id", id])
    expect(revoked.code, revoked.stderr).toBe(0)
    expect(revoked.stdout).toContain(`Key ${id}`)
    await eventually(async () => (await status(gw, key)) === 401)
    expect((await run(["key:list", "--username", "old"])).stdout).toContain("has no active keys")
    expectUsageError(await run(["key:revoke", "--id", id]), new RegExp(`no active key with id ${id}`))
    expectUsageError(await run(["key:revoke", "--id", "abc"]), /--id must be a positive integer/)
    const { rows: audit } = await admin.query("SELECT action FROM audit_log WHERE target = $1 ORDER BY id", [id])
    expect(audit.map((a) => a.action)).toEqual(["key.create", "key.delete"])
  })

  it("account:status reaches the gateway's key cache", async () => {
    const key = keyOf(await run(["key:create", "--username", "old"]))
    const cachedStatus = () => gw.run(Effect.flatMap(Auth, (a) => a.authenticateKey(`Bearer ${key}`, "127.0.0.1"))).then((c) => c.account.status)
    expect(await cachedStatus()).toBe("unlinked")
    const r = await run(["account:status", "--username", "old", "--status", "active"])
    expect(r.code, r.stderr).toBe(0)
    expect(r.stdout).toContain("unlinked -> active")
    await eventually(async () => (await cachedStatus()) === "active")
    expectUsageError(await run(["account:status", "--username", "nobody", "--status", "active"]), /no account with username "nobody"/)
    expectUsageError(await run(["account:status", "--id", "acc_nope", "--status", "active"]), /no account with id "acc_nope"/)
    expectUsageError(await run(["account:status", "--username", "old"]), /missing required flag --status/)
    expectUsageError(await run(["account:status", "--status", "active"]), /missing --id ID or --username U/)
  })

  it("session:create prints a ws-session cookie the gateway accepts", async () => {
    const r = await run(["session:create", "--username", "alice", "--hours", "2"])
    expect(r.code, r.stderr).toBe(0)
    const token = /^ws-session=([0-9A-Za-z]{48})$/m.exec(r.stdout)?.[1]
    expect(token).toBeDefined()
    const caller = await gw.run(Effect.flatMap(Auth, (a) => a.authenticateSession(token!, "127.0.0.1")))
    expect(caller?.account.username).toBe("alice")
    const { rows } = await admin.query(
      "SELECT extract(epoch FROM expires_at - created_at)::int AS s FROM sessions WHERE account_id = $1",
      [caller!.account.id]
    )
    expect(rows[0].s).toBe(7200)
    expectUsageError(await run(["session:create", "--username", "alice", "--hours", "-1"]), /--hours must be/)
  })
})

describe("CLI in embedded mode", () => {
  it("refuses to create a new embedded database unless asked (--create, or account:create), and names the database it used", async () => {
    const dataDir = Path.join(tmp, "typo")
    const refused = await spawned(["key:list", "--username", "dev", "--data-dir", dataDir])
    expectUsageError(refused, /no embedded database in .*typo; .*--create/)
    expect(refused.stderr.trim().split("\n")[0]).toContain(dataDir)
    // Nothing was made in its place.
    expect(Fs.existsSync(dataDir)).toBe(false)
  })

  it("opens the data folder itself when no gateway runs, and leaves no lock behind", async () => {
    const dataDir = Path.join(tmp, "embedded")
    // `account:create` bootstraps a deployment: it may make the database, and says it did.
    const created = await spawned(["account:create", "--username", "solo", "--display-name", "Solo", "--data-dir", dataDir])
    expect(created.code, created.stderr).toBe(0)
    expect(created.stderr).toBe(`wellspring-cli: database: embedded database in ${dataDir} (new: created by this command)\n`)
    // A command that fails after opening it says which database it looked in.
    const unknown = await inProcess(["key:list", "--username", "nobody", "--data-dir", dataDir])
    expectUsageError(unknown, /no account with username "nobody" \(embedded database in .*embedded\)/)
    const key = keyOf(await inProcess(["key:create", "--username", "solo"], { WELLSPRING_DATA_DIR: dataDir }))
    const listed = await inProcess(["key:list", "--username", "solo", "--data-dir", dataDir])
    expect(listed.stdout).toContain(key.slice(0, 16))
    // The embedded key-encryption key was generated into the folder, so the key is revealable.
    expect(listed.stdout.trim().split("\n")[1]).toMatch(/\s+yes\s+no$/)
    expect(Fs.existsSync(Path.join(dataDir, "encryption.key"))).toBe(true)
    expect(Fs.existsSync(Path.join(dataDir, "embedded.lock"))).toBe(false)
  })

  it("attaches to a running embedded gateway instead of opening its folder twice", async () => {
    const gw = await startGateway()
    try {
      const flags = ["--config", gw.configPath, "--data-dir", Path.join(gw.dir, "data")]
      const issued = await spawned(["key:create", "--username", "dev", "--label", "cli", ...flags])
      expect(issued.stderr).toMatch(/^wellspring-cli: database: embedded database in .* \(through the running gateway, process \d+\)$/m)
      const key = keyOf(issued)
      expect(await status(gw, key)).toBe(200)
      const listed = await inProcess(["key:list", "--username", "dev", ...flags])
      expect(listed.stdout).toContain(key.slice(0, 16))
      const id = /^(\d+)\s+cli\s/m.exec(listed.stdout)![1]!
      const revoked = await inProcess(["key:revoke", "--id", id, ...flags])
      expect(revoked.code, revoked.stderr).toBe(0)
      expect(revoked.stdout).toMatch(/may keep this key or account in its cache for up to 60 s/)
      // The gateway is still healthy and shares the same data.
      expect(await status(gw, gw.key)).toBe(200)
      expect((await inProcess(["key:list", "--username", "dev", ...flags])).stdout).not.toContain(key.slice(0, 16))
    } finally {
      await gw.stop()
    }
  })
})
