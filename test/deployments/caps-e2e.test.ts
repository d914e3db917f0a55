/**
 * Per-deployment caps across replicas, end to end: two gateways in production mode (PostgreSQL + Redis, one key
 * prefix) in front of fake upstreams. A deployment with `concurrency: 3` never has more than 3 requests in flight
 * from both together, and the requests beyond it go to the other deployment; its `rate_limit_rpm` holds for both;
 * slots come back when clients leave and when streams are cut. Real time (Redis TIME): nothing here waits on a
 * window or a lease.
 */
import { Effect } from "effect"
import { Redis } from "ioredis"
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest"
import { LiveCatalog } from "../../src/config/Live.js"
import { seeded } from "../../src/deployments/Balancer.js"
import { keysOf } from "../../src/deployments/CapsRedis.js"
import { Deployments } from "../../src/deployments/Router.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { eventually } from "../support/Eventually.js"
import { type FakeDeployment, providerFor, startFakeDeployment } from "../support/FakeDeployment.js"
import { authed, type ConfigDoc, startGateway, type TestGateway } from "../support/Gateway.js"
import { deleteByPrefix, uniquePrefix } from "../support/Redis.js"
import { afterFlush } from "../support/Rows.js"
import { REDIS_URL, serviceGate } from "../support/Services.js"

const postgres = await serviceGate("postgres")
const redisUp = await serviceGate("redis")

const cleanups: Array<() => Promise<unknown>> = []
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup()
})

const fakes = async (names: ReadonlyArray<string>) => {
  const all = await Promise.all(names.map((n) => startFakeDeployment(n)))
  cleanups.push(() => Promise.all(all.map((f) => f.kill())))
  return all
}

interface Caps {
  readonly concurrency?: number
  readonly rate_limit_rpm?: number
}

/** Model `capped`: `gpu` with `caps` first, `backup` (no cap) only when gpu is not available. */
const configure = (gpu: FakeDeployment, backup: FakeDeployment, caps: Caps) => (doc: ConfigDoc) => {
  doc.abuse = { burst: 100_000, window_seconds: 10, cooldown_seconds: 60 }
  doc.limits = { ...doc.limits, failed_requests_per_minute: 100_000 }
  doc.routing = { health: { consecutive_failures: 1_000 } }
  doc.catalog.providers.gpu = providerFor(gpu, 30_000)
  doc.catalog.providers.backup = providerFor(backup)
  doc.catalog.models.push({
    id: "capped",
    owned_by: "test",
    max_input_tokens: 10_000,
    max_output_tokens: 100,
    rate_limit_rpm: 100_000,
    concurrency: 1_000,
    deployments: [
      { provider: "gpu", model: "gpu-model", ...caps },
      { provider: "backup", model: "backup-model", priority: 1 }
    ]
  })
}

const chat = (gw: TestGateway, key: string, stream = false, signal?: AbortSignal) =>
  fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: authed(key),
    body: JSON.stringify({ model: "capped", stream, messages: [{ role: "user", content: "hi" }] }),
    ...(signal ? { signal } : {})
  })

/** The body as far as it came: a stream cut by the gateway ends the read with an error. */
const received = async (response: Response): Promise<string> => {
  const decoder = new TextDecoder()
  let text = ""
  try {
    for await (const chunk of response.body!) text += decoder.decode(chunk as Uint8Array, { stream: true })
  } catch {
    // the connection was closed mid-stream
  }
  return text
}

/** What `GET /deployments` lists for the capped model's `gpu` deployment on this replica. */
const gpuListed = (gw: TestGateway) =>
  gw.run(Effect.gen(function*() {
    const deployments = yield* Deployments
    const catalog = yield* LiveCatalog
    const all = yield* deployments.status(catalog.current().catalog.models)
    return all.find((d) => d.model === "capped" && d.deployment === "gpu")!
  }))

/** This replica's in-flight count on each of the model's deployments. */
const inFlightOn = (gw: TestGateway) =>
  gw.run(Effect.gen(function*() {
    const deployments = yield* Deployments
    const catalog = yield* LiveCatalog
    const all = yield* deployments.status(catalog.current().catalog.models)
    return all.filter((d) => d.model === "capped").reduce((n, d) => n + d.inFlight, 0)
  }))

describe.skipIf(!postgres || !redisUp)("per-deployment caps across replicas (production)", () => {
  const prefix = uniquePrefix("deploy-caps-e2e")
  let db: FreshDatabase
  let redis: Redis
  /** The dev account's key, printed by the first gateway on the database. */
  let devKey = ""
  beforeAll(async () => {
    db = await freshDatabase("deploycaps")
    redis = new Redis(REDIS_URL)
  })
  afterAll(async () => {
    redis?.disconnect()
    await deleteByPrefix(REDIS_URL, prefix)
    await db?.drop()
  })

  /** Two replicas on one database and Redis prefix; the key of the dev account. */
  const replicas = async (configure: (doc: ConfigDoc) => void, label: string) => {
    const options = { configure, databaseUrl: db.url, redisUrl: REDIS_URL, redisPrefix: `${prefix}${label}:` }
    const one = await startGateway({ ...options, deploymentRandom: seeded(1) })
    cleanups.push(() => one.stop())
    const two = await startGateway({ ...options, deploymentRandom: seeded(2) })
    cleanups.push(() => two.stop())
    devKey ||= one.key || two.key
    const key = devKey
    return { one, two, key, slots: keysOf(`${prefix}${label}:`, "capped/gpu").slots }
  }

  it("two replicas never have more than concurrency requests in flight on a deployment; the rest go elsewhere", async () => {
    const [gpu, backup] = await fakes(["gpu", "backup"]) as [FakeDeployment, FakeDeployment]
    gpu.mode = { _tag: "slow", delayMs: 150 }
    backup.mode = { _tag: "slow", delayMs: 20 }
    const { one, two, key, slots } = await replicas(configure(gpu, backup, { concurrency: 3 }), "conc")
    const results: Array<{ status: number; text: string }> = []
    let next = 0
    const worker = async (w: number) => {
      while (next < 60) {
        const i = next++
        const response = await chat(w % 2 === 0 ? one : two, key, i % 3 === 0)
        results.push({ status: response.status, text: await response.text() })
      }
    }
    await Promise.all(Array.from({ length: 12 }, (_, w) => worker(w)))
    expect(results.map((r) => r.status)).toEqual(Array(60).fill(200))
    expect(gpu.maxInFlight()).toBeLessThanOrEqual(3)
    expect(gpu.maxInFlight()).toBe(3)
    expect(backup.requests()).toBeGreaterThan(0)
    expect(gpu.requests() + backup.requests()).toBe(60)
    // A skip is not an attempt: every row names the deployment that answered, at its first attempt.
    await afterFlush(two, () => Effect.void)
    const rows = await afterFlush(one, (sql) =>
      sql<{ deployment: string; attempts: number }>`SELECT deployment, attempts FROM request_log WHERE model_id = 'capped'`)
    expect(rows).toHaveLength(60)
    expect(rows.filter((r) => r.deployment === "gpu")).toHaveLength(gpu.requests())
    expect(rows.every((r) => r.attempts === 1)).toBe(true)
    // Every slot came back.
    await eventually(async () => (await redis.zcard(slots)) === 0, { what: "the fleet's slots released" })
    expect([await inFlightOn(one), await inFlightOn(two)]).toEqual([0, 0])
  }, 60_000)

  it("slots come back when clients leave and when streams are cut", async () => {
    const [gpu, backup] = await fakes(["gpu", "backup"]) as [FakeDeployment, FakeDeployment]
    gpu.mode = { _tag: "hang" }
    const { one, two, key, slots } = await replicas(configure(gpu, backup, { concurrency: 2 }), "leave")
    const leaving = [new AbortController(), new AbortController()]
    const pending = [one, two].map((gw, i) => chat(gw, key, true, leaving[i]!.signal).catch(() => null))
    await eventually(() => gpu.inFlight() === 2, { what: "two streams waiting on gpu" })
    expect(await redis.zcard(slots)).toBe(2)
    // Each replica lists its own attempt and the fleet's two.
    for (const gw of [one, two]) expect(await gpuListed(gw)).toMatchObject({ inFlight: 1, fleetInFlight: 2, startsLastMinute: null })
    // Full for both replicas: the next requests are answered by the backup.
    for (const gw of [one, two]) expect(await (await chat(gw, key)).text()).toContain("from backup")
    for (const controller of leaving) controller.abort()
    await Promise.all(pending)
    await eventually(async () => (await redis.zcard(slots)) === 0 && gpu.inFlight() === 0, {
      what: "the slots of the clients that left"
    })
    expect([await inFlightOn(one), await inFlightOn(two)]).toEqual([0, 0])

    // Streams cut after their first frame: each slot comes back too.
    gpu.mode = { _tag: "cut_after_first" }
    const cut: Array<string> = []
    for (const gw of [one, two, one, two]) cut.push(await chat(gw, key, true).then(received))
    expect(cut.every((text) => text.includes("from gpu") && !text.includes("[DONE]"))).toBe(true)
    await eventually(async () => (await redis.zcard(slots)) === 0, { what: "the slots of cut streams" })
    expect([await inFlightOn(one), await inFlightOn(two)]).toEqual([0, 0])
  }, 60_000)

  it("a deployment's rate_limit_rpm holds across two replicas", async () => {
    const [gpu, backup] = await fakes(["gpu", "backup"]) as [FakeDeployment, FakeDeployment]
    const { one, two, key } = await replicas(configure(gpu, backup, { rate_limit_rpm: 5 }), "rpm")
    const answered: Array<string> = []
    for (let i = 0; i < 20; i++) {
      const response = await chat(i % 2 === 0 ? one : two, key)
      expect(response.status).toBe(200)
      answered.push((await response.json() as { choices: Array<{ message: { content: string } }> }).choices[0]!.message.content)
    }
    expect(gpu.requests()).toBe(5)
    expect(backup.requests()).toBe(15)
    expect(answered.slice(0, 5)).toEqual(Array(5).fill("from gpu"))
    expect(answered.slice(5)).toEqual(Array(15).fill("from backup"))
    // Both replicas list the fleet's five starts of the minute (no concurrency cap: no fleet in-flight figure).
    for (const gw of [one, two]) expect(await gpuListed(gw)).toMatchObject({ startsLastMinute: 5, fleetInFlight: null })
  }, 60_000)
})
