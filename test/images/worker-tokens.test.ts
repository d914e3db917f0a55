/**
 * Worker tokens (src/images/WorkerTokens.ts) and their CLI commands: the format, only the SHA-256 stored, the
 * in-memory set of active tokens (reads of the table bounded whatever is presented), and revocation: at once in
 * the replica that revokes, and on PostgreSQL at once in a gateway the CLI (another client) tells by NOTIFY.
 */
import { Effect } from "effect"
import * as Crypto from "node:crypto"
import { SqlClient } from "effect/sql"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { run as runCli } from "../../src/cli.js"
import { WORKER_PATH } from "../../src/images/WorkerRoutes.js"
import {
  generateToken,
  hashToken,
  isWellFormedToken,
  MISS_RELOAD_MS,
  SNAPSHOT_TTL_MS,
  validName,
  WorkerTokens
} from "../../src/images/WorkerTokens.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { eventually } from "../support/Eventually.js"
import { serviceGate } from "../support/Services.js"
import { cleanEnv, type Finished } from "../foundation/spawn.js"
import { makeTestWork, startWorkerGateway, type WorkerGateway } from "./workerSupport.js"

const postgres = await serviceGate("postgres")

const heartbeat = async (gw: WorkerGateway, token: string) => {
  const res = await fetch(`${gw.url}${WORKER_PATH}/heartbeat`, {
    method: "POST",
    headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
    body: JSON.stringify({ worker_id: "w", name: "w", kind: "comfyui" })
  })
  await res.arrayBuffer()
  return res.status
}

const tokens = <A>(gw: WorkerGateway, f: (t: WorkerTokens["Service"]) => Effect.Effect<A>) => gw.run(Effect.flatMap(WorkerTokens, f))

describe("format", () => {
  it("wsw_ and 43 base62 characters, from the CSPRNG", () => {
    const seen = new Set<string>()
    for (let i = 0; i < 200; i++) {
      const token = generateToken()
      expect(token).toMatch(/^wsw_[A-Za-z0-9]{43}$/)
      expect(isWellFormedToken(token)).toBe(true)
      seen.add(token)
    }
    expect(seen.size).toBe(200)
    for (const bad of ["", "wsw_", `wsw_${"a".repeat(42)}`, `wsw_${"a".repeat(44)}`, `wsx_${"a".repeat(43)}`, `wsw_${"a".repeat(42)}-`, `sk-ws-${"a".repeat(41)}`]) {
      expect(isWellFormedToken(bad), bad).toBe(false)
    }
  })

  it("names: 1–64 characters, no control characters", () => {
    expect(validName("gpu-1")).toBe(true)
    expect(validName("  지포스 상자  ")).toBe(true)
    expect(validName("가".repeat(64))).toBe(true)
    for (const bad of ["", "   ", "가".repeat(65), "a\nb", "a\u0000", "a\u202eb"]) expect(validName(bad), JSON.stringify(bad)).toBe(false)
  })
})

describe("on the embedded store", () => {
  let gw: WorkerGateway
  beforeAll(async () => {
    gw = await startWorkerGateway({ work: makeTestWork() })
  })
  afterAll(() => gw?.stop())

  it("only the SHA-256 is stored; list shows the name and the revocation", async () => {
    const { token, row } = await tokens(gw, (t) => t.issue("  gpu-box  "))
    expect(row.name).toBe("gpu-box")
    expect(row.token_hash).toBe(Crypto.createHash("sha256").update(token).digest("hex"))
    const dump = await gw.run(Effect.flatMap(SqlClient.SqlClient, (sql) => sql`SELECT * FROM image_worker_tokens`))
    expect(JSON.stringify(dump)).not.toContain(token.slice(4))
    expect(JSON.stringify(dump)).toContain(hashToken(token))

    expect(await tokens(gw, (t) => t.verify(token))).toEqual({ tokenId: row.id, name: "gpu-box", hash: row.token_hash })
    const revoked = await tokens(gw, (t) => t.revoke(row.id))
    expect(revoked?.revoked_at).toBeInstanceOf(Date)
    expect(await tokens(gw, (t) => t.revoke(row.id))).toBeNull()
    expect(await tokens(gw, (t) => t.verify(token))).toBeNull()
    const listed = (await tokens(gw, (t) => t.list)).find((r) => r.id === row.id)
    expect(listed?.revoked_at).toBeInstanceOf(Date)
  })

  it("a valid token is served from memory; unknown tokens read the table at most once per second", async () => {
    const { token } = await tokens(gw, (t) => t.issue("memory"))
    expect(await tokens(gw, (t) => t.verify(token))).not.toBeNull()
    const before = await tokens(gw, (t) => t.reloads)
    for (let i = 0; i < 100; i++) expect(await tokens(gw, (t) => t.verify(token))).not.toBeNull()
    // Within the set's lifetime a valid token costs no read at all.
    const afterValid = await tokens(gw, (t) => t.reloads)
    expect(afterValid - before).toBeLessThanOrEqual(1)

    const started = Date.now()
    const guesses = await Promise.all(Array.from({ length: 300 }, () => tokens(gw, (t) => t.verify(generateToken()))))
    expect(guesses.every((g) => g === null)).toBe(true)
    const elapsed = Date.now() - started
    const reads = (await tokens(gw, (t) => t.reloads)) - afterValid
    expect(reads).toBeLessThanOrEqual(1 + Math.ceil(elapsed / MISS_RELOAD_MS))
    // Malformed ones never read it.
    const beforeMalformed = await tokens(gw, (t) => t.reloads)
    for (let i = 0; i < 50; i++) expect(await tokens(gw, (t) => t.verify(`sk-ws-${i}`))).toBeNull()
    expect(await tokens(gw, (t) => t.reloads)).toBe(beforeMalformed)
  })

  it("a waiting poll ends when its token is revoked without an announcement (the embedded CLI writes the row only)", async () => {
    const { token, row } = await tokens(gw, (t) => t.issue("silent-revoke"))
    const credential = (await tokens(gw, (t) => t.verify(token)))!
    let ended = false
    const waiting = tokens(gw, (t) => t.revoked(credential)).then(() => (ended = true))
    await gw.run(Effect.flatMap(SqlClient.SqlClient, (sql) =>
      sql`UPDATE image_worker_tokens SET revoked_at = now() WHERE id = ${row.id}`))
    const started = Date.now()
    await eventually(() => ended, { timeoutMs: 3 * SNAPSHOT_TTL_MS })
    await waiting
    expect(Date.now() - started).toBeLessThanOrEqual(2 * SNAPSHOT_TTL_MS + 1000)
    expect(await heartbeat(gw, token)).toBe(401)
  })

  it("the worker API accepts the token over HTTP and refuses it once revoked", async () => {
    const { token, row } = await tokens(gw, (t) => t.issue("http"))
    expect(await heartbeat(gw, token)).toBe(204)
    await tokens(gw, (t) => t.revoke(row.id))
    expect(await heartbeat(gw, token)).toBe(401)
  })
})

const cli = async (args: ReadonlyArray<string>, url: string): Promise<Finished> => {
  let stdout = ""
  let stderr = ""
  const code = await runCli([...args, "--database-url", url], { out: (s) => (stdout += s), err: (s) => (stderr += s) }, cleanEnv())
  return { code, stdout, stderr }
}

describe.skipIf(!postgres)("on PostgreSQL, with the CLI", () => {
  let db: FreshDatabase
  let gw: WorkerGateway
  beforeAll(async () => {
    db = await freshDatabase("wtok")
    gw = await startWorkerGateway({ work: makeTestWork(), databaseUrl: db.url })
  })
  afterAll(async () => {
    await gw?.stop()
    await db?.drop()
  })

  it("create prints the token once; list; revoke reaches the running gateway by NOTIFY, before any reload", async () => {
    const created = await cli(["worker:token:create", "--name", "gpu-1"], db.url)
    expect(created.code, created.stderr).toBe(0)
    const lines = created.stdout.trim().split("\n")
    expect(lines[0]).toMatch(/^Worker token (\d+) \("gpu-1"\) created; it is shown only this once:$/)
    const token = /^Worker token: (wsw_[A-Za-z0-9]{43})$/.exec(lines[1]!)![1]!
    const id = Number(/Worker token (\d+)/.exec(lines[0]!)![1])

    // Issued elsewhere: accepted once the gateway's set is a second old.
    await eventually(async () => (await heartbeat(gw, token)) === 204, { what: "the new token accepted", timeoutMs: 5_000 })

    const list = await cli(["worker:token:list"], db.url)
    expect(list.code).toBe(0)
    expect(list.stdout).toMatch(/^ID\s+NAME\s+CREATED\s+REVOKED$/m)
    expect(list.stdout).toMatch(new RegExp(`^${id}\\s+gpu-1\\s+\\d{4}-\\d\\d-\\d\\dT\\S+Z\\s+-$`, "m"))
    expect(list.stdout).not.toContain(token)

    const reloads = await tokens(gw, (t) => t.reloads)
    const revokedAt = Date.now()
    const revoked = await cli(["worker:token:revoke", "--id", String(id)], db.url)
    expect(revoked.code, revoked.stderr).toBe(0)
    expect(revoked.stdout).toContain(`Worker token ${id} ("gpu-1") revoked`)
    await eventually(async () => (await heartbeat(gw, token)) === 401, { what: "the revoked token refused", timeoutMs: 3_000 })
    // Refused by the announcement: sooner than the set's lifetime, and without reading the table again.
    expect(Date.now() - revokedAt).toBeLessThan(SNAPSHOT_TTL_MS)
    expect(await tokens(gw, (t) => t.reloads)).toBe(reloads)
    expect((await cli(["worker:token:list"], db.url)).stdout).toMatch(new RegExp(`^${id}\\s+gpu-1\\s+\\S+\\s+\\d{4}-\\S+Z$`, "m"))
  })

  it("bad arguments exit 2", async () => {
    for (const [args, message] of [
      [["worker:token:create"], /missing required flag --name/],
      [["worker:token:create", "--name", "x".repeat(65)], /--name must be 1 to 64 characters/],
      [["worker:token:revoke", "--id", "abc"], /--id must be a positive integer/],
      [["worker:token:revoke", "--id", "999999"], /no active worker token with id 999999/]
    ] as const) {
      const r = await cli(args, db.url)
      expect(r.code, `${args.join(" ")}: ${r.stderr}`).toBe(2)
      expect(r.stderr).toMatch(message)
    }
  })
})
