/**
 * Bearer authentication over HTTP against running gateways: embedded, and two replicas on one PostgreSQL.
 */
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import pg from "pg"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { AccountsRepo } from "../../src/accounts/AccountsRepo.js"
import { Auth } from "../../src/auth/Auth.js"
import { generateKey, hashKey, randomBase62 } from "../../src/auth/KeyMaterial.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { startGateway, type TestGateway } from "../support/Gateway.js"
import { POSTGRES, serviceGate } from "../support/Services.js"
import { eventually } from "../support/Eventually.js"

const postgres = await serviceGate("postgres")

const HANGUL = /[\uAC00-\uD7A3]/

const get = async (gw: TestGateway, authorization?: string) => {
  const res = await fetch(`${gw.url}/v1/models`, { headers: authorization === undefined ? {} : { authorization } })
  const body = await res.json() as { error?: { code?: string; type?: string; message?: string } }
  return { status: res.status, body, requestId: res.headers.get("x-wellspring-request-id") }
}

const expectInvalidKey = (r: Awaited<ReturnType<typeof get>>) => {
  expect(r.status).toBe(401)
  expect(r.body.error?.code).toBe("invalid_api_key")
  expect(r.body.error?.type).toBe("invalid_request_error")
  expect(r.body.error?.message).toMatch(HANGUL)
  expect(r.requestId).toMatch(/^req_/)
}

/** Issues a key for the gateway's dev account (or a new account) through the repository. */
const issueKey = (gw: TestGateway, options: { readonly legacy?: boolean } = {}) =>
  gw.run(Effect.gen(function*() {
    const repo = yield* AccountsRepo
    const account = (yield* repo.findAccountByUsername("dev")) ??
      (yield* repo.createAccount({ username: "dev", displayName: "Dev" }))
    return yield* repo.createKey(account.id, "test", options)
  }))

/** Revokes the way the account API does: repository, then cache invalidation (announced to replicas). */
const revoke = (gw: TestGateway, keyId: number) =>
  gw.run(Effect.gen(function*() {
    const row = yield* Effect.flatMap(AccountsRepo, (r) => r.revokeKeyById(keyId))
    yield* Effect.flatMap(Auth, (a) => a.invalidateKeys([row!.key_hash]))
  }))

/** Revokes in the database only, bypassing every cache. */
const revokeBehindCache = (gw: TestGateway, keyId: number) =>
  gw.run(Effect.flatMap(SqlClient.SqlClient, (sql) => sql`UPDATE api_keys SET revoked_at = now() WHERE id = ${keyId}`)
    .pipe(Effect.orDie))

describe("auth over HTTP (embedded)", () => {
  let gw: TestGateway
  beforeAll(async () => {
    gw = await startGateway()
  })
  afterAll(() => gw?.stop())

  it("the dev key works", async () => {
    expect(gw.key).toMatch(/^sk-ws-[0-9A-Za-z]{43}$/)
    expect((await get(gw, `Bearer ${gw.key}`)).status).toBe(200)
  })

  it("missing, malformed, wrong-prefix and unknown keys get 401 invalid_api_key", async () => {
    expectInvalidKey(await get(gw))
    expectInvalidKey(await get(gw, ""))
    expectInvalidKey(await get(gw, "Bearer"))
    expectInvalidKey(await get(gw, gw.key))
    expectInvalidKey(await get(gw, `Basic ${gw.key}`))
    expectInvalidKey(await get(gw, `Bearer ${gw.key} ${gw.key}`))
    expectInvalidKey(await get(gw, "Bearer sk-ws-short"))
    expectInvalidKey(await get(gw, `Bearer ${gw.key.slice(0, -2)}-_`))
    expectInvalidKey(await get(gw, `Bearer sk-other-${randomBase62()}`))
    expectInvalidKey(await get(gw, `Bearer ${"sk-ws-".toUpperCase()}${randomBase62()}`))
    expectInvalidKey(await get(gw, `Bearer ${generateKey("sk-ws-")}`))
    expectInvalidKey(await get(gw, `Bearer ws-${randomBase62()}`))
  })

  it("a legacy ws- key is accepted", async () => {
    const { key, row } = await issueKey(gw, { legacy: true })
    expect(key.startsWith("ws-")).toBe(true)
    expect(row.legacy).toBe(true)
    expect((await get(gw, `Bearer ${key}`)).status).toBe(200)
  })

  it("a revoked key gets 401 on its very next request", async () => {
    const { key, row } = await issueKey(gw)
    expect((await get(gw, `Bearer ${key}`)).status).toBe(200) // now cached
    expect((await get(gw, `Bearer ${key}`)).status).toBe(200)
    await revoke(gw, row.id)
    expectInvalidKey(await get(gw, `Bearer ${key}`))
    // The other keys are untouched.
    expect((await get(gw, `Bearer ${gw.key}`)).status).toBe(200)
  })

  it("the key cache answers a known key without the database", async () => {
    const { key, row } = await issueKey(gw)
    expect((await get(gw, `Bearer ${key}`)).status).toBe(200)
    // The database now says "revoked", but nobody told the cache: the hot path never asked the database.
    await revokeBehindCache(gw, row.id)
    for (let i = 0; i < 3; i++) expect((await get(gw, `Bearer ${key}`)).status).toBe(200)
    // Control: a key that was never cached is looked up, so the database's answer shows.
    const fresh = await issueKey(gw)
    await revokeBehindCache(gw, fresh.row.id)
    expectInvalidKey(await get(gw, `Bearer ${fresh.key}`))
  })
})

describe.skipIf(!postgres)("auth across two replicas on one PostgreSQL", () => {
  let db: FreshDatabase
  let a: TestGateway
  let b: TestGateway
  let admin: pg.Client

  /** Both replicas' LISTEN connections are up (so no announcement can be missed). */
  const listeners = async () => {
    const { rows } = await admin.query<{ n: number }>(
      `SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = $1 AND query ILIKE 'LISTEN%wellspring_auth%'`,
      [db.name]
    )
    return rows[0]!.n
  }


  beforeAll(async () => {
    db = await freshDatabase("replicas")
    admin = new pg.Client({ ...POSTGRES, database: db.name })
    await admin.connect()
    a = await startGateway({ databaseUrl: db.url })
    b = await startGateway({ databaseUrl: db.url })
    await eventually(async () => (await listeners()) >= 2)
  })
  afterAll(async () => {
    await a?.stop()
    await b?.stop()
    await admin?.end()
    await db?.drop()
  })

  it("the first replica created the dev account; the second found it and printed no key", () => {
    expect(a.key).toMatch(/^sk-ws-/)
    expect(b.key).toBe("")
  })

  it("a key revoked on one replica is rejected by the other shortly after", async () => {
    const { key, row } = await issueKey(a)
    expect((await get(b, `Bearer ${key}`)).status).toBe(200) // cached on b
    await revoke(a, row.id)
    expectInvalidKey(await get(a, `Bearer ${key}`))
    const started = Date.now()
    await eventually(async () => (await get(b, `Bearer ${key}`)).status === 401, { timeoutMs: 5_000 })
    console.log(`cross-replica key invalidation reached the other replica after ${Date.now() - started} ms`)
  })

  it("without the announcement the other replica keeps its cached entry (the control)", async () => {
    const { key, row } = await issueKey(a)
    expect((await get(b, `Bearer ${key}`)).status).toBe(200)
    await revokeBehindCache(a, row.id)
    expect((await get(b, `Bearer ${key}`)).status).toBe(200)
  })

  it("an account status change on one replica reaches the other's cache", async () => {
    const { key } = await issueKey(a)
    const statusOnB = () => b.run(Effect.flatMap(Auth, (auth) => auth.authenticateKey(`Bearer ${key}`, "127.0.0.1")))
      .then((c) => c.account.status)
    expect(await statusOnB()).toBe("active")
    await a.run(Effect.gen(function*() {
      const repo = yield* AccountsRepo
      const dev = (yield* repo.findAccountByUsername("dev"))!
      yield* repo.setStatus(dev.id, "unlinked")
      yield* Effect.flatMap(Auth, (auth) => auth.invalidateAccount(dev.id))
    }))
    await eventually(async () => (await statusOnB()) === "unlinked")
    await a.run(Effect.gen(function*() {
      const repo = yield* AccountsRepo
      const dev = (yield* repo.findAccountByUsername("dev"))!
      yield* repo.setStatus(dev.id, "active")
      yield* Effect.flatMap(Auth, (auth) => auth.invalidateAccount(dev.id))
    }))
  })

  it("a NOTIFY from any process (the CLI's path) invalidates both replicas", async () => {
    const { key } = await issueKey(a)
    expect((await get(a, `Bearer ${key}`)).status).toBe(200)
    expect((await get(b, `Bearer ${key}`)).status).toBe(200)
    await admin.query(`UPDATE api_keys SET revoked_at = now() WHERE key_hash = $1`, [hashKey(key)])
    await admin.query(`SELECT pg_notify('wellspring_auth', $1)`, [`key:${hashKey(key)}`])
    await eventually(async () => (await get(a, `Bearer ${key}`)).status === 401)
    await eventually(async () => (await get(b, `Bearer ${key}`)).status === 401)
  })

  it("a message this version does not know (a newer replica's) drops every cached key, never none", async () => {
    const { key } = await issueKey(a)
    expect((await get(b, `Bearer ${key}`)).status).toBe(200) // cached on b
    await admin.query(`UPDATE api_keys SET revoked_at = now() WHERE key_hash = $1`, [hashKey(key)])
    expect((await get(b, `Bearer ${key}`)).status).toBe(200) // the cache has not been told
    await admin.query(`SELECT pg_notify('wellspring_auth', $1)`, ["plans:changed"])
    await eventually(async () => (await get(b, `Bearer ${key}`)).status === 401)
  })
})
