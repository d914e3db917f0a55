/**
 * Deployments end to end: a gateway (embedded, and PostgreSQL + Redis in production mode) in front of three fake
 * OpenAI-compatible servers the test starts. Weights over 1,000 requests; a server killed mid-load with no
 * client-visible error; a 429 with Retry-After skipped; a slow server avoided by least-in-flight; no double charge
 * and no in-flight overrun under failover, with the row recording the answering deployment and the attempts; two
 * replicas agreeing on an ejection; the operator listing and the CLI.
 */
import { Effect } from "effect"
import { afterAll, afterEach, describe, expect, it } from "vitest"
import { run as runCli } from "../../src/cli.js"
import { Settings } from "../../src/config/Live.js"
import { seeded } from "../../src/deployments/Balancer.js"
import { Admission } from "../../src/quota/Admission.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import {
  type FakeDeployment,
  providerFor,
  type SharedLoad,
  startFakeDeployment
} from "../support/FakeDeployment.js"
import { authed, type ConfigDoc, startGateway, type TestGateway } from "../support/Gateway.js"
import { eventually } from "../support/Eventually.js"
import { deleteByPrefix, freePort, uniquePrefix } from "../support/Redis.js"
import { afterFlush } from "../support/Rows.js"
import { REDIS_URL, serviceGate } from "../support/Services.js"

const postgres = await serviceGate("postgres")
const redis = await serviceGate("redis")

const cleanups: Array<() => Promise<unknown>> = []
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup()
})

const fakes = async (names: ReadonlyArray<string>, shared?: SharedLoad) => {
  const all = await Promise.all(names.map((n) => startFakeDeployment(n, shared)))
  cleanups.push(() => Promise.all(all.map((f) => f.kill())))
  return all
}

interface ModelOptions {
  readonly weights?: ReadonlyArray<number>
  readonly concurrency?: number
  readonly health?: object
  readonly failover?: object
  readonly operatorPort?: number
}

/** The default config plus model `multi` over `ups`, quotas out of the way. */
const configure = (ups: ReadonlyArray<FakeDeployment>, options: ModelOptions = {}) => (doc: ConfigDoc) => {
  doc.abuse = { burst: 100_000, window_seconds: 10, cooldown_seconds: 60 }
  doc.limits = { ...doc.limits, failed_requests_per_minute: 100_000 }
  doc.routing = {
    health: { consecutive_failures: 2, open_seconds: 60, ...options.health },
    failover: { max_attempts: 3, budget_seconds: 30, ...options.failover }
  }
  if (options.operatorPort !== undefined) {
    doc.listeners = [...doc.listeners, { host: "127.0.0.1", port: options.operatorPort, origins: ["operator"] }]
  }
  for (const up of ups) doc.catalog.providers[up.name] = providerFor(up)
  doc.catalog.models.push({
    id: "multi",
    owned_by: "test",
    max_input_tokens: 10_000,
    max_output_tokens: 100,
    rate_limit_rpm: 100_000,
    concurrency: options.concurrency ?? 1_000,
    weights: { input: 1, output: 1 },
    deployments: ups.map((up, i) => ({ provider: up.name, model: `${up.name}-model`, weight: options.weights?.[i] ?? 1 }))
  })
}

const chat = (gw: TestGateway, stream = false) =>
  fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: authed(gw.key),
    body: JSON.stringify({ model: "multi", stream, messages: [{ role: "user", content: "hi" }] })
  })

/** Sends `n` requests, `concurrency` at a time; returns status and text of each. */
const load = async (n: number, concurrency: number, send: (i: number) => Promise<Response>) => {
  const results: Array<{ status: number; text: string }> = []
  let next = 0
  const worker = async () => {
    while (next < n) {
      const i = next++
      const response = await send(i)
      results[i] = { status: response.status, text: await response.text() }
    }
  }
  await Promise.all(Array.from({ length: concurrency }, worker))
  return results
}

const start = async (options: Parameters<typeof startGateway>[0]) => {
  const gw = await startGateway({ deploymentRandom: seeded(11), ...options })
  cleanups.push(() => gw.stop())
  return gw
}

interface Row {
  readonly status: string
  readonly http_status: number
  readonly deployment: string | null
  readonly attempts: number
  readonly api: string
  readonly weighted_cost: number
  readonly account_id: string
}

const rowsOf = (gw: TestGateway) =>
  afterFlush(gw, (sql) =>
    sql<Row>`SELECT status, http_status, deployment, attempts, api, weighted_cost, account_id
             FROM request_log WHERE model_id = 'multi' ORDER BY id`)

describe("deployments end to end (embedded)", () => {
  it("shares 1,000 sequential requests by weight 1:2:5 (each share within 4 points)", async () => {
    const ups = await fakes(["a", "b", "c"])
    const gw = await start({ configure: configure(ups, { weights: [1, 2, 5] }) })
    const results = await load(1_000, 1, () => chat(gw))
    expect(results.every((r) => r.status === 200)).toBe(true)
    const shares = ups.map((u) => u.requests() / 1_000)
    expect(Math.abs(shares[0]! - 1 / 8)).toBeLessThan(0.04)
    expect(Math.abs(shares[1]! - 2 / 8)).toBeLessThan(0.04)
    expect(Math.abs(shares[2]! - 5 / 8)).toBeLessThan(0.04)
    const rows = await rowsOf(gw)
    expect(rows).toHaveLength(1_000)
    for (const up of ups) expect(rows.filter((r) => r.deployment === up.name).length).toBe(up.requests())
    expect(rows.every((r) => r.attempts === 1 && r.api === "chat")).toBe(true)
  }, 120_000)

  it("a server killed mid-load costs no client-visible error for requests not yet streaming", async () => {
    const ups = await fakes(["a", "b", "c"])
    for (const up of ups) up.mode = { _tag: "slow", delayMs: 15 }
    const gw = await start({ configure: configure(ups) })
    let done = 0
    const killed = { at: -1 }
    const results = await load(240, 12, async (i) => {
      if (done === 80 && killed.at < 0) {
        killed.at = i
        void ups[1]!.kill()
      }
      const response = await chat(gw, i % 2 === 0)
      done += 1
      return response
    })
    expect(killed.at).toBeGreaterThan(0)
    for (const r of results) expect(r.status).toBe(200)
    // Streams completed in full.
    for (const [i, r] of results.entries()) if (i % 2 === 0) expect(r.text.endsWith("data: [DONE]\n\n")).toBe(true)
    const rows = await rowsOf(gw)
    expect(rows.every((r) => r.status === "success")).toBe(true)
    // The killed server answered nothing after it died: later rows name a or c.
    expect(rows.slice(-60).every((r) => r.deployment !== "b")).toBe(true)
  }, 60_000)

  it("a 429 with Retry-After fails over and keeps that deployment out", async () => {
    const ups = await fakes(["a", "b", "c"])
    ups[0]!.mode = { _tag: "rate_limited", retryAfterSeconds: 120 }
    const gw = await start({ configure: configure(ups, { health: { consecutive_failures: 50 } }) })
    const first = await load(30, 1, () => chat(gw))
    expect(first.every((r) => r.status === 200)).toBe(true)
    expect(ups[0]!.requests()).toBe(1)
    ups[0]!.mode = { _tag: "ok" }
    const later = await load(60, 1, () => chat(gw))
    expect(later.every((r) => r.status === 200)).toBe(true)
    expect(ups[0]!.requests()).toBe(1)
    const rows = await rowsOf(gw)
    expect(rows.filter((r) => r.attempts === 2)).toHaveLength(1)
  }, 60_000)

  it("a slow server is avoided by least-in-flight", async () => {
    const ups = await fakes(["slow", "b", "c"])
    ups[0]!.mode = { _tag: "slow", delayMs: 300 }
    ups[1]!.mode = { _tag: "slow", delayMs: 10 }
    ups[2]!.mode = { _tag: "slow", delayMs: 10 }
    const gw = await start({ configure: configure(ups) })
    const results = await load(150, 6, () => chat(gw))
    expect(results.every((r) => r.status === 200)).toBe(true)
    // Equal weights would give it a third (50); while its requests are in flight the others are preferred.
    expect(ups[0]!.requests()).toBeLessThan(20)
  }, 60_000)

  it("failover neither charges twice nor overruns the model's in-flight cap; rows name the answering deployment", async () => {
    const shared: SharedLoad = { inFlight: 0, max: 0 }
    const ups = await fakes(["bad", "b", "c"], shared)
    ups[0]!.mode = { _tag: "status", status: 500 }
    ups[1]!.mode = { _tag: "slow", delayMs: 40 }
    ups[2]!.mode = { _tag: "slow", delayMs: 40 }
    const gw = await start({ configure: configure(ups, { concurrency: 3, health: { consecutive_failures: 1_000 } }) })
    // As many at a time as the cap: failover never takes a second slot, so none is refused.
    const atCap = await load(40, 3, () => chat(gw))
    expect(atCap.map((r) => r.status)).toEqual(Array(40).fill(200))
    // Over the cap: the rest are refused with 529, and the upstreams never see more than 3 at once.
    const over = await load(20, 8, () => chat(gw))
    const results = [...atCap, ...over]
    const ok = results.filter((r) => r.status === 200)
    const capped = results.filter((r) => r.status === 529)
    expect(ok.length + capped.length).toBe(60)
    expect(capped.length).toBeGreaterThan(0)
    expect(shared.max).toBeLessThanOrEqual(3)
    const rows = await rowsOf(gw)
    expect(rows).toHaveLength(60)
    const successes = rows.filter((r) => r.status === "success")
    expect(successes).toHaveLength(ok.length)
    for (const r of successes) {
      expect(["b", "c"]).toContain(r.deployment)
      expect([1, 2]).toContain(r.attempts)
    }
    expect(successes.some((r) => r.attempts === 2)).toBe(true)
    // Every success charged once: 7 input + 3 output tokens at weight 1; the refused charged nothing.
    for (const r of successes) expect(r.weighted_cost).toBe(10)
    const standing = await gw.run(Effect.gen(function*() {
      const settings = yield* Settings
      const admission = yield* Admission
      return yield* admission.standing(successes[0]!.account_id, settings.planFor(null))
    }))
    expect(standing.session.used).toBe(10 * successes.length)
    // The bad deployment saw only first attempts: each of its failures was followed by one on b or c.
    expect(ups[0]!.requests()).toBe(successes.filter((r) => r.attempts === 2).length)
  }, 60_000)

  it("embeddings fail over too, and their rows name the deployment", async () => {
    const ups = await fakes(["bad", "good"])
    ups[0]!.mode = { _tag: "status", status: 500 }
    const gw = await start({
      configure: (doc) => {
        configure(ups, { health: { consecutive_failures: 1_000 } })(doc)
        const multi = doc.catalog.models.find((m: { id: string }) => m.id === "multi")
        multi.supports_embeddings = true
        multi.supports_chat = false
      }
    })
    const results = await load(20, 2, () =>
      fetch(`${gw.url}/v1/embeddings`, {
        method: "POST",
        headers: authed(gw.key),
        body: JSON.stringify({ model: "multi", input: ["one", "two"] })
      }))
    expect(results.map((r) => r.status)).toEqual(Array(20).fill(200))
    expect(ups[0]!.requests()).toBeGreaterThan(0)
    const rows = await rowsOf(gw)
    expect(rows.every((r) => r.deployment === "good" && r.api === "embeddings")).toBe(true)
    expect(rows.filter((r) => r.attempts === 2)).toHaveLength(ups[0]!.requests())
  }, 60_000)

  it("a catalog edit adds and removes deployments without a restart", async () => {
    const ups = await fakes(["a", "b"])
    const gw = await start({ configure: configure([ups[0]!]) })
    await load(10, 1, () => chat(gw))
    expect(ups[0]!.requests()).toBe(10)
    gw.rewriteConfig((doc) => {
      doc.catalog.providers.b = providerFor(ups[1]!)
      const multi = doc.catalog.models.find((m: { id: string }) => m.id === "multi")
      multi.deployments = [{ provider: "b", model: "b-model" }]
    })
    await eventually(async () => {
      await chat(gw).then((r) => r.text())
      return ups[1]!.requests() > 0
    })
    const before = ups[0]!.requests()
    await load(20, 1, () => chat(gw))
    expect(ups[0]!.requests()).toBe(before)
  }, 60_000)

  it("the operator listener and deployments:list show each deployment's state", async () => {
    const ups = await fakes(["a", "b"])
    ups[0]!.mode = { _tag: "status", status: 503 }
    const operatorPort = await freePort()
    const gw = await start({ configure: configure(ups, { operatorPort }) })
    await load(20, 1, () => chat(gw))
    const listed = await (await fetch(`http://127.0.0.1:${operatorPort}/deployments`)).json() as {
      data: Array<{ model: string; deployment: string; state: string; retryInSeconds: number }>
    }
    const multi = listed.data.filter((d) => d.model === "multi")
    expect(multi.map((d) => [d.deployment, d.state])).toEqual([["a", "open"], ["b", "closed"]])
    expect(multi[0]!.retryInSeconds).toBeGreaterThan(50)
    let out = ""
    const code = await runCli(["deployments:list", "--url", `http://127.0.0.1:${operatorPort}`], {
      out: (s) => void (out += s),
      err: () => {}
    })
    expect(code).toBe(0)
    expect(out).toMatch(/^MODEL\s+DEPLOYMENT\s+PROVIDER.*\s+IN FLIGHT\s+STARTS\/60S\s+FAILURES\n/)
    expect(out).toMatch(/\nmulti\s+a\s+a\s+a-model\s+1\s+0\s+open\s+\d+s/)
    expect(out).toMatch(/\nmulti\s+b\s+b\s+b-model\s+1\s+0\s+closed\s+-/)
    // The inference origin does not serve it.
    expect((await fetch(`${gw.url}/deployments`)).status).toBe(404)
  }, 60_000)
})

describe.skipIf(!postgres || !redis)("deployments end to end (production: PostgreSQL + Redis)", () => {
  const prefix = uniquePrefix("deploy")
  let db: FreshDatabase | undefined
  afterAll(async () => {
    await deleteByPrefix(REDIS_URL, prefix)
    await db?.drop()
  })

  it("two replicas agree on an ejection", async () => {
    const ups = await fakes(["a", "b"])
    ups[0]!.mode = { _tag: "status", status: 502 }
    db = await freshDatabase("deploy")
    const options = { configure: configure(ups), databaseUrl: db.url, redisUrl: REDIS_URL, redisPrefix: prefix }
    const one = await start(options)
    const two = await start(options)
    const keyOne = one.key || two.key
    // Replica one sees a fail until it ejects it.
    while (ups[0]!.requests() < 2) {
      const response = await fetch(`${one.url}/v1/chat/completions`, {
        method: "POST",
        headers: authed(keyOne),
        body: JSON.stringify({ model: "multi", messages: [{ role: "user", content: "hi" }] })
      })
      expect(response.status).toBe(200)
    }
    const stateOn = (gw: TestGateway) =>
      gw.run(Effect.gen(function*() {
        const { Deployments } = yield* Effect.promise(() => import("../../src/deployments/Router.js"))
        const { LiveCatalog } = yield* Effect.promise(() => import("../../src/config/Live.js"))
        const deployments = yield* Deployments
        const catalog = yield* LiveCatalog
        const all = yield* deployments.status(catalog.current().catalog.models)
        return all.find((d) => d.model === "multi" && d.deployment === "a")!.state
      }))
    expect(await stateOn(one)).toBe("open")
    // Replica two learns it through Redis, without failing on a itself.
    await eventually(async () => (await stateOn(two)) === "open")
    const seen = ups[0]!.requests()
    const results = await load(30, 3, () =>
      fetch(`${two.url}/v1/chat/completions`, {
        method: "POST",
        headers: authed(keyOne),
        body: JSON.stringify({ model: "multi", messages: [{ role: "user", content: "hi" }] })
      }))
    expect(results.every((r) => r.status === 200)).toBe(true)
    expect(ups[0]!.requests()).toBe(seen)
  }, 60_000)
})
