/**
 * The per-minute sums of `request_log` (migration 0009) and the periods read through them (`spanned`): for random
 * rows written in random batches and random periods (edges on rows, on minute boundaries, within one minute, open
 * ended), the sums equal the same aggregate over the rows themselves, on PGlite and on PostgreSQL. Rows written
 * before the migration are summed by it.
 */
import fc from "fast-check"
import { Effect, ManagedRuntime } from "effect"
import { SqlClient, type Statement } from "effect/sql"
import { describe, expect, it } from "vitest"
import migration0009 from "../../src/store/migrations/0009_request_minutes.js"
import { type Span, spanned } from "../../src/telemetry/RequestQueries.js"
import { serviceGate } from "../support/Services.js"
import { type Backend, backends } from "./backends.js"

const postgres = await serviceGate("postgres")

const MINUTE = 60_000
/** A minute boundary, so that the generated edges fall on boundaries too. */
const BASE = Date.UTC(2026, 10, 29, 3, 0, 0)
const MODELS = ["ws-a", "ws-b", "ws-c"]
const ACCOUNTS = ["acc_1", "acc_2", "acc_3"]
const OUTCOMES = [
  ["success", 200, null],
  ["error", 500, "upstream_error"],
  ["error", 503, "upstream_timeout"],
  ["error", 529, "model_overloaded"],
  ["error", 429, "rate_limited"],
  ["error", 400, "invalid_messages"],
  ["cancelled", 499, "cancelled"]
] as const

interface Fixture {
  readonly offsetMs: number
  readonly model: number
  readonly account: number
  readonly outcome: number
  readonly byok: boolean
  readonly input: number
  readonly output: number
  readonly ttfb: number | null
  readonly tps: number
}

const fixture: fc.Arbitrary<Fixture> = fc.record({
  // Ten minutes, whole seconds mostly, some rows exactly on a minute boundary.
  offsetMs: fc.oneof(fc.integer({ min: 0, max: 10 * MINUTE - 1 }), fc.integer({ min: 0, max: 9 }).map((m) => m * MINUTE)),
  model: fc.integer({ min: 0, max: MODELS.length - 1 }),
  account: fc.integer({ min: 0, max: ACCOUNTS.length - 1 }),
  outcome: fc.integer({ min: 0, max: OUTCOMES.length - 1 }),
  byok: fc.boolean(),
  input: fc.integer({ min: 0, max: 5000 }),
  output: fc.integer({ min: 0, max: 5000 }),
  ttfb: fc.option(fc.integer({ min: 1, max: 3000 }), { nil: null }),
  tps: fc.oneof(fc.constant(0), fc.double({ min: 0.5, max: 400, noNaN: true }))
})

let nextId = 1
const insert = (sql: SqlClient.SqlClient, rows: ReadonlyArray<Fixture>) =>
  rows.length === 0 ? Effect.void : sql`INSERT INTO request_log ${
    sql.insert(rows.map((r): Record<string, unknown> => {
      const [status, http_status, error_code] = OUTCOMES[r.outcome]!
      const id = nextId++
      return {
        id,
        request_id: `req_${id}`,
        account_id: ACCOUNTS[r.account]!,
        model_id: MODELS[r.model]!,
        status,
        error_code,
        http_status,
        byok: r.byok,
        input_tokens: r.input,
        output_tokens: r.output,
        ttfb_ms: r.ttfb,
        tps: r.tps,
        created_at: new Date(BASE + r.offsetMs)
      }
    }) as unknown as readonly [Record<string, unknown>, ...Array<Record<string, unknown>>])
  }`.pipe(Effect.asVoid)

const FAILURE = "status = 'error' AND http_status >= 500 AND http_status <> 529"

interface Sums {
  readonly requests: number
  readonly successes: number
  readonly failures: number
  readonly ttfb_sum: number
  readonly ttfb_count: number
  readonly tps_sum: number
  readonly tps_count: number
  readonly input_tokens: number
  readonly output_tokens: number
}

const throughMinutes = (sql: SqlClient.SqlClient, where: Statement.Fragment, span: Span) =>
  Effect.map(
    sql<Sums>`SELECT coalesce(sum(requests), 0)::int AS requests, coalesce(sum(successes), 0)::int AS successes,
      coalesce(sum(failures), 0)::int AS failures, coalesce(sum(ttfb_sum), 0)::float8 AS ttfb_sum,
      coalesce(sum(ttfb_count), 0)::int AS ttfb_count, coalesce(sum(tps_sum), 0)::float8 AS tps_sum,
      coalesce(sum(tps_count), 0)::int AS tps_count, coalesce(sum(input_tokens), 0)::bigint AS input_tokens,
      coalesce(sum(output_tokens), 0)::bigint AS output_tokens
      FROM ${spanned(sql, where, span)} s`,
    (rows) => rows[0]!
  )

const fromRows = (sql: SqlClient.SqlClient, where: Statement.Fragment, span: Span) => {
  const lower = span.fromInclusive === true ? sql`created_at >= ${span.from}` : sql`created_at > ${span.from}`
  const upper = span.to === undefined ? sql`TRUE` : sql`created_at <= ${span.to}`
  return Effect.map(
    sql<Sums>`SELECT count(*)::int AS requests, count(*) FILTER (WHERE status = 'success')::int AS successes,
      count(*) FILTER (WHERE ${sql.literal(FAILURE)})::int AS failures,
      coalesce(sum(ttfb_ms) FILTER (WHERE status = 'success' AND ttfb_ms IS NOT NULL), 0)::float8 AS ttfb_sum,
      count(*) FILTER (WHERE status = 'success' AND ttfb_ms IS NOT NULL)::int AS ttfb_count,
      coalesce(sum(tps) FILTER (WHERE status = 'success' AND tps > 0), 0)::float8 AS tps_sum,
      count(*) FILTER (WHERE status = 'success' AND tps > 0)::int AS tps_count,
      coalesce(sum(input_tokens), 0)::bigint AS input_tokens, coalesce(sum(output_tokens), 0)::bigint AS output_tokens
      FROM request_log WHERE ${where} AND ${lower} AND ${upper}`,
    (rows) => rows[0]!
  )
}

const expectSame = (got: Sums, want: Sums, label: string) => {
  const exact = ["requests", "successes", "failures", "ttfb_count", "tps_count", "input_tokens", "output_tokens"] as const
  for (const k of exact) expect(Number(got[k]), `${label}: ${k}`).toBe(Number(want[k]))
  expect(got.ttfb_sum, `${label}: ttfb_sum`).toBeCloseTo(want.ttfb_sum, 3)
  expect(got.tps_sum, `${label}: tps_sum`).toBeCloseTo(want.tps_sum, 3)
}

/** A period edge: on a row's time, on a minute boundary, or anywhere in (and a little around) the ten minutes. */
const edge = (rows: ReadonlyArray<Fixture>) =>
  fc.oneof(
    fc.integer({ min: 0, max: Math.max(0, rows.length - 1) }).map((i) => BASE + (rows[i]?.offsetMs ?? 0)),
    fc.integer({ min: -1, max: 11 }).map((m) => BASE + m * MINUTE),
    fc.integer({ min: -MINUTE, max: 11 * MINUTE }).map((ms) => BASE + ms)
  )

/** Runs `body` against a fresh migrated store of `backend`, closed afterwards. */
const onStore = async (
  backend: Backend,
  body: (sql: SqlClient.SqlClient) => Effect.Effect<void, unknown, SqlClient.SqlClient>
) => {
  const opened = await backend.open()
  const runtime = ManagedRuntime.make(opened.layer)
  try {
    await runtime.runPromise(Effect.flatMap(SqlClient.SqlClient, body).pipe(Effect.orDie))
  } finally {
    await runtime.dispose()
    await opened.close()
  }
}

/** Every row is summed once in request_minutes. */
const expectAllSummed = (sql: SqlClient.SqlClient, rows: number) =>
  Effect.map(
    sql<{ requests: number }>`SELECT sum(requests)::int AS requests FROM request_minutes`,
    ([minutes]) => expect(minutes!.requests).toBe(rows)
  )

describe.each(backends(postgres))("request_minutes on $name", (backend) => {
  it("every period summed through the minutes equals the same sums over the rows", async () => {
    const rows = fc.sample(fixture, { numRuns: 600, seed: 19 })
    await onStore(backend, (sql) =>
      Effect.gen(function*() {
        // Batches of random sizes, as the writer and the tests write them; the same minute across batches.
        for (let at = 0; at < rows.length;) {
          const size = 1 + ((at * 7919) % 97)
          yield* insert(sql, rows.slice(at, at + size))
          at += size
        }
        const wheres: ReadonlyArray<readonly [string, Statement.Fragment]> = [
          ["all", sql`TRUE`],
          ["pool of ws-a, ws-b", sql`${sql.in("model_id", ["ws-a", "ws-b"])} AND NOT byok`],
          ["acc_2", sql`account_id = ${"acc_2"}`]
        ]
        const spans = fc.sample(
          fc.record({
            a: edge(rows),
            b: edge(rows),
            inclusive: fc.boolean(),
            open: fc.boolean(),
            endsNow: fc.boolean(),
            where: fc.nat(wheres.length - 1)
          }),
          { numRuns: 120, seed: 7 }
        )
        // Edges picked by hand too: one minute exactly, within one minute, adjacent partial minutes, a span ending
        // now five seconds into a minute.
        const handPicked = [
          { a: BASE + MINUTE, b: BASE + 2 * MINUTE, inclusive: false, open: false, endsNow: false, where: 0 },
          { a: BASE + MINUTE, b: BASE + 2 * MINUTE, inclusive: true, open: false, endsNow: false, where: 0 },
          { a: BASE + MINUTE + 10_000, b: BASE + MINUTE + 50_000, inclusive: false, open: false, endsNow: false, where: 0 },
          { a: BASE + MINUTE + 30_000, b: BASE + 2 * MINUTE + 20_000, inclusive: false, open: false, endsNow: false, where: 1 },
          { a: BASE + MINUTE + 30_000, b: BASE + 4 * MINUTE + 5_000, inclusive: false, open: false, endsNow: true, where: 0 },
          { a: BASE, b: BASE, inclusive: true, open: true, endsNow: false, where: 0 }
        ]
        for (const [i, s] of [...handPicked, ...spans].entries()) {
          const span: Span = {
            from: new Date(Math.min(s.a, s.b)),
            fromInclusive: s.inclusive,
            ...(s.open ? {} : { to: new Date(Math.max(s.a, s.b)), endsNow: s.endsNow })
          }
          const [label, where] = wheres[s.where]!
          const got = yield* throughMinutes(sql, where, span)
          const want = yield* fromRows(sql, where, span)
          expectSame(got, want, `span ${i} (${label}, ${JSON.stringify(span)})`)
        }
        // The minutes hold every row: the totals of the table.
        yield* expectAllSummed(sql, rows.length)
      }))
  }, 120_000)

  it("a span that ends now reads its last partial minute as the minute's sums less the rows after now", async () => {
    await onStore(backend, (sql) =>
      Effect.gen(function*() {
        // Five seconds into a minute: read as rows, the end reads [minute, now]; ending now, (now, minute + 1).
        const span = (endsNow: boolean): Span => ({ from: new Date(BASE), fromInclusive: true, to: new Date(BASE + 2 * MINUTE + 5_000), endsNow })
        const text = (s: Span) => sql`SELECT * FROM ${spanned(sql, sql`TRUE`, s)} s`.compile()[0]
        expect(text(span(false))).toMatch(/created_at >= \$\d+ AND created_at <= \$\d+/)
        expect(text(span(false))).not.toMatch(/created_at > \$\d+ AND created_at < \$\d+/)
        expect(text(span(true))).toMatch(/created_at > \$\d+ AND created_at < \$\d+/)
        expect(text(span(true))).not.toMatch(/created_at >= \$\d+ AND created_at <= \$\d+/)
      }))
  })

  it("rows written before the migration are summed by it; later inserts add to them", async () => {
    const rows = fc.sample(fixture, { numRuns: 200, seed: 23 })
    await onStore(backend, (sql) =>
      Effect.gen(function*() {
        // Back to the state before migration 0009, with rows in the log.
        yield* sql`DROP TRIGGER request_log_minutes ON request_log`
        yield* sql`DROP FUNCTION request_minutes_add()`
        yield* sql`DROP TABLE request_minutes`
        yield* insert(sql, rows.slice(0, 150))
        yield* migration0009
        yield* insert(sql, rows.slice(150))
        const all: Span = { from: new Date(BASE - MINUTE) }
        expectSame(yield* throughMinutes(sql, sql`TRUE`, all), yield* fromRows(sql, sql`TRUE`, all), "whole table")
        yield* expectAllSummed(sql, rows.length)
      }))
  }, 120_000)
})
