/**
 * Shared by the worker tests: a gateway whose `ImageWork` is a small in-test implementation that records what
 * workers do, a valid PNG, and a job.
 */
import { Effect, Layer } from "effect"
import * as Crypto from "node:crypto"
import * as Zlib from "node:zlib"
import { type ImageJob, ImageWork, type JobSpec, type WorkerInfo } from "../../src/images/Contracts.js"
import { type ConfigDoc, startGateway } from "../support/Gateway.js"

// ---------------------------------------------------------------------------------------------------------
// The in-test ImageWork

export interface Outcome {
  readonly workerId: string
  readonly jobId: string
}

export interface TestWork {
  readonly layer: Layer.Layer<ImageWork>
  /** Queues a job for the next `take`. */
  readonly enqueue: (job: ImageJob) => void
  /** Marks a job cancelled: its next progress report answers `cancelled: true`. */
  readonly cancel: (jobId: string) => void
  /** Last heartbeat (ms) per worker id. */
  readonly heartbeats: Map<string, { readonly at: number; readonly info: WorkerInfo; count: number }>
  /** Workers with a heartbeat within `windowMs`. */
  readonly online: (windowMs: number) => number
  /**
   * A stopped worker gets no job: its waiting `take` ends with null, and so do later ones (a long poll whose
   * connection the gateway has not yet seen close would otherwise take a job into the void).
   */
  readonly retire: (workerId: string) => void
  /** Calls of `take` waiting now. */
  readonly waiting: () => number
  /** `wait_ms` of every `take`. */
  readonly waits: Array<number>
  /** Who took which job. */
  readonly taken: Map<string, string>
  readonly progress: Array<Outcome & { readonly step: number; readonly total: number }>
  readonly completed: Array<Outcome & { readonly png: Uint8Array }>
  readonly failed: Array<Outcome & { readonly reason: string }>
}

export const makeTestWork = (): TestWork => {
  const pending: Array<ImageJob> = []
  const waiters: Array<{ readonly workerId: string; readonly give: (job: ImageJob | null) => void }> = []
  const retired = new Set<string>()
  const cancelled = new Set<string>()
  const work: TestWork = {
    layer: Layer.effect(ImageWork, Effect.sync(() => service)),
    enqueue: (job) => {
      const waiter = waiters.shift()
      if (waiter) waiter.give(job)
      else pending.push(job)
    },
    retire: (workerId) => {
      retired.add(workerId)
      for (const waiter of waiters.filter((w) => w.workerId === workerId)) waiter.give(null)
    },
    cancel: (jobId) => void cancelled.add(jobId),
    heartbeats: new Map(),
    online: (windowMs) => [...work.heartbeats.values()].filter((h) => Date.now() - h.at < windowMs).length,
    waiting: () => waiters.length,
    waits: [],
    taken: new Map(),
    progress: [],
    completed: [],
    failed: []
  }
  const beat = (info: WorkerInfo) => {
    const previous = work.heartbeats.get(info.id)
    work.heartbeats.set(info.id, { at: Date.now(), info, count: (previous?.count ?? 0) + 1 })
  }
  const service = ImageWork.of({
    heartbeat: (info) => Effect.sync(() => beat(info)),
    take: (worker, waitMs) =>
      Effect.callback<ImageJob | null>((resume) => {
        work.waits.push(waitMs)
        if (retired.has(worker.id)) return resume(Effect.succeed(null))
        const ready = pending.shift()
        if (ready !== undefined) {
          work.taken.set(ready.id, worker.id)
          return resume(Effect.succeed(ready))
        }
        const waiter = {
          workerId: worker.id,
          give: (job: ImageJob | null) => {
            clearTimeout(timer)
            leave()
            if (job !== null) work.taken.set(job.id, worker.id)
            resume(Effect.succeed(job))
          }
        }
        const leave = () => {
          const i = waiters.indexOf(waiter)
          if (i >= 0) waiters.splice(i, 1)
        }
        const timer = setTimeout(() => {
          leave()
          resume(Effect.succeed(null))
        }, waitMs)
        waiters.push(waiter)
        return Effect.sync(() => {
          clearTimeout(timer)
          leave()
        })
      }),
    progress: (workerId, jobId, step, total) =>
      Effect.sync(() => {
        work.progress.push({ workerId, jobId, step, total })
        return { cancelled: cancelled.has(jobId) }
      }),
    complete: (workerId, jobId, png) => Effect.sync(() => void work.completed.push({ workerId, jobId, png })),
    fail: (workerId, jobId, reason) => Effect.sync(() => void work.failed.push({ workerId, jobId, reason }))
  })
  return work
}

// ---------------------------------------------------------------------------------------------------------
// The gateway

export interface WorkerGateway {
  readonly url: string
  readonly port: number
  readonly configPath: string
  readonly run: <A, E>(effect: Effect.Effect<A, E, any>) => Promise<A>
  readonly stop: () => Promise<void>
}

export const startWorkerGateway = async (options: {
  readonly work: TestWork
  readonly databaseUrl?: string
  readonly configure?: (doc: ConfigDoc) => void
}): Promise<WorkerGateway> => {
  const gw = await startGateway({
    ...(options.configure ? { configure: options.configure } : {}),
    ...(options.databaseUrl ? { databaseUrl: options.databaseUrl } : {}),
    imageWork: options.work.layer,
    logSink: () => undefined
  })
  return {
    url: gw.url,
    port: gw.port,
    configPath: gw.configPath,
    run: (effect) => gw.run(effect as Effect.Effect<any, any, never>),
    stop: gw.stop
  }
}

// ---------------------------------------------------------------------------------------------------------
// Data

const chunk = (type: string, data: Buffer) => {
  const body = Buffer.concat([Buffer.from(type, "latin1"), data])
  const length = Buffer.alloc(4)
  length.writeUInt32BE(data.length)
  const crc = Buffer.alloc(4)
  crc.writeUInt32BE(Zlib.crc32(body) >>> 0)
  return Buffer.concat([length, body, crc])
}

/** A valid RGB PNG of random pixels (so two calls differ). */
export const makePng = (width = 8, height = 8): Buffer => {
  const ihdr = Buffer.alloc(13)
  ihdr.writeUInt32BE(width, 0)
  ihdr.writeUInt32BE(height, 4)
  ihdr[8] = 8
  ihdr[9] = 2
  const rows = Buffer.concat(Array.from({ length: height }, () => Buffer.concat([Buffer.from([0]), Crypto.randomBytes(width * 3)])))
  return Buffer.concat([
    Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]),
    chunk("IHDR", ihdr),
    chunk("IDAT", Zlib.deflateSync(rows)),
    chunk("IEND", Buffer.alloc(0))
  ])
}

export const newJobId = () => `img_${Crypto.randomBytes(12).toString("hex")}`

export const sampleSpec = (overrides: Partial<JobSpec> = {}): JobSpec => ({
  prompt: "(masterpiece:1.1), a lighthouse at dusk",
  negative_prompt: "blurry, lowres",
  width: 832,
  height: 1216,
  steps: 28,
  scale: 5.5,
  seed: 123456789,
  preset: {
    name: "기본",
    checkpoint: "sdxl_base_1.0.safetensors",
    loras: [{ name: "detail.safetensors", weight: 0.6 }, { name: "style.safetensors", weight: 1 }],
    sampler: "euler_ancestral",
    scheduler: "karras",
    upscaler: null
  },
  ...overrides
})

export const sampleJob = (overrides: Partial<JobSpec> = {}): ImageJob => ({
  id: newJobId(),
  accountId: "acc_test",
  spec: sampleSpec(overrides)
})
