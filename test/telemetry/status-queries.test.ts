/**
 * The status refresh's per-model "most recent counted requests" and its active-account count walk indexes
 * (`telemetry/RequestQueries.ts`) instead of numbering or scanning every row of their period. They must return
 * what the direct forms return: both are run here, as oracles, over the same seeded rows (ties in time, BYOK
 * rows, client faults and refusals, rows outside every period, accounts active only long ago), on embedded
 * PGlite and PostgreSQL.
 */
import { Effect, Layer, ManagedRuntime } from "effect"
import { SqlClient } from "effect/sql"
import { describe, expect, it } from "vitest"
import { fleetRows, serverRow } from "../../src/telemetry/RequestQueries.js"
import { serviceGate } from "../support/Services.js"
import { backends } from "../storage/backends.js"

const postgres = await serviceGate("postgres")

const MINUTE = 60_000
const HOUR = 60 * MINUTE
const NOW = Date.UTC(2026, 10, 25, 12, 0, 0)

/** A small seeded generator, so every run (and both backends) sees the same rows. */
const seeded = (seed: number) => () => {
  seed = (seed + 0x6d2b79f5) | 0
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed)
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296
}

const MODELS = ["ws-pro", "ws-lite", "ws-reasoner", "ws-code", "ws-quiet"]
const OUTCOMES: ReadonlyArray<readonly [string, number]> = [
  ["success", 200], ["success", 200], ["success", 200], ["error", 500], ["error", 502], ["error", 503],
  ["error", 429], ["error", 529], ["error", 400], ["cancelled", 499]
]

const makeRows = () => {
  const random = seeded(7)
  const pick = <A>(items: ReadonlyArray<A>) => items[Math.floor(random() * items.length)]!
  return Array.from({ length: 2_500 }, (_, i) => {
    const [status, http] = pick(OUTCOMES)
    // Most rows in the last 20 minutes, some up to 30 hours back; every fifth shares its time with the one before.
    const back = random() < 0.8 ? random() * 20 * MINUTE : random() * 30 * HOUR
    return {
      id: i + 1,
      request_id: `req_${i}`,
      // acc_0 .. acc_39; acc_40 .. acc_44 only in rows more than a day old (set below).
      account_id: `acc_${Math.floor(random() * 40)}`,
      model_id: random() < 0.05 ? "@byok/other" : pick(MODELS.slice(0, 4)),
      status,
      http_status: http,
      byok: random() < 0.1,
      created_at: new Date(NOW - Math.round(back)),
      api: "chat",
      attempts: 1
    }
  }).map((row, i, all) => (i % 5 === 4 ? { ...row, created_at: all[i - 1]!.created_at } : row))
    .concat(Array.from({ length: 5 }, (_, k) => ({
      id: 10_000 + k,
      request_id: `old_${k}`,
      account_id: `acc_${40 + k}`,
      model_id: "ws-quiet",
      status: "success",
      http_status: 200,
      byok: false,
      created_at: new Date(NOW - 26 * HOUR - k * MINUTE),
      api: "chat",
      attempts: 1
    })))
}

const MODEL_FAILURE = "status = 'error' AND http_status >= 500 AND http_status <> 529"

for (const backend of backends(postgres)) {
  describe(`status queries (${backend.name})`, () => {
    it("the newest counted rows per model and the active accounts match their direct forms", async () => {
      const opened = await backend.open()
      const runtime = ManagedRuntime.make(Layer.orDie(opened.layer))
      try {
        const rows = makeRows()
        await runtime.runPromise(Effect.gen(function*() {
          const sql = yield* SqlClient.SqlClient
          for (let i = 0; i < rows.length; i += 500) {
            yield* sql`INSERT INTO request_log ${sql.insert(rows.slice(i, i + 500) as any)}`
          }
        }).pipe(Effect.orDie))

        const compare = (now: number, windowMs: number, recent: number, activeMs: number) =>
          runtime.runPromise(Effect.gen(function*() {
            const sql = yield* SqlClient.SqlClient
            // Duplicates in the model list must not count a row twice.
            const models = [...MODELS, "ws-pro"]
            const fleet = yield* fleetRows(sql, { models, now, windowMs, recent, idleMs: 24 * HOUR })
            const failure = sql.literal(MODEL_FAILURE)
            const direct = yield* sql<{ model_id: string; attempts: number; failures: number }>`
              SELECT model_id, count(*)::int AS attempts, count(*) FILTER (WHERE failed)::int AS failures
              FROM (
                SELECT model_id, (${failure}) AS failed,
                  row_number() OVER (PARTITION BY model_id ORDER BY created_at DESC, id DESC) AS n
                FROM request_log
                WHERE ${sql.in("model_id", models)} AND NOT byok AND created_at <= ${new Date(now)}
                  AND created_at > ${new Date(now - windowMs)} AND (status = 'success' OR (${failure}))
              ) counted
              WHERE n <= ${recent}::int
              GROUP BY model_id`.pipe(Effect.orDie)
            const byModel = (list: ReadonlyArray<{ model_id: string; attempts: number; failures: number }>) =>
              [...list].map((r) => ({ ...r })).sort((a, b) => a.model_id.localeCompare(b.model_id))
            expect(byModel(fleet.recent)).toEqual(byModel(direct))

            const server = yield* serverRow(sql, new Date(now - activeMs), new Date(now))
            const [distinct] = yield* sql<{ users: number }>`
              SELECT count(DISTINCT account_id)::int AS users FROM request_log
              WHERE created_at >= ${new Date(now - activeMs)} AND created_at <= ${new Date(now)}`.pipe(Effect.orDie)
            expect(server.users).toBe(distinct!.users)
            return { recent: fleet.recent.length, users: server.users }
          }))

        // The shipped rules (15 minutes, the last 10), a short window, a long one, and points in the past.
        const seen = [
          await compare(NOW, 15 * MINUTE, 10, 24 * HOUR),
          await compare(NOW, 2 * MINUTE, 3, HOUR),
          await compare(NOW, 30 * HOUR, 50, 30 * HOUR),
          await compare(NOW - 10 * MINUTE, 15 * MINUTE, 10, 10 * MINUTE),
          await compare(NOW - 25 * HOUR, 15 * MINUTE, 10, 24 * HOUR)
        ]
        // The cases are not empty: four models counted, and accounts active only a day ago are seen by 30 hours.
        expect(seen[0]).toEqual({ recent: 4, users: 40 })
        expect(seen[2]!.users).toBe(45)
      } finally {
        await runtime.dispose()
        await opened.close()
      }
    })
  })
}
