import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Clock, Context, Effect, Exit, Layer, Redacted, Scope } from "effect"
import { SqlClient } from "effect/sql"
import { TestClock } from "effect/testing"
import { Redis } from "ioredis"
import { Admission } from "../../src/quota/Admission.js"
import { AdmissionRedisProbe, layerRedisWithProbe, type RedisAdmissionOptions } from "../../src/quota/AdmissionRedis.js"
import { layerPostgres, runMigrations } from "../../src/store/Sql.js"
import { type FreshDatabase, freshDatabase } from "../support/Db.js"
import { deleteByPrefix, hasRedisServer, privateRedis, uniquePrefix } from "../support/Redis.js"
import { REDIS_URL, serviceGate } from "../support/Services.js"
import { admissionContract } from "./contract.js"
import { InFlightProbe, input, LAX, model, plan, T0 } from "./fixtures.js"

// With GATEWAY_REQUIRE_SERVICES=1 an unreachable Redis throws here and fails the file; otherwise it skips.
const redisUp = await serviceGate("redis")
const runPrefix = uniquePrefix("quota")
let layers = 0

const redisLayer = (options: Omit<RedisAdmissionOptions, "keyPrefix">) =>
  Layer.provideMerge(
    Layer.effect(InFlightProbe, Effect.map(AdmissionRedisProbe, (p) => p.inFlight)),
    layerRedisWithProbe({ url: REDIS_URL, keyPrefix: `${runPrefix}${++layers}:`, ...options })
  )

describe.skipIf(!redisUp)("AdmissionRedis", () => {
  afterAll(async () => {
    await deleteByPrefix(REDIS_URL, runPrefix)
  })

  // The scripts take `now` from the Effect Clock here, so TestClock drives Redis exactly like the memory layer.
  admissionContract({ name: "redis", layer: (abuse) => redisLayer({ abuse, time: "clock" }) })

  it.live("server time: windows are computed from Redis TIME", () =>
    Effect.gen(function*() {
      const adm = yield* Admission
      const p = plan({ session_hours: 5 })
      const before = Date.now()
      const r = yield* Effect.scoped(Effect.flatMap(adm.admit(input("st", model({ id: "m" }), p, 10)), (t) =>
        t.settle({ inputTokens: 10, outputTokens: 1 })))
      expect(r.weighted).toBe(13)
      const resetsAt = r.standing.session.resets_at!
      expect(resetsAt).toBeGreaterThanOrEqual(before + 5 * 3_600_000 - 2_000)
      expect(resetsAt).toBeLessThanOrEqual(Date.now() + 5 * 3_600_000 + 2_000)
      expect(r.standing.session.resets_in_seconds).toBeGreaterThan(5 * 3600 - 5)
    }).pipe(Effect.provide(redisLayer({ abuse: LAX }))))

  it.effect("a dead holder's lease lapses after leaseMs and is reclaimed; a live holder's is extended", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const adm = yield* Admission
      const probe = yield* AdmissionRedisProbe
      const m = model({ id: "leased", concurrency: 1 })
      const p = plan()
      // a replica that died holding the only slot: its lease was written at T0 and is never extended
      yield* Effect.promise(() => probe.client.zadd(`${probe.keyPrefix}m:{leased}:lease`, T0 + 30_000, "dead.1"))
      expect((yield* Effect.flip(Effect.scoped(adm.admit(input("a", m, p, 1))))).code).toBe("model_overloaded")
      yield* TestClock.adjust(29_999)
      expect((yield* Effect.flip(Effect.scoped(adm.admit(input("a", m, p, 1))))).code).toBe("model_overloaded")
      yield* TestClock.adjust(1)
      // lapsed: pruned by the next admission, which takes the slot
      const scope = yield* Scope.make()
      yield* adm.admit(input("a", m, p, 1)).pipe(Scope.provide(scope))
      expect(yield* probe.inFlight("leased")).toBe(1)
      // this replica is alive: its heartbeat keeps the lease past the original 30 s
      yield* TestClock.adjust("20 seconds")
      yield* probe.heartbeat
      yield* TestClock.adjust("20 seconds")
      expect((yield* Effect.flip(Effect.scoped(adm.admit(input("b", m, p, 1))))).code).toBe("model_overloaded")
      yield* Scope.close(scope, Exit.void)
      expect(yield* probe.inFlight("leased")).toBe(0)
      yield* Effect.scoped(adm.admit(input("b", m, p, 1)))
    }).pipe(Effect.provide(redisLayer({ abuse: LAX, time: "clock", leaseMs: 30_000 }))))

  it.live("Redis unreachable: every call fails fast with service_unavailable (fail closed)", () =>
    Effect.gen(function*() {
      const adm = yield* Admission
      const m = model({ id: "m" })
      const started = Date.now()
      const errors = yield* Effect.all([
        Effect.flip(Effect.scoped(adm.admit(input("a", m, plan(), 1)))),
        Effect.flip(adm.standing("a", plan())),
        Effect.flip(adm.currentRpm("a")),
        Effect.flip(adm.dailyUsage("m")),
        Effect.flip(adm.limit("k", 1, 60))
      ])
      const elapsed = Date.now() - started
      for (const e of errors) {
        expect(e.code).toBe("service_unavailable")
        expect(e.status).toBe(503)
      }
      expect(elapsed).toBeLessThan(1_000)
    }).pipe(Effect.provide(redisLayer({ abuse: LAX, url: "redis://127.0.0.1:1" }))))

  describe.skipIf(!hasRedisServer())("outage and recovery (private redis-server)", () => {
    it.live("fails closed during an outage and recovers when Redis returns (scripts reloaded)", () =>
      Effect.gen(function*() {
        const server = yield* Effect.promise(() => privateRedis())
        yield* Effect.promise(() => server.start())
        yield* Effect.addFinalizer(() => Effect.promise(() => server.stop()))
        yield* Effect.gen(function*() {
          const adm = yield* Admission
          const m = model({ id: "m" })
          const p = plan()
          const held = yield* Scope.make()
          const ticket = yield* adm.admit(input("a", m, p, 100)).pipe(Scope.provide(held))

          yield* Effect.promise(() => server.stop())
          const started = Date.now()
          const down = yield* Effect.flip(Effect.scoped(adm.admit(input("a", m, p, 1))))
          expect(down.code).toBe("service_unavailable")
          expect(Date.now() - started).toBeLessThan(1_000)
          // a settle during the outage answers (reservation-time figures) instead of hanging or dying
          const settled = yield* ticket.settle({ inputTokens: 10, outputTokens: 0 })
          expect(settled.weighted).toBe(10)
          yield* Scope.close(held, Exit.void)

          // a fresh server: empty, no scripts loaded (EVALSHA -> NOSCRIPT -> EVAL)
          yield* Effect.promise(() => server.start())
          const deadline = Date.now() + 10_000
          let recovered = false
          while (!recovered && Date.now() < deadline) {
            const exit = yield* Effect.exit(Effect.scoped(adm.admit(input("a", m, p, 1))))
            recovered = Exit.isSuccess(exit)
            if (!recovered) yield* Effect.sleep("100 millis")
          }
          expect(recovered).toBe(true)
          const s = yield* adm.standing("a", p)
          expect(s.session.used).toBe(0) // admitted then refunded on the new, empty server
        }).pipe(Effect.provide(redisLayer({ abuse: LAX, url: server.url })))
      }).pipe(Effect.scoped), 30_000)

    it.live("a timed-out admission fails with 503 after the command timeout and is undone once Redis answers", () =>
      Effect.gen(function*() {
        const server = yield* Effect.promise(() => privateRedis())
        yield* Effect.promise(() => server.start())
        yield* Effect.addFinalizer(() => Effect.promise(() => server.stop()))
        yield* Effect.gen(function*() {
          const adm = yield* Admission
          const probe = yield* AdmissionRedisProbe
          const m = model({ id: "m", daily_cap: 1_000_000 })
          const p = plan()
          yield* Effect.scoped(adm.admit(input("a", m, p, 1))) // scripts loaded, connection warm
          server.pause()
          const started = Date.now()
          const e = yield* Effect.flip(Effect.scoped(adm.admit(input("a", m, p, 500))))
          const elapsed = Date.now() - started
          server.resume()
          expect(e.code).toBe("service_unavailable")
          expect(elapsed).toBeGreaterThanOrEqual(250)
          expect(elapsed).toBeLessThan(2_000)
          // Redis ran the late admission, then the compensating release queued behind it on the connection
          const s = yield* adm.standing("a", p)
          expect(s.session.used).toBe(0)
          expect(yield* adm.dailyUsage("m")).toBe(0)
          expect(yield* probe.inFlight("m")).toBe(0)
        }).pipe(Effect.provide(redisLayer({ abuse: LAX, url: server.url, commandTimeoutMs: 300 })))
      }).pipe(Effect.scoped), 30_000)
  })
})

// --- rebuild from PostgreSQL ---------------------------------------------------------------------------------------

const postgresUp = await serviceGate("postgres")

/**
 * The PostgreSQL pool on real time, as node-pg's own timers were in v3. The v4 pool keeps its idle-TTL fiber on
 * the Effect Clock: built under TestClock, `TestClock.setTime(T0)` would wake it once per idle period since 1970.
 */
const liveSql = (url: string) =>
  layerPostgres(Redacted.make(url), 2).pipe(Layer.provide(Layer.succeed(Clock.Clock, Context.get(Context.empty(), Clock.Clock))))

describe.skipIf(!redisUp || !postgresUp)("AdmissionRedis with PostgreSQL", () => {
  let db: FreshDatabase
  beforeAll(async () => {
    db = await freshDatabase("quotaredis")
    await Effect.runPromise(runMigrations.pipe(Effect.provide(layerPostgres(Redacted.make(db.url), 2))))
  })
  afterAll(async () => {
    await db?.drop()
    await deleteByPrefix(REDIS_URL, `${runPrefix}pg:`)
  })

  it.effect("missing pool keys are rebuilt from the quota_windows snapshot instead of restarting at zero", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const sql = yield* SqlClient.SqlClient
      yield* Effect.gen(function*() {
        const adm = yield* Admission
        const probe = yield* AdmissionRedisProbe
        const m = model({ id: "rb", daily_cap: 1_000_000 })
        const p = plan({ session_limit: 10_000 })
        const first = yield* Effect.scoped(Effect.flatMap(adm.admit(input("rb-1", m, p, 100)), (t) =>
          t.settle({ inputTokens: 100, outputTokens: 40 })))
        expect(first.standing.session.used).toBe(220)
        yield* probe.flush
        const rows = yield* sql<{ readonly used: number }>`
          SELECT session_used::float8 AS used FROM quota_windows WHERE account_id = 'rb-1'`
        expect(rows[0]?.used).toBe(220)

        // Redis loses the account and the model's daily totals (e.g. restarted without persistence)
        const client: Redis = probe.client
        yield* Effect.promise(() =>
          client.del(`${probe.keyPrefix}a:{rb-1}`, `${probe.keyPrefix}m:{rb}:daily`)
        )
        const s = yield* adm.standing("rb-1", p)
        expect(s.session).toMatchObject({ used: 220, resets_at: T0 + 5 * 3_600_000 })
        expect(s.weekly).toMatchObject({ used: 220, anchor_at: T0 })
        expect(yield* adm.dailyUsage("rb")).toBe(140)

        yield* Effect.promise(() =>
          client.del(`${probe.keyPrefix}a:{rb-1}`, `${probe.keyPrefix}m:{rb}:daily`)
        )
        const t = yield* Effect.scoped(Effect.map(adm.admit(input("rb-1", m, p, 10)), (t) => t.reserved))
        expect(t.session.used).toBe(230)
        expect(yield* adm.dailyUsage("rb")).toBe(140) // the reservation was refunded on scope close
        // an account never seen anywhere starts empty (and is not looked up again)
        const fresh = yield* Effect.scoped(Effect.map(adm.admit(input("rb-new", m, p, 5)), (t) => t.reserved))
        expect(fresh.session.used).toBe(5)
      }).pipe(Effect.provide(
        Layer.provideMerge(
          Layer.effect(InFlightProbe, Effect.map(AdmissionRedisProbe, (p) => p.inFlight)),
          layerRedisWithProbe({
            url: REDIS_URL,
            keyPrefix: `${runPrefix}pg:`,
            abuse: LAX,
            time: "clock",
            sql
          })
        )
      ))
    }).pipe(Effect.provide(liveSql(db.url))))
})
