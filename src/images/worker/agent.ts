/**
 * The GPU worker agent (issue 17): runs next to a ComfyUI server and bridges it to the gateway's worker API
 * (WorkerRoutes.ts).
 *
 *   WELLSPRING_WORKER_TOKEN=wsw_… npm run worker -- --gateway https://api.example --comfyui http://127.0.0.1:8188
 *
 * It heartbeats every `--heartbeat-seconds` (default 5, a third of the gateway's default
 * `worker_heartbeat_seconds`), whatever else it is doing. While ComfyUI answers `GET /system_stats` it long-polls
 * `jobs/next`; a job becomes a workflow (Workflow.ts), submitted with `POST /prompt` and followed with
 * `GET /history/{id}` (steps from `/ws` when it connects); progress is reported to the gateway, whose answer says
 * whether the job was cancelled (then `POST /queue` delete and `POST /interrupt`, and the job is dropped). The
 * image comes from `GET /view`, is checked (PngCheck.ts) and posted back; a ComfyUI error is posted as a failure.
 *
 * ComfyUI down: no job is taken, heartbeats go on, the probe backs off (1 s doubling to 30 s). The token refused
 * (401, 429): nothing is polled, and one heartbeat probes again after a back-off (30 s doubling to 5 min), so a
 * revoked worker costs the gateway a request every few minutes. SIGTERM/SIGINT: no new job; the current one gets
 * `--grace-seconds` (default 30) to finish, then ComfyUI is interrupted and the job reported failed.
 *
 * Every call has a timeout and every response a size bound (JSON 4 MB, the image 32 MB).
 */
import { Cause, Data, Deferred, Effect, Exit, Fiber, Latch, Option, Schedule } from "effect"
import * as Crypto from "node:crypto"
import * as Os from "node:os"
import * as Url from "node:url"
import { Agent as Dispatcher, request as send, WebSocket } from "undici"
import type { ImageJob, JobSpec } from "../Contracts.js"
import { checkPng } from "./PngCheck.js"
import { buildWorkflow, NODE, type Workflow } from "./Workflow.js"

const WORKER_PATH = "/v1/images/workers"
const MB = 1024 * 1024

export interface AgentOptions {
  /** The gateway's inference origin, e.g. `https://api.example`. */
  readonly gateway: string
  readonly token: string
  /** ComfyUI's HTTP address, e.g. `http://127.0.0.1:8188`. */
  readonly comfyui: string
  /** This process's worker id (default: a random UUID). */
  readonly workerId?: string
  /** Shown to operators (default: the host name). */
  readonly name?: string
  readonly heartbeatMs?: number
  /** Long-poll wait per `jobs/next` (the gateway clamps it to 25 s). */
  readonly waitMs?: number
  /** `/history` polling interval while a job runs. */
  readonly pollMs?: number
  /** Progress reports (and so cancellation checks) at most this often. */
  readonly progressMs?: number
  /** A job still running after this long is interrupted and reported failed. */
  readonly jobTimeoutMs?: number
  /** Timeout of one call (not of the long poll, which gets `waitMs` more). */
  readonly callTimeoutMs?: number
  /** ComfyUI unreachable this long during a job: the job is reported failed. */
  readonly comfyLostMs?: number
  /** Back-off while ComfyUI is down (doubling). */
  readonly downBackoff?: { readonly initialMs: number; readonly maxMs: number }
  /** Back-off while the gateway refuses the token (doubling). */
  readonly authBackoff?: { readonly initialMs: number; readonly maxMs: number }
  /** After a stop request, how long the current job may still take. */
  readonly graceMs?: number
  readonly maxImageBytes?: number
  readonly filenamePrefix?: string
  readonly log?: (line: string) => void
}

export type AgentState = "starting" | "idle" | "working" | "comfy_down" | "unauthorized" | "stopping" | "stopped"

export interface AgentStatus {
  readonly workerId: string
  readonly state: AgentState
  readonly jobId: string | null
  readonly heartbeats: number
  /** Times the gateway refused the token (401/429), in-flight calls refused together counted once. */
  readonly refusals: number
  readonly jobsDone: number
  readonly jobsFailed: number
  readonly jobsCancelled: number
}

export interface AgentHandle {
  readonly status: () => AgentStatus
  /** Stops taking jobs; the current job gets the grace period; resolves once the agent has stopped. */
  readonly stop: () => Promise<void>
  /** Resolves when the agent has stopped. */
  readonly done: Promise<void>
}

/** A call that did not get a usable answer. */
class CallError extends Data.TaggedError("CallError")<{
  /** `unreachable`: no answer (refused, reset, timeout); `status`: an answer we cannot use; `too_large`. */
  readonly kind: "unreachable" | "status" | "too_large"
  readonly status: number
  readonly message: string
  readonly body: string
}> {}

/** The gateway refused the token (401) or the address (429). */
class Refused extends Data.TaggedError("Refused")<{ readonly status: number; readonly retryAfterMs: number }> {}

interface Reply {
  readonly status: number
  readonly headers: Readonly<Record<string, string | ReadonlyArray<string> | undefined>>
  readonly body: Buffer
}

const header = (reply: Reply, name: string): string | undefined => {
  const value = reply.headers[name]
  return typeof value === "string" ? value : undefined
}

const dispatcher = new Dispatcher({ connect: { timeout: 5_000 }, keepAliveTimeout: 30_000 })

/** One HTTP call: a total timeout, the response read up to `maxBytes`. */
const call = (
  url: string,
  init: {
    readonly method: "GET" | "POST"
    readonly headers?: Record<string, string>
    readonly body?: string | Uint8Array
    readonly timeoutMs: number
    readonly maxBytes: number
  }
): Effect.Effect<Reply, CallError> =>
  Effect.tryPromise({
    try: async (signal) => {
      const response = await send(url, {
        method: init.method,
        headers: init.headers ?? {},
        body: init.body ?? null,
        signal: AbortSignal.any([signal, AbortSignal.timeout(init.timeoutMs)]),
        headersTimeout: init.timeoutMs,
        bodyTimeout: init.timeoutMs,
        dispatcher
      })
      const declared = Number(response.headers["content-length"])
      if (Number.isFinite(declared) && declared > init.maxBytes) {
        response.body.destroy()
        throw new CallError({ kind: "too_large", status: response.statusCode, message: `response of ${declared} bytes`, body: "" })
      }
      const parts: Array<Buffer> = []
      let size = 0
      for await (const chunk of response.body as AsyncIterable<Buffer>) {
        size += chunk.length
        if (size > init.maxBytes) {
          response.body.destroy()
          throw new CallError({ kind: "too_large", status: response.statusCode, message: `response over ${init.maxBytes} bytes`, body: "" })
        }
        parts.push(chunk)
      }
      return { status: response.statusCode, headers: response.headers, body: Buffer.concat(parts) }
    },
    catch: (error) =>
      error instanceof CallError
        ? error
        : new CallError({ kind: "unreachable", status: 0, message: (error as Error)?.message ?? String(error), body: "" })
  })

const parseJson = (reply: Reply): unknown => {
  try {
    return JSON.parse(reply.body.toString("utf8"))
  } catch {
    return undefined
  }
}

const isObject = (value: unknown): value is Record<string, unknown> =>
  value !== null && typeof value === "object" && !Array.isArray(value)

/** One line, at most `max` characters. */
export const oneLine = (text: string, max = 500): string => {
  const line = text.replace(/[\p{Cc}\p{Cf}]/gu, " ").replace(/\s+/g, " ").trim()
  return [...line].slice(0, max).join("")
}

// ---------------------------------------------------------------------------------------------------------
// The job as the gateway sends it

const isString = (v: unknown): v is string => typeof v === "string"
const isNumber = (v: unknown): v is number => typeof v === "number" && Number.isFinite(v)
const isInt = (v: unknown): v is number => Number.isInteger(v)

/** The job of a `jobs/next` answer, or null when it is not one. */
export const decodeJob = (body: unknown): Pick<ImageJob, "id" | "spec"> | null => {
  if (!isObject(body) || !isObject(body.job)) return null
  const { id, spec } = body.job
  if (!isString(id) || !/^[A-Za-z0-9_-]{1,64}$/.test(id) || !isObject(spec) || !isObject(spec.preset)) return null
  const p = spec.preset
  const loras = p.loras
  const ok = isString(spec.prompt) && isString(spec.negative_prompt) && isInt(spec.width) && isInt(spec.height) &&
    isInt(spec.steps) && isNumber(spec.scale) && isInt(spec.seed) && isString(p.name) && isString(p.checkpoint) &&
    isString(p.sampler) && isString(p.scheduler) && (p.upscaler === null || isString(p.upscaler)) && Array.isArray(loras) &&
    loras.every((l) => isObject(l) && isString(l.name) && isNumber(l.weight))
  return ok ? { id, spec: spec as unknown as JobSpec } : null
}

// ---------------------------------------------------------------------------------------------------------
// ComfyUI's answers

type HistoryState =
  | { readonly _tag: "Running" }
  | { readonly _tag: "Failed"; readonly message: string }
  | { readonly _tag: "Done"; readonly image: { readonly filename: string; readonly subfolder: string; readonly type: string } }

/** `GET /history/{id}`: `{}` until the prompt ends, then its entry with `status` and `outputs`. */
export const readHistory = (body: unknown, promptId: string): HistoryState => {
  if (!isObject(body) || !isObject(body[promptId])) return { _tag: "Running" }
  const entry = body[promptId]
  const status = isObject(entry.status) ? entry.status : {}
  const messages = Array.isArray(status.messages) ? status.messages : []
  const event = (name: string) => {
    const found = messages.find((m) => Array.isArray(m) && m[0] === name)
    return found && isObject(found[1]) ? found[1] : null
  }
  if (status.status_str === "error") {
    const error = event("execution_error")
    if (error) {
      const where = isString(error.node_type) ? `${error.node_type}: ` : ""
      return { _tag: "Failed", message: `ComfyUI error: ${where}${isString(error.exception_message) ? error.exception_message : "unknown"}` }
    }
    return { _tag: "Failed", message: event("execution_interrupted") ? "interrupted on ComfyUI" : "ComfyUI reported an error" }
  }
  const outputs = isObject(entry.outputs) ? entry.outputs : {}
  const imagesOf = (node: unknown) => (isObject(node) && Array.isArray(node.images) ? node.images : [])
  // Our SaveImage node first, else any output image.
  const candidates = [...imagesOf(outputs[NODE.save]), ...Object.values(outputs).flatMap(imagesOf)]
  const image = candidates.find((i) => isObject(i) && isString(i.filename))
  if (image && isObject(image)) {
    return {
      _tag: "Done",
      image: {
        filename: image.filename as string,
        subfolder: isString(image.subfolder) ? image.subfolder : "",
        type: isString(image.type) ? image.type : "output"
      }
    }
  }
  if (status.completed === true) return { _tag: "Failed", message: "ComfyUI finished without an image" }
  return { _tag: "Running" }
}

/** `POST /prompt` refused (400): ComfyUI's message and the first node errors. */
export const describeRefusal = (body: unknown): string => {
  if (!isObject(body)) return "ComfyUI refused the workflow"
  const parts: Array<string> = []
  if (isObject(body.error) && isString(body.error.message)) parts.push(body.error.message)
  if (isObject(body.node_errors)) {
    for (const [node, info] of Object.entries(body.node_errors).slice(0, 3)) {
      if (!isObject(info) || !Array.isArray(info.errors)) continue
      const details = info.errors
        .filter(isObject)
        .map((e) => [e.message, e.details].filter(isString).join(": "))
        .join("; ")
      parts.push(`node ${node}${isString(info.class_type) ? ` (${info.class_type})` : ""}: ${details}`)
    }
  }
  return `ComfyUI refused the workflow: ${parts.join(" | ") || "no reason given"}`
}

// ---------------------------------------------------------------------------------------------------------
// The agent

const failureOf = <E>(cause: Cause.Cause<E>): E | null => Option.getOrNull(Cause.findErrorOption(cause))

type Outcome =
  | { readonly _tag: "Done"; readonly png: Uint8Array }
  | { readonly _tag: "Failed"; readonly message: string }
  | { readonly _tag: "Cancelled" }

const backoff = (settings: { readonly initialMs: number; readonly maxMs: number }) => {
  let next = settings.initialMs
  return {
    next: () => {
      const wait = next
      next = Math.min(next * 2, settings.maxMs)
      return wait
    },
    reset: () => void (next = settings.initialMs)
  }
}

export const startAgent = (options: AgentOptions): AgentHandle => {
  const gateway = options.gateway.replace(/\/+$/, "")
  const comfy = options.comfyui.replace(/\/+$/, "")
  const workerId = options.workerId ?? Crypto.randomUUID()
  const info = { worker_id: workerId, name: oneLine(options.name ?? Os.hostname(), 64) || "worker", kind: "comfyui" }
  const heartbeatMs = options.heartbeatMs ?? 5_000
  const waitMs = options.waitMs ?? 25_000
  const pollMs = options.pollMs ?? 500
  const progressMs = options.progressMs ?? 1_000
  const jobTimeoutMs = options.jobTimeoutMs ?? 10 * 60_000
  const callTimeoutMs = options.callTimeoutMs ?? 15_000
  const comfyLostMs = options.comfyLostMs ?? 30_000
  const graceMs = options.graceMs ?? 30_000
  const maxImageBytes = options.maxImageBytes ?? 32 * MB
  const log = options.log ?? ((line: string) => process.stdout.write(`${new Date().toISOString()} ${line}\n`))
  const down = backoff(options.downBackoff ?? { initialMs: 1_000, maxMs: 30_000 })
  /** The gateway unreachable (or answering 5xx) for jobs/next: the same schedule, reset by an answer. */
  const gatewayDown = backoff(options.downBackoff ?? { initialMs: 1_000, maxMs: 30_000 })
  let lastPollProblem = ""
  const refusedBackoff = backoff(options.authBackoff ?? { initialMs: 30_000, maxMs: 5 * 60_000 })

  const status = {
    workerId,
    state: "starting" as AgentState,
    jobId: null as string | null,
    heartbeats: 0,
    refusals: 0,
    jobsDone: 0,
    jobsFailed: 0,
    jobsCancelled: 0
  }
  const setState = (state: AgentState) =>
    Effect.sync(() => {
      if (status.state === state) return
      const previous = status.state
      status.state = state
      if (state === "comfy_down") log(`ComfyUI at ${comfy} is not answering; no jobs are taken until it does`)
      if (previous === "comfy_down" && state === "idle") log("ComfyUI answers again; taking jobs")
    })

  const stopRequested = Deferred.makeUnsafe<void>()
  /** Open while the gateway accepts the token. */
  const accepted = Latch.makeUnsafe(true)
  /** When a refused token may be tried again. */
  let refusedUntil = 0

  // --- the gateway

  const gatewayCall = (path: string, body: string | Uint8Array, contentType: string, timeoutMs = callTimeoutMs) =>
    call(`${gateway}${WORKER_PATH}${path}`, {
      method: "POST",
      headers: { authorization: `Bearer ${options.token}`, "content-type": contentType },
      body,
      timeoutMs,
      maxBytes: 4 * MB
    }).pipe(Effect.flatMap((reply): Effect.Effect<Reply, CallError | Refused> => {
      if (reply.status === 401 || reply.status === 429) {
        const retryAfter = Number(header(reply, "retry-after"))
        return Effect.fail(new Refused({ status: reply.status, retryAfterMs: Number.isFinite(retryAfter) ? retryAfter * 1000 : 0 }))
      }
      return Effect.succeed(reply)
    }))

  const gatewayJson = (path: string, body: unknown, timeoutMs?: number) =>
    gatewayCall(path, JSON.stringify(body), "application/json", timeoutMs)

  /** The token was refused: stop polling until a heartbeat is accepted again. */
  const refused = (error: Refused) =>
    Effect.gen(function*() {
      // Another call refused within the same window (a heartbeat in flight): the window stands.
      if (Date.now() < refusedUntil) return
      status.refusals++
      const wait = Math.max(refusedBackoff.next(), error.retryAfterMs)
      refusedUntil = Date.now() + wait
      yield* Effect.sync(() => accepted.closeUnsafe())
      yield* setState("unauthorized")
      log(
        error.status === 401
          ? `the gateway refused the worker token (401: unknown or revoked); trying again in ${Math.round(wait / 1000)} s`
          : `the gateway refused this address (429: too many failed authentications); trying again in ${Math.round(wait / 1000)} s`
      )
    })

  const unexpected = (what: string, reply: Reply) =>
    new CallError({ kind: "status", status: reply.status, message: `${what}: HTTP ${reply.status}`, body: oneLine(reply.body.toString("utf8"), 300) })

  const heartbeat = gatewayJson("/heartbeat", info).pipe(
    Effect.flatMap((reply) => (reply.status === 204 ? Effect.void : Effect.fail(unexpected("heartbeat", reply)))),
    Effect.tap(() =>
      Effect.sync(() => {
        status.heartbeats++
        if (status.state === "unauthorized") {
          refusedBackoff.reset()
          status.state = "idle"
          log("the gateway accepts the worker token again")
          accepted.openUnsafe()
        }
      })
    )
  )

  let lastHeartbeatProblem = ""
  const heartbeatLoop: Effect.Effect<never> = Effect.gen(function*() {
    for (;;) {
      const waitForRefusal = refusedUntil - Date.now()
      if (waitForRefusal > 0) yield* Effect.sleep(waitForRefusal)
      const exit = yield* Effect.exit(heartbeat)
      if (Exit.isFailure(exit)) {
        const failure = failureOf(exit.cause)
        if (failure instanceof Refused) {
          yield* refused(failure)
          continue
        }
        const problem = failure instanceof CallError ? failure.message : "heartbeat failed"
        if (problem !== lastHeartbeatProblem) log(`heartbeat failed: ${problem}`)
        lastHeartbeatProblem = problem
      } else lastHeartbeatProblem = ""
      yield* Effect.sleep(heartbeatMs)
    }
  })

  const next = gatewayJson("/jobs/next", { ...info, wait_ms: waitMs }, callTimeoutMs + waitMs).pipe(
    Effect.flatMap((reply): Effect.Effect<Pick<ImageJob, "id" | "spec"> | null | { readonly undecodable: string | null }, CallError> => {
      if (reply.status === 204) return Effect.succeed(null)
      if (reply.status !== 200) return Effect.fail(unexpected("jobs/next", reply))
      const body = parseJson(reply)
      const job = decodeJob(body)
      if (job !== null) return Effect.succeed(job)
      // A job we cannot read: reported failed when it has an id, so that it does not wait for nothing.
      const id = isObject(body) && isObject(body.job) && isString(body.job.id) && /^[A-Za-z0-9_-]{1,64}$/.test(body.job.id)
        ? body.job.id
        : null
      return Effect.succeed({ undecodable: id })
    })
  )

  /** Posts with a few retries when the gateway is unreachable (the outcome is worth keeping). */
  const report = <A>(what: string, attempt: Effect.Effect<A, CallError | Refused>) =>
    attempt.pipe(
      Effect.retry({
        schedule: Schedule.exponential("500 millis"),
        times: 3,
        while: (e) => e._tag === "CallError" && e.kind === "unreachable"
      }),
      Effect.catch((error) =>
        error._tag === "Refused" ? refused(error) : Effect.sync(() => log(`${what} not delivered: ${error.message} ${error.body}`))
      )
    )

  const progress = (jobId: string, step: number, total: number) =>
    gatewayJson(`/jobs/${jobId}/progress`, { worker_id: workerId, step, total }).pipe(
      Effect.map((reply) => {
        const body = parseJson(reply)
        return reply.status === 200 && isObject(body) && body.cancelled === true
      })
    )

  const postFailure = (jobId: string, message: string) =>
    // With the token refused it would only be refused again.
    status.state === "unauthorized" ? Effect.void : report(
      `failure of ${jobId}`,
      gatewayJson(`/jobs/${jobId}/failure`, { worker_id: workerId, message: oneLine(message, 500) }).pipe(
        Effect.flatMap((reply) => (reply.status === 204 ? Effect.void : Effect.fail(unexpected("failure", reply))))
      )
    )

  const postResult = (jobId: string, png: Uint8Array) =>
    gatewayCall(`/jobs/${jobId}/result?worker_id=${encodeURIComponent(workerId)}`, png, "image/png", callTimeoutMs * 4).pipe(
      Effect.flatMap((reply) => (reply.status === 204 ? Effect.succeed(true) : Effect.fail(unexpected("result", reply))))
    )

  // --- ComfyUI

  const comfyJson = (method: "GET" | "POST", path: string, body?: unknown) =>
    call(`${comfy}${path}`, {
      method,
      ...(body === undefined ? {} : { headers: { "content-type": "application/json" }, body: JSON.stringify(body) }),
      timeoutMs: callTimeoutMs,
      maxBytes: 4 * MB
    })

  let announced = false
  /** `GET /system_stats` answers with its `system` object. */
  const comfyHealthy = comfyJson("GET", "/system_stats").pipe(
    Effect.map((reply) => {
      const body = parseJson(reply)
      const ok = reply.status === 200 && isObject(body) && isObject(body.system)
      if (ok && !announced && isObject(body)) {
        announced = true
        const devices = Array.isArray(body.devices) ? body.devices.filter(isObject).map((d) => d.name).filter(isString) : []
        const version = isObject(body.system) && isString(body.system.comfyui_version) ? ` ${body.system.comfyui_version}` : ""
        log(`ComfyUI${version} at ${comfy}: ${oneLine(devices.join(", "), 200) || "no device listed"}`)
      }
      return ok
    }),
    Effect.catch(() => Effect.succeed(false))
  )

  /** Best effort: the queued prompt is removed and the running one interrupted. */
  const interruptComfy = (promptId: string) =>
    Effect.all([
      comfyJson("POST", "/queue", { delete: [promptId] }),
      comfyJson("POST", "/interrupt", { prompt_id: promptId })
    ], { discard: true }).pipe(Effect.catch((error) => Effect.sync(() => log(`interrupting ComfyUI failed: ${error.message}`))))

  /** Steps from ComfyUI's websocket (`progress` events of our prompt); none when it does not connect. */
  const watchSteps = (steps: { promptId: string | null; step: number; total: number }) =>
    Effect.acquireRelease(
      Effect.sync(() => {
        try {
          const socket = new WebSocket(`${comfy.replace(/^http/, "ws")}/ws?clientId=${encodeURIComponent(workerId)}`)
          socket.binaryType = "arraybuffer"
          socket.addEventListener("message", (event) => {
            if (typeof event.data !== "string" || event.data.length > 64 * 1024) return
            try {
              const message = JSON.parse(event.data) as unknown
              if (!isObject(message) || message.type !== "progress" || !isObject(message.data)) return
              const { value, max, prompt_id } = message.data
              if (prompt_id !== undefined && prompt_id !== steps.promptId) return
              if (isInt(value) && isInt(max) && max >= 1 && value >= 0) {
                steps.total = Math.min(max, 100_000)
                steps.step = Math.min(value, steps.total)
              }
            } catch {
              // not JSON: ignored
            }
          })
          socket.addEventListener("error", () => undefined)
          return socket
        } catch {
          return null
        }
      }),
      (socket) => Effect.sync(() => socket?.close())
    )

  const fetchImage = (image: { filename: string; subfolder: string; type: string }) => {
    const query = new URLSearchParams({ filename: image.filename, subfolder: image.subfolder, type: image.type })
    return call(`${comfy}/view?${query}`, { method: "GET", timeoutMs: callTimeoutMs * 4, maxBytes: maxImageBytes }).pipe(
      Effect.map((reply): Outcome => {
        if (reply.status !== 200) return { _tag: "Failed", message: `ComfyUI /view answered HTTP ${reply.status}` }
        const check = checkPng(reply.body)
        return check.ok ? { _tag: "Done", png: reply.body } : { _tag: "Failed", message: `ComfyUI's image is not a valid PNG: ${check.reason}` }
      }),
      Effect.catch((error) =>
        Effect.succeed<Outcome>({
          _tag: "Failed",
          message: error.kind === "too_large" ? `ComfyUI's image is larger than ${maxImageBytes} bytes` : `fetching the image failed: ${error.message}`
        })
      )
    )
  }

  /** Runs the job on ComfyUI; `prompt.id` is set once submitted (for the interruption). */
  const execute = (job: Pick<ImageJob, "id" | "spec">, prompt: { id: string | null }) =>
    Effect.scoped(Effect.gen(function*() {
      const steps = { promptId: null as string | null, step: 0, total: Math.max(1, job.spec.steps) }
      yield* watchSteps(steps)
      let workflow: Workflow
      try {
        workflow = buildWorkflow(job.spec, options.filenamePrefix ? { filenamePrefix: options.filenamePrefix } : {})
      } catch (error) {
        return { _tag: "Failed", message: `could not build the workflow: ${(error as Error).message}` } as Outcome
      }
      const submitted = yield* Effect.exit(comfyJson("POST", "/prompt", { prompt: workflow, client_id: workerId }))
      if (Exit.isFailure(submitted)) return { _tag: "Failed", message: "ComfyUI unreachable when submitting the workflow" } as Outcome
      const reply = submitted.value
      const body = parseJson(reply)
      if (reply.status !== 200) {
        return {
          _tag: "Failed",
          message: reply.status === 400 ? describeRefusal(body) : `ComfyUI /prompt answered HTTP ${reply.status}`
        } as Outcome
      }
      if (!isObject(body) || !isString(body.prompt_id)) return { _tag: "Failed", message: "ComfyUI /prompt answered without a prompt_id" } as Outcome
      prompt.id = body.prompt_id
      steps.promptId = body.prompt_id
      let nextProgressAt = 0
      let lostSince: number | null = null
      for (;;) {
        const now = Date.now()
        if (now >= nextProgressAt) {
          nextProgressAt = now + progressMs
          // Unreachable gateway: the job goes on (the result may still get through). Refused token: nothing this
          // worker sends will be taken, so the job is dropped like a cancelled one.
          const cancelled = yield* progress(job.id, steps.step, steps.total).pipe(
            Effect.catch((error) => (error._tag === "Refused" ? Effect.as(refused(error), true) : Effect.succeed(false)))
          )
          if (cancelled) return { _tag: "Cancelled" } as Outcome
        }
        const history = yield* Effect.exit(comfyJson("GET", `/history/${encodeURIComponent(body.prompt_id)}`))
        if (Exit.isSuccess(history) && history.value.status === 200) {
          lostSince = null
          const state = readHistory(parseJson(history.value), body.prompt_id)
          if (state._tag === "Failed") return state as Outcome
          if (state._tag === "Done") return yield* fetchImage(state.image)
        } else {
          lostSince ??= now
          if (now - lostSince >= comfyLostMs) {
            return { _tag: "Failed", message: `ComfyUI unreachable for ${Math.round(comfyLostMs / 1000)} s during the job` } as Outcome
          }
        }
        yield* Effect.sleep(pollMs)
      }
    }))

  const runJob = (job: Pick<ImageJob, "id" | "spec">) =>
    Effect.gen(function*() {
      status.jobId = job.id
      yield* setState("working")
      log(`job ${job.id}: ${job.spec.width}x${job.spec.height}, ${job.spec.steps} steps, checkpoint ${job.spec.preset.checkpoint}`)
      const prompt = { id: null as string | null }
      const stopped = Deferred.await(stopRequested).pipe(
        Effect.andThen(Effect.sleep(graceMs)),
        Effect.as<Outcome>({ _tag: "Failed", message: "the worker is shutting down" })
      )
      const timedOut = Effect.sleep(jobTimeoutMs).pipe(
        Effect.as<Outcome>({ _tag: "Failed", message: `the job took longer than ${Math.round(jobTimeoutMs / 1000)} s` })
      )
      const outcome = yield* Effect.raceAll([execute(job, prompt), stopped, timedOut])
      switch (outcome._tag) {
        case "Done": {
          const delivered = yield* report(`result of ${job.id}`, postResult(job.id, outcome.png))
          if (delivered === true) {
            status.jobsDone++
            log(`job ${job.id}: done (${outcome.png.length} bytes)`)
          } else {
            status.jobsFailed++
            yield* postFailure(job.id, "the gateway did not take the image")
          }
          break
        }
        case "Failed":
          status.jobsFailed++
          log(`job ${job.id}: failed: ${outcome.message}`)
          if (prompt.id !== null) yield* interruptComfy(prompt.id)
          yield* postFailure(job.id, outcome.message)
          break
        case "Cancelled":
          status.jobsCancelled++
          log(`job ${job.id}: dropped (${status.state === "unauthorized" ? "the token was refused" : "cancelled by the gateway"})`)
          if (prompt.id !== null) yield* interruptComfy(prompt.id)
      }
      status.jobId = null
    })

  const mainLoop = Effect.gen(function*() {
    while (!Deferred.isDoneUnsafe(stopRequested)) {
      yield* Effect.raceFirst(accepted.await, Deferred.await(stopRequested))
      if (Deferred.isDoneUnsafe(stopRequested)) break
      if (!(yield* comfyHealthy)) {
        yield* setState("comfy_down")
        yield* Effect.raceFirst(Effect.sleep(down.next()), Deferred.await(stopRequested))
        continue
      }
      down.reset()
      yield* setState("idle")
      const taken = yield* Effect.raceFirst(
        Effect.exit(next),
        Effect.as(Deferred.await(stopRequested), null)
      )
      if (taken === null) break
      if (Exit.isFailure(taken)) {
        const error = failureOf(taken.cause)
        if (error instanceof Refused) yield* refused(error)
        else {
          const problem = error?.message ?? "unknown"
          if (problem !== lastPollProblem) log(`jobs/next failed: ${problem}; retrying with back-off`)
          lastPollProblem = problem
          yield* Effect.raceFirst(Effect.sleep(gatewayDown.next()), Deferred.await(stopRequested))
        }
        continue
      }
      gatewayDown.reset()
      lastPollProblem = ""
      if (taken.value === null) continue
      if ("undecodable" in taken.value) {
        log("the gateway sent a job this agent cannot read; is the agent older than the gateway?")
        if (taken.value.undecodable !== null) yield* postFailure(taken.value.undecodable, "the worker could not read the job")
        continue
      }
      yield* runJob(taken.value)
      if (status.state === "working") yield* setState("idle")
    }
  })

  const program = Effect.gen(function*() {
    log(`worker ${workerId} ("${info.name}") for ${gateway}, ComfyUI at ${comfy}`)
    const beating = yield* Effect.forkChild(heartbeatLoop)
    yield* mainLoop
    yield* setState("stopping")
    yield* Fiber.interrupt(beating)
    yield* setState("stopped")
    log("worker stopped")
  })

  const fiber = Effect.runFork(program)
  const done = new Promise<void>((resolve) => fiber.addObserver(() => resolve()))
  return {
    status: () => ({ ...status }),
    stop: () => {
      if (!Deferred.isDoneUnsafe(stopRequested)) {
        log(status.jobId ? `stopping: job ${status.jobId} gets up to ${Math.round(graceMs / 1000)} s to finish` : "stopping")
        Deferred.doneUnsafe(stopRequested, Effect.void)
      }
      return done
    },
    done
  }
}

// ---------------------------------------------------------------------------------------------------------
// Command line

const USAGE = `Usage: npm run worker -- --gateway URL --comfyui URL [--token T] [--name N] [--id ID]
                         [--heartbeat-seconds 5] [--grace-seconds 30]

The token may come from WELLSPRING_WORKER_TOKEN instead of --token (it then stays out of the process list).
`

export const parseAgentArgs = (argv: ReadonlyArray<string>, env: NodeJS.ProcessEnv): AgentOptions | string => {
  const flags: Record<string, string> = {}
  const known = new Set(["gateway", "comfyui", "token", "name", "id", "heartbeat-seconds", "grace-seconds"])
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!
    if (arg === "--help" || arg === "-h") return USAGE
    if (!arg.startsWith("--")) return `unexpected argument "${arg}"\n${USAGE}`
    const eq = arg.indexOf("=")
    const name = eq > 0 ? arg.slice(2, eq) : arg.slice(2)
    if (!known.has(name)) return `unknown flag --${name}\n${USAGE}`
    const value = eq > 0 ? arg.slice(eq + 1) : argv[++i]
    if (value === undefined) return `flag --${name} needs a value\n${USAGE}`
    flags[name] = value
  }
  const token = flags.token ?? env.WELLSPRING_WORKER_TOKEN
  for (const [name, value] of [["gateway", flags.gateway], ["comfyui", flags.comfyui], ["token", token]] as const) {
    if (value === undefined || value === "") return `missing --${name}${name === "token" ? " (or WELLSPRING_WORKER_TOKEN)" : ""}\n${USAGE}`
  }
  for (const name of ["gateway", "comfyui"] as const) {
    try {
      const url = new URL(flags[name]!)
      if (url.protocol !== "http:" && url.protocol !== "https:") return `--${name} must be an http(s) URL`
    } catch {
      return `--${name} must be an http(s) URL`
    }
  }
  const seconds = (name: string, fallback: number) => {
    const raw = flags[name]
    if (raw === undefined) return fallback
    const n = Number(raw)
    return Number.isFinite(n) && n >= 0 && n <= 3600 ? n : Number.NaN
  }
  const heartbeat = seconds("heartbeat-seconds", 5)
  const grace = seconds("grace-seconds", 30)
  if (!(heartbeat > 0)) return "--heartbeat-seconds must be a number of seconds above 0"
  if (Number.isNaN(grace)) return "--grace-seconds must be a number of seconds"
  if (flags.id !== undefined && !/^[A-Za-z0-9._:-]{1,64}$/.test(flags.id)) return "--id must be 1-64 characters of A-Z a-z 0-9 . _ : -"
  return {
    gateway: flags.gateway!,
    comfyui: flags.comfyui!,
    token: token!,
    ...(flags.name !== undefined ? { name: flags.name } : {}),
    ...(flags.id !== undefined ? { workerId: flags.id } : {}),
    heartbeatMs: heartbeat * 1000,
    graceMs: grace * 1000
  }
}

const isMain = process.argv[1] !== undefined && Url.pathToFileURL(process.argv[1]).href === import.meta.url
if (isMain) {
  const parsed = parseAgentArgs(process.argv.slice(2), process.env)
  if (typeof parsed === "string") {
    const help = parsed === USAGE
    ;(help ? process.stdout : process.stderr).write(help ? parsed : `wellspring-worker: ${parsed}\n`)
    process.exit(help ? 0 : 2)
  }
  const agent = startAgent(parsed)
  const stop = () => void agent.stop().then(() => process.exit(0))
  process.once("SIGTERM", stop)
  process.once("SIGINT", stop)
}
