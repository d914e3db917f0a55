/**
 * Two real gateway processes (`node --import tsx src/main.ts`, what `npm start` runs) sharing one PostgreSQL
 * database and one Redis (this run's key prefix through `WELLSPRING_REDIS_PREFIX`) enforce limits jointly
 * (issue [3/4] §7): one account's RPM on a model (rpm 4 → exactly 4 of 10 concurrent requests spread over both
 * processes are admitted) and one model's in-flight cap (concurrency 2 → with a stream held open on each
 * process, a third request on either process is 529; a slot freed on one process is usable from the other).
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
import { deleteByPrefix, uniquePrefix } from "../support/Redis.js"
import { REDIS_URL } from "../support/Services.js"
import { eventually } from "../inference/helpers.js"
import { addQuotaModel, countKeys, quotaConfig, redisAvailable, rejection, user } from "./helpers.js"

describe.skipIf(!redisAvailable)("two gateway processes sharing Redis and PostgreSQL", () => {
  let db: FreshDatabase
  let fast: MockUpstream
  let hanging: MockUpstream
  let dir: string
  const prefix = uniquePrefix("replicas")
  const procs: Array<Running> = []
  const urls: Array<string> = []
  let key = ""
  const open: Array<AbortController> = []

  beforeAll(async () => {
    db = await freshDatabase("replicas")
    fast = await startMockUpstream()
    hanging = await startMockUpstream()
    fast.script(Behaviour.json(Chunks.completion({ content: "ok", usage: { prompt: 3, completion: 1 } })))
    hanging.script(Behaviour.hangAfter([Chunks.role(), Chunks.content("holding")]))
    dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-replicas-"))
    const doc = defaultConfigDoc()
    quotaConfig(doc)
    doc.shutdown_grace_seconds = 1
    addQuotaModel(doc, { id: "ws-rpm4", rpm: 4, baseUrl: fast.url, provider: "fast" })
    addQuotaModel(doc, { id: "ws-conc2", rpm: 1_000, concurrency: 2, baseUrl: hanging.url, provider: "hanging" })
    const configPath = Path.join(dir, "gateway.yaml")
    Fs.writeFileSync(configPath, Yaml.stringify(doc))
    const start = async (n: number) => {
      const port = await closedPort()
      const proc = startTs("src/main.ts", [], cleanEnv({
        WELLSPRING_CONFIG: configPath,
        WELLSPRING_PORT: String(port),
        WELLSPRING_DATA_DIR: Path.join(dir, `data${n}`),
        DATABASE_URL: db.url,
        REDIS_URL,
        WELLSPRING_REDIS_PREFIX: prefix
      }))
      procs.push(proc)
      urls.push(`http://127.0.0.1:${port}`)
      return proc
    }
    // One after the other: the first migrates the fresh database and creates the dev account.
    const first = await start(1)
    await first.waitFor(/ready in/, 60_000)
    key = await operatorKey(cleanEnv({ WELLSPRING_CONFIG: configPath, DATABASE_URL: db.url }))
    await (await start(2)).waitFor(/ready in/, 60_000)
  })
  afterAll(async () => {
    for (const c of open) c.abort()
    await Promise.all(procs.map((p) => p.stop(10_000)))
    await fast?.close()
    await hanging?.close()
    await db?.drop()
    await deleteByPrefix(REDIS_URL, prefix)
    if (dir) Fs.rmSync(dir, { recursive: true, force: true })
  })

  const post = (i: number, body: Record<string, unknown>, init: RequestInit = {}) =>
    fetch(`${urls[i % 2]}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify(body),
      ...init
    })

  it("rpm 4: exactly 4 of 10 concurrent requests across both processes are admitted", async () => {
    const results = await Promise.all(
      Array.from({ length: 10 }, async (_, i) => {
        const res = await post(i, { model: "ws-rpm4", messages: [user(`request ${i}`)] })
        return res.status === 200 ? { status: 200, code: null, retryAfter: null } : await rejection(res)
      })
    )
    const admitted = results.filter((r) => r.status === 200)
    const limited = results.filter((r) => r.status === 429)
    expect(admitted.length).toBe(4)
    expect(limited.length).toBe(6)
    for (const r of limited) {
      expect(r.code).toBe("rate_limited")
      expect(r.retryAfter).toBeGreaterThan(0)
    }
    // Both processes see the same window: one more on each is refused.
    for (const i of [0, 1]) expect((await rejection(await post(i, { model: "ws-rpm4", messages: [user("again")] }))).code).toBe("rate_limited")
    expect(fast.requests.length).toBe(4)
    // The shared state lives under this run's prefix (WELLSPRING_REDIS_PREFIX), not the default `ws:q:`.
    expect(await countKeys(`${prefix}a:`)).toBeGreaterThan(0)
  })

  it("concurrency 2: a stream held on each process fills the model; a third on either is 529; a freed slot serves the other process", async () => {
    const hold = async (i: number) => {
      const controller = new AbortController()
      open.push(controller)
      const res = await post(i, { model: "ws-conc2", messages: [user("hold")], stream: true }, { signal: controller.signal })
      expect(res.status).toBe(200)
      await res.body!.getReader().read()
      return controller
    }
    const first = await hold(0)
    await hold(1)
    for (const i of [0, 1, 0, 1]) {
      const r = await rejection(await post(i, { model: "ws-conc2", messages: [user("one too many")], stream: true }))
      expect(r.status).toBe(529)
      expect(r.code).toBe("model_overloaded")
      expect(r.retryAfter).toBe(5)
    }
    expect(hanging.requests.length).toBe(2)
    // Process 1's client leaves: its slot is usable from process 2.
    const aborts = hanging.clientAborts()
    first.abort()
    await hanging.waitForClientAborts(aborts + 1)
    await eventually(async () => {
      const controller = new AbortController()
      const res = await post(1, { model: "ws-conc2", messages: [user("next")], stream: true }, { signal: controller.signal })
      if (res.status === 200) open.push(controller)
      else await res.text()
      expect(res.status).toBe(200)
    })
    expect((await rejection(await post(0, { model: "ws-conc2", messages: [user("full again")], stream: true }))).status).toBe(529)
  })
})
