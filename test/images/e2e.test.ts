/**
 * Issue 17 end to end: the real endpoint, slots, queue, presets, gallery, worker routes and workers, over HTTP,
 * on both backends (embedded: PGlite and in-process actors; production: PostgreSQL and Redis).
 * - the simulated worker answers a ZIP holding one PNG of the snapped size, kept in the gallery;
 * - two pending requests, then 429, under concurrency; a client that disconnects frees its slot and withdraws
 *   its job;
 * - past `max_wait_seconds` the request is 504 and the job is cancelled on its (remote) worker;
 * - a remote worker that dies mid-job: the job goes to another worker; one account's backlog of 20 delays
 *   another's single job by at most one job;
 * - the project's worker agent against a fake ComfyUI: a round trip through the gateway;
 * - production: the pending slots are shared by two gateways on one Redis.
 */
import { Effect } from "effect"
import { unzipSync } from "fflate"
import * as Crypto from "node:crypto"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { AccountsRepo } from "../../src/accounts/AccountsRepo.js"
import { BoundListeners } from "../../src/http/Server.js"
import { ImageQueue, ImageSlots } from "../../src/images/Contracts.js"
import { LiveImages } from "../../src/images/LiveConfig.js"
import { WorkerTokens } from "../../src/images/WorkerTokens.js"
import { startAgent } from "../../src/images/worker/agent.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { eventually } from "../support/Eventually.js"
import { type ConfigDoc, startGateway, type TestGateway } from "../support/Gateway.js"
import { deleteByPrefix, uniquePrefix } from "../support/Redis.js"
import { REDIS_URL, serviceGate } from "../support/Services.js"
import { histograms, parseExposition } from "../support/Exposition.js"
import { startFakeComfyUi } from "./FakeComfyUi.js"
import { ihdrSize, makePng } from "./png.js"

const PATH = "/v1/images/nai/generate-image"
const PNG_SIGNATURE = [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]

const postgres = await serviceGate("postgres")
const redis = await serviceGate("redis")

interface Backend {
  readonly name: string
  readonly available: boolean
  /** Gateway options for one gateway (a fresh database and Redis prefix per backend, shared by its gateways). */
  readonly start: (configure: (doc: ConfigDoc) => void) => Promise<TestGateway>
  readonly cleanup: () => Promise<void>
}

const embedded = (): Backend => ({
  name: "embedded (PGlite, memory)",
  available: true,
  start: (configure) => startGateway({ configure }),
  cleanup: async () => undefined
})

const production = (): Backend => {
  let db: FreshDatabase | null = null
  const prefix = uniquePrefix("img-e2e")
  return {
    name: "production (PostgreSQL, Redis)",
    available: postgres && redis,
    start: async (configure) => {
      db ??= await freshDatabase("img")
      return startGateway({ configure, databaseUrl: db.url, redisUrl: REDIS_URL, redisPrefix: prefix })
    },
    cleanup: async () => {
      await deleteByPrefix(REDIS_URL, prefix)
      await db?.drop()
    }
  }
}

const imagesConfig = (images: Record<string, unknown>) => (doc: ConfigDoc) => {
  doc.images = { ...images }
}

/** A member account and one of its keys. */
const newMember = async (gw: TestGateway) =>
  gw.run(Effect.gen(function*() {
    const repo = yield* AccountsRepo
    const account = yield* repo.createAccount({
      username: `m_${Crypto.randomBytes(4).toString("hex")}`,
      displayName: "멤버",
      email: "m@example.com",
      emailVerified: true
    })
    const { key } = yield* repo.createKey(account.id, "img")
    return { id: account.id, key }
  }))

const generate = (gw: TestGateway, key: string, body: unknown, signal?: AbortSignal) =>
  fetch(`${gw.url}${PATH}`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify(body),
    ...(signal ? { signal } : {})
  })

/** The one PNG of a ZIP answer. */
const pngOf = async (res: Response) => {
  expect(res.status).toBe(200)
  expect(res.headers.get("content-type")).toBe("application/zip")
  const files = unzipSync(new Uint8Array(await res.arrayBuffer()))
  const names = Object.keys(files)
  expect(names).toHaveLength(1)
  expect(names[0]).toMatch(/\.png$/)
  const png = files[names[0]!]!
  expect([...png.subarray(0, 8)]).toEqual(PNG_SIGNATURE)
  return png
}

/** A remote worker speaking the HTTP protocol by hand (to hold, abandon or finish a job on purpose). */
const remoteWorker = (gw: TestGateway, token: string, id: string) => {
  const call = (path: string, body: unknown) =>
    fetch(`${gw.url}/v1/images/workers${path}`, {
      method: "POST",
      headers: { authorization: `Bearer ${token}`, "content-type": "application/json" },
      body: JSON.stringify(body)
    })
  const info = { worker_id: id, name: id, kind: "test" }
  return {
    heartbeat: () => call("/heartbeat", info).then((r) => r.status),
    next: async (waitMs = 2000) => {
      const res = await call("/jobs/next", { ...info, wait_ms: waitMs })
      return res.status === 200 ? ((await res.json()) as { job: { id: string; spec: { width: number; height: number } } }).job : null
    },
    progress: async (jobId: string) => {
      const res = await call(`/jobs/${jobId}/progress`, { worker_id: id, step: 1, total: 2 })
      return ((await res.json()) as { cancelled: boolean }).cancelled
    },
    result: (jobId: string, png: Uint8Array) =>
      fetch(`${gw.url}/v1/images/workers/jobs/${jobId}/result?worker_id=${id}`, {
        method: "POST",
        headers: { authorization: `Bearer ${token}`, "content-type": "image/png" },
        body: png
      }).then((r) => r.status)
  }
}

/** Remote workers only (no simulated one); a worker silent for 2 s is lost. */
const remoteOnly = { simulated: { enabled: false }, max_wait_seconds: 30, worker_heartbeat_seconds: 2 }

/** Rewrites the `images` section and reloads it. */
const setImages = async (gw: TestGateway, images: Record<string, unknown>) => {
  gw.rewriteConfig((doc) => void (doc.images = images))
  expect(await gw.run(Effect.flatMap(LiveImages, (live) => live.reload))).toBe(true)
}

const held = (gw: TestGateway, accountId: string) => gw.run(Effect.flatMap(ImageSlots, (slots) => slots.held(accountId)))
const waiting = (gw: TestGateway) => gw.run(Effect.flatMap(ImageQueue, (queue) => queue.waiting))

const issueToken = (gw: TestGateway) =>
  gw.run(Effect.flatMap(WorkerTokens, (tokens) => tokens.issue("e2e"))).then((issued) => issued.token)

for (const backend of [embedded(), production()]) {
  describe.skipIf(!backend.available)(`images end to end: ${backend.name}`, () => {
    afterAll(() => backend.cleanup())

    describe("with the simulated worker", () => {
      let gw: TestGateway
      beforeAll(async () => {
        gw = await backend.start((doc) => {
          imagesConfig({ simulated: { enabled: true, latency_ms: 300, concurrency: 4 } })(doc)
          doc.listeners = [
            { host: "127.0.0.1", port: 8080, origins: ["inference", "account", "status"] },
            { host: "127.0.0.1", port: 0, origins: ["operator"] }
          ]
        })
      })
      afterAll(() => gw?.stop())

      it("answers a ZIP with one PNG at the snapped size, kept in the caller's gallery only", async () => {
        const me = await newMember(gw)
        const other = await newMember(gw)
        const png = await pngOf(await generate(gw, me.key, {
          input: "{{masterpiece}}, 1girl, blue hair",
          model: "nai-diffusion-4-full",
          action: "generate",
          parameters: { width: 1000, height: 1000, steps: 20, seed: 42 }
        }))
        expect(ihdrSize(png)).toEqual({ width: 1024, height: 1024 })

        const list = await fetch(`${gw.url}/api/user/me/images`, { headers: { authorization: `Bearer ${me.key}` } })
        const images = ((await list.json()) as { data: { images: Array<{ id: string; seed: number; width: number }> } }).data.images
        expect(images).toHaveLength(1)
        expect(images[0]).toMatchObject({ seed: 42, width: 1024 })
        const own = await fetch(`${gw.url}/api/user/me/images/${images[0]!.id}`, { headers: { authorization: `Bearer ${me.key}` } })
        expect(Buffer.from(await own.arrayBuffer()).equals(Buffer.from(png))).toBe(true)
        const theirs = await fetch(`${gw.url}/api/user/me/images/${images[0]!.id}`, { headers: { authorization: `Bearer ${other.key}` } })
        expect(theirs.status).toBe(404)
      })

      it("image requests show in /metrics: requests, queue wait, workers online", async () => {
        const me = await newMember(gw)
        await pngOf(await generate(gw, me.key, { input: "metered" }))
        const { listeners } = await gw.run(BoundListeners)
        const operator = listeners.find((l) => l.origins.includes("operator"))!
        const families = parseExposition(await (await fetch(`http://127.0.0.1:${operator.port}/metrics`)).text())
        const requests = families.get("wellspring_requests_total")!.samples.filter((x) =>
          x.labels.operation === "image_generation" && x.labels.status === "success"
        )
        expect(requests.map((x) => x.labels.model)).toEqual(["nai-image"])
        expect(requests[0]!.value).toBeGreaterThanOrEqual(1)
        const wait = histograms(families.get("wellspring_image_queue_wait_seconds")!)
        expect(wait[0]!.count).toBeGreaterThanOrEqual(1)
        expect(families.get("wellspring_image_workers_online")!.samples[0]!.value).toBeGreaterThanOrEqual(1)
      })

      it("holds two pending requests per account; a third at the same time gets 429", async () => {
        const me = await newMember(gw)
        const answers = await Promise.all(Array.from({ length: 3 }, () => generate(gw, me.key, { input: "cat" })))
        const statuses = answers.map((r) => r.status).sort()
        expect(statuses).toEqual([200, 200, 429])
        const refused = answers.find((r) => r.status === 429)!
        expect(await refused.json()).toEqual({ statusCode: 429, message: expect.stringMatching(/[가-힣]/) })
        // Once they are done, the account may queue again.
        await pngOf(await generate(gw, me.key, { input: "cat" }))
      })

    })

    describe("with remote workers only", () => {
      let gw: TestGateway
      let token: string
      beforeAll(async () => {
        gw = await backend.start(imagesConfig(remoteOnly))
        token = await issueToken(gw)
      })
      afterAll(() => gw?.stop())

      it("a client that disconnects frees its slot and withdraws its job", async () => {
        const me = await newMember(gw)
        // A worker is online (so requests are queued) but takes nothing: both wait, each holding a slot.
        expect(await remoteWorker(gw, token, `idle-${Crypto.randomUUID()}`).heartbeat()).toBe(204)
        const controllers = [new AbortController(), new AbortController()]
        const gone = controllers.map((c) => generate(gw, me.key, { input: "dog" }, c.signal).catch(() => null))
        await eventually(async () => (await held(gw, me.id)) === 2, { timeoutMs: 5000 })
        const third = await generate(gw, me.key, { input: "third" })
        expect(third.status).toBe(429)
        controllers.forEach((c) => c.abort())
        await Promise.all(gone)
        await eventually(async () => (await held(gw, me.id)) === 0 && (await waiting(gw)) === 0, { timeoutMs: 5000 })
      })

      it("past max_wait_seconds: 504, and the job is cancelled on its worker", async () => {
        await setImages(gw, { ...remoteOnly, max_wait_seconds: 2 })
        const me = await newMember(gw)
        const worker = remoteWorker(gw, token, `slow-${Crypto.randomUUID()}`)
        expect(await worker.heartbeat()).toBe(204)
        const answer = generate(gw, me.key, { input: "a very slow image" })
        const job = (await eventually(() => worker.next(500), { timeoutMs: 5000 }))!
        expect(await worker.progress(job.id)).toBe(false)
        const res = await answer
        expect(res.status).toBe(504)
        expect(await res.json()).toEqual({ statusCode: 504, message: expect.stringMatching(/[가-힣]/) })
        await eventually(() => worker.progress(job.id), { timeoutMs: 5000 })
        await setImages(gw, remoteOnly)
      })

      it("a worker that dies mid-job: the job goes to another worker and the request still gets its image", async () => {
        const me = await newMember(gw)
        const dying = remoteWorker(gw, token, `dying-${Crypto.randomUUID()}`)
        const healthy = remoteWorker(gw, token, `healthy-${Crypto.randomUUID()}`)
        expect(await dying.heartbeat()).toBe(204)
        const answer = generate(gw, me.key, { input: "resilient", parameters: { width: 832, height: 1216 } })
        const job = (await eventually(() => dying.next(500), { timeoutMs: 5000 }))!
        // The dying worker never reports again; the healthy one polls until the job comes back to the queue.
        const again = (await eventually(async () => {
          await healthy.heartbeat()
          return healthy.next(500)
        }, { timeoutMs: 10_000 }))!
        expect(again.id).toBe(job.id)
        expect(await healthy.result(again.id, makePng(again.spec.width, again.spec.height))).toBe(204)
        expect(ihdrSize(await pngOf(await answer))).toEqual({ width: 832, height: 1216 })
      })

      it("fair across accounts: one account's backlog of 20 delays another's single job by at most one job", async () => {
        await setImages(gw, { ...remoteOnly, pending_per_account: 20 })
        const a = await newMember(gw)
        const b = await newMember(gw)
        const worker = remoteWorker(gw, token, `fair-${Crypto.randomUUID()}`)
        expect(await worker.heartbeat()).toBe(204)
        const backlog = Array.from({ length: 20 }, (_, i) => generate(gw, a.key, { input: `backlog ${i}` }))
        await eventually(async () => (await waiting(gw)) === 20, { timeoutMs: 10_000 })
        const single = generate(gw, b.key, { input: "single" })
        await eventually(async () => (await waiting(gw)) === 21, { timeoutMs: 5000 })
        const order: Array<string> = []
        for (let i = 0; i < 21; i++) {
          const job = (await worker.next(2000))!
          order.push((job.spec as unknown as { prompt: string }).prompt)
          expect(await worker.result(job.id, makePng(job.spec.width, job.spec.height))).toBe(204)
        }
        expect(order.findIndex((prompt) => prompt.includes("single"))).toBeLessThanOrEqual(1)
        for (const res of await Promise.all([...backlog, single])) await pngOf(res)
        await setImages(gw, remoteOnly)
      })

      it("no worker online: 503", async () => {
        const me = await newMember(gw)
        // The remote workers of the tests above stopped heartbeating; once they count as offline:
        await eventually(async () => (await gw.run(Effect.flatMap(ImageQueue, (q) => q.workersOnline))) === 0, { timeoutMs: 10_000 })
        const res = await generate(gw, me.key, { input: "nobody home" })
        expect(res.status).toBe(503)
        expect(await res.json()).toEqual({ statusCode: 503, message: expect.stringMatching(/[가-힣]/) })
      })

      it("the worker agent and a fake ComfyUI make the image through the gateway", async () => {
        const comfy = await startFakeComfyUi(Buffer.from(makePng(1216, 832)))
        const agent = startAgent({
          gateway: gw.url,
          token,
          comfyui: comfy.url,
          waitMs: 500,
          pollMs: 20,
          heartbeatMs: 300,
          log: () => undefined
        })
        try {
          const me = await newMember(gw)
          await eventually(() => agent.status().heartbeats > 0, { timeoutMs: 5000 })
          const png = await pngOf(await generate(gw, me.key, { input: "landscape, {sunset}", parameters: { width: 1216, height: 832, seed: 7 } }))
          expect(ihdrSize(png)).toEqual({ width: 1216, height: 832 })
          // The workflow ComfyUI received carries the job: size, seed, the converted prompt.
          const workflow = JSON.stringify(comfy.prompts[0]!)
          expect(workflow).toContain("\"seed\":7")
          expect(workflow).toContain("(sunset:1.05)")
          expect(agent.status().jobsDone).toBe(1)
        } finally {
          await agent.stop()
          await comfy.close()
        }
      })
    })

    if (backend.name.startsWith("production")) {
      it("two gateways on one Redis share an account's pending slots", async () => {
        const a = await backend.start(imagesConfig(remoteOnly))
        const b = await backend.start(imagesConfig(remoteOnly))
        try {
          const token = await issueToken(a)
          const me = await newMember(a)
          const controllers = [new AbortController(), new AbortController()]
          const first = controllers.map((c) => generate(a, me.key, { input: "one" }, c.signal).catch(() => null))
          await eventually(async () => (await held(b, me.id)) === 2, { timeoutMs: 5000 })
          expect((await generate(b, me.key, { input: "three" })).status).toBe(429)
          controllers.forEach((c) => c.abort())
          await Promise.all(first)
          await eventually(async () => (await held(b, me.id)) === 0, { timeoutMs: 5000 })
          // Asked on replica b, made by a worker polling replica a.
          const worker = remoteWorker(a, token, `w-${Crypto.randomUUID()}`)
          await worker.heartbeat()
          const answer = generate(b, me.key, { input: "four", parameters: { width: 1024, height: 1024 } })
          const job = (await eventually(() => worker.next(500), { timeoutMs: 5000 }))!
          expect(await worker.result(job.id, makePng(1024, 1024))).toBe(204)
          expect(ihdrSize(await pngOf(await answer))).toEqual({ width: 1024, height: 1024 })
        } finally {
          await a.stop()
          await b.stop()
        }
      })
    }
  })
}
