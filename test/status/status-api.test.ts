/**
 * Issue 18, points 1–3: the public status API over HTTP, on the embedded PGlite and on PostgreSQL.
 *
 * - every endpoint's shape, on the origins that serve it (account and status listeners apart), CORS and caching;
 * - the fleet from real traffic: sparkline, speed, first byte, the live `max_input_tokens`; client-fault errors do
 *   not degrade a model; degraded → down → ok → idle as the clock moves over injected rows (TestClock);
 * - the quota block from the live daily caps; server stats; incidents written by the operator CLI, `limit` clamped;
 * - 5,000 requests of `/api/stats/fleet` send zero SQL statements (counted on the wire: support/SqlCounter.ts);
 * - 60 requests per minute per client address (X-Forwarded-For from a trusted proxy), then 429 with Retry-After.
 */
import { Context, Effect } from "effect"
import { TestClock } from "effect/testing"
import * as Path from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { LiveCatalog } from "../../src/config/Live.js"
import { run as runCli } from "../../src/cli.js"
import { decodeGatewayConfig } from "../../src/config/GatewayConfig.js"
import { ImageQueue } from "../../src/images/Contracts.js"
import * as Status from "../../src/status/Status.js"
import { StatusCache } from "../../src/status/Status.js"
import { errorRow, insertRows, row, unique } from "../accounts/support.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { defaultConfigDoc, startGateway, type TestGateway } from "../support/Gateway.js"
import { serviceGate } from "../support/Services.js"
import { makeSqlCounter, untilQuiet } from "../support/SqlCounter.js"
import { chat, get, originUrl, refreshStatus, sortedKeys } from "./support.js"

const postgresAvailable = await serviceGate("postgres")

const backends = [
  { name: "embedded PGlite", postgres: false },
  { name: "PostgreSQL", postgres: true }
] as const

/** Each test sends from its own client address (through the trusted proxy 127.0.0.1), so budgets do not mix. */
let nextAddress = 1
const newAddress = () => `198.51.100.${nextAddress++ % 250}`
const from = (address: string) => ({ "x-forwarded-for": address })

/** The effect without the gateway's `ImageQueue` in its context. */
const withoutImageQueue = <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  Effect.updateContext(effect, (context: Context.Context<R>) => Context.omit(ImageQueue)(context) as Context.Context<R>)

const T0 = Date.parse("2021-03-01T12:00:00Z")
const MINUTE = 60_000

describe.each(backends)("public status API on $name", ({ postgres }) => {
  const skip = postgres && !postgresAvailable
  let gw: TestGateway
  let db: FreshDatabase | undefined
  let account: string
  let status: string
  const counter = makeSqlCounter()

  const cli = async (...args: Array<string>) => {
    let stdout = ""
    let stderr = ""
    const env: NodeJS.ProcessEnv = db
      ? { DATABASE_URL: db.url, WELLSPRING_CONFIG: gw.configPath }
      : { WELLSPRING_CONFIG: gw.configPath, WELLSPRING_DATA_DIR: Path.join(gw.dir, "data") }
    const code = await runCli(args, { out: (s) => (stdout += s), err: (s) => (stderr += s) }, env)
    return { code, stdout, stderr }
  }

  beforeAll(async () => {
    if (skip) return
    db = postgres ? await freshDatabase("status") : undefined
    gw = await startGateway({
      ...(db ? { databaseUrl: db.url } : {}),
      sqlTap: counter.tap,
      configure: (doc) => {
        doc.listeners = [
          { host: "127.0.0.1", port: 0, origins: ["inference", "account"] },
          { host: "127.0.0.1", port: 0, origins: ["status"] }
        ]
        doc.trusted_proxies = ["127.0.0.1"]
        // Refreshes happen when a test asks (refreshStatus), not on their own in the middle of one.
        doc.status = { refresh_seconds: 3600, all_time_refresh_seconds: 3600 }
      }
    })
    account = await originUrl(gw, "account")
    status = await originUrl(gw, "status")
  }, 120_000)

  afterAll(async () => {
    await gw?.stop()
    await db?.drop()
  })

  it.skipIf(skip)("each endpoint on its origins: shapes, CORS, Cache-Control; the page on the status origin only", async () => {
    await refreshStatus(gw)
    const address = newAddress()
    for (const base of [account, status]) {
      const fleet = await get(`${base}/api/stats/fleet`, from(address))
      expect(fleet.status).toBe(200)
      expect(fleet.headers.get("access-control-allow-origin")).toBe("*")
      expect(fleet.headers.get("access-control-allow-credentials")).toBeNull()
      expect(fleet.headers.get("cache-control")).toBe("public, max-age=3600")
      // `images`: the gateway runs an image queue (issue 17).
      expect(sortedKeys(fleet.body)).toEqual(["disabled", "images", "models", "updated_at"])
      expect(sortedKeys(fleet.body.images)).toEqual(["queue_depth", "workers_online"])
      expect(fleet.body.images.queue_depth).toEqual(expect.any(Number))
      expect(fleet.body.images.workers_online).toEqual(expect.any(Number))
      expect(fleet.body.models.map((m: any) => m.id)).toEqual(["ws-pro", "ws-reasoner", "ws-lite", "ws-embed"])
      for (const m of fleet.body.models) {
        expect(sortedKeys(m)).toEqual(["display_name", "id", "max_input_tokens", "sparkline", "status", "tps", "ttfb_ms"])
        expect(m.sparkline).toHaveLength(7)
      }
      expect(fleet.body.disabled).toEqual([{ id: "ws-legacy", displayName: "ws-legacy", note: "점검 중" }])
      expect(Number.isNaN(Date.parse(fleet.body.updated_at))).toBe(false)

      const server = await get(`${base}/api/stats/server?unknown=1`, from(address))
      expect(server.status).toBe(200)
      expect(server.headers.get("access-control-allow-origin")).toBe("*")
      expect(sortedKeys(server.body)).toEqual(["allTime", "all_time_updated_at", "quota", "tps", "updated_at", "users"])
      expect(sortedKeys(server.body.allTime)).toEqual(["input", "output", "requests", "tokens"])
      expect(sortedKeys(server.body.quota)).toEqual(["global", "models", "requests", "updated_at"])

      const incidents = await get(`${base}/api/incidents`, from(address))
      expect(incidents.status).toBe(200)
      expect(sortedKeys(incidents.body)).toEqual(["active", "incidents", "limit", "updated_at"])
      expect(incidents.body.limit).toBe(10)
    }
    // `/api/quota` is the account origin's.
    const quota = await get(`${account}/api/quota?x=y`, from(address))
    expect(quota.status).toBe(200)
    expect(quota.headers.get("access-control-allow-origin")).toBe("*")
    expect(sortedKeys(quota.body)).toEqual(["global", "models", "requests", "updated_at"])
    expect(sortedKeys(quota.body.global)).toEqual(["limit", "remaining", "reset_at", "used"])
    // Enabled models with a daily cap; `global` is their sum; the reset is the next 00:00 UTC (09:00 KST).
    expect(Object.keys(quota.body.models).sort()).toEqual(["ws-pro", "ws-reasoner"])
    expect(quota.body.models["ws-pro"]).toMatchObject({ limit: 50_000_000 })
    expect(quota.body.global.limit).toBe(70_000_000)
    const reset = Date.parse(quota.body.global.reset_at)
    expect(reset % 86_400_000).toBe(0)
    expect(reset - Date.now()).toBeGreaterThan(0)
    expect(reset - Date.now()).toBeLessThanOrEqual(86_400_000)
    expect((await get(`${status}/api/quota`, from(address))).status).toBe(404)

    const page = await get(`${status}/`)
    expect(page.status).toBe(200)
    expect(page.headers.get("content-type")).toBe("text/html; charset=utf-8")
    const csp = page.headers.get("content-security-policy")!
    expect(csp).toContain("default-src 'none'")
    expect(csp).toContain("script-src 'self'")
    expect(csp).toContain("connect-src 'self'")
    expect(csp).not.toContain("unsafe-inline")
    expect(String(page.body)).toContain("<html lang=\"ko\">")
    expect(String(page.body)).not.toMatch(/<script>|<style>| style=| on[a-z]+=/)
    for (const asset of ["/status.js", "/status.css"]) {
      const res = await get(`${status}${asset}`)
      expect(res.status).toBe(200)
      expect(res.headers.get("x-content-type-options")).toBe("nosniff")
    }
    expect((await get(`${account}/`)).status).toBe(404)
  })

  it.skipIf(skip)("real traffic: the fleet shows output, speed and first byte; client-fault errors do not degrade", async () => {
    const before = (await get(`${account}/api/quota`, from(newAddress()))).body
    for (let i = 0; i < 4; i++) expect((await chat(gw, "ws-lite")).status).toBe(200)
    for (let i = 0; i < 2; i++) expect((await chat(gw, "ws-pro")).status).toBe(200)
    // The caller's own fault: 400 tools_not_supported, many times.
    const tools = [{ type: "function", function: { name: "f", parameters: { type: "object" } } }]
    for (let i = 0; i < 10; i++) expect((await chat(gw, "ws-lite", { tools })).status).toBe(400)
    await refreshStatus(gw)
    const address = newAddress()
    const fleet = (await get(`${status}/api/stats/fleet`, from(address))).body
    const lite = fleet.models.find((m: any) => m.id === "ws-lite")
    expect(lite.status).toBe("ok")
    expect(lite.sparkline.slice(0, 6)).toEqual([0, 0, 0, 0, 0, 0])
    expect(lite.sparkline[6]).toBeGreaterThan(0)
    expect(lite.ttfb_ms).toEqual(expect.any(Number))
    expect(lite.tps === null || lite.tps > 0).toBe(true)
    expect(lite.max_input_tokens).toBe(32_000)
    // Never used: idle.
    expect(fleet.models.find((m: any) => m.id === "ws-embed").status).toBe("idle")

    const quota = (await get(`${account}/api/quota`, from(address))).body
    expect(quota.models["ws-pro"].used).toBeGreaterThan(before.models["ws-pro"].used)
    expect(quota.models["ws-pro"].remaining).toBe(50_000_000 - quota.models["ws-pro"].used)
    expect(quota.global.used).toBe(quota.models["ws-pro"].used + quota.models["ws-reasoner"].used)
    expect(quota.requests).toBe(before.requests + 6)

    const server = (await get(`${status}/api/stats/server`, from(address))).body
    expect(server.users).toBe(1)
    expect(server.tps).toBeGreaterThan(0)
    expect(server.allTime.requests).toBeGreaterThanOrEqual(6)
    expect(server.allTime.tokens).toBe(server.allTime.input + server.allTime.output)
    expect(server.quota.models).toEqual(quota.models)
  })

  it.skipIf(skip)("max_input_tokens is the live catalog's, without waiting for a refresh", async () => {
    gw.rewriteConfig((doc) => {
      doc.catalog.models.find((m: any) => m.id === "ws-lite").max_input_tokens = 31_000
    })
    expect(await gw.run(Effect.flatMap(LiveCatalog, (c) => c.reload))).toBe(true)
    const fleet = (await get(`${status}/api/stats/fleet`, from(newAddress()))).body
    expect(fleet.models.find((m: any) => m.id === "ws-lite").max_input_tokens).toBe(31_000)
    gw.rewriteConfig((doc) => {
      doc.catalog.models.find((m: any) => m.id === "ws-lite").max_input_tokens = 32_000
    })
    await gw.run(Effect.flatMap(LiveCatalog, (c) => c.reload))
  })

  it.skipIf(skip)("incidents from the operator CLI: newest first, updates newest first, active count, limit clamped", async () => {
    const first = await cli("incident:create", "--title", "ws-pro 응답 지연", "--message", "원인을 조사하고 있습니다.")
    expect(first.code, first.stderr).toBe(0)
    const id1 = Number(first.stdout.split("\n")[0])
    expect(id1).toBeGreaterThan(0)
    const second = await cli("incident:create", "--title", "대시보드 점검", "--status", "monitoring")
    expect(second.code, second.stderr).toBe(0)
    const id2 = Number(second.stdout.split("\n")[0])
    expect((await cli("incident:update", "--id", String(id1), "--message", "업스트림 장애로 확인되었습니다.", "--status", "identified")).code).toBe(0)
    expect((await cli("incident:resolve", "--id", String(id1))).code).toBe(0)
    // Usage errors: exit 2, nothing written.
    const twice = await cli("incident:resolve", "--id", String(id1))
    expect(twice.code).toBe(2)
    expect(twice.stderr).toContain("already resolved")
    expect((await cli("incident:update", "--id", "999999", "--message", "x")).code).toBe(2)
    expect((await cli("incident:update", "--id", String(id2), "--message", "x", "--status", "fixed")).code).toBe(2)
    expect((await cli("incident:create", "--message", "no title")).code).toBe(2)
    expect((await cli("incident:create", "--title", "x".repeat(201))).code).toBe(2)
    const list = await cli("incident:list")
    expect(list.code).toBe(0)
    expect(list.stdout).toContain("대시보드 점검")
    expect(list.stdout).toContain("1 not resolved")

    await refreshStatus(gw)
    const address = newAddress()
    const body = (await get(`${status}/api/incidents?limit=10&whatever=1`, from(address))).body
    expect(body.active).toBe(1)
    expect(body.incidents.map((i: any) => i.id)).toEqual([id2, id1])
    const [monitoring, resolved] = body.incidents
    expect(sortedKeys(monitoring)).toEqual(["created_at", "id", "resolved_at", "status", "title", "updated_at", "updates"])
    expect(monitoring).toMatchObject({ title: "대시보드 점검", status: "monitoring", updates: [], resolved_at: null })
    expect(resolved.status).toBe("resolved")
    expect(resolved.resolved_at).toEqual(expect.any(String))
    expect(resolved.updates.map((u: any) => [u.status, u.message])).toEqual([
      ["resolved", "문제가 해결되었습니다."],
      ["identified", "업스트림 장애로 확인되었습니다."],
      ["investigating", "원인을 조사하고 있습니다."]
    ])
    for (const u of resolved.updates) expect(sortedKeys(u)).toEqual(["at", "message", "status"])

    // `limit` like the requests limit: default 10, cap 50, bad values fall back to the default.
    const limitOf = async (q: string) => (await get(`${account}/api/incidents${q}`, from(address))).body
    expect((await limitOf("?limit=1")).incidents.map((i: any) => i.id)).toEqual([id2])
    expect((await limitOf("?limit=1")).limit).toBe(1)
    for (const [q, expected] of [["", 10], ["?limit=0", 10], ["?limit=-3", 10], ["?limit=abc", 10], ["?limit=2.9", 2], ["?limit=1000", 50], ["?limit=50", 50]] as const) {
      expect((await limitOf(q)).limit, q).toBe(expected)
    }
  })

  it.skipIf(skip)("5,000 requests of /api/stats/fleet send zero SQL statements; a refresh sends some", async () => {
    await refreshStatus(gw)
    const expected = (await get(`${status}/api/stats/fleet`, from(newAddress()))).body
    // The earlier tests' chat traffic leaves writes behind (quota totals; key last-used stamps, every 5 s): wait
    // until they are done.
    await untilQuiet(counter, 6_000)
    const before = counter.statements()
    const texts = counter.texts().length
    let ok = 0
    // 50 concurrent clients; 100 addresses with 50 requests each keep every one under its 60 per minute.
    await Promise.all(Array.from({ length: 50 }, async (_, worker) => {
      for (let i = worker; i < 5_000; i += 50) {
        const address = `203.0.113.${Math.floor(i / 50) + 1}`
        const res = await fetch(`${status}/api/stats/fleet`, { headers: { "x-forwarded-for": address } })
        const body = await res.json() as any
        if (res.status === 200 && body.updated_at === expected.updated_at) ok++
      }
    }))
    expect(ok).toBe(5_000)
    expect(counter.opaque()).toBe(0)
    expect(counter.statements() - before, counter.texts().slice(texts).join("\n")).toBe(0)
    // The counter sees the statements the refresh sends, so the zero above is a real zero.
    await gw.run(Effect.flatMap(StatusCache, (cache) => cache.fleet.refresh))
    expect(counter.statements() - before).toBeGreaterThan(0)
  }, 120_000)

  it.skipIf(skip)("60 requests per minute per client address, all endpoints together; then 429 with Retry-After", async () => {
    const address = newAddress()
    const paths = ["/api/stats/fleet", "/api/stats/server", "/api/incidents", "/api/quota"]
    for (let i = 0; i < 60; i++) {
      const res = await get(`${account}${paths[i % paths.length]}`, from(address))
      expect(res.status, `request ${i + 1}`).toBe(200)
    }
    const limited = await get(`${status}/api/stats/fleet`, from(address))
    expect(limited.status).toBe(429)
    expect(limited.body.error.code).toBe("rate_limited")
    expect(limited.body.error.message).toContain("60")
    expect(limited.headers.get("access-control-allow-origin")).toBe("*")
    expect(limited.headers.get("cache-control")).toBe("no-store")
    const retryAfter = Number(limited.headers.get("retry-after"))
    expect(retryAfter).toBeGreaterThanOrEqual(1)
    expect(retryAfter).toBeLessThanOrEqual(60)
    // Another address has its own budget. Entries a client writes in front of its own do not change the counted
    // address (the rightmost one that is not a trusted proxy).
    expect((await get(`${account}/api/stats/fleet`, from(newAddress()))).status).toBe(200)
    expect((await get(`${account}/api/stats/fleet`, from(`${newAddress()}, ${address}`))).status).toBe(429)
  })

  it.skipIf(skip)("image workers appear in the fleet exactly when an ImageQueue service exists", async () => {
    const config = decodeGatewayConfig({ ...defaultConfigDoc(), status: { refresh_seconds: 10_000_000 } }, "test").status
    const fleetWith = (queue: ImageQueue["Service"] | null) =>
      gw.run(Effect.gen(function*() {
        const make = Status.make(config)
        // The gateway's own queue is in the context: replaced, or removed.
        const cache = yield* (queue === null
          ? withoutImageQueue(make)
          : make.pipe(Effect.provideService(ImageQueue, queue)))
        return Status.fleetBody(yield* Effect.flatMap(LiveCatalog, (c) => Effect.sync(() => c.current())), yield* cache.fleet.get)
      }).pipe(Effect.scoped))
    const queue = ImageQueue.of({
      run: () => Effect.die("not used"),
      waiting: Effect.succeed(4),
      workersOnline: Effect.succeed(2)
    })
    expect((await fleetWith(queue)).images).toEqual({ workers_online: 2, queue_depth: 4 })
    expect("images" in (await fleetWith(null))).toBe(false)
  })

  it.skipIf(skip)("degraded, down, ok, idle as the TestClock moves over injected rows; client faults and BYOK never count", async () => {
    const who = unique("acct")
    const at = (msBefore: number) => new Date(T0 - msBefore)
    await insertRows(gw, [
      // ws-lite: 20 successes over the last 10 minutes...
      ...Array.from({ length: 20 }, (_, i) => row(who, { model_id: "ws-lite", created_at: at(10 * MINUTE - i * 20_000), output_tokens: 600 })),
      // ...then 3 upstream failures: 3 of 23 (13%) in the window, 3 of the last 10: degraded, not down.
      ...Array.from({ length: 3 }, (_, i) => errorRow(who, "upstream_error", 500, { model_id: "ws-lite", created_at: at(2 * MINUTE - i * 1000) })),
      // BYOK failures are the caller's own provider's: not the fleet's.
      ...Array.from({ length: 30 }, () => errorRow(who, "upstream_error", 500, { model_id: "ws-lite", byok: true, created_at: at(MINUTE) })),
      // ws-reasoner: 5 successes and a pile of the callers' own faults, refusals and disconnects.
      ...Array.from({ length: 5 }, (_, i) => row(who, { model_id: "ws-reasoner", created_at: at(5 * MINUTE + i * 1000) })),
      ...[
        ["invalid_messages", 400],
        ["invalid_api_key", 401],
        ["account_unlinked", 403],
        ["payload_too_large", 413],
        ["rate_limited", 429],
        ["model_quota_exceeded", 429],
        ["model_overloaded", 529],
        ["cancelled", 499]
      ].flatMap(([code, status]) =>
        Array.from({ length: 5 }, () => errorRow(who, code as string, status as number, { model_id: "ws-reasoner", created_at: at(MINUTE) }))
      )
    ])
    const fleetAt = (sets: ReadonlyArray<number>) =>
      gw.run(Effect.gen(function*() {
        // A fresh set of refreshers on the TestClock (period long enough that only explicit refreshes run).
        const config = decodeGatewayConfig({ ...defaultConfigDoc(), status: { refresh_seconds: 10_000_000 } }, "test").status
        yield* TestClock.setTime(sets[0]!)
        const cache = yield* Status.make(config)
        const seen: Array<Record<string, string>> = []
        for (const time of sets) {
          yield* TestClock.setTime(time)
          const snapshot = yield* cache.fleet.refresh
          seen.push(Object.fromEntries(Object.entries(snapshot.value.models).map(([id, m]) => [id, m.status])))
        }
        return seen
      }).pipe(Effect.scoped, Effect.provide(TestClock.layer())))

    const [degraded] = await fleetAt([T0])
    expect(degraded).toMatchObject({ "ws-lite": "degraded", "ws-reasoner": "ok", "ws-pro": "idle" })

    // 6 more failures: 9 of the 10 most recent failed.
    await insertRows(gw, Array.from({ length: 6 }, (_, i) =>
      errorRow(who, "upstream_timeout", 503, { model_id: "ws-lite", created_at: at(30_000 - i * 1000) })))
    const [down, later, dayLater] = await fleetAt([T0, T0 + 16 * MINUTE, T0 + 25 * 60 * MINUTE])
    expect(down).toMatchObject({ "ws-lite": "down", "ws-reasoner": "ok" })
    // The window (15 min) has moved past every failure; requests within 24 h: ok, not idle.
    expect(later).toMatchObject({ "ws-lite": "ok", "ws-reasoner": "ok" })
    // No request at all in 24 h: idle.
    expect(dayLater).toMatchObject({ "ws-lite": "idle", "ws-reasoner": "idle" })

    // The sparkline of T0: 20 × 600 tokens in the buckets of the last 10 minutes... and before.
    const spark = await gw.run(Effect.gen(function*() {
      const config = decodeGatewayConfig({ ...defaultConfigDoc(), status: { refresh_seconds: 10_000_000 } }, "test").status
      yield* TestClock.setTime(T0)
      const cache = yield* Status.make(config)
      return (yield* cache.fleet.refresh).value.models["ws-lite"]!
    }).pipe(Effect.scoped, Effect.provide(TestClock.layer())))
    expect(spark.sparkline).toHaveLength(7)
    expect(spark.sparkline.slice(0, 5)).toEqual([0, 0, 0, 0, 0])
    // 12,000 output tokens of successes (failures carry none) over two 10-minute buckets: 20 tokens/s in all.
    expect(spark.sparkline[5]! + spark.sparkline[6]!).toBeCloseTo(12_000 / 600, 1)
    expect(spark.ttfb_ms).toBe(100)
    expect(spark.tps).toBe(50)
  })
})
