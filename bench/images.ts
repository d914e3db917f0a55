/**
 * Image queue overhead, in process (no HTTP): 50 accounts, each in a loop that takes a pending slot and runs one
 * job through the queue to the simulated worker (latency 0, concurrency 4) and back. Per job this is the whole
 * path of the endpoint's middle: slot acquire/release, submit, round-robin take, progress, complete, the waiter
 * resumed. The simulated worker draws a 64x64 PNG per job; that drawing is timed alone and subtracted, so "queue
 * overhead" is what slots and queue add.
 *
 * Memory mode always; Redis mode (the same with the state in Redis on localhost) when Redis answers.
 * Run alone: `npx tsx bench/images.ts [--jobs N]`; `npm run bench` runs it first.
 */
import { Effect, Layer } from "effect"
import * as Net from "node:net"
import { ImagesConfig } from "../src/config/Images.js"
import { ImageQueue, type ImageJob, ImageSlots } from "../src/images/Contracts.js"
import * as Images from "../src/images/layer.js"
import { draw } from "../src/images/Png.js"
import { Schema } from "effect"

const ACCOUNTS = 50
const SIZE = 64

export interface ImageBenchRow {
  readonly mode: string
  readonly jobs: number
  /** Wall time per job, everything included. */
  readonly msPerJob: number
  /** Process CPU per job. */
  readonly cpuMsPerJob: number
  /** Wall time per job minus the PNG drawing. */
  readonly overheadMsPerJob: number
  readonly jobsPerSecond: number
}

const config = Schema.decodeSync(ImagesConfig)({
  congestion_threshold: 100_000,
  simulated: { enabled: true, latency_ms: 0, concurrency: 4 }
})

const spec = (seed: number): ImageJob["spec"] => ({
  prompt: "benchmark",
  negative_prompt: "",
  width: SIZE,
  height: SIZE,
  steps: 1,
  scale: 5,
  seed,
  preset: { name: "bench", checkpoint: "none", loras: [], sampler: "euler", scheduler: "normal", upscaler: null }
})

/** The cost of drawing alone, per job. */
const drawMs = (n: number) => {
  const started = performance.now()
  for (let i = 0; i < n; i++) draw({ prompt: "benchmark", seed: i, width: SIZE, height: SIZE })
  return (performance.now() - started) / n
}

const drive = (jobs: number) =>
  Effect.gen(function*() {
    const slots = yield* ImageSlots
    const queue = yield* ImageQueue
    let next = 0
    const account = (a: number) =>
      Effect.gen(function*() {
        while (next < jobs) {
          const n = next++
          const outcome = yield* Effect.scoped(
            Effect.andThen(slots.acquire(`acct-${a}`), queue.run({ id: `img_${n.toString(16).padStart(24, "0")}`, accountId: `acct-${a}`, spec: spec(n) }))
          )
          if (outcome._tag !== "Done") return yield* Effect.die(new Error(`job ${n}: ${outcome.reason}`))
        }
      })
    yield* Effect.forEach(Array.from({ length: ACCOUNTS }, (_, a) => a), account, { concurrency: "unbounded", discard: true })
  })

const measure = (mode: string, layer: Layer.Layer<ImageSlots | ImageQueue>, jobs: number) =>
  Effect.gen(function*() {
    yield* drive(Math.min(2_000, jobs)) // warm-up: JIT, actors
    const cpu = process.cpuUsage()
    const started = performance.now()
    yield* drive(jobs)
    const wall = performance.now() - started
    const used = process.cpuUsage(cpu)
    const msPerJob = wall / jobs
    const row: ImageBenchRow = {
      mode,
      jobs,
      msPerJob,
      cpuMsPerJob: (used.user + used.system) / 1000 / jobs,
      overheadMsPerJob: msPerJob - drawMs(2_000),
      jobsPerSecond: jobs / (wall / 1000)
    }
    return row
  }).pipe(Effect.provide(layer))

const redisAnswers = () =>
  new Promise<boolean>((resolve) => {
    const socket = Net.connect({ host: "127.0.0.1", port: 6379 })
    const done = (ok: boolean) => {
      socket.destroy()
      resolve(ok)
    }
    socket.setTimeout(500, () => done(false))
    socket.once("connect", () => done(true))
    socket.once("error", () => done(false))
  })

export const runImageBench = async (jobs = 20_000): Promise<Array<ImageBenchRow>> => {
  const rows: Array<ImageBenchRow> = []
  const memory = Layer.fresh(Images.layerWith({ config: () => config, embedded: true }))
  rows.push(await Effect.runPromise(measure("memory", memory, jobs)))
  if (await redisAnswers()) {
    const prefix = `wsbench:${Date.now().toString(36)}:`
    const redis = Layer.fresh(Images.layerWith({ config: () => config, embedded: false, redisUrl: "redis://127.0.0.1:6379", keyPrefix: prefix }))
    rows.push(await Effect.runPromise(measure("redis", redis, Math.max(500, Math.floor(jobs / 5)))))
  }
  return rows
}

export const printImageBench = (rows: ReadonlyArray<ImageBenchRow>) => {
  const header = ["mode", "jobs", "accounts", "ms/job", "queue overhead ms/job", "CPU ms/job", "jobs/s"]
  console.log(`| ${header.join(" | ")} |`)
  console.log(`|${header.map(() => "---").join("|")}|`)
  for (const r of rows) {
    console.log(`| ${[r.mode, r.jobs, ACCOUNTS, r.msPerJob.toFixed(3), r.overheadMsPerJob.toFixed(3), r.cpuMsPerJob.toFixed(3), r.jobsPerSecond.toFixed(0)].join(" | ")} |`)
  }
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const i = process.argv.indexOf("--jobs")
  runImageBench(i > 0 ? Number(process.argv[i + 1]) : undefined).then(printImageBench, (error) => {
    console.error(error)
    process.exitCode = 1
  })
}
