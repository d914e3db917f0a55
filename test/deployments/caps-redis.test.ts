/**
 * Per-deployment caps in Redis (`deployments/CapsRedis.ts`), on real Redis with the scripts' time on the TestClock:
 * two replicas share a deployment's slots and its minute; a refusal writes nothing; a replica that dies holding
 * slots (its heartbeat stops, nothing is released) gives them back within the 9 s lease, and not before, while a
 * live one keeps them as long as it lives; hostile contents of the keys and odd replies skip the deployment rather
 * than admit past the cap. Then the router of two replicas (`HealthRedis.ts`, real fake upstreams) holding a
 * deployment's `rate_limit_rpm` together until the window slides. Last, in real time against Redis TIME, a separate
 * process holding slots is SIGKILLed right after a heartbeat extended them (the worst case): its slots are free
 * again within 10 s (about 10-15 s of test time).
 */
import { afterAll, describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Layer, Schema, Scope } from "effect"
import { Redis } from "ioredis"
import * as ChildProcess from "node:child_process"
import * as Path from "node:path"
import { TestClock } from "effect/testing"
import { ModelConfig, Provider, RoutingConfig } from "../../src/config/GatewayConfig.js"
import { seeded } from "../../src/deployments/Balancer.js"
import * as CapsRedis from "../../src/deployments/CapsRedis.js"
import * as HealthRedis from "../../src/deployments/HealthRedis.js"
import { Deployments } from "../../src/deployments/Router.js"
import type { SharedCaps, TakeResult } from "../../src/deployments/SharedCaps.js"
import { DEFAULT_LEASE_MS } from "../../src/quota/RedisLeases.js"
import * as StoreRedis from "../../src/store/Redis.js"
import { completeChat } from "../../src/upstream/Complete.js"
import * as Upstreams from "../../src/upstream/Upstreams.js"
import { eventually } from "../support/Eventually.js"
import { providerFor, startFakeDeployment } from "../support/FakeDeployment.js"
import { deleteByPrefix, uniquePrefix } from "../support/Redis.js"
import { REDIS_URL, serviceGate } from "../support/Services.js"

const redisUp = await serviceGate("redis")
const runPrefix = uniquePrefix("deploy-caps")
const T0 = Date.UTC(2031, 0, 6, 12, 0, 0)

/** One replica's caps: its own client and heartbeat, in `scope`. */
const replica = (prefix: string, scope: Scope.Scope) =>
  Effect.gen(function*() {
    const { client } = yield* StoreRedis.make({ url: REDIS_URL })
    const caps = yield* CapsRedis.make(client, prefix, { time: "clock" })
    return { caps, client }
  }).pipe(Scope.provide(scope))

const tags = (results: ReadonlyArray<TakeResult>) => results.map((r) => r._tag)

const takeN = (caps: SharedCaps, key: string, n: number, c: { concurrency: number | null; rate_limit_rpm: number | null }) =>
  Effect.forEach(Array.from({ length: n }), () => caps.take(key, c))

describe.skipIf(!redisUp)("deployment caps in Redis", () => {
  afterAll(async () => {
    await deleteByPrefix(REDIS_URL, runPrefix)
  })

  it.effect("two replicas share a deployment's concurrency; a released slot is free for either", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const prefix = `${runPrefix}conc:`
      const a = yield* replica(prefix, yield* Effect.scope)
      const b = yield* replica(prefix, yield* Effect.scope)
      const cap = { concurrency: 3, rate_limit_rpm: null }
      const onA = yield* takeN(a.caps, "m/gpu", 2, cap)
      const onB = yield* takeN(b.caps, "m/gpu", 2, cap)
      expect(tags(onA)).toEqual(["Taken", "Taken"])
      expect(tags(onB)).toEqual(["Taken", "Full"])
      expect(tags([yield* a.caps.take("m/gpu", cap)])).toEqual(["Full"])
      // Another deployment (and another model's deployment of the same name) counts apart.
      expect(tags([yield* a.caps.take("m/other", cap), yield* a.caps.take("n/gpu", cap)])).toEqual(["Taken", "Taken"])
      const { slots } = CapsRedis.keysOf(prefix, "m/gpu")
      expect(yield* Effect.promise(() => a.client.zcard(slots))).toBe(3)

      const first = onA[0]!
      if (first._tag !== "Taken" || first.slot === null) throw new Error("expected a slot")
      a.caps.release("m/gpu", first.slot)
      yield* Effect.promise(() => a.client.ping())
      expect(yield* Effect.promise(() => a.client.zcard(slots))).toBe(2)
      expect(tags([yield* b.caps.take("m/gpu", cap), yield* a.caps.take("m/gpu", cap)])).toEqual(["Taken", "Full"])
    }).pipe(Effect.scoped))

  it.effect("two replicas share a deployment's minute; a refusal writes nothing; the window slides", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const prefix = `${runPrefix}rpm:`
      const a = yield* replica(prefix, yield* Effect.scope)
      const b = yield* replica(prefix, yield* Effect.scope)
      const rpm = { concurrency: null, rate_limit_rpm: 4 }
      expect(tags(yield* takeN(a.caps, "m/gpu", 2, rpm))).toEqual(["Taken", "Taken"])
      yield* TestClock.adjust("10 seconds")
      expect(tags(yield* takeN(b.caps, "m/gpu", 2, rpm))).toEqual(["Taken", "Taken"])
      // The oldest starts (T0) leave the window at T0 + 60 s: 50 s from now.
      expect(yield* a.caps.take("m/gpu", rpm)).toEqual({ _tag: "RateLimited", retryMs: 50_000 })
      expect(yield* b.caps.take("m/gpu", rpm)).toEqual({ _tag: "RateLimited", retryMs: 50_000 })
      const { slots, starts } = CapsRedis.keysOf(prefix, "m/gpu")
      expect(yield* Effect.promise(() => a.client.zcard(starts))).toBe(4)

      // Both caps: a full minute takes no slot, and full slots count no start.
      const both = { concurrency: 1, rate_limit_rpm: 4 }
      expect(tags([yield* a.caps.take("m/gpu", both)])).toEqual(["RateLimited"])
      expect(yield* Effect.promise(() => a.client.zcard(slots))).toBe(0)
      const bothElsewhere = yield* takeN(a.caps, "m/cpu", 3, both)
      expect(tags(bothElsewhere)).toEqual(["Taken", "Full", "Full"])
      expect(yield* Effect.promise(() => a.client.zcard(CapsRedis.keysOf(prefix, "m/cpu").starts))).toBe(1)

      yield* TestClock.adjust("49999 millis")
      expect(tags([yield* a.caps.take("m/gpu", rpm)])).toEqual(["RateLimited"])
      yield* TestClock.adjust("1 millis")
      expect(tags(yield* takeN(b.caps, "m/gpu", 3, rpm))).toEqual(["Taken", "Taken", "RateLimited"])
    }).pipe(Effect.scoped))

  it.effect("a live replica keeps its slots; a dead one's come back within the lease, not before", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const prefix = `${runPrefix}dead:`
      const cap = { concurrency: 3, rate_limit_rpm: null }
      const aScope = yield* Scope.make()
      const a = yield* replica(prefix, aScope)
      const b = yield* replica(prefix, yield* Effect.scope)
      expect(tags(yield* takeN(a.caps, "m/gpu", 3, cap))).toEqual(["Taken", "Taken", "Taken"])

      // Alive for 30 s (more than three leases): the heartbeat keeps every slot.
      for (let s = 1; s <= 30; s++) {
        yield* TestClock.adjust("1 second")
        expect(tags([yield* b.caps.take("m/gpu", cap)])).toEqual(["Full"])
      }

      // A dies: its heartbeat and client stop; nothing releases its slots.
      yield* Scope.close(aScope, Exit.void)
      const diedAt = T0 + 30_000
      const { slots } = CapsRedis.keysOf(prefix, "m/gpu")
      const expiries = (yield* Effect.promise(() => b.client.zrange(slots, 0, -1, "WITHSCORES")))
        .filter((_, i) => i % 2 === 1).map(Number)
      expect(expiries).toHaveLength(3)
      const lastExpiry = Math.max(...expiries)
      expect(lastExpiry - diedAt).toBeLessThanOrEqual(DEFAULT_LEASE_MS)

      let back: number | null = null
      for (let s = 1; s <= 10 && back === null; s++) {
        yield* TestClock.adjust("1 second")
        const now = diedAt + s * 1000
        const taken = yield* b.caps.take("m/gpu", cap)
        if (now < lastExpiry) expect(taken._tag).toBe("Full")
        else if (taken._tag === "Taken") back = now - diedAt
      }
      expect(back).not.toBeNull()
      expect(back!).toBeLessThanOrEqual(10_000)
      expect(tags(yield* takeN(b.caps, "m/gpu", 3, cap))).toEqual(["Taken", "Taken", "Full"])
    }).pipe(Effect.scoped))

  it.effect("hostile key contents and replies skip the deployment instead of admitting past the cap", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const prefix = `${runPrefix}hostile:`
      const a = yield* replica(prefix, yield* Effect.scope)
      const keys = CapsRedis.keysOf(prefix, "m/gpu")
      // The wrong type under the slots key: the script fails, the deployment is skipped.
      yield* Effect.promise(() => a.client.set(keys.slots, "garbage"))
      expect(tags([yield* a.caps.take("m/gpu", { concurrency: 2, rate_limit_rpm: null })])).toEqual(["Unavailable"])
      // A start that never leaves the window: refused for at most the minute.
      yield* Effect.promise(() => a.client.zadd(keys.starts, "+inf", "forever"))
      expect(yield* a.caps.take("m/gpu", { concurrency: null, rate_limit_rpm: 1 })).toEqual({
        _tag: "RateLimited",
        retryMs: 60_000
      })

      // Replies of another shape are not believed.
      const slot = "s.1"
      expect(CapsRedis.decodeTake([1, 2], slot, true)).toEqual({ _tag: "Taken", slot })
      expect(CapsRedis.decodeTake([1, 2], slot, false)).toEqual({ _tag: "Taken", slot: null })
      expect(CapsRedis.decodeTake([0, 2, 10_000_000_000], slot, true)._tag).toBe("Unavailable")
      expect(CapsRedis.decodeTake([0, 2, 0], slot, true)).toEqual({ _tag: "RateLimited", retryMs: 1 })
      for (const reply of [null, "OK", [], [1], [1, -1], [1, 1.5], ["1", 1], [0, 3], [0, 1, 1], [0, 2, "5"], [1, 1, 1, 1]]) {
        expect([reply, CapsRedis.decodeTake(reply, slot, true)._tag]).toEqual([reply, "Unavailable"])
      }
    }).pipe(Effect.scoped))

  it.effect("the routers of two replicas hold a deployment's rate_limit_rpm together, until the window slides", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const prefix = `${runPrefix}router:`
      const ups = yield* Effect.acquireRelease(
        Effect.promise(() => Promise.all(["gpu", "backup"].map((n) => startFakeDeployment(n)))),
        (all) => Effect.promise(() => Promise.all(all.map((f) => f.kill())))
      )
      const [gpu, backup] = ups
      const routing = Schema.decodeUnknownSync(RoutingConfig)({})
      const providers = Object.fromEntries(ups.map((u) => [u.name, Schema.decodeUnknownSync(Provider)(providerFor(u))]))
      const router = (seed: number) =>
        Effect.map(
          Layer.build(Layer.provide(
            HealthRedis.layer(REDIS_URL, prefix, { routing: () => routing, random: seeded(seed), caps: { time: "clock" } }),
            Upstreams.layerStatic(providers)
          )),
          (context) => context.mapUnsafe.get(Deployments.key) as typeof Deployments.Service
        )
      const replicas = [yield* router(1), yield* router(2)]
      const model = Schema.decodeUnknownSync(ModelConfig)({
        id: "m",
        owned_by: "test",
        max_input_tokens: 1000,
        max_output_tokens: 100,
        rate_limit_rpm: 1000,
        concurrency: 100,
        deployments: [
          { provider: "gpu", model: "gpu-model", rate_limit_rpm: 5 },
          { provider: "backup", model: "backup-model", priority: 1 }
        ]
      })
      const request = { model: "m", stream: false, max_tokens: 10, messages: [{ role: "user" as const, content: "hi" }] }
      const send = (i: number) => {
        const attempts: Array<string> = []
        return Effect.as(completeChat(replicas[i % 2]!.forModel(model, { attempt: (d) => attempts.push(d) }), request), attempts)
      }
      const sent: Array<ReadonlyArray<string>> = []
      for (let i = 0; i < 20; i++) sent.push(yield* send(i))
      // Five went to gpu (three through one replica, two through the other), the rest straight to the backup.
      expect(gpu!.requests()).toBe(5)
      expect(backup!.requests()).toBe(15)
      expect(sent.slice(0, 5)).toEqual(Array(5).fill(["gpu"]))
      expect(sent.slice(5)).toEqual(Array(15).fill(["backup"]))

      yield* TestClock.adjust("59999 millis")
      for (let i = 0; i < 4; i++) yield* send(i)
      expect(gpu!.requests()).toBe(5)
      yield* TestClock.adjust("1 millis")
      for (let i = 0; i < 10; i++) yield* send(i)
      expect(gpu!.requests()).toBe(10)
    }).pipe(Effect.scoped))

  it("real time: a SIGKILLed replica's slots are free again within 10 s", async () => {
    const prefix = `${runPrefix}real:`
    const SLOTS = 3
    const key = "m/gpu"
    const { slots } = CapsRedis.keysOf(prefix, key)
    const client = new Redis(REDIS_URL)
    const bScope = Effect.runSync(Scope.make())
    const b = await Effect.runPromise(
      Effect.gen(function*() {
        const { client: bClient } = yield* StoreRedis.make({ url: REDIS_URL })
        return yield* CapsRedis.make(bClient, prefix)
      }).pipe(Scope.provide(bScope))
    )
    const expiries = () =>
      client.zrange(slots, 0, -1, "WITHSCORES").then((flat) => flat.filter((_, i) => i % 2 === 1).map(Number))
    /** Whether B can take every slot now (it gives them back at once). */
    const bTakesAll = async () => {
      const taken = await Effect.runPromise(takeN(b, key, SLOTS, { concurrency: SLOTS, rate_limit_rpm: null }))
      for (const t of taken) if (t._tag === "Taken" && t.slot !== null) b.release(key, t.slot)
      await client.ping()
      return taken.every((t) => t._tag === "Taken")
    }
    const child = ChildProcess.spawn(
      process.execPath,
      ["--import", "tsx", Path.resolve("test/deployments/support/slot-holder.ts")],
      {
        env: { ...process.env, REDIS_URL, PREFIX: prefix, KEY: key, CONCURRENCY: String(SLOTS), COUNT: String(SLOTS) },
        stdio: ["ignore", "pipe", "pipe"]
      }
    )
    let stdout = ""
    let stderr = ""
    child.stdout.on("data", (d: Buffer) => (stdout += d.toString()))
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString()))
    try {
      await eventually(() => stdout.includes("held") || child.exitCode !== null, { timeoutMs: 30_000, what: "the holder's slots" })
      expect(stdout, stderr).toContain(`held ${SLOTS}`)
      // Wait for one heartbeat to extend the slots, then kill at once: the latest expiry there can be.
      const first = Math.max(...await expiries())
      await eventually(async () => Math.max(...await expiries()) > first, {
        timeoutMs: DEFAULT_LEASE_MS,
        everyMs: 10,
        what: "a heartbeat extending the holder's slots"
      })
      child.kill("SIGKILL")
      const killedAt = Date.now()
      expect(await expiries()).toHaveLength(SLOTS)
      expect(await bTakesAll()).toBe(false)
      // Redis time is real time: bounded polling, every 100 ms.
      await eventually(bTakesAll, { timeoutMs: 12_000, everyMs: 100, what: "the dead replica's slots" })
      expect(Date.now() - killedAt).toBeLessThanOrEqual(10_000)
    } finally {
      child.kill("SIGKILL")
      client.disconnect()
      await Effect.runPromise(Scope.close(bScope, Exit.void))
    }
  }, 60_000)
})
