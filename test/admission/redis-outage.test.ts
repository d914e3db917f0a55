/**
 * Redis unreachable or slow (issue [3/4] §6), with a real gateway process: `REDIS_URL` points at a port where
 * nothing listens. Spending fails closed at once with 503 `service_unavailable` (no hang, no admission without
 * limits), endpoints that need no quota state keep working, the process stays up, and it recovers when Redis
 * comes up on that port (and fails closed again when it goes away). A frozen Redis (SIGSTOP) fails closed
 * within the command timeout, and the admissions that timed out are undone once it thaws.
 */
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import * as Yaml from "yaml"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { cleanEnv, closedPort, operatorKey, type Running, startTs } from "../foundation/spawn.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { defaultConfigDoc } from "../support/Gateway.js"
import { Behaviour, Chunks, type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"
import { hasRedisServer, type PrivateRedis, privateRedis } from "../support/Redis.js"
import { requireServices } from "../support/Services.js"
import { eventually } from "../inference/helpers.js"
import { addQuotaModel, postgresUp, quotaConfig, rejection, user } from "./helpers.js"

const redisServer = hasRedisServer()
if (!redisServer && requireServices) throw new Error("redis-server is required (GATEWAY_REQUIRE_SERVICES=1) but not installed")

describe.skipIf(!postgresUp || !redisServer)("Redis unreachable: fail closed, stay up, recover", () => {
  let db: FreshDatabase
  let mock: MockUpstream
  let redis: PrivateRedis
  let proc: Running
  let dir: string
  let base = ""
  let key = ""
  let exited = false

  beforeAll(async () => {
    db = await freshDatabase("outage")
    mock = await startMockUpstream()
    mock.script(Behaviour.json(Chunks.completion({ content: "ok", usage: { prompt: 3, completion: 1 } })))
    redis = await privateRedis() // not started: nothing listens on its port yet
    dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-outage-"))
    const doc = defaultConfigDoc()
    quotaConfig(doc)
    doc.shutdown_grace_seconds = 1
    addQuotaModel(doc, { id: "ws-q", baseUrl: mock.url })
    const configPath = Path.join(dir, "gateway.yaml")
    Fs.writeFileSync(configPath, Yaml.stringify(doc))
    const port = await closedPort()
    base = `http://127.0.0.1:${port}`
    const env = cleanEnv({
      WELLSPRING_CONFIG: configPath,
      WELLSPRING_PORT: String(port),
      WELLSPRING_DATA_DIR: Path.join(dir, "data"),
      DATABASE_URL: db.url,
      REDIS_URL: redis.url
    })
    proc = startTs("src/main.ts", [], env)
    void proc.exited.then(() => (exited = true))
    await proc.waitFor(/ready in/, 60_000)
    key = await operatorKey(env)
  })
  afterAll(async () => {
    await proc?.stop(10_000)
    await redis?.stop()
    await mock?.close()
    await db?.drop()
    if (dir) Fs.rmSync(dir, { recursive: true, force: true })
  })

  const headers = () => ({ authorization: `Bearer ${key}`, "content-type": "application/json" })
  const chat = (stream = false) =>
    fetch(`${base}/v1/chat/completions`, {
      method: "POST",
      headers: headers(),
      body: JSON.stringify({ model: "ws-q", messages: [user("hello")], stream })
    })
  const get = (path: string) => fetch(`${base}${path}`, { headers: headers() })

  /** Every spending request is refused quickly with 503 service_unavailable. */
  const expectFailsClosed = async () => {
    for (const stream of [false, true, false]) {
      const started = performance.now()
      const r = await rejection(await chat(stream))
      const ms = performance.now() - started
      expect({ status: r.status, code: r.code, type: r.type }, r.text).toEqual({
        status: 503,
        code: "service_unavailable",
        type: "service_unavailable"
      })
      expect(ms).toBeLessThan(1_500)
    }
  }

  it("chat answers 503 service_unavailable at once; /v1/models and /v1/me still work; nothing reached the upstream", async () => {
    await expectFailsClosed()
    expect(mock.requests.length).toBe(0)
    const models = await get("/v1/models")
    expect(models.status).toBe(200)
    expect(((await models.json()) as any).data.map((m: any) => m.id)).toContain("ws-q")
    expect((await get("/v1/me")).status).toBe(200)
    // The standing lives in Redis: /v1/usage fails closed too.
    expect((await rejection(await get("/v1/usage"))).status).toBe(503)
    expect(exited).toBe(false)
  })

  it("recovers when Redis comes up, fails closed again when it goes away, and the process stays up", async () => {
    await redis.start()
    await eventually(async () => {
      const res = await chat()
      const text = await res.text()
      expect(res.status, text).toBe(200)
    }, 10_000)
    expect(JSON.parse(await (await chat()).text()).wellspring.rpm.remaining).toBeGreaterThan(0)
    expect((await get("/v1/usage")).status).toBe(200)

    await redis.stop()
    await eventually(async () => expect((await rejection(await chat())).status).toBe(503), 5_000)
    await expectFailsClosed()
    expect((await get("/v1/models")).status).toBe(200)
    expect(exited).toBe(false)
    expect(proc.stderr()).not.toMatch(/Unhandled|uncaught/i)
  })

  it("a frozen Redis: 503 within the command timeout, and the timed-out admissions charge nothing once it thaws", async () => {
    await redis.start()
    const ok = async () => {
      const res = await chat()
      const text = await res.text()
      expect(res.status, text).toBe(200)
      return JSON.parse(text).wellspring
    }
    const before = await eventually(ok, 10_000).then(ok)
    redis.pause()
    try {
      await expectFailsClosed()
    } finally {
      redis.resume()
    }
    let after: any
    await eventually(async () => {
      after = await ok()
    }, 10_000)
    // One more request of 3 + 1×2 = 5 weighted (0.05 % of 10 000); the three timed-out reservations are gone.
    expect(after.session.used_pct).toBe(Math.round((before.session.used_pct + 0.05) * 100) / 100)
    expect(exited).toBe(false)
  })
})
