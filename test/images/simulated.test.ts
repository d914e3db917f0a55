/**
 * The simulated worker on the memory queue, on the TestClock: latency, cancellation, concurrency, the live switch;
 * and the layer that chooses it (on in embedded mode, off in production unless enabled).
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Fiber, Layer } from "effect"
import { TestClock } from "effect/testing"
import type { ImagesConfig } from "../../src/config/Images.js"
import { ImageQueue, ImageWork } from "../../src/images/Contracts.js"
import * as Images from "../../src/images/layer.js"
import { dimensions } from "../../src/images/Png.js"
import * as Queue from "../../src/images/Queue.js"
import * as Simulated from "../../src/images/Simulated.js"
import { defaults, job, liveConfig, T0, until } from "./contract.js"

const simulated = (changes: Partial<ImagesConfig["simulated"]>) => ({ simulated: { ...defaults.simulated, ...changes } })

/** The memory queue with a simulated worker on it. */
const setup = (overrides: Partial<ImagesConfig>, enabled: () => boolean = () => true) =>
  Effect.gen(function*() {
    yield* TestClock.setTime(T0)
    const config = liveConfig(overrides)
    const q = yield* Queue.makeMemory({ config: config.get })
    yield* Simulated.start({ work: q.work, config: config.get, enabled, id: "sim" })
    return { ...q, config }
  })

const taken = (q: Queue.ImageQueues) => until("taken", Effect.map(q.queue.waiting, (n) => n === 0))

describe("Simulated worker", () => {
  it.effect("answers after latency_ms of the Effect clock", () =>
    Effect.gen(function*() {
      const q = yield* setup(simulated({ latency_ms: 1000 }))
      const fiber = yield* Effect.forkChild(q.queue.run(job("acct", { width: 832, height: 1216 })))
      yield* taken(q)
      yield* TestClock.adjust(999)
      expect(fiber.pollUnsafe()).toBeUndefined()
      yield* TestClock.adjust(1)
      const outcome = yield* Fiber.join(fiber)
      expect(outcome._tag === "Done" && outcome.workerId).toBe("sim")
      expect(outcome._tag === "Done" && dimensions(outcome.png)).toEqual({ width: 832, height: 1216 })
    }).pipe(Effect.scoped))

  it.effect("stops on a cancelled job and takes the next one at once", () =>
    Effect.gen(function*() {
      const q = yield* setup(simulated({ latency_ms: 1000, concurrency: 1 }))
      const cancelled = yield* Effect.forkChild(q.queue.run(job("acct")))
      yield* taken(q)
      yield* TestClock.adjust(300)
      yield* Fiber.interrupt(cancelled)
      // the worker learns it at its next progress (250 ms steps) and is free again
      yield* TestClock.adjust(200)
      const next = yield* Effect.forkChild(q.queue.run(job("acct")))
      yield* taken(q)
      yield* TestClock.adjust(1000)
      expect((yield* Fiber.join(next))._tag).toBe("Done")
    }).pipe(Effect.scoped))

  it.effect("runs `concurrency` jobs at once, read live", () =>
    Effect.gen(function*() {
      const q = yield* setup(simulated({ latency_ms: 1000, concurrency: 2 }))
      const runs = yield* Effect.forEach([1, 2, 3], () => Effect.forkChild(q.queue.run(job("acct"))))
      yield* until("two taken", Effect.map(q.queue.waiting, (n) => n === 1))
      yield* TestClock.adjust(1000)
      expect((yield* Fiber.join(runs[0]!))._tag).toBe("Done")
      expect((yield* Fiber.join(runs[1]!))._tag).toBe("Done")
      yield* taken(q)
      yield* TestClock.adjust(1000)
      expect((yield* Fiber.join(runs[2]!))._tag).toBe("Done")
      // three at once after the next config read
      q.config.set(simulated({ latency_ms: 1000, concurrency: 3 }))
      yield* TestClock.adjust(1000)
      yield* Effect.forEach([1, 2, 3], () => Effect.forkChild(q.queue.run(job("acct"))))
      yield* taken(q)
    }).pipe(Effect.scoped))

  it.effect("switched off, it stops taking and goes offline; switched on, it is back", () =>
    Effect.gen(function*() {
      let on = true
      const q = yield* setup(simulated({ latency_ms: 0 }), () => on)
      expect(yield* q.queue.workersOnline).toBe(1)
      on = false
      // its takes end within 10 s, then it is silent for the heartbeat time
      yield* TestClock.adjust("26 seconds")
      expect(yield* q.queue.workersOnline).toBe(0)
      expect((yield* Effect.flip(q.queue.run(job("acct")))).code).toBe("image_no_worker")
      on = true
      yield* TestClock.adjust("1 second")
      expect((yield* q.queue.run(job("acct")))._tag).toBe("Done")
    }).pipe(Effect.scoped))
})

describe("images layer", () => {
  const check = (embedded: boolean, enabled: boolean | undefined) =>
    Effect.gen(function*() {
      const queue = yield* ImageQueue
      yield* ImageWork
      return yield* Effect.match(queue.run(job("acct")), { onFailure: (e) => e.code, onSuccess: (o) => o._tag })
    }).pipe(
      Effect.provide(Layer.fresh(Images.layerWith({
        config: liveConfig(simulated({ latency_ms: 0, ...(enabled === undefined ? {} : { enabled }) })).get,
        embedded
      })))
    )

  it.effect("embedded: the simulated worker answers at once", () =>
    Effect.gen(function*() {
      expect(yield* check(true, undefined)).toBe("Done")
    }))

  it.effect("production: off unless enabled (no worker: 503)", () =>
    Effect.gen(function*() {
      expect(yield* check(false, undefined)).toBe("image_no_worker")
      expect(yield* check(false, true)).toBe("Done")
      expect(yield* check(true, false)).toBe("image_no_worker")
    }))
})
