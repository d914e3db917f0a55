/**
 * The worker API over real HTTP (src/images/WorkerRoutes.ts) against an in-test ImageWork: the protocol of
 * Contracts.ts end to end, token scoping of worker ids, long polls (clamped, ended by the client leaving or by a
 * revocation), and hostile bodies: always a 4xx, never a 5xx.
 */
import { Effect } from "effect"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { ensureDevAccount } from "../../src/App.js"
import { MAX_WAIT_MS, WORKER_PATH } from "../../src/images/WorkerRoutes.js"
import { WorkerTokens } from "../../src/images/WorkerTokens.js"
import { connect, head } from "../edge/raw.js"
import { eventually } from "../support/Eventually.js"
import { makePng, makeTestWork, sampleJob, startWorkerGateway, type TestWork, type WorkerGateway } from "./workerSupport.js"

const LIMIT = 3
let gw: WorkerGateway
let work: TestWork
let token = ""
let tokenId = 0
let apiKey = ""
let nextAddress = 0
/** A fresh counted address per use (TEST-NET-3). */
const freshAddress = () => `203.0.113.${++nextAddress}`

beforeAll(async () => {
  work = makeTestWork()
  gw = await startWorkerGateway({
    work,
    configure: (doc) => {
      doc.limits = { ...doc.limits, failed_auth_per_minute: LIMIT }
      doc.trusted_proxies = ["127.0.0.1"]
    }
  })
  const issued = await gw.run(Effect.flatMap(WorkerTokens, (t) => t.issue("gpu-1")))
  token = issued.token
  tokenId = issued.row.id
  apiKey = (await gw.run(ensureDevAccount)) ?? ""
})
afterAll(() => gw?.stop())

interface Answer {
  readonly status: number
  readonly body: any
  readonly text: string
}

const post = async (
  path: string,
  body: unknown,
  options: { token?: string | null; contentType?: string; from?: string; signal?: AbortSignal } = {}
): Promise<Answer> => {
  const headers: Record<string, string> = { "x-forwarded-for": options.from ?? "192.0.2.1" }
  const credential = options.token === undefined ? token : options.token
  if (credential !== null) headers.authorization = `Bearer ${credential}`
  const raw = body instanceof Uint8Array || typeof body === "string"
  headers["content-type"] = options.contentType ?? (body instanceof Uint8Array ? "image/png" : "application/json")
  const res = await fetch(`${gw.url}${WORKER_PATH}${path}`, {
    method: "POST",
    headers,
    body: raw ? (body as string | Uint8Array) : JSON.stringify(body),
    ...(options.signal ? { signal: options.signal } : {})
  })
  const text = await res.text()
  let parsed: unknown = text
  try {
    parsed = JSON.parse(text)
  } catch {
    // not JSON
  }
  return { status: res.status, body: parsed, text }
}

const worker = { worker_id: "box-1", name: "GPU box 1", kind: "comfyui" }
const scoped = (id: string, tid = tokenId) => `t${tid}:${id}`

describe("the protocol", () => {
  it("jobs/next hands out a queued job; progress, result and failure reach ImageWork under the token-scoped id", async () => {
    const job = sampleJob()
    work.enqueue(job)
    const next = await post("/jobs/next", { ...worker, wait_ms: 1000 })
    expect(next.status).toBe(200)
    expect(next.body).toEqual({ job: { id: job.id, spec: job.spec } })
    expect(work.taken.get(job.id)).toBe(scoped("box-1"))
    // jobs/next counts as a heartbeat.
    expect(work.heartbeats.get(scoped("box-1"))?.info).toEqual({ id: scoped("box-1"), name: "GPU box 1", kind: "comfyui" })

    const progress = await post(`/jobs/${job.id}/progress`, { worker_id: "box-1", step: 3, total: 28 })
    expect(progress).toMatchObject({ status: 200, body: { cancelled: false } })
    expect(work.progress.at(-1)).toEqual({ workerId: scoped("box-1"), jobId: job.id, step: 3, total: 28 })
    work.cancel(job.id)
    expect((await post(`/jobs/${job.id}/progress`, { worker_id: "box-1", step: 4, total: 28 })).body).toEqual({ cancelled: true })

    const png = makePng(16, 8)
    const result = await post(`/jobs/${job.id}/result?worker_id=box-1`, png)
    expect(result.status).toBe(204)
    expect(result.text).toBe("")
    const completed = work.completed.at(-1)!
    expect(completed.workerId).toBe(scoped("box-1"))
    expect(completed.jobId).toBe(job.id)
    expect(Buffer.from(completed.png).equals(png)).toBe(true)

    // A failure message is one bounded line.
    const failure = await post(`/jobs/${job.id}/failure`, { worker_id: "box-1", message: `CUDA\u0000 out\nof memory ${"x".repeat(5000)}` })
    expect(failure.status).toBe(204)
    const reason = work.failed.at(-1)!.reason
    expect(reason.startsWith("CUDA out of memory xxx")).toBe(true)
    expect([...reason].length).toBe(1000)
  })

  it("heartbeat: 204, recorded with the worker's name and kind", async () => {
    const before = work.heartbeats.get(scoped("box-2"))?.count ?? 0
    const answer = await post("/heartbeat", { worker_id: "box-2", name: "두 번째 상자", kind: "comfyui" })
    expect(answer.status).toBe(204)
    expect(work.heartbeats.get(scoped("box-2"))).toMatchObject({ count: before + 1, info: { name: "두 번째 상자" } })
  })

  it("another token's holder reports under its own scope, never under the first token's workers", async () => {
    const other = await gw.run(Effect.flatMap(WorkerTokens, (t) => t.issue("gpu-2")))
    const job = sampleJob()
    work.enqueue(job)
    expect((await post("/jobs/next", { ...worker, wait_ms: 1000 })).status).toBe(200)
    expect((await post(`/jobs/${job.id}/result?worker_id=box-1`, makePng(), { token: other.token })).status).toBe(204)
    expect(work.completed.at(-1)!.workerId).toBe(scoped("box-1", other.row.id))
    expect(work.taken.get(job.id)).toBe(scoped("box-1"))
  })

  it("an idle poll answers 204 after wait_ms; a larger wait_ms is clamped to 25 s; the client leaving ends the wait", async () => {
    const idle = await post("/jobs/next", { ...worker, wait_ms: 50 })
    expect(idle.status).toBe(204)
    expect(work.waits.at(-1)).toBe(50)

    const controller = new AbortController()
    const long = post("/jobs/next", { ...worker, wait_ms: 3_600_000 }, { signal: controller.signal }).catch((e: Error) => e)
    await eventually(() => work.waiting() === 1, { what: "the long poll waiting" })
    expect(work.waits.at(-1)).toBe(MAX_WAIT_MS)
    controller.abort()
    expect(await long).toBeInstanceOf(Error)
    await eventually(() => work.waiting() === 0, { what: "the abandoned wait withdrawn" })

    // Without wait_ms: the longest wait, ended here by a job.
    const waiting = post("/jobs/next", worker)
    await eventually(() => work.waiting() === 1)
    expect(work.waits.at(-1)).toBe(MAX_WAIT_MS)
    const job = sampleJob()
    work.enqueue(job)
    expect((await waiting).body.job.id).toBe(job.id)
  })
})

describe("tokens", () => {
  it("401 without a token, with an API key, a malformed, unknown or revoked token; valid again under a new token", async () => {
    const expect401 = (answer: Answer) => {
      expect(answer.status).toBe(401)
      expect(answer.body.error).toMatchObject({ code: "invalid_api_key", type: "invalid_request_error" })
      expect(answer.body.error.message).toMatch(/워커 토큰/)
    }
    expect401(await post("/heartbeat", worker, { token: null, from: freshAddress() }))
    expect401(await post("/heartbeat", worker, { token: apiKey, from: freshAddress() }))
    expect401(await post("/heartbeat", worker, { token: "wsw_short", from: freshAddress() }))
    expect401(await post("/heartbeat", worker, { token: `wsw_${"A".repeat(43)}`, from: freshAddress() }))
    const issued = await gw.run(Effect.flatMap(WorkerTokens, (t) => t.issue("short-lived")))
    expect((await post("/heartbeat", worker, { token: issued.token })).status).toBe(204)
    await gw.run(Effect.flatMap(WorkerTokens, (t) => t.revoke(issued.row.id)))
    // At once: the revocation is announced to this replica's set, no reload needed.
    expect401(await post("/heartbeat", worker, { token: issued.token, from: freshAddress() }))
    expect401(await post(`/jobs/${sampleJob().id}/result?worker_id=a`, makePng(), { token: issued.token, from: freshAddress() }))
  })

  it("failures count toward the per-address limit shared with API keys; a missing token is not counted", async () => {
    const from = freshAddress()
    // Not counted: no credential at all.
    for (let i = 0; i < LIMIT + 2; i++) expect((await post("/heartbeat", worker, { token: null, from })).status).toBe(401)
    // One failed API key on /v1/models and LIMIT - 1 unknown worker tokens: the address is at its limit.
    const models = await fetch(`${gw.url}/v1/models`, { headers: { authorization: "Bearer sk-ws-nope", "x-forwarded-for": from } })
    expect(models.status).toBe(401)
    await models.arrayBuffer()
    for (let i = 0; i < LIMIT - 1; i++) expect((await post("/heartbeat", worker, { token: `wsw_${"B".repeat(43)}`, from })).status).toBe(401)
    // Refused now, a valid worker token included (no lookup from a refused address), and for API keys too.
    const refused = await post("/heartbeat", worker, { from })
    expect(refused.status).toBe(429)
    expect(refused.body.error.code).toBe("too_many_failed_requests")
    const key = await fetch(`${gw.url}/v1/models`, { headers: { authorization: `Bearer ${apiKey}`, "x-forwarded-for": from } })
    await key.arrayBuffer()
    expect(key.status).toBe(429)
    // Another address is unaffected.
    expect((await post("/heartbeat", worker, { from: freshAddress() })).status).toBe(204)
  })

  it("a token revoked during a long poll ends it with 401 (the wait is withdrawn)", async () => {
    const issued = await gw.run(Effect.flatMap(WorkerTokens, (t) => t.issue("revoked-while-waiting")))
    const waiting = post("/jobs/next", { ...worker, worker_id: "doomed" }, { token: issued.token })
    await eventually(() => work.waiting() === 1, { what: "the poll waiting" })
    await gw.run(Effect.flatMap(WorkerTokens, (t) => t.revoke(issued.row.id)))
    const answer = await waiting
    expect(answer.status).toBe(401)
    await eventually(() => work.waiting() === 0)
  })
})

describe("hostile bodies: a 4xx, never a 5xx", () => {
  const jobId = () => sampleJob().id
  const png = makePng()
  const corrupt = (f: (b: Buffer) => void) => {
    const copy = Buffer.from(png)
    f(copy)
    return copy
  }
  const cases: ReadonlyArray<{ name: string; path: () => string; body: unknown; contentType?: string; status: number }> = [
    { name: "JSON over 16 KB", path: () => "/heartbeat", body: { ...worker, pad: "x".repeat(17 * 1024) }, status: 413 },
    { name: "deep nesting", path: () => "/heartbeat", body: "[".repeat(200) + "]".repeat(200), status: 400 },
    { name: "invalid JSON", path: () => "/jobs/next", body: "{\"worker_id\":", status: 400 },
    { name: "an array", path: () => "/heartbeat", body: [worker], status: 400 },
    { name: "null", path: () => "/heartbeat", body: "null", status: 400 },
    { name: "multipart", path: () => "/heartbeat", body: "--x\r\n\r\n", contentType: "multipart/form-data; boundary=x", status: 415 },
    { name: "worker_id too long", path: () => "/heartbeat", body: { ...worker, worker_id: "a".repeat(65) }, status: 400 },
    { name: "worker_id with a newline", path: () => "/heartbeat", body: { ...worker, worker_id: "a\nb" }, status: 400 },
    { name: "worker_id missing", path: () => "/jobs/next", body: { name: "n", kind: "comfyui" }, status: 400 },
    { name: "name with NUL", path: () => "/heartbeat", body: { ...worker, name: "a\u0000b" }, status: 400 },
    { name: "name too long", path: () => "/heartbeat", body: { ...worker, name: "가".repeat(65) }, status: 400 },
    { name: "name empty", path: () => "/heartbeat", body: { ...worker, name: "" }, status: 400 },
    { name: "kind with a space", path: () => "/heartbeat", body: { ...worker, kind: "comfy ui" }, status: 400 },
    { name: "wait_ms negative", path: () => "/jobs/next", body: { ...worker, wait_ms: -1 }, status: 400 },
    { name: "wait_ms a string", path: () => "/jobs/next", body: { ...worker, wait_ms: "100" }, status: 400 },
    { name: "wait_ms fractional", path: () => "/jobs/next", body: { ...worker, wait_ms: 1.5 }, status: 400 },
    { name: "wait_ms 1e999", path: () => "/jobs/next", body: `{"worker_id":"a","name":"a","kind":"a","wait_ms":1e999}`, status: 400 },
    { name: "step over total", path: () => `/jobs/${jobId()}/progress`, body: { worker_id: "a", step: 5, total: 3 }, status: 400 },
    { name: "total zero", path: () => `/jobs/${jobId()}/progress`, body: { worker_id: "a", step: 0, total: 0 }, status: 400 },
    { name: "step missing", path: () => `/jobs/${jobId()}/progress`, body: { worker_id: "a", total: 3 }, status: 400 },
    { name: "failure message not a string", path: () => `/jobs/${jobId()}/failure`, body: { worker_id: "a", message: 5 }, status: 400 },
    { name: "malformed job id", path: () => "/jobs/..%2F..%2Fetc/progress", body: { worker_id: "a", step: 0, total: 1 }, status: 404 },
    { name: "job id of another shape", path: () => "/jobs/img_XYZ/failure", body: { worker_id: "a", message: "m" }, status: 404 },
    { name: "PNG as JSON", path: () => `/jobs/${jobId()}/result?worker_id=a`, body: png, contentType: "application/json", status: 415 },
    { name: "PNG without worker_id", path: () => `/jobs/${jobId()}/result`, body: png, status: 400 },
    { name: "random bytes as PNG", path: () => `/jobs/${jobId()}/result?worker_id=a`, body: Buffer.alloc(4096, 7), status: 400 },
    { name: "empty PNG", path: () => `/jobs/${jobId()}/result?worker_id=a`, body: Buffer.alloc(0), status: 400 },
    { name: "truncated PNG", path: () => `/jobs/${jobId()}/result?worker_id=a`, body: png.subarray(0, png.length - 5), status: 400 },
    { name: "PNG with a broken IHDR CRC", path: () => `/jobs/${jobId()}/result?worker_id=a`, body: corrupt((b) => void (b[30] ^= 1)), status: 400 },
    { name: "PNG of width 0", path: () => `/jobs/${jobId()}/result?worker_id=a`, body: corrupt((b) => b.writeUInt32BE(0, 16)), status: 400 },
    { name: "PNG with a bad bit depth", path: () => `/jobs/${jobId()}/result?worker_id=a`, body: corrupt((b) => void (b[24] = 3)), status: 400 }
  ]

  for (const c of cases) {
    it(c.name, async () => {
      const completedBefore = work.completed.length
      const answer = await post(c.path(), c.body, { ...(c.contentType ? { contentType: c.contentType } : {}), from: freshAddress() })
      expect(answer.status, answer.text).toBe(c.status)
      expect(answer.body.error.type).toBe(c.status === 404 ? "not_found_error" : "invalid_request_error")
      expect(answer.text.length).toBeLessThan(1024)
      expect(work.completed.length).toBe(completedBefore)
    })
  }

  /** Sends a body on a raw socket until the server answers; the answer's status. */
  const rawSend = async (path: string, headers: Record<string, string | number>, chunked: boolean, total: number) => {
    const connection = await connect(gw.port)
    await connection.write(head("POST", `${WORKER_PATH}${path}`, { authorization: `Bearer ${token}`, "content-type": "image/png", ...headers }))
    const piece = Buffer.alloc(64 * 1024, 1)
    for (let sent = 0; sent < total && connection.received().length === 0; sent += piece.length) {
      const ok = await connection.write(chunked ? Buffer.concat([Buffer.from(`${piece.length.toString(16)}\r\n`), piece, Buffer.from("\r\n")]) : piece)
      if (!ok) break
    }
    const response = await connection.response(10_000)
    connection.destroy()
    return response
  }

  it("a PNG declared over 32 MB is refused before it is read", async () => {
    const response = await rawSend(`/jobs/${jobId()}/result?worker_id=a`, { "content-length": 33 * 1024 * 1024 }, false, 33 * 1024 * 1024)
    expect(response.status).toBe(413)
    expect(response.headers.connection).toBe("close")
  })

  it("a chunked PNG is cut at 32 MB", async () => {
    const response = await rawSend(`/jobs/${jobId()}/result?worker_id=a`, { "transfer-encoding": "chunked" }, true, 40 * 1024 * 1024)
    expect(response.status).toBe(413)
  })

  it("a large valid PNG (close to the bound) is accepted", async () => {
    // Incompressible rows: about 3 MB.
    const big = makePng(1024, 1024)
    const job = sampleJob()
    const answer = await post(`/jobs/${job.id}/result?worker_id=a`, big, { from: freshAddress() })
    expect(answer.status).toBe(204)
    expect(Buffer.from(work.completed.at(-1)!.png).equals(big)).toBe(true)
  })
})
