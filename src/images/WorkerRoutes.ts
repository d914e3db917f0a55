/**
 * The worker API over HTTP (issue 17), on the inference origin: the protocol documented on `ImageWork`
 * (Contracts.ts), served by whatever implements `ImageWork`.
 *
 * - Every route authenticates first (`Authorization: Bearer wsw_…`, WorkerTokens.ts): 401 `invalid_api_key` when
 *   missing, unknown or revoked, counted against the client address like API keys; only then is a body read.
 * - Errors use the inference envelope (`{error: {message, type, code}}`); 204 answers have no body.
 * - Bodies are bounded: JSON at most `WORKER_BODY_BYTES`, the PNG at most `MAX_PNG_BYTES`, of type `image/png`,
 *   and checked (signature, IHDR, IEND: worker/PngCheck.ts) before `complete`.
 * - `worker_id` is the worker's own choice, scoped by its token: `ImageWork` sees `t<token id>:<worker_id>`, so
 *   one token's holder cannot report for another token's workers.
 * - `jobs/next` waits at most `MAX_WAIT_MS` (a larger `wait_ms` is clamped), counts as a heartbeat, and ends
 *   with 401 when the token is revoked meanwhile; the client going away ends the wait (the job stays queued).
 */
import { Effect, Layer } from "effect"
import { HttpRouter, HttpServerRequest, HttpServerResponse } from "effect/http"
import { fail, type GatewayError } from "../errors/Catalog.js"
import { renderInference } from "../errors/Render.js"
import { readBytes, readJson } from "../http/Body.js"
import { handle, json } from "../http/Respond.js"
import { ImageWork, type WorkerInfo } from "./Contracts.js"
import { checkPng } from "./worker/PngCheck.js"
import { type WorkerCredential, WorkerMessages, WorkerTokens } from "./WorkerTokens.js"

export const WORKER_PATH = "/v1/images/workers"
/** Worker JSON bodies are a few ids and numbers. */
export const WORKER_BODY_BYTES = 16 * 1024
export const MAX_PNG_BYTES = 32 * 1024 * 1024
export const MAX_WAIT_MS = 25_000
/** A failure message is cut to this many characters. */
export const MAX_FAILURE_CHARS = 1_000
/** Largest `total` of a progress report. */
const MAX_PROGRESS_TOTAL = 100_000

const WORKER_ID = /^[A-Za-z0-9._:-]{1,64}$/
const KIND = /^[A-Za-z0-9._-]{1,32}$/
const JOB_ID = /^img_[0-9a-f]{24}$/
const CONTROL = /[\p{Cc}\p{Cf}\u2028\u2029]/u
const CONTROLS = /[\p{Cc}\p{Cf}\u2028\u2029]/gu

/** Texts of the worker API's 400s. */
export const WorkerRouteMessages = {
  notAnObject: "요청 본문은 JSON 객체여야 합니다.",
  workerId: "worker_id 는 영문, 숫자, . _ : - 로 된 1–64자여야 합니다.",
  name: "name 은 제어 문자가 없는 1–64자 문자열이어야 합니다.",
  kind: "kind 는 영문, 숫자, . _ - 로 된 1–32자여야 합니다.",
  waitMs: "wait_ms 는 0 이상의 정수여야 합니다.",
  progress: `step 과 total 은 0 ≤ step ≤ total, 1 ≤ total ≤ ${MAX_PROGRESS_TOTAL} 인 정수여야 합니다.`,
  message: "message 는 문자열이어야 합니다.",
  png: (reason: string) => `올바른 PNG 이미지가 아닙니다: ${reason}`
} as const

const invalid = (message: string) => fail("invalid_request", { message })

type Body = Readonly<Record<string, unknown>>

const objectBody = (request: HttpServerRequest.HttpServerRequest) =>
  Effect.flatMap(readJson(request, { maxBytes: WORKER_BODY_BYTES }), (value) =>
    value !== null && typeof value === "object" && !Array.isArray(value)
      ? Effect.succeed(value as Body)
      : Effect.fail(invalid(WorkerRouteMessages.notAnObject)))

const workerIdOf = (value: unknown): Effect.Effect<string, GatewayError> =>
  typeof value === "string" && WORKER_ID.test(value) ? Effect.succeed(value) : Effect.fail(invalid(WorkerRouteMessages.workerId))

/** `ImageWork`'s id of a worker: its own id scoped by its token. */
export const scopedWorkerId = (credential: WorkerCredential, workerId: string) => `t${credential.tokenId}:${workerId}`

const workerInfo = (credential: WorkerCredential, body: Body): Effect.Effect<WorkerInfo, GatewayError> =>
  Effect.gen(function*() {
    const id = yield* workerIdOf(body.worker_id)
    const name = body.name
    if (typeof name !== "string" || name.length === 0 || [...name].length > 64 || CONTROL.test(name)) {
      return yield* Effect.fail(invalid(WorkerRouteMessages.name))
    }
    if (typeof body.kind !== "string" || !KIND.test(body.kind)) return yield* Effect.fail(invalid(WorkerRouteMessages.kind))
    return { id: scopedWorkerId(credential, id), name, kind: body.kind }
  })

const waitMsOf = (value: unknown): Effect.Effect<number, GatewayError> => {
  if (value === undefined) return Effect.succeed(MAX_WAIT_MS)
  return typeof value === "number" && Number.isInteger(value) && value >= 0
    ? Effect.succeed(Math.min(value, MAX_WAIT_MS))
    : Effect.fail(invalid(WorkerRouteMessages.waitMs))
}

const isCount = (value: unknown, max: number): value is number =>
  typeof value === "number" && Number.isInteger(value) && value >= 0 && value <= max

/** The failure reason as the queue keeps it: one line, no control characters, at most `MAX_FAILURE_CHARS`. */
export const cleanReason = (message: string): string => {
  const line = message.replace(CONTROLS, " ").replace(/\s+/g, " ").trim()
  const cut = [...line].slice(0, MAX_FAILURE_CHARS).join("")
  return cut === "" ? "worker failure" : cut
}

const jobIdParam = Effect.flatMap(HttpRouter.params, (params) => {
  const id = params["id"]
  return id !== undefined && JOB_ID.test(id) ? Effect.succeed(id) : Effect.fail(fail("not_found"))
})

const queryParam = (request: HttpServerRequest.HttpServerRequest, name: string): string | undefined => {
  const i = request.url.indexOf("?")
  return i < 0 ? undefined : new URLSearchParams(request.url.slice(i + 1)).get(name) ?? undefined
}

const noContent = HttpServerResponse.empty({ status: 204 })

/** A worker route: authenticated before anything else, errors in the inference envelope. */
const workerRoute = <R>(
  path: string,
  body: (request: HttpServerRequest.HttpServerRequest, credential: WorkerCredential, work: ImageWork["Service"]) => Effect.Effect<
    HttpServerResponse.HttpServerResponse,
    GatewayError,
    R
  >
) =>
  HttpRouter.add(
    "POST",
    `${WORKER_PATH}${path}`,
    Effect.gen(function*() {
      const request = yield* HttpServerRequest.HttpServerRequest
      const tokens = yield* WorkerTokens
      const work = yield* ImageWork
      return yield* handle(renderInference, Effect.flatMap(tokens.authenticate(request), (credential) => body(request, credential, work)))
    })
  )

export const workerRoutes = Layer.mergeAll(
  workerRoute("/heartbeat", (request, credential, work) =>
    Effect.gen(function*() {
      const info = yield* workerInfo(credential, yield* objectBody(request))
      yield* work.heartbeat(info)
      return noContent
    })),
  workerRoute("/jobs/next", (request, credential, work) =>
    Effect.gen(function*() {
      const tokens = yield* WorkerTokens
      const body = yield* objectBody(request)
      const info = yield* workerInfo(credential, body)
      const waitMs = yield* waitMsOf(body.wait_ms)
      yield* work.heartbeat(info)
      const taken = yield* Effect.raceFirst(
        Effect.map(work.take(info, waitMs), (job) => ({ job })),
        Effect.as(tokens.revoked(credential), "revoked" as const)
      )
      if (taken === "revoked") return yield* Effect.fail(fail("invalid_api_key", { message: WorkerMessages.unauthorized }))
      return taken.job === null ? noContent : json({ job: { id: taken.job.id, spec: taken.job.spec } })
    })),
  workerRoute("/jobs/:id/progress", (request, credential, work) =>
    Effect.gen(function*() {
      const jobId = yield* jobIdParam
      const body = yield* objectBody(request)
      const workerId = yield* workerIdOf(body.worker_id)
      const { step, total } = body
      if (!isCount(total, MAX_PROGRESS_TOTAL) || total < 1 || !isCount(step, total)) {
        return yield* Effect.fail(invalid(WorkerRouteMessages.progress))
      }
      const { cancelled } = yield* work.progress(scopedWorkerId(credential, workerId), jobId, step, total)
      return json({ cancelled })
    })),
  workerRoute("/jobs/:id/result", (request, credential, work) =>
    Effect.gen(function*() {
      const jobId = yield* jobIdParam
      const workerId = yield* workerIdOf(queryParam(request, "worker_id"))
      const png = yield* readBytes(request, { maxBytes: MAX_PNG_BYTES, contentTypes: ["image/png"] })
      const check = checkPng(png)
      if (!check.ok) return yield* Effect.fail(invalid(WorkerRouteMessages.png(check.reason)))
      yield* work.complete(scopedWorkerId(credential, workerId), jobId, png)
      return noContent
    })),
  workerRoute("/jobs/:id/failure", (request, credential, work) =>
    Effect.gen(function*() {
      const jobId = yield* jobIdParam
      const body = yield* objectBody(request)
      const workerId = yield* workerIdOf(body.worker_id)
      if (typeof body.message !== "string") return yield* Effect.fail(invalid(WorkerRouteMessages.message))
      yield* work.fail(scopedWorkerId(credential, workerId), jobId, cleanReason(body.message))
      return noContent
    }))
)
