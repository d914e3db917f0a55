/**
 * Two gateway replicas on one PostgreSQL database and one Redis (production mode): the public status limit of
 * 60 requests per minute per client address holds across both, and the status resources are computed by one
 * replica per period and served alike by both (runtime/RefreshRedis.ts).
 */
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { StatusCache } from "../../src/status/Status.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { startGateway, type TestGateway } from "../support/Gateway.js"
import { deleteByPrefix, uniquePrefix } from "../support/Redis.js"
import { REDIS_URL, serviceGate } from "../support/Services.js"
import { get } from "./support.js"

const postgresAvailable = await serviceGate("postgres")
const redisAvailable = postgresAvailable && (await serviceGate("redis"))

describe.skipIf(!redisAvailable)("public status across replicas (PostgreSQL + Redis)", () => {
  let db: FreshDatabase
  let one: TestGateway
  let two: TestGateway
  const prefix = uniquePrefix("status")

  beforeAll(async () => {
    db = await freshDatabase("statusrep")
    const configure = (doc: Record<string, any>) => {
      doc.trusted_proxies = ["127.0.0.1"]
      // One period spans the whole test: the lock taken at start is the first replica's throughout.
      doc.status = { refresh_seconds: 120 }
    }
    one = await startGateway({ databaseUrl: db.url, redisUrl: REDIS_URL, redisPrefix: prefix, configure })
    // The first replica's first refresh is published before the second starts.
    await one.run(Effect.flatMap(StatusCache, (cache) => cache.fleet.get))
    two = await startGateway({ databaseUrl: db.url, redisUrl: REDIS_URL, redisPrefix: prefix, configure })
  }, 120_000)
  afterAll(async () => {
    await one?.stop()
    await two?.stop()
    await db?.drop()
    await deleteByPrefix(REDIS_URL, prefix)
  })

  it("60 per minute per address across both replicas; other addresses unaffected", async () => {
    const address = { "x-forwarded-for": "192.0.2.10" }
    for (let i = 0; i < 60; i++) {
      const gw = i % 2 === 0 ? one : two
      expect((await get(`${gw.url}/api/stats/fleet`, address)).status, `request ${i + 1}`).toBe(200)
    }
    for (const gw of [one, two]) {
      const limited = await get(`${gw.url}/api/incidents`, address)
      expect(limited.status).toBe(429)
      expect(Number(limited.headers.get("retry-after"))).toBeGreaterThanOrEqual(1)
      expect(limited.headers.get("access-control-allow-origin")).toBe("*")
    }
    expect((await get(`${two.url}/api/stats/fleet`, { "x-forwarded-for": "192.0.2.11" })).status).toBe(200)
  })

  it("one replica computes a period's fleet; the other serves the same snapshot", async () => {
    const loads = async (gw: TestGateway) => gw.run(Effect.map(StatusCache, (cache) => cache.fleet.loads()))
    const [oneBefore, twoBefore] = [await loads(one), await loads(two)]
    // Within the period the lock is the first replica's: the second reads its value instead of computing.
    const fromTwo = await two.run(Effect.flatMap(StatusCache, (cache) => cache.fleet.refresh))
    const fromOne = await one.run(Effect.flatMap(StatusCache, (cache) => cache.fleet.get))
    expect(fromTwo.at).toBe(fromOne.at)
    expect(await loads(two)).toBe(twoBefore)
    expect(twoBefore).toBe(0)
    expect(oneBefore).toBe(1)
    const a = (await get(`${one.url}/api/stats/fleet`, { "x-forwarded-for": "192.0.2.20" })).body
    const b = (await get(`${two.url}/api/stats/fleet`, { "x-forwarded-for": "192.0.2.21" })).body
    expect(b.updated_at).toBe(a.updated_at)
    expect(b.models).toEqual(a.models)
  })
})
