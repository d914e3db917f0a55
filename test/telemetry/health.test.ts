/**
 * Issue 18 (7): `/healthz` (alive) and `/readyz` (database, Redis when configured, catalog; not ready while
 * draining) on every listener, outside every rate limit. The real process's SIGTERM path is in
 * test/operators/messages.test.ts; here the drain is started in process.
 */
import { Effect, Fiber } from "effect"
import pg from "pg"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { BoundListeners } from "../../src/http/Server.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { eventually } from "../support/Eventually.js"
import { authed, startGateway, type TestGateway } from "../support/Gateway.js"
import { hasRedisServer, privateRedis, type PrivateRedis, uniquePrefix } from "../support/Redis.js"
import { POSTGRES, serviceGate } from "../support/Services.js"

const postgres = await serviceGate("postgres")
const redisServer = hasRedisServer()

const probe = async (base: string, path: "/healthz" | "/readyz") => {
  const res = await fetch(`${base}${path}`)
  return { status: res.status, body: (await res.json()) as any, headers: res.headers }
}

describe("probes on every listener", () => {
  let gw: TestGateway
  let operator: string

  beforeAll(async () => {
    gw = await startGateway({
      configure: (doc) => {
        doc.shutdown_delay_seconds = 2
        doc.listeners = [
          { host: "127.0.0.1", port: 8080, origins: ["inference", "account", "status"] },
          { host: "127.0.0.1", port: 0, origins: ["operator"] }
        ]
      }
    })
    const { listeners } = await gw.run(BoundListeners)
    operator = `http://127.0.0.1:${listeners[1]!.port}`
  })
  afterAll(() => gw?.stop())

  it("answers alive and ready on the public and the operator listener", async () => {
    for (const base of [gw.url, operator]) {
      const alive = await probe(base, "/healthz")
      expect([alive.status, alive.body]).toEqual([200, { status: "ok" }])
      expect(alive.headers.get("cache-control")).toBe("no-store")
      const ready = await probe(base, "/readyz")
      expect(ready.status).toBe(200)
      expect(ready.body).toMatchObject({
        status: "ready",
        checks: { database: "ok", redis: "not_configured", catalog: "ok" },
        catalog: { version: 1 }
      })
      expect(ready.body.catalog.models).toBeGreaterThan(0)
    }
  })

  it("is outside every rate limit: hundreds of probes from one address, then a bad key is still a plain 401", async () => {
    for (let round = 0; round < 10; round++) {
      const answers = await Promise.all(
        Array.from({ length: 30 }, (_, i) => probe(gw.url, i % 2 === 0 ? "/readyz" : "/healthz"))
      )
      expect(answers.map((a) => a.status)).toEqual(Array(30).fill(200))
    }
    const bad = await fetch(`${gw.url}/v1/models`, { headers: authed("sk-ws-" + "x".repeat(43)) })
    expect(bad.status).toBe(401)
    await bad.text()
    const good = await fetch(`${gw.url}/v1/models`, { headers: authed(gw.key) })
    expect(good.status).toBe(200)
    await good.text()
  })

  it("while draining: not ready, still alive, still serving during shutdown_delay_seconds", async () => {
    const drain = await gw.run(Effect.forkDetach(Effect.flatMap(BoundListeners, (b) => b.drain)))
    await eventually(async () => (await probe(gw.url, "/readyz")).status === 503, { what: "readyz 503" })
    expect((await probe(gw.url, "/readyz")).body).toEqual({ status: "draining" })
    expect((await probe(operator, "/readyz")).status).toBe(503)
    expect((await probe(gw.url, "/healthz")).status).toBe(200)
    const models = await fetch(`${gw.url}/v1/models`, { headers: authed(gw.key) })
    expect(models.status).toBe(200)
    await models.text()
    await gw.run(Fiber.join(drain))
    // The listeners are closed after the delay.
    await expect(fetch(`${gw.url}/healthz`)).rejects.toThrow()
  })
})

const admin = async (text: string) => {
  const client = new pg.Client({ ...POSTGRES })
  await client.connect()
  try {
    await client.query(text)
  } finally {
    await client.end()
  }
}

describe.skipIf(!postgres)("readyz with PostgreSQL down", () => {
  let db: FreshDatabase
  let gw: TestGateway

  beforeAll(async () => {
    db = await freshDatabase("readyz")
    gw = await startGateway({ databaseUrl: db.url })
  })
  afterAll(async () => {
    await admin(`ALTER DATABASE ${db.name} ALLOW_CONNECTIONS true`).catch(() => undefined)
    await gw?.stop()
    await db?.drop()
  })

  it("is 503 naming the database while it is unreachable, alive all along, and ready again after", async () => {
    expect((await probe(gw.url, "/readyz")).status).toBe(200)
    await admin(`ALTER DATABASE ${db.name} ALLOW_CONNECTIONS false`)
    await admin(`SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '${db.name}' AND pid <> pg_backend_pid()`)
    // The check is cached for about a second.
    const started = Date.now()
    await eventually(async () => (await probe(gw.url, "/readyz")).status === 503, { timeoutMs: 5_000, what: "readyz 503" })
    expect(Date.now() - started).toBeLessThan(4_000)
    const down = await probe(gw.url, "/readyz")
    expect(down.body).toMatchObject({ status: "not_ready", checks: { database: "down", redis: "not_configured", catalog: "ok" } })
    // The answer names the check, never the reason (host names, errors stay in the log).
    expect(JSON.stringify(down.body)).not.toMatch(/ECONN|terminat|127\.0\.0\.1|allow/i)
    expect((await probe(gw.url, "/healthz")).status).toBe(200)

    await admin(`ALTER DATABASE ${db.name} ALLOW_CONNECTIONS true`)
    await eventually(async () => (await probe(gw.url, "/readyz")).status === 200, { timeoutMs: 15_000, what: "ready again" })
  })
})

describe.skipIf(!redisServer)("readyz with Redis configured", () => {
  let redis: PrivateRedis
  let gw: TestGateway

  beforeAll(async () => {
    redis = await privateRedis()
    await redis.start()
    gw = await startGateway({ redisUrl: redis.url, redisPrefix: uniquePrefix("readyz") })
  })
  afterAll(async () => {
    await gw?.stop()
    await redis?.stop()
  })

  it("checks Redis: 503 while it is down, ready when it is back", async () => {
    expect((await probe(gw.url, "/readyz")).body).toMatchObject({ status: "ready", checks: { redis: "ok" } })
    await redis.stop()
    await eventually(async () => (await probe(gw.url, "/readyz")).status === 503, { timeoutMs: 5_000, what: "readyz 503" })
    expect((await probe(gw.url, "/readyz")).body).toMatchObject({ status: "not_ready", checks: { database: "ok", redis: "down" } })
    await redis.start()
    await eventually(async () => (await probe(gw.url, "/readyz")).status === 200, { timeoutMs: 15_000, what: "ready again" })
  })
})
