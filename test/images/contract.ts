/**
 * One contract for the image slots and queue, run against the memory and the Redis implementations
 * (ARCHITECTURE §4). Time is the `TestClock`: the memory services read `Clock`, the Redis ones run with
 * `time: "clock"` (scripts receive `now`). Redis replies arrive on real I/O, so conditions the test waits for
 * (a job waiting, a job requeued) are polled with `until`, never slept for.
 */
import { describe, expect, it } from "@effect/vitest"
import { type Context, Effect, Exit, Fiber, Schema, Scope } from "effect"
import { TestClock } from "effect/testing"
import type { GatewayError } from "../../src/errors/Catalog.js"
import { ImagesConfig } from "../../src/config/Images.js"
import type { ImageJob, ImageQueue, ImageSlots, ImageWork, JobSpec, WorkerInfo } from "../../src/images/Contracts.js"
import { dimensions } from "../../src/images/Png.js"
import { LOST_TWICE } from "../../src/images/Queue.js"
import * as Simulated from "../../src/images/Simulated.js"

/** Monday 2026-01-05 03:00 UTC. */
export const T0 = Date.UTC(2026, 0, 5, 3, 0, 0)

export interface SlotsServices {
  readonly slots: Context.Service.Shape<typeof ImageSlots>
}

export interface QueueServices {
  readonly queue: Context.Service.Shape<typeof ImageQueue>
  readonly work: Context.Service.Shape<typeof ImageWork>
  /** The queue's sweep for silent workers, run now. */
  readonly sweep: Effect.Effect<void>
}

export interface Target<S> {
  readonly name: string
  /** A fresh, empty backend with one replica on it; `config` is read live. */
  readonly make: (config: () => ImagesConfig) => Effect.Effect<S, unknown, Scope.Scope>
}

export const defaults: ImagesConfig = Schema.decodeSync(ImagesConfig)({})

/** Live config a test can change. */
export const liveConfig = (overrides: Partial<ImagesConfig> = {}) => {
  let current: ImagesConfig = { ...defaults, ...overrides }
  return {
    get: () => current,
    set: (changes: Partial<ImagesConfig>) => {
      current = { ...current, ...changes }
    }
  }
}

const realPause = Effect.promise(() => new Promise<void>((resolve) => setTimeout(resolve, 2)))

/** Polls `check` (yielding to other fibers and to real I/O) until it holds; dies after `timeoutMs` of real time. */
export const until = (what: string, check: Effect.Effect<boolean>, timeoutMs = 5_000) =>
  Effect.gen(function*() {
    const started = Date.now()
    while (!(yield* check)) {
      if (Date.now() - started > timeoutMs) return yield* Effect.die(new Error(`${what}: not within ${timeoutMs} ms`))
      yield* Effect.yieldNow
      yield* realPause
    }
  })

export const SPEC: JobSpec = {
  prompt: "a lighthouse at dusk",
  negative_prompt: "",
  width: 64,
  height: 64,
  steps: 8,
  scale: 5,
  seed: 7,
  preset: { name: "default", checkpoint: "ckpt", loras: [], sampler: "euler", scheduler: "normal", upscaler: null }
}

let jobs = 0
export const job = (accountId: string, spec: Partial<JobSpec> = {}): ImageJob => ({
  id: `img_${process.pid.toString(16)}${(++jobs).toString(16).padStart(16, "0")}`.padEnd(28, "0"),
  accountId,
  spec: { ...SPEC, ...spec }
})

export const worker = (id: string): WorkerInfo => ({ id, name: id, kind: "test" })
const W1 = worker("w1")
const W2 = worker("w2")

const waitingIs = (s: QueueServices, n: number) =>
  until(`${n} waiting`, Effect.map(s.queue.waiting, (w) => w === n))

/** Takes with no wait. */
const takeNow = (s: QueueServices, w: WorkerInfo) => s.work.take(w, 0)

const codeOf = (exit: Exit.Exit<unknown, GatewayError>) =>
  Exit.isFailure(exit) ? (exit.cause.reasons[0] as { error?: GatewayError } | undefined)?.error?.code : "success"

const servicesOf = <S>(target: Target<S>) => <A, E>(
    body: (s: S, config: ReturnType<typeof liveConfig>) => Effect.Effect<A, E, Scope.Scope>,
    overrides: Partial<ImagesConfig> = {}
  ) =>
    Effect.scoped(Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const config = liveConfig(overrides)
      const s = yield* Effect.orDie(target.make(config.get))
      return yield* body(s, config)
    }))

export const slotsContract = (target: Target<SlotsServices>) => {
  const withServices = servicesOf(target)
  describe(`Image slots contract: ${target.name}`, () => {
    it.effect("10 concurrent acquires: exactly 2 succeed, the rest 429 image_pending_full; closing a scope frees one", () =>
      withServices((s) =>
        Effect.gen(function*() {
          const scopes = yield* Effect.forEach(Array.from({ length: 10 }), () => Scope.make())
          const exits = yield* Effect.forEach(
            scopes,
            (scope) => Effect.exit(s.slots.acquire("acct-a").pipe(Scope.provide(scope))),
            { concurrency: "unbounded" }
          )
          const won = exits.flatMap((exit, i) => (Exit.isSuccess(exit) ? [scopes[i]!] : []))
          expect(won).toHaveLength(2)
          for (const exit of exits) if (Exit.isFailure(exit)) expect(codeOf(exit)).toBe("image_pending_full")
          const error = yield* Effect.flip(Effect.scoped(s.slots.acquire("acct-a")))
          expect(error.status).toBe(429)
          expect(yield* s.slots.held("acct-a")).toBe(2)
          // other accounts are not affected
          yield* Effect.scoped(s.slots.acquire("acct-b"))
          yield* Scope.close(won[0]!, Exit.void)
          expect(yield* s.slots.held("acct-a")).toBe(1)
          yield* Effect.scoped(s.slots.acquire("acct-a"))
          yield* Scope.close(won[1]!, Exit.void)
          expect(yield* s.slots.held("acct-a")).toBe(0)
        })
      ))

    it.effect("interrupting the holder frees its slot", () =>
      withServices((s) =>
        Effect.gen(function*() {
          const fiber = yield* Effect.forkChild(Effect.scoped(Effect.andThen(s.slots.acquire("acct"), Effect.never)))
          yield* until("slot held", Effect.map(s.slots.held("acct"), (n) => n === 1))
          yield* Fiber.interrupt(fiber)
          expect(yield* s.slots.held("acct")).toBe(0)
        })
      ))

    it.effect("pending_per_account is read live", () =>
      withServices((s, config) =>
        Effect.gen(function*() {
          yield* s.slots.acquire("acct")
          yield* s.slots.acquire("acct")
          expect(codeOf(yield* Effect.exit(Effect.scoped(s.slots.acquire("acct"))))).toBe("image_pending_full")
          config.set({ pending_per_account: 3 })
          yield* s.slots.acquire("acct")
          expect(yield* s.slots.held("acct")).toBe(3)
        })
      ))
  })
}

export const queueContract = (target: Target<QueueServices>) => {
  const withServices = servicesOf(target)
  describe(`Image queue contract: ${target.name}`, () => {
    it.effect("run: queued, taken, completed; the PNG and the worker id come back", () =>
      withServices((s) =>
        Effect.gen(function*() {
          yield* s.work.heartbeat(W1)
          expect(yield* s.queue.workersOnline).toBe(1)
          const j = job("acct")
          const fiber = yield* Effect.forkChild(s.queue.run(j))
          yield* waitingIs(s, 1)
          const taken = yield* takeNow(s, W1)
          expect(taken).toEqual(j)
          expect(yield* s.queue.waiting).toBe(0)
          expect(yield* s.work.progress("w1", j.id, 1, 8)).toEqual({ cancelled: false })
          const png = new Uint8Array([1, 2, 3])
          yield* s.work.complete("w1", j.id, png)
          const outcome = yield* Fiber.join(fiber)
          expect(outcome._tag).toBe("Done")
          if (outcome._tag === "Done") {
            expect([...outcome.png]).toEqual([1, 2, 3])
            expect(outcome.workerId).toBe("w1")
          }
          // a second report of the same job changes nothing
          yield* s.work.complete("w1", j.id, png)
        })
      ))

    it.effect("a worker's failure is the job's outcome; another worker cannot report on a job it does not hold", () =>
      withServices((s) =>
        Effect.gen(function*() {
          yield* s.work.heartbeat(W1)
          yield* s.work.heartbeat(W2)
          const j = job("acct")
          const fiber = yield* Effect.forkChild(s.queue.run(j))
          yield* waitingIs(s, 1)
          expect((yield* takeNow(s, W1))?.id).toBe(j.id)
          expect(yield* s.work.progress("w2", j.id, 1, 8)).toEqual({ cancelled: true })
          yield* s.work.complete("w2", j.id, new Uint8Array([9]))
          yield* s.work.fail("w1", j.id, "out of memory")
          expect(yield* Fiber.join(fiber)).toEqual({ _tag: "Failed", reason: "out of memory" })
        })
      ))

    it.effect("no worker online: 503 image_no_worker, checked at submit; a worker silent for the heartbeat time is offline", () =>
      withServices((s) =>
        Effect.gen(function*() {
          const first = yield* Effect.flip(s.queue.run(job("acct")))
          expect(first.code).toBe("image_no_worker")
          expect(first.status).toBe(503)
          expect(yield* s.queue.waiting).toBe(0)
          yield* s.work.heartbeat(W1)
          const fiber = yield* Effect.forkChild(s.queue.run(job("acct")))
          yield* waitingIs(s, 1)
          yield* TestClock.adjust("14 seconds")
          expect(yield* s.queue.workersOnline).toBe(1)
          yield* TestClock.adjust("1 second")
          expect(yield* s.queue.workersOnline).toBe(0)
          expect((yield* Effect.flip(s.queue.run(job("acct")))).code).toBe("image_no_worker")
          yield* Fiber.interrupt(fiber)
        })
      ))

    it.effect("a take waiting now keeps its worker online", () =>
      withServices((s) =>
        Effect.gen(function*() {
          const taker = yield* Effect.forkChild(s.work.take(W1, 60_000))
          yield* until("worker online", Effect.map(s.queue.workersOnline, (n) => n === 1))
          yield* TestClock.adjust("20 seconds")
          yield* until("worker still online", Effect.map(s.queue.workersOnline, (n) => n === 1))
          const j = job("acct")
          const run = yield* Effect.forkChild(s.queue.run(j))
          expect((yield* Fiber.join(taker))?.id).toBe(j.id)
          yield* s.work.complete("w1", j.id, new Uint8Array([1]))
          expect((yield* Fiber.join(run))._tag).toBe("Done")
        })
      ))

    it.effect("a take waits up to waitMs and answers null when nothing came", () =>
      withServices((s) =>
        Effect.gen(function*() {
          const taker = yield* Effect.forkChild(s.work.take(W1, 5_000))
          yield* until("worker online", Effect.map(s.queue.workersOnline, (n) => n === 1))
          yield* TestClock.adjust("5 seconds")
          expect(yield* Fiber.join(taker)).toBeNull()
        })
      ))

    it.effect("congestion: at congestion_threshold jobs waiting, 503 image_congested (read live)", () =>
      withServices((s, config) =>
        Effect.gen(function*() {
          yield* s.work.heartbeat(W1)
          for (let i = 0; i < 3; i++) yield* Effect.forkChild(s.queue.run(job(`acct-${i}`)))
          yield* waitingIs(s, 3)
          const error = yield* Effect.flip(s.queue.run(job("acct-x")))
          expect(error.code).toBe("image_congested")
          expect(error.status).toBe(503)
          config.set({ congestion_threshold: 4 })
          yield* Effect.forkChild(s.queue.run(job("acct-x")))
          yield* waitingIs(s, 4)
          expect((yield* Effect.flip(s.queue.run(job("acct-y")))).code).toBe("image_congested")
          yield* takeNow(s, W1)
          yield* Effect.forkChild(s.queue.run(job("acct-y")))
          yield* waitingIs(s, 4)
        }), { congestion_threshold: 3 }))

    it.effect("fair with one worker: account B's job is taken within two takes of account A's backlog of 20", () =>
      withServices((s) =>
        Effect.gen(function*() {
          yield* s.work.heartbeat(W1)
          for (let i = 0; i < 20; i++) yield* Effect.forkChild(s.queue.run(job("acct-a")))
          yield* waitingIs(s, 20)
          const b = job("acct-b")
          yield* Effect.forkChild(s.queue.run(b))
          yield* waitingIs(s, 21)
          const taken = [yield* takeNow(s, W1), yield* takeNow(s, W1)]
          expect(taken.map((j) => j?.id)).toContain(b.id)
          // then A's backlog drains in order
          const rest = []
          for (let i = 0; i < 19; i++) rest.push((yield* takeNow(s, W1))?.accountId)
          expect(rest).toEqual(Array.from({ length: 19 }, () => "acct-a"))
          expect(yield* takeNow(s, W1)).toBeNull()
        })
      ))

    it.effect("fair with two workers: B's job within the next two takes of each worker; C after B", () =>
      withServices((s) =>
        Effect.gen(function*() {
          yield* s.work.heartbeat(W1)
          yield* s.work.heartbeat(W2)
          for (let i = 0; i < 20; i++) yield* Effect.forkChild(s.queue.run(job("acct-a")))
          yield* waitingIs(s, 20)
          const b = job("acct-b")
          yield* Effect.forkChild(s.queue.run(b))
          yield* waitingIs(s, 21)
          const c = job("acct-c")
          yield* Effect.forkChild(s.queue.run(c))
          yield* waitingIs(s, 22)
          const taken: Array<string | undefined> = []
          for (let i = 0; i < 4; i++) taken.push((yield* takeNow(s, i % 2 === 0 ? W1 : W2))?.id)
          expect(taken).toContain(b.id)
          expect(taken).toContain(c.id)
        })
      ))

    it.effect("interrupting run while queued withdraws the job: it is never taken", () =>
      withServices((s) =>
        Effect.gen(function*() {
          yield* s.work.heartbeat(W1)
          const fiber = yield* Effect.forkChild(s.queue.run(job("acct")))
          yield* waitingIs(s, 1)
          yield* Fiber.interrupt(fiber)
          expect(yield* s.queue.waiting).toBe(0)
          expect(yield* takeNow(s, W1)).toBeNull()
          // the line and the ring are consistent afterwards
          const next = job("acct")
          yield* Effect.forkChild(s.queue.run(next))
          yield* waitingIs(s, 1)
          expect((yield* takeNow(s, W1))?.id).toBe(next.id)
        })
      ))

    it.effect("interrupting run while a worker holds the job: progress says cancelled, the result is ignored", () =>
      withServices((s) =>
        Effect.gen(function*() {
          yield* s.work.heartbeat(W1)
          const j = job("acct")
          const fiber = yield* Effect.forkChild(s.queue.run(j))
          yield* waitingIs(s, 1)
          yield* takeNow(s, W1)
          expect(yield* s.work.progress("w1", j.id, 1, 8)).toEqual({ cancelled: false })
          yield* Fiber.interrupt(fiber)
          expect(yield* s.work.progress("w1", j.id, 2, 8)).toEqual({ cancelled: true })
          yield* s.work.complete("w1", j.id, new Uint8Array([1]))
          expect(yield* s.queue.waiting).toBe(0)
          expect(yield* takeNow(s, W1)).toBeNull()
        })
      ))

    it.effect("a silent worker's job goes back to the front of its line once; lost again, it fails", () =>
      withServices((s) =>
        Effect.gen(function*() {
          yield* s.work.heartbeat(W1)
          const first = job("acct")
          const second = job("acct")
          const run = yield* Effect.forkChild(s.queue.run(first))
          yield* waitingIs(s, 1)
          yield* Effect.forkChild(s.queue.run(second))
          yield* waitingIs(s, 2)
          expect((yield* takeNow(s, W1))?.id).toBe(first.id)
          // w1 goes silent; w2 keeps beating
          yield* TestClock.adjust("10 seconds")
          yield* s.work.heartbeat(W2)
          yield* TestClock.adjust("4 seconds")
          yield* s.sweep
          expect(yield* s.queue.waiting).toBe(1)
          yield* TestClock.adjust("1 second")
          yield* s.sweep
          yield* waitingIs(s, 2)
          expect((yield* takeNow(s, W2))?.id).toBe(first.id)
          // w1's late report is ignored; its progress says cancelled
          expect(yield* s.work.progress("w1", first.id, 3, 8)).toEqual({ cancelled: true })
          yield* s.work.complete("w1", first.id, new Uint8Array([1]))
          // w2 goes silent too
          yield* TestClock.adjust("15 seconds")
          yield* s.sweep
          expect(yield* Fiber.join(run)).toEqual({ _tag: "Failed", reason: LOST_TWICE })
          expect(yield* s.queue.waiting).toBe(1)
        })
      ))

    it.effect("the simulated worker answers a valid PNG of the job's size, the same for the same prompt and seed", () =>
      withServices((s, config) =>
        Effect.gen(function*() {
          yield* Simulated.start({ work: s.work, config: config.get, enabled: () => true })
          const runOne = (spec: Partial<JobSpec>) =>
            Effect.map(s.queue.run(job("acct", spec)), (outcome) => {
              if (outcome._tag !== "Done") throw new Error(`expected Done, got ${outcome.reason}`)
              return Buffer.from(outcome.png)
            })
          const a = yield* runOne({ width: 832, height: 1216, prompt: "sea", seed: 1 })
          expect(dimensions(a)).toEqual({ width: 832, height: 1216 })
          const again = yield* runOne({ width: 832, height: 1216, prompt: "sea", seed: 1 })
          expect(again.equals(a)).toBe(true)
          const other = yield* runOne({ width: 832, height: 1216, prompt: "sea", seed: 2 })
          expect(other.equals(a)).toBe(false)
          expect(dimensions(yield* runOne({ width: 1216, height: 832 }))).toEqual({ width: 1216, height: 832 })
        }), { simulated: { ...defaults.simulated, latency_ms: 0 } }))
  })
}
