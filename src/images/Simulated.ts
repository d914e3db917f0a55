/**
 * The simulated image worker: in-process, it uses `ImageWork` like any remote worker (heartbeat, take, progress,
 * complete) and answers every job with a deterministic PNG drawn from the prompt and the seed (`Png.ts`) at the
 * job's size, after `images.simulated.latency_ms` on the Effect clock. `images.simulated.concurrency` jobs at once.
 *
 * Live: a manager fiber re-reads the config every second, starts takers up to `concurrency`, and heartbeats while
 * the worker is enabled (`images.simulated.enabled`; absent: on in embedded mode, off in production). A taker past
 * the concurrency, or of a disabled worker, stops after its current take.
 */
import * as Crypto from "node:crypto"
import { type Context, Duration, Effect, type Scope } from "effect"
import type { ImagesConfig } from "../config/Images.js"
import type { ImageJob, ImageWork, WorkerInfo } from "./Contracts.js"
import { draw } from "./Png.js"

/** How long one take waits for a job. */
const TAKE_WAIT_MS = 10_000
/** How often the manager re-reads the config and heartbeats. */
const MANAGE_MS = 1_000

/** Whether the simulated worker runs: the setting, else on in embedded mode only. */
export const enabledFor = (config: ImagesConfig, embedded: boolean): boolean => config.simulated.enabled ?? embedded

export interface SimulatedOptions {
  readonly work: Context.Service.Shape<typeof ImageWork>
  readonly config: () => ImagesConfig
  /** Read live, every second. */
  readonly enabled: () => boolean
  /** Default `simulated-<random>`. */
  readonly id?: string | undefined
}

/** Starts the worker in the current scope. */
export const start = (options: SimulatedOptions): Effect.Effect<void, never, Scope.Scope> =>
  Effect.gen(function*() {
    const { work, config, enabled } = options
    const info: WorkerInfo = {
      id: options.id ?? `simulated-${Crypto.randomBytes(6).toString("hex")}`,
      name: "simulated",
      kind: "simulated"
    }
    const scope = yield* Effect.scope

    const generate = (job: ImageJob) =>
      Effect.gen(function*() {
        const latency = config().simulated.latency_ms
        const total = Math.max(1, job.spec.steps)
        const chunks = latency > 0 ? Math.min(4, total) : 1
        for (let i = 1; i <= chunks; i++) {
          if (latency > 0) yield* Effect.sleep(Duration.millis(latency / chunks))
          const { cancelled } = yield* work.progress(info.id, job.id, Math.round((i * total) / chunks), total)
          if (cancelled) return
        }
        const { prompt, seed, width, height } = job.spec
        const png = yield* Effect.try(() => draw({ prompt, seed, width, height }))
        yield* work.complete(info.id, job.id, png)
      }).pipe(Effect.catch((error) => work.fail(info.id, job.id, String(error))))

    let running = 0
    const taker = (index: number) =>
      Effect.gen(function*() {
        while (enabled() && index < config().simulated.concurrency) {
          const job = yield* work.take(info, TAKE_WAIT_MS)
          if (job !== null) yield* generate(job)
        }
      }).pipe(Effect.ensuring(Effect.sync(() => void running--)))

    const manage = Effect.suspend(() => {
      if (!enabled()) return Effect.void
      const starts: Array<Effect.Effect<unknown>> = []
      while (running < config().simulated.concurrency) starts.push(Effect.forkIn(taker(running++), scope))
      return Effect.andThen(Effect.all(starts, { discard: true }), work.heartbeat(info))
    })
    // the first round at once: the worker is online when the layer is built
    yield* manage
    yield* Effect.sleep(MANAGE_MS).pipe(Effect.andThen(manage), Effect.forever, Effect.forkScoped)
  })
