/**
 * The image queue in one process (embedded mode): `ImageQueue` for the endpoint and `ImageWork` for the workers
 * (the simulated one in-process, remote ones through `WorkerRoutes.ts`). `QueueRedis.ts` serves the same two
 * interfaces across replicas.
 *
 * - Fair: one line per account, and a ring of the accounts that have jobs waiting. A take serves the first account of
 *   the ring and moves it to the back, so an account's backlog delays another account's job by at most one job per
 *   worker (round-robin).
 * - `run` checks at submit: a worker online (a heartbeat, take, progress or report within
 *   `worker_heartbeat_seconds`, or a take waiting now), else 503 `image_no_worker`; fewer than
 *   `congestion_threshold` jobs waiting, else 503 `image_congested`. Config is read live at every decision.
 * - Interrupting `run` withdraws a waiting job; a job a worker holds is marked cancelled instead: the worker's next
 *   `progress` answers `cancelled: true` and its result is ignored.
 * - A worker silent for `worker_heartbeat_seconds` loses the jobs it holds: each goes back to the front of its
 *   account's line once; lost a second time it fails (`Failed`, which the endpoint answers with 500 `image_failed`).
 *   A sweep on the Effect clock (every second) finds them; it also forgets workers silent for 4× that time.
 *
 * All state is plain data changed synchronously (each operation is atomic on the event loop: the queue is one actor
 * served inline); waiters are resumed only after the state is consistent, because a v4 `resume` runs the waiting
 * fiber at once.
 */
import { Clock, type Context, Effect, type Scope } from "effect"
import { CurrentTelemetry } from "../telemetry/Telemetry.js"
import { GatewayError } from "../errors/Catalog.js"
import type { ImagesConfig } from "../config/Images.js"
import { type ImageJob, ImageQueue, ImageWork, type JobOutcome, type WorkerInfo } from "./Contracts.js"
import { makeTakers } from "./Takers.js"

export const noWorker = () => new GatewayError({ code: "image_no_worker" })
export const congested = () => new GatewayError({ code: "image_congested" })
export const duplicateJob = (id: string) => new GatewayError({ code: "image_failed", detail: `duplicate job id ${id}` })

/** What `run` answers for a job whose workers were lost twice. */
export const LOST_TWICE = "the job's worker stopped responding twice"

/** A worker's failure reason is kept to this many characters. */
export const MAX_REASON = 500

/** How often the sweep looks for silent workers. */
export const SWEEP_MS = 1_000

/** The longest a take waits (the HTTP protocol allows 25 s). */
export const MAX_TAKE_WAIT_MS = 60_000

export interface QueueOptions {
  /** The live `images` config, read at every decision. */
  readonly config: () => ImagesConfig
}

export interface ImageQueues {
  readonly queue: Context.Service.Shape<typeof ImageQueue>
  readonly work: Context.Service.Shape<typeof ImageWork>
  /** Looks for silent workers now (what runs every `SWEEP_MS`). */
  readonly sweep: Effect.Effect<void>
}

interface Entry {
  readonly job: ImageJob
  state: "queued" | "held" | "cancelled" | "done"
  worker: Worker | null
  losses: number
  /** When it was cancelled on its worker: dropped after `max_wait_seconds` if the worker never reports. */
  cancelledAt: number
  /** When it was submitted (its wait for a worker is measured from here). */
  readonly queuedAt: number
  /** Resumes the waiting `run`; null once nobody waits. */
  resume: ((outcome: JobOutcome) => void) | null
}

interface Worker {
  info: WorkerInfo
  lastSeen: number
  /** Takes of this worker waiting now: a polling worker is online. */
  polling: number
  readonly held: Set<Entry>
}


/** Builds both services in the current scope (the sweep fiber lives in it). */
export const makeMemory = (options: QueueOptions): Effect.Effect<ImageQueues, never, Scope.Scope> =>
  Effect.gen(function*() {
    const clock = yield* Clock.Clock
    const now = () => clock.currentTimeMillisUnsafe()
    const telemetry = yield* CurrentTelemetry
    const { config } = options
    const jobs = new Map<string, Entry>()
    /** Accounts with jobs waiting, in round-robin order; each with its line. */
    const ring = new Map<string, Array<Entry>>()
    let queued = 0
    const workers = new Map<string, Worker>()
    /** Takes waiting for a job, oldest first. */
    const takers = makeTakers(clock)
    const wakeOne = takers.wakeOne
    const waitForJob = takers.wait

    const alive = (w: Worker, t: number, hbMs: number) => w.polling > 0 || t - w.lastSeen < hbMs

    const touch = (info: WorkerInfo): Worker => {
      let w = workers.get(info.id)
      if (w === undefined) workers.set(info.id, w = { info, lastSeen: 0, polling: 0, held: new Set() })
      w.info = info
      w.lastSeen = now()
      return w
    }

    const seen = (workerId: string): Worker | undefined => {
      const w = workers.get(workerId)
      if (w !== undefined) w.lastSeen = now()
      return w
    }

    const enqueue = (entry: Entry, front: boolean) => {
      entry.state = "queued"
      entry.worker = null
      const line = ring.get(entry.job.accountId)
      if (line === undefined) ring.set(entry.job.accountId, [entry])
      else if (front) line.unshift(entry)
      else line.push(entry)
      queued++
    }

    /** The next job in round-robin order, now held by `w`. */
    const next = (w: Worker): Entry | undefined => {
      const first = ring.entries().next()
      if (first.done) return undefined
      const [accountId, line] = first.value
      const entry = line.shift()!
      ring.delete(accountId)
      if (line.length > 0) ring.set(accountId, line)
      queued--
      entry.state = "held"
      entry.worker = w
      w.held.add(entry)
      telemetry.imageWait((now() - entry.queuedAt) / 1000)
      return entry
    }


    /** Forgets a job; the worker holding it (if any) no longer does. */
    const drop = (entry: Entry) => {
      entry.state = "done"
      entry.resume = null
      entry.worker?.held.delete(entry)
      entry.worker = null
      jobs.delete(entry.job.id)
    }

    const finish = (entry: Entry, outcome: JobOutcome) => {
      const resume = entry.resume
      drop(entry)
      resume?.(outcome)
    }

    const withdraw = (entry: Entry) => {
      entry.resume = null
      if (entry.state === "queued") {
        const line = ring.get(entry.job.accountId)!
        line.splice(line.indexOf(entry), 1)
        if (line.length === 0) ring.delete(entry.job.accountId)
        queued--
        drop(entry)
      } else if (entry.state === "held") {
        entry.state = "cancelled"
        entry.cancelledAt = now()
      }
    }

    const sweep = Effect.sync(() => {
      const t = now()
      const cfg = config()
      const hbMs = cfg.worker_heartbeat_seconds * 1000
      const maxWaitMs = cfg.max_wait_seconds * 1000
      const failed: Array<Entry> = []
      let requeued = 0
      for (const [id, w] of workers) {
        if (alive(w, t, hbMs)) {
          for (const entry of w.held) {
            if (entry.state === "cancelled" && t - entry.cancelledAt >= maxWaitMs) drop(entry)
          }
          continue
        }
        for (const entry of [...w.held]) {
          w.held.delete(entry)
          if (entry.state !== "held") {
            drop(entry)
          } else if (++entry.losses >= 2) {
            failed.push(entry)
          } else {
            enqueue(entry, true)
            requeued++
          }
        }
        if (t - w.lastSeen >= hbMs * 4) workers.delete(id)
      }
      // the state is consistent: resume the waiters now
      for (const entry of failed) finish(entry, { _tag: "Failed", reason: LOST_TWICE })
      for (let i = 0; i < requeued; i++) wakeOne()
    })
    yield* Effect.sleep(SWEEP_MS).pipe(Effect.andThen(sweep), Effect.forever, Effect.forkScoped)

    const online = (t: number, hbMs: number) => {
      let n = 0
      for (const w of workers.values()) if (alive(w, t, hbMs)) n++
      return n
    }

    const run = (job: ImageJob): Effect.Effect<JobOutcome, GatewayError> =>
      Effect.suspend(() => {
        const cfg = config()
        if (online(now(), cfg.worker_heartbeat_seconds * 1000) === 0) return Effect.fail(noWorker())
        if (queued >= cfg.congestion_threshold) return Effect.fail(congested())
        if (jobs.has(job.id)) return Effect.fail(duplicateJob(job.id))
        return Effect.callback<JobOutcome>((resume) => {
          const entry: Entry = {
            job,
            state: "queued",
            worker: null,
            losses: 0,
            cancelledAt: 0,
            queuedAt: now(),
            resume: (outcome) => resume(Effect.succeed(outcome))
          }
          jobs.set(job.id, entry)
          enqueue(entry, false)
          wakeOne()
          return Effect.sync(() => withdraw(entry))
        })
      })


    const take = (info: WorkerInfo, waitMs: number): Effect.Effect<ImageJob | null> =>
      // Only the wait is interruptible: a job is handed over in the same step as it is taken.
      Effect.uninterruptibleMask((restore) =>
        Effect.suspend(() => {
          const w = touch(info)
          const deadline = now() + Math.min(MAX_TAKE_WAIT_MS, Math.max(0, waitMs))
          const attempt = (): Effect.Effect<ImageJob | null> => {
            const entry = next(w)
            if (entry !== undefined) return Effect.succeed(entry.job)
            const left = deadline - now()
            if (left <= 0) return Effect.succeed(null)
            const taker = takers.make()
            w.polling++
            return restore(waitForJob(left, taker)).pipe(
              // woken for a job but interrupted before taking it: let another take have it
              Effect.onInterrupt(() => Effect.sync(() => taker.woken && wakeOne())),
              Effect.ensuring(Effect.sync(() => {
                w.polling--
                w.lastSeen = now()
              })),
              Effect.flatMap((woken) => woken ? attempt() : Effect.sync(() => next(w)?.job ?? null))
            )
          }
          return attempt()
        })
      )

    const progress = (workerId: string, jobId: string) =>
      Effect.sync(() => {
        const w = seen(workerId)
        const entry = jobs.get(jobId)
        if (entry === undefined || w === undefined || entry.worker !== w) return { cancelled: true }
        if (entry.state !== "cancelled") return { cancelled: false }
        drop(entry)
        return { cancelled: true }
      })

    const report = (workerId: string, jobId: string, outcome: () => JobOutcome) =>
      Effect.sync(() => {
        const w = seen(workerId)
        const entry = jobs.get(jobId)
        if (entry === undefined || w === undefined || entry.worker !== w) return
        if (entry.state === "held") finish(entry, outcome())
        else drop(entry)
      })

    return {
      sweep,
      queue: ImageQueue.of({
        run,
        waiting: Effect.sync(() => queued),
        workersOnline: Effect.sync(() => online(now(), config().worker_heartbeat_seconds * 1000))
      }),
      work: ImageWork.of({
        heartbeat: (info) => Effect.sync(() => void touch(info)),
        take,
        progress: (workerId, jobId) => progress(workerId, jobId),
        complete: (workerId, jobId, png) => report(workerId, jobId, () => ({ _tag: "Done", png, workerId })),
        fail: (workerId, jobId, reason) =>
          report(workerId, jobId, () => ({ _tag: "Failed", reason: reason.slice(0, MAX_REASON) }))
      })
    }
  })
