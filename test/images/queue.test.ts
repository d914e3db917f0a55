import { afterAll, describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Layer, Scope } from "effect"
import { Redis } from "ioredis"
import { TestClock } from "effect/testing"
import { ImageQueue, ImageSlots } from "../../src/images/Contracts.js"
import * as Images from "../../src/images/layer.js"
import { dimensions } from "../../src/images/Png.js"
import * as Queue from "../../src/images/Queue.js"
import * as QueueRedis from "../../src/images/QueueRedis.js"
import * as StoreRedis from "../../src/store/Redis.js"
import { deleteByPrefix, uniquePrefix } from "../support/Redis.js"
import { REDIS_URL, serviceGate } from "../support/Services.js"
import { defaults, job, liveConfig, queueContract, T0, until, worker } from "./contract.js"

const redisUp = await serviceGate("redis")
const runPrefix = uniquePrefix("img-queue")
let backends = 0

queueContract({
  name: "memory",
  make: (config) =>
    Queue.makeMemory({ config })
})

/** One replica: its own connections, on the backend named by `keyPrefix`. */
const replica = (keyPrefix: string, config = liveConfig().get) =>
  Effect.gen(function*() {
    const { client } = yield* StoreRedis.make({ url: REDIS_URL })
    return yield* QueueRedis.makeRedis(client, { config, keyPrefix, time: "clock" })
  })

describe.skipIf(!redisUp)("Image queue in Redis", () => {
  afterAll(async () => {
    await deleteByPrefix(REDIS_URL, runPrefix)
  })

  queueContract({ name: "redis", make: (config) => replica(`${runPrefix}${++backends}:`, config) })

  it.effect("a job submitted on one replica is taken through another; its PNG reaches the first", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const prefix = `${runPrefix}${++backends}:`
      const one = yield* replica(prefix)
      const two = yield* replica(prefix)
      const w = worker("remote")
      // the worker long-polls replica two before anything is queued
      const taker = yield* Effect.forkChild(two.work.take(w, 20_000))
      yield* until("worker online", Effect.map(one.queue.workersOnline, (n) => n === 1))
      const j = job("acct")
      const run = yield* Effect.forkChild(one.queue.run(j))
      const taken = yield* Fiber.join(taker)
      expect(taken).toEqual(j)
      expect(yield* two.work.progress(w.id, j.id, 4, 8)).toEqual({ cancelled: false })
      yield* two.work.complete(w.id, j.id, new Uint8Array([137, 80, 78, 71]))
      const outcome = yield* Fiber.join(run)
      expect(outcome).toEqual({ _tag: "Done", png: new Uint8Array([137, 80, 78, 71]), workerId: "remote" })
    }).pipe(Effect.scoped))

  it.effect("interrupting the request on one replica cancels the job for its worker on another", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const prefix = `${runPrefix}${++backends}:`
      const one = yield* replica(prefix)
      const two = yield* replica(prefix)
      const w = worker("remote")
      yield* two.work.heartbeat(w)
      const j = job("acct")
      const run = yield* Effect.forkChild(one.queue.run(j))
      yield* until("queued", Effect.map(two.queue.waiting, (n) => n === 1))
      expect((yield* two.work.take(w, 0))?.id).toBe(j.id)
      yield* Fiber.interrupt(run)
      expect(yield* two.work.progress(w.id, j.id, 4, 8)).toEqual({ cancelled: true })
      yield* two.work.complete(w.id, j.id, new Uint8Array([1]))
    }).pipe(Effect.scoped))

  it.effect("a dead replica's queued job lapses with its owner lease (9 s) and is never handed to a worker", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const prefix = `${runPrefix}${++backends}:`
      const deadScope = yield* Scope.make()
      const dead = yield* replica(prefix).pipe(Scope.provide(deadScope))
      const live = yield* replica(prefix)
      const w = worker("w")
      yield* live.work.heartbeat(w)
      yield* Effect.forkChild(dead.queue.run(job("acct")))
      yield* until("queued", Effect.map(live.queue.waiting, (n) => n === 1))
      // the replica dies: its tick stops renewing the job (the request fiber is left as it is)
      yield* Scope.close(deadScope, Exit.void)
      yield* TestClock.adjust("9 seconds")
      yield* live.work.heartbeat(w)
      expect(yield* live.work.take(w, 0)).toBeNull()
      expect(yield* live.queue.waiting).toBe(0)
      // a live replica's job outlives that time: its tick renews it
      const j = job("acct")
      yield* Effect.forkChild(live.queue.run(j))
      yield* until("queued", Effect.map(live.queue.waiting, (n) => n === 1))
      for (let i = 0; i < 12; i++) {
        yield* TestClock.adjust("1 second")
        yield* live.work.heartbeat(w)
      }
      yield* Effect.yieldNow
      expect((yield* live.work.take(w, 0))?.id).toBe(j.id)
    }).pipe(Effect.scoped))

  it.live("the layer with a Redis URL keeps slots and queue under <prefix>img:, and runs the simulated worker if enabled", () =>
    Effect.gen(function*() {
      const prefix = `${runPrefix}${++backends}:`
      const config = liveConfig({ simulated: { ...defaults.simulated, enabled: true, latency_ms: 0 } })
      const outcome = yield* Effect.gen(function*() {
        const slots = yield* ImageSlots
        const queue = yield* ImageQueue
        yield* slots.acquire("acct")
        return yield* queue.run(job("acct", { width: 128, height: 96 }))
      }).pipe(
        Effect.scoped,
        Effect.provide(Layer.fresh(Images.layerWith({ config: config.get, embedded: false, redisUrl: REDIS_URL, keyPrefix: prefix })))
      )
      expect(outcome._tag === "Done" && dimensions(outcome.png)).toEqual({ width: 128, height: 96 })
      const redis = new Redis(REDIS_URL)
      const workers = yield* Effect.promise(() => redis.zcard(`${prefix}img:workers`))
      redis.disconnect()
      expect(workers).toBe(1)
    }))
})
