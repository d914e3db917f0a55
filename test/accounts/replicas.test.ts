/**
 * Two gateway replicas on one PostgreSQL database (and, when Redis runs, one Redis admission engine):
 * a key deleted or rotated on one replica fails with 401 on the other replica's next request (PG NOTIFY
 * invalidation); the rotate cooldown and the endpoint rate limits are shared.
 */
import * as Crypto from "node:crypto"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { layerFromConfig } from "../../src/quota/layer.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { startGateway, type TestGateway } from "../support/Gateway.js"
import { REDIS_URL, serviceGate } from "../support/Services.js"
import { call, newKey, newUser } from "./support.js"
import { eventually } from "../support/Eventually.js"

const postgresAvailable = await serviceGate("postgres")
const redisAvailable = postgresAvailable && (await serviceGate("redis"))


describe.skipIf(!postgresAvailable)("account API across replicas (PostgreSQL)", () => {
  let db: FreshDatabase
  let one: TestGateway
  let two: TestGateway
  const keyPrefix = `ws:test:acct:${Crypto.randomBytes(4).toString("hex")}:`
  // Without Redis each replica has its own in-process limiter (the rate-limit test below is then skipped).
  const admission = () =>
    layerFromConfig({
      abuse: { burst: 300, window_seconds: 10, cooldown_seconds: 60 },
      ...(redisAvailable ? { redisUrl: REDIS_URL, keyPrefix } : {})
    })

  beforeAll(async () => {
    db = await freshDatabase("replicas")
    const kek = Crypto.randomBytes(32).toString("base64")
    const configure = (doc: Record<string, any>) => {
      doc.encryption_key = kek
    }
    one = await startGateway({ databaseUrl: db.url, admission: admission(), configure })
    two = await startGateway({ databaseUrl: db.url, admission: admission(), configure })
  })
  afterAll(async () => {
    await one?.stop()
    await two?.stop()
    await db?.drop()
  })

  it("a key deleted on replica one is refused by replica two", async () => {
    const u = await newUser(one)
    const spare = await newKey(one, u.account.id, "spare")
    // Replica two caches the key as valid.
    expect((await call(two, "GET", "/v1/models", { key: spare.key })).status).toBe(200)
    expect((await call(one, "DELETE", `/api/user/me/keys/${spare.id}`, { session: u.session })).status).toBe(200)
    expect(await eventually(async () => (await call(two, "GET", "/v1/models", { key: spare.key })).status === 401)).toBe(true)
    expect((await call(two, "GET", "/v1/models", { key: u.key })).status).toBe(200)
  })

  it("rotation on replica one revokes on replica two, and the cooldown holds on replica two", async () => {
    const u = await newUser(one)
    expect((await call(two, "GET", "/v1/models", { key: u.key })).status).toBe(200)
    const rotated = await call(one, "POST", "/api/user/me/rotate-key", { session: u.session })
    expect(rotated.status).toBe(200)
    expect(await eventually(async () => (await call(two, "GET", "/v1/models", { key: u.key })).status === 401)).toBe(true)
    const again = await call(two, "POST", "/api/user/me/rotate-key", { key: rotated.body.data.apiKey })
    expect(again.status).toBe(429)
    expect(again.body.error.type).toBe("rate_limit_exceeded")
    // A key created on one replica is revealable on the other (same key-encryption key).
    const revealed = await call(two, "GET", `/api/user/me/keys/${(await call(one, "GET", "/api/user/me/keys", { session: u.session })).body.data.keys[0].id}/reveal`, { session: u.session })
    expect(revealed.body).toEqual({ success: true, data: { key: rotated.body.data.apiKey } })
  })

  it.skipIf(!redisAvailable)("the reveal and metrics limits count across replicas (Redis admission)", async () => {
    const u = await newUser(one)
    for (let i = 0; i < 30; i++) {
      const gw = i % 2 === 0 ? one : two
      expect((await call(gw, "GET", `/api/user/me/keys/${u.keyId}/reveal`, { session: u.session })).status).toBe(200)
    }
    expect((await call(one, "GET", `/api/user/me/keys/${u.keyId}/reveal`, { session: u.session })).status).toBe(429)
    expect((await call(two, "GET", `/api/user/me/keys/${u.keyId}/reveal`, { session: u.session })).status).toBe(429)
    for (let i = 0; i < 120; i++) {
      const gw = i % 2 === 0 ? one : two
      const path = i % 3 === 0 ? "/api/user/me/metrics?range=1h" : "/api/user/me/requests?limit=1"
      expect((await call(gw, "GET", path, { key: u.key })).status).toBe(200)
    }
    expect((await call(two, "GET", "/api/user/me/requests", { key: u.key })).status).toBe(429)
    expect((await call(one, "GET", "/api/user/me/metrics", { key: u.key })).status).toBe(429)
  })
})
