/**
 * A replica that dies holding in-flight slots gives them back within 10 s (issue 19, point 5), in production mode
 * (Redis admission):
 * - on the TestClock (scripts take `now` from the Effect clock): while the holder lives its heartbeat keeps the
 *   leases for 30 s; once its heartbeat stops (its layer closed, its tickets never released: no settle, no
 *   release), a second replica gets every slot back at most 9 s later, and not before the last extension lapses;
 * - in real time, against Redis TIME: a separate process holds the slots and is killed with SIGKILL right after a
 *   heartbeat extended them (the worst case); this replica's admissions succeed again within 10 s. Redis TTLs are
 *   real time, so this test takes about 10-15 s (process start, one heartbeat, the lease).
 */
import { afterAll, describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Layer, ManagedRuntime, Scope } from "effect"
import { TestClock } from "effect/testing"
import { Redis } from "ioredis"
import * as ChildProcess from "node:child_process"
import * as Path from "node:path"
import { Admission } from "../../src/quota/Admission.js"
import { AdmissionRedisProbe, layerRedis, layerRedisWithProbe } from "../../src/quota/AdmissionRedis.js"
import { DEFAULT_LEASE_MS } from "../../src/quota/RedisLeases.js"
import { eventually } from "../support/Eventually.js"
import { deleteByPrefix, uniquePrefix } from "../support/Redis.js"
import { REDIS_URL, serviceGate } from "../support/Services.js"
import { input, LAX, model, plan, T0 } from "./fixtures.js"

const redisUp = await serviceGate("redis")
const runPrefix = uniquePrefix("dead-replica")
const SLOTS = 3

/** The lease expiries (ms) on a model, as stored. */
const leaseScores = (client: Redis, prefix: string, modelId: string) =>
  client.zrange(`${prefix}m:{${modelId}}:lease`, 0, -1, "WITHSCORES").then((flat) =>
    flat.filter((_, i) => i % 2 === 1).map(Number)
  )

describe.skipIf(!redisUp)("a dead replica's in-flight slots", () => {
  afterAll(async () => {
    await deleteByPrefix(REDIS_URL, runPrefix)
  })

  it("the default lease returns slots within 10 s", () => {
    expect(DEFAULT_LEASE_MS).toBeLessThanOrEqual(10_000)
  })

  it.effect("TestClock: kept by the heartbeat while alive, back within the lease after the heartbeat stops", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const prefix = `${runPrefix}clock:`
      const m = model({ id: "dead-clock", concurrency: SLOTS })
      const p = plan()
      const options = { url: REDIS_URL, keyPrefix: prefix, abuse: LAX, time: "clock" as const }
      // Replica A: its own layer (heartbeat fiber, client) in a scope closed below; its tickets in another, never closed.
      const aScope = yield* Scope.make()
      const a = yield* Layer.buildWithScope(layerRedisWithProbe(options), aScope)
      const aAdmission = a.mapUnsafe.get(Admission.key) as Admission["Service"]
      const tickets = yield* Scope.make()
      for (let i = 0; i < SLOTS; i++) yield* aAdmission.admit(input(`a-${i}`, m, p, 1)).pipe(Scope.provide(tickets))
      const b = yield* Admission
      const probe = yield* AdmissionRedisProbe
      const refusedOnB = (account: string) =>
        Effect.flip(Effect.scoped(b.admit(input(account, m, p, 1)))).pipe(Effect.map((e) => e.code))

      // Alive for 30 s (three lease lifetimes): the heartbeat keeps every slot.
      for (let s = 1; s <= 30; s++) {
        yield* TestClock.adjust("1 second")
        expect(yield* refusedOnB(`b-alive-${s}`)).toBe("model_overloaded")
      }
      expect(yield* probe.inFlight(m.id)).toBe(SLOTS)

      // A dies: its heartbeat and client stop; nothing releases its tickets.
      yield* Scope.close(aScope, Exit.void)
      const diedAt = T0 + 30_000
      const expiries = yield* Effect.promise(() => leaseScores(probe.client, prefix, m.id))
      expect(expiries).toHaveLength(SLOTS)
      const lastExpiry = Math.max(...expiries)
      expect(lastExpiry - diedAt).toBeLessThanOrEqual(DEFAULT_LEASE_MS)

      // B polls once a second: refused until the last lease lapses, then every slot is B's.
      let back: number | null = null
      for (let s = 1; s <= 10 && back === null; s++) {
        yield* TestClock.adjust("1 second")
        const now = diedAt + s * 1000
        const exit = yield* Effect.exit(Effect.scoped(b.admit(input(`b-${s}`, m, p, 1))))
        if (now < lastExpiry) expect(Exit.isFailure(exit)).toBe(true)
        if (Exit.isSuccess(exit) && now >= lastExpiry) back = now - diedAt
      }
      expect(back).not.toBeNull()
      expect(back!).toBeLessThanOrEqual(10_000)
      const bScope = yield* Scope.make()
      for (let i = 0; i < SLOTS; i++) yield* b.admit(input(`b-take-${i}`, m, p, 1)).pipe(Scope.provide(bScope))
      expect(yield* probe.inFlight(m.id)).toBe(SLOTS)
      yield* Scope.close(bScope, Exit.void)
    }).pipe(Effect.provide(layerRedisWithProbe({ url: REDIS_URL, keyPrefix: `${runPrefix}clock:`, abuse: LAX, time: "clock" }))))

  it("real time: a SIGKILLed replica's slots are admitted again within 10 s", async () => {
    const prefix = `${runPrefix}real:`
    const m = model({ id: "dead-real", concurrency: SLOTS })
    const p = plan()
    const client = new Redis(REDIS_URL)
    const replicaB = ManagedRuntime.make(layerRedis({ url: REDIS_URL, keyPrefix: prefix, abuse: LAX }))
    const child = ChildProcess.spawn(
      process.execPath,
      ["--import", "tsx", Path.resolve("test/quota/support/lease-holder.ts")],
      {
        env: { ...process.env, REDIS_URL, PREFIX: prefix, MODEL: m.id, CONCURRENCY: String(SLOTS), COUNT: String(SLOTS) },
        stdio: ["ignore", "pipe", "pipe"]
      }
    )
    let stdout = ""
    let stderr = ""
    child.stdout.on("data", (d: Buffer) => (stdout += d.toString()))
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString()))
    /** Whether B can take every slot now (it gives them back at once). */
    const bTakesAll = () =>
      replicaB.runPromise(Effect.gen(function*() {
        const admission = yield* Admission
        const scope = yield* Scope.make()
        let taken = 0
        for (let i = 0; i < SLOTS; i++) {
          const exit = yield* Effect.exit(admission.admit(input(`b-${i}`, m, p, 1)).pipe(Scope.provide(scope)))
          if (Exit.isSuccess(exit)) taken++
        }
        yield* Scope.close(scope, Exit.void)
        return taken === SLOTS
      }))
    try {
      await eventually(() => stdout.includes(`held ${SLOTS}`) || child.exitCode !== null, {
        timeoutMs: 30_000,
        what: "the holder's slots"
      })
      expect(stdout, stderr).toContain(`held ${SLOTS}`)
      // Wait for one heartbeat to extend the leases, then kill at once: the latest expiry there can be.
      const first = Math.max(...await leaseScores(client, prefix, m.id))
      await eventually(async () => Math.max(...await leaseScores(client, prefix, m.id)) > first, {
        timeoutMs: DEFAULT_LEASE_MS,
        everyMs: 10,
        what: "a heartbeat extending the holder's leases"
      })
      child.kill("SIGKILL")
      const killedAt = Date.now()
      expect(await leaseScores(client, prefix, m.id)).toHaveLength(SLOTS)
      expect(await bTakesAll()).toBe(false)
      // Redis TTL is real time: bounded polling, every 100 ms.
      await eventually(bTakesAll, { timeoutMs: 12_000, everyMs: 100, what: "the dead replica's slots" })
      const back = Date.now() - killedAt
      expect(back).toBeLessThanOrEqual(10_000)
    } finally {
      child.kill("SIGKILL")
      client.disconnect()
      await replicaB.dispose()
    }
  }, 60_000)
})
