import { afterAll, beforeAll, describe, expect, it } from "@effect/vitest"
import { Cause, Effect, Exit, Layer, Redacted, Scope } from "effect"
import { SqlClient } from "effect/sql"
import { TestClock } from "effect/testing"
import { Admission } from "../../src/quota/Admission.js"
import { AdmissionMemoryProbe, layerMemoryWithProbe, type MemoryOptions } from "../../src/quota/AdmissionMemory.js"
import { layerPostgres, runMigrations } from "../../src/store/Sql.js"
import { type FreshDatabase, freshDatabase } from "../support/Db.js"
import { serviceGate } from "../support/Services.js"
import { admissionContract } from "./contract.js"
import { InFlightProbe, input, LAX, model, plan, T0 } from "./fixtures.js"

const memory = (options: MemoryOptions) =>
  Layer.provideMerge(
    Layer.effect(InFlightProbe, Effect.map(AdmissionMemoryProbe, (p) => (id: string) => Effect.sync(() => p.inFlight(id)))),
    layerMemoryWithProbe(options)
  )

admissionContract({ name: "memory", layer: (abuse) => memory({ abuse }) })
// the same contract with every command going through the actors' mailboxes (no inline fast path)
admissionContract({ name: "memory, mailbox only", layer: (abuse) => memory({ abuse, mailboxOnly: true }) })

const once = (accountId: string, weighted: number) =>
  Effect.scoped(Effect.gen(function*() {
    const adm = yield* Admission
    const t = yield* adm.admit(input(accountId, model({ id: "m" }), plan(), weighted))
    return yield* t.settle({ inputTokens: weighted, outputTokens: 0 })
  }))

describe("AdmissionMemory actors", () => {
  it.effect("a defect restarts the account actor; state, open tickets and the mailbox survive", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const adm = yield* Admission
      const probe = yield* AdmissionMemoryProbe
      const p = plan()
      yield* once("a", 100)
      yield* once("b", 7)
      const scope = yield* Scope.make()
      const open = yield* adm.admit(input("a", model({ id: "m" }), p, 50)).pipe(Scope.provide(scope))

      const crash = yield* Effect.exit(probe.crash("a"))
      expect(Exit.isFailure(crash) && Cause.hasDies(crash.cause)).toBe(true)
      expect(probe.restarts()).toBe(1)

      expect((yield* adm.standing("a", p)).session.used).toBe(150)
      expect(yield* adm.currentRpm("a")).toBe(2) // the RPM window is part of the reloaded state
      expect((yield* open.settle({ inputTokens: 20, outputTokens: 0 })).standing.session.used).toBe(120)
      yield* Scope.close(scope, Exit.void)
      expect(probe.inFlight("m")).toBe(0)
      yield* once("a", 1)
      expect((yield* adm.standing("a", p)).session.used).toBe(121)
      expect((yield* adm.standing("b", p)).session.used).toBe(7) // other actors untouched

      yield* Effect.exit(probe.crash("a"))
      yield* Effect.exit(probe.crash("a"))
      expect(probe.restarts()).toBe(3)
      expect((yield* adm.standing("a", p)).session.used).toBe(121)
    }).pipe(Effect.provide(memory({ abuse: LAX }))))

  it.effect("idle actors are passivated and come back with their state", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const adm = yield* Admission
      const probe = yield* AdmissionMemoryProbe
      const p = plan()
      yield* once("a", 100)
      yield* once("b", 5)
      expect(yield* probe.liveActors).toBe(2)
      yield* TestClock.adjust("9 minutes")
      expect(yield* probe.liveActors).toBe(2)
      yield* TestClock.adjust("1 minute")
      expect(yield* probe.liveActors).toBe(0)
      const s = yield* adm.standing("a", p)
      expect(s.session).toMatchObject({ used: 100, resets_at: T0 + 5 * 3_600_000 })
      expect(s.weekly).toMatchObject({ used: 100, anchor_at: T0 })
      expect((yield* adm.standing("b", p)).session.used).toBe(5)
    }).pipe(Effect.provide(memory({ abuse: LAX, idleTimeToLive: "10 minutes" }))))

  it.effect("a held ticket keeps its actor alive past the idle time", () =>
    Effect.gen(function*() {
      yield* TestClock.setTime(T0)
      const adm = yield* Admission
      const probe = yield* AdmissionMemoryProbe
      const scope = yield* Scope.make()
      const t = yield* adm.admit(input("a", model({ id: "m" }), plan(), 10)).pipe(Scope.provide(scope))
      yield* TestClock.adjust("1 hour")
      expect(yield* probe.liveActors).toBe(1)
      expect((yield* t.settle({ inputTokens: 30, outputTokens: 0 })).weighted).toBe(30)
      yield* Scope.close(scope, Exit.void)
      yield* TestClock.adjust("10 minutes")
      expect(yield* probe.liveActors).toBe(0)
      expect((yield* adm.standing("a", plan())).session.used).toBe(30)
    }).pipe(Effect.provide(memory({ abuse: LAX }))))

  it.live("hot path: admit + settle + release costs tens of microseconds of CPU", () =>
    Effect.gen(function*() {
      const adm = yield* Admission
      const m = model({ id: "m" })
      const p = plan({ session_limit: 1e15, weekly_limit: 1e15 })
      const cycle = (i: number) =>
        Effect.scoped(Effect.flatMap(adm.admit(input(`acct-${i % 100}`, m, p, 10)), (t) =>
          t.settle({ inputTokens: 10, outputTokens: 5 })))
      const scopeOnly = Effect.scoped(Effect.void)
      // CPU time, not wall time: the build machine is shared
      const cpu = (n: number, f: (i: number) => Effect.Effect<unknown, unknown>) =>
        Effect.gen(function*() {
          const start = process.cpuUsage()
          for (let i = 0; i < n; i++) yield* f(i)
          const used = process.cpuUsage(start)
          return (used.user + used.system) / n
        })
      yield* cpu(5_000, cycle) // warm-up
      const perCycle = yield* cpu(20_000, cycle)
      const perScope = yield* cpu(20_000, () => scopeOnly)
      console.log(
        `memory admission: admit+settle+release ${perCycle.toFixed(1)} µs CPU ` +
          `(of which the caller's Effect.scoped ${perScope.toFixed(1)} µs)`
      )
      expect(perCycle).toBeLessThan(250) // generous: shared CI machines
    }).pipe(Effect.provide(memory({ abuse: LAX }))))
})

// --- PostgreSQL persistence ------------------------------------------------------------------------------------

const postgres = await serviceGate("postgres")

describe.skipIf(!postgres)("AdmissionMemory persistence (PostgreSQL)", () => {
  let db: FreshDatabase
  beforeAll(async () => {
    db = await freshDatabase("quota")
    await Effect.runPromise(runMigrations.pipe(Effect.provide(layerPostgres(Redacted.make(db.url), 2))))
  })
  afterAll(async () => {
    await db?.drop()
  })
  const sqlLayer = () => layerPostgres(Redacted.make(db.url), 2)
  const withSql = (options: Omit<MemoryOptions, "sql">) =>
    Layer.unwrap(Effect.map(SqlClient.SqlClient, (sql) => layerMemoryWithProbe({ ...options, sql })))

  it.live("state survives a restart: written behind on scope close, loaded when an actor starts", () =>
    Effect.gen(function*() {
      const m = model({ id: "pm", daily_cap: 1_000_000 })
      const p = plan({ session_limit: 10_000 })
      const abuse = { burst: 1, window_seconds: 60, cooldown_seconds: 600 }
      // first "process"
      const first = yield* Effect.gen(function*() {
        const adm = yield* Admission
        const t = yield* Effect.scoped(Effect.flatMap(adm.admit(input("p1", m, p, 100)), (t) =>
          t.settle({ inputTokens: 100, outputTokens: 40 })))
        yield* Effect.scoped(adm.admit(input("p2", m, p, 10)))
        const cooldown = yield* Effect.flip(Effect.scoped(adm.admit(input("p2", m, p, 10))))
        expect(cooldown.code).toBe("abuse_cooldown")
        return { standing: t.standing, cooldownUntil: cooldown.resetsAt! }
      }).pipe(Effect.provide(withSql({ abuse })))
      expect(first.standing.session.used).toBe(100 + 40 * 3)

      const rows = yield* Effect.flatMap(SqlClient.SqlClient, (sql) =>
        sql<{ readonly n: number }>`SELECT count(*)::int AS n FROM quota_windows`)
      expect(rows[0]!.n).toBe(2)

      // second "process": same database, empty memory
      yield* Effect.gen(function*() {
        const adm = yield* Admission
        const s = yield* adm.standing("p1", p)
        expect(s.session.used).toBe(220)
        expect(s.session.resets_at).toBe(first.standing.session.resets_at)
        expect(s.weekly.used).toBe(220)
        expect(s.weekly.anchor_at).toBe(first.standing.weekly.anchor_at)
        expect(yield* adm.dailyUsage("pm")).toBe(140) // p2's reservation was refunded
        const still = yield* Effect.flip(Effect.scoped(adm.admit(input("p2", m, p, 10))))
        expect(still.code).toBe("abuse_cooldown")
        expect(still.resetsAt).toBe(first.cooldownUntil)
      }).pipe(Effect.provide(withSql({ abuse })))
    }).pipe(Effect.provide(sqlLayer())))

  it.live("passivation and the write-behind flush reach the database without a shutdown", () =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const m = model({ id: "pm2" })
      const p = plan()
      yield* Effect.gen(function*() {
        const adm = yield* Admission
        const probe = yield* AdmissionMemoryProbe
        yield* Effect.scoped(Effect.flatMap(adm.admit(input("w1", m, p, 10)), (t) =>
          t.settle({ inputTokens: 10, outputTokens: 0 })))
        // flushed by the background writer shortly after the change
        yield* Effect.sleep("300 millis")
        const row = yield* sql<{ readonly used: number }>`
          SELECT session_used::float8 AS used FROM quota_windows WHERE account_id = 'w1'`
        expect(row[0]?.used).toBe(10)
        // passivation hands the state to the writer as well
        yield* Effect.scoped(Effect.flatMap(adm.admit(input("w1", m, p, 5)), (t) =>
          t.settle({ inputTokens: 5, outputTokens: 0 })))
        yield* Effect.sleep("300 millis")
        expect(yield* probe.liveActors).toBe(0)
        const after = yield* sql<{ readonly used: number }>`
          SELECT session_used::float8 AS used FROM quota_windows WHERE account_id = 'w1'`
        expect(after[0]?.used).toBe(15)
        const daily = yield* sql<{ readonly t: number }>`
          SELECT tokens::float8 AS t FROM model_daily_usage WHERE model_id = 'pm2'`
        expect(daily[0]?.t).toBe(15)
      }).pipe(Effect.provide(withSql({ abuse: LAX, flushInterval: "50 millis", idleTimeToLive: "100 millis" })))
    }).pipe(Effect.provide(sqlLayer())))
})
