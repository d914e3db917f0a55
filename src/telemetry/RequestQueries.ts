/**
 * Every read of `request_log` (the layout is in RequestRow.ts): the account's metrics and recent requests, the
 * per-model usage of a quota window, the snapshot's figures and the leaderboard's day totals. Each returns the
 * rows as the database gives them; the account and inference modules shape the responses. Infrastructure
 * failures are defects (rendered 503 when the store is down).
 *
 * Every per-account query filters on `account_id` (and `created_at`), served by the (account_id, created_at)
 * index; only the leaderboard and the public status resources aggregate every account, and they run in the
 * background refresh (runtime/Refresh.ts), never per request.
 */
import { Effect } from "effect"
import { SqlClient, type Statement } from "effect/sql"
import type { PoolStanding } from "../quota/Admission.js"

// ---------------------------------------------------------------------------------------------
// Per-model usage of a quota window (`/v1/usage`, the snapshot's `plan`)

export interface ModelShare {
  readonly model_id: string
  readonly request_count: number
  readonly weighted: number
  readonly pct_of_total: number
}

/**
 * A request row is stamped when the request arrives; the window it opens starts at admission, a little
 * later. Rows this close before a window start belong to it.
 */
export const WINDOW_SLACK_MS = 5_000

/** Earliest row time counted in the window a pool standing describes, or null while inactive. */
export const windowStart = (pool: PoolStanding, lengthMs: number): number | null => {
  const start = pool.anchor_at != null ? pool.anchor_at : pool.resets_at === null ? null : pool.resets_at - lengthMs
  return start === null ? null : start - WINDOW_SLACK_MS
}

/** Successful requests per model since `since`, with each model's share of the weighted total. */
export const usageByModel = (
  accountId: string,
  since: number | null
): Effect.Effect<Array<ModelShare>, never, SqlClient.SqlClient> =>
  Effect.gen(function*() {
    if (since === null) return [] as Array<ModelShare>
    const sql = yield* SqlClient.SqlClient
    const rows = yield* sql<{ model_id: string; request_count: number; weighted: number }>`
      SELECT model_id, count(*)::int AS request_count, coalesce(sum(weighted_cost), 0)::float8 AS weighted
      FROM request_log
      WHERE account_id = ${accountId} AND status = 'success' AND created_at >= ${new Date(since)}
      GROUP BY model_id ORDER BY weighted DESC, model_id`
    const total = rows.reduce((sum, r) => sum + r.weighted, 0)
    return rows.map((r) => ({
      model_id: r.model_id,
      request_count: r.request_count,
      weighted: r.weighted,
      pct_of_total: total > 0 ? Math.round((r.weighted / total) * 10000) / 100 : 0
    }))
  }).pipe(Effect.orDie)

// ---------------------------------------------------------------------------------------------
// `GET /api/user/me/metrics`

/** Rows of `tools.choices`, and the longest choice text returned. */
export const TOOL_CHOICES_TOP = 10
export const TOOL_CHOICE_MAX_CHARS = 64
/** Rows of `by_model` and `byok.by_provider`. */
export const GROUPS_MAX = 50

/** Error tiers of `errors.by_code[].tier` and `errors.by_tier`. */
export const TIERS = ["client", "limit", "server"] as const
export type Tier = (typeof TIERS)[number]

export interface TotalsRow {
  readonly requests: number
  readonly success: number
  readonly errors: number
  readonly cancelled: number
  readonly input_tokens: number
  readonly output_tokens: number
  readonly reasoning_tokens: number
  readonly cached_tokens: number
  readonly with_tools: number
  readonly ttfb_p50: number | null
  readonly ttfb_p95: number | null
  readonly duration_p50: number | null
  readonly duration_p95: number | null
  readonly tps_avg: number | null
  readonly tps_p50: number | null
  readonly tps_max: number | null
  readonly byok_requests: number
  readonly byok_success: number
  readonly byok_errors: number
  readonly byok_fell_back: number
  readonly byok_input_tokens: number
  readonly byok_output_tokens: number
}

export interface CodeRow {
  readonly code: string
  readonly tier: Tier
  readonly count: number
}

export interface ChoiceRow {
  readonly choice: string
  readonly count: number
}

export interface GroupRow {
  readonly name: string
  readonly requests: number
  readonly success: number
  readonly errors: number
  readonly input_tokens: number
  readonly output_tokens: number
}

export interface BucketRow {
  readonly bucket: number
  readonly requests: number
  readonly success: number
  readonly errors: number
  readonly input_tokens: number
  readonly output_tokens: number
}

export interface MetricsRows {
  readonly totals: TotalsRow
  readonly codes: ReadonlyArray<CodeRow>
  readonly choices: ReadonlyArray<ChoiceRow>
  readonly models: ReadonlyArray<GroupRow>
  readonly providers: ReadonlyArray<GroupRow>
  /** Non-empty buckets only, `bucket` being the bucket's start in epoch seconds. */
  readonly buckets: ReadonlyArray<BucketRow>
}

/**
 * The metrics aggregates over the account's rows in `[since, until]`, optionally of one model, bucketed by
 * `bucketSeconds` for the series. Every figure is computed in SQL.
 */
export const metricsRows = (
  accountId: string,
  since: Date,
  until: Date,
  model: string | null,
  bucketSeconds: number
): Effect.Effect<MetricsRows, never, SqlClient.SqlClient> =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    // One filter for every query below.
    const scope = sql`account_id = ${accountId} AND created_at >= ${since} AND created_at <= ${until}
      AND (${model}::text IS NULL OR model_id = ${model}::text)`
    const tier = sql`CASE WHEN http_status IN (429, 529) THEN 'limit' WHEN http_status >= 500 THEN 'server' ELSE 'client' END`

    const [totals] = yield* sql<TotalsRow>`
      SELECT
        count(*) AS requests,
        count(*) FILTER (WHERE status = 'success') AS success,
        count(*) FILTER (WHERE status = 'error') AS errors,
        count(*) FILTER (WHERE status = 'cancelled') AS cancelled,
        coalesce(sum(input_tokens), 0)::bigint AS input_tokens,
        coalesce(sum(output_tokens), 0)::bigint AS output_tokens,
        coalesce(sum(reasoning_tokens), 0)::bigint AS reasoning_tokens,
        coalesce(sum(prompt_cached_tokens), 0)::bigint AS cached_tokens,
        count(*) FILTER (WHERE had_tools) AS with_tools,
        percentile_cont(0.5) WITHIN GROUP (ORDER BY ttfb_ms) FILTER (WHERE status = 'success') AS ttfb_p50,
        percentile_cont(0.95) WITHIN GROUP (ORDER BY ttfb_ms) FILTER (WHERE status = 'success') AS ttfb_p95,
        percentile_cont(0.5) WITHIN GROUP (ORDER BY duration_ms) FILTER (WHERE status = 'success') AS duration_p50,
        percentile_cont(0.95) WITHIN GROUP (ORDER BY duration_ms) FILTER (WHERE status = 'success') AS duration_p95,
        avg(tps) FILTER (WHERE status = 'success' AND tps > 0) AS tps_avg,
        percentile_cont(0.5) WITHIN GROUP (ORDER BY tps) FILTER (WHERE status = 'success' AND tps > 0) AS tps_p50,
        max(tps) FILTER (WHERE status = 'success' AND tps > 0) AS tps_max,
        count(*) FILTER (WHERE byok) AS byok_requests,
        count(*) FILTER (WHERE byok AND status = 'success') AS byok_success,
        count(*) FILTER (WHERE byok AND status <> 'success') AS byok_errors,
        count(*) FILTER (WHERE byok AND fell_back) AS byok_fell_back,
        coalesce(sum(input_tokens) FILTER (WHERE byok), 0)::bigint AS byok_input_tokens,
        coalesce(sum(output_tokens) FILTER (WHERE byok), 0)::bigint AS byok_output_tokens
      FROM request_log WHERE ${scope}`

    // A cancelled row's error_code is `cancelled` (as `/requests` shows it); rows written before it was null.
    const codes = yield* sql<CodeRow>`
      SELECT coalesce(error_code, CASE WHEN status = 'cancelled' THEN 'cancelled' ELSE 'unknown' END) AS code,
        ${tier} AS tier, count(*) AS count
      FROM request_log WHERE ${scope} AND status <> 'success'
      GROUP BY 1, 2 ORDER BY count DESC, code, tier`

    const choices = yield* sql<ChoiceRow>`
      SELECT left(coalesce(tool_choice, 'unset'), ${TOOL_CHOICE_MAX_CHARS}::int) AS choice, count(*) AS count
      FROM request_log WHERE ${scope} AND had_tools
      GROUP BY 1 ORDER BY count DESC, choice LIMIT ${TOOL_CHOICES_TOP}::int`

    const group = (column: "model_id" | "provider", where: Statement.Fragment) =>
      sql<GroupRow>`
        SELECT coalesce(${sql(column)}, 'unknown') AS name, count(*) AS requests,
          count(*) FILTER (WHERE status = 'success') AS success,
          count(*) FILTER (WHERE status <> 'success') AS errors,
          coalesce(sum(input_tokens), 0)::bigint AS input_tokens,
          coalesce(sum(output_tokens), 0)::bigint AS output_tokens
        FROM request_log WHERE ${scope} AND ${where}
        GROUP BY 1 ORDER BY requests DESC, name LIMIT ${GROUPS_MAX}::int`
    const models = yield* group("model_id", sql`TRUE`)
    const providers = yield* group("provider", sql`byok`)

    const buckets = yield* sql<BucketRow>`
      SELECT (floor(extract(epoch FROM created_at) / ${bucketSeconds}::int) * ${bucketSeconds}::int)::bigint AS bucket,
        count(*) AS requests,
        count(*) FILTER (WHERE status = 'success') AS success,
        count(*) FILTER (WHERE status <> 'success') AS errors,
        coalesce(sum(input_tokens), 0)::bigint AS input_tokens,
        coalesce(sum(output_tokens), 0)::bigint AS output_tokens
      FROM request_log WHERE ${scope}
      GROUP BY 1 ORDER BY 1`

    return { totals: totals!, codes, choices, models, providers, buckets }
  }).pipe(Effect.orDie)

// ---------------------------------------------------------------------------------------------
// `GET /api/user/me/requests`

/** The spec's Request row, as stored (the view turns `created_at` into ISO text). */
export interface RecentRequestRow {
  readonly id: number
  readonly created_at: Date
  readonly model_id: string
  readonly status: string
  readonly error_code: string | null
  readonly input_tokens: number
  readonly output_tokens: number
  readonly reasoning_tokens: number
  readonly prompt_cached_tokens: number
  readonly duration_ms: number
  readonly tps: number
  readonly had_tools: boolean
  readonly byok: boolean
  readonly fell_back: boolean
}

/** The account's newest rows first (no cursor). */
export const recentRequestRows = (
  accountId: string,
  limit: number
): Effect.Effect<ReadonlyArray<RecentRequestRow>, never, SqlClient.SqlClient> =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    return yield* sql<RecentRequestRow>`
      SELECT id, created_at, model_id, status, error_code, input_tokens, output_tokens, reasoning_tokens,
        prompt_cached_tokens, duration_ms, tps, had_tools, byok, fell_back
      FROM request_log WHERE account_id = ${accountId}
      ORDER BY created_at DESC, id DESC LIMIT ${limit}::int`
  }).pipe(Effect.orDie)

// ---------------------------------------------------------------------------------------------
// `GET /api/user/me` (the snapshot)

export interface SnapshotRecentRow {
  readonly id: number
  readonly model_id: string
  readonly status: string
  readonly created_at: Date
  readonly input_tokens: number
  readonly output_tokens: number
  readonly tps: number
  readonly error: string | null
}

export interface ModelDayRow {
  readonly model_id: string
  readonly requests: number
  readonly successes: number
  readonly input_tokens: number
  readonly output_tokens: number
}

export interface TodaySelfRow {
  readonly tokens: number
  readonly requests: number
  readonly attempted: number
}

export interface SnapshotRows {
  readonly recent: ReadonlyArray<SnapshotRecentRow>
  /** Per model over the last 24 hours (since `dayAgo`). */
  readonly models: ReadonlyArray<ModelDayRow>
  /** The account's own figures of the leaderboard day (since `dayStart`). */
  readonly self: TodaySelfRow
}

/** The snapshot's own figures of one account: its `recent` newest rows, its last day per model, its today. */
export const snapshotRows = (
  accountId: string,
  recent: number,
  dayAgo: Date,
  dayStart: Date
): Effect.Effect<SnapshotRows, never, SqlClient.SqlClient> =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const rows = yield* sql<SnapshotRecentRow>`
      SELECT id, model_id, status, created_at, input_tokens, output_tokens, tps, error
      FROM request_log WHERE account_id = ${accountId}
      ORDER BY created_at DESC, id DESC LIMIT ${recent}`
    const models = yield* sql<ModelDayRow>`
      SELECT model_id, count(*)::int AS requests,
        count(*) FILTER (WHERE status = 'success')::int AS successes,
        coalesce(sum(input_tokens), 0)::bigint AS input_tokens,
        coalesce(sum(output_tokens), 0)::bigint AS output_tokens
      FROM request_log WHERE account_id = ${accountId} AND created_at >= ${dayAgo}
      GROUP BY model_id ORDER BY requests DESC, model_id`
    const self = yield* sql<TodaySelfRow>`
      SELECT coalesce(sum(input_tokens::bigint + output_tokens), 0)::bigint AS tokens,
        count(*) FILTER (WHERE status = 'success')::int AS requests,
        count(*)::int AS attempted
      FROM request_log WHERE account_id = ${accountId} AND created_at >= ${dayStart}`
    return { recent: rows, models, self: self[0]! }
  }).pipe(Effect.orDie)

// ---------------------------------------------------------------------------------------------
// The leaderboard

/** Today's token totals (input + output) of every non-guest account with any, largest first. */
export const leaderboardTotals = (sql: SqlClient.SqlClient, dayStart: Date): Effect.Effect<Float64Array> =>
  sql<{ tokens: number }>`
    SELECT sum(r.input_tokens + r.output_tokens)::bigint AS tokens
    FROM ${spanned(sql, sql`TRUE`, { from: dayStart, fromInclusive: true })} r JOIN accounts a ON a.id = r.account_id
    WHERE NOT a.is_guest
    GROUP BY r.account_id
    HAVING sum(r.input_tokens + r.output_tokens) > 0
    ORDER BY tokens DESC`.pipe(
    Effect.map((rows) => Float64Array.from(rows, (row) => Number(row.tokens))),
    Effect.orDie
  )

// ---------------------------------------------------------------------------------------------
// Periods summed from whole minutes (the public status resources, the leaderboard)

const MINUTE_MS = 60_000

/** A period of request rows: `(from, to]`, or `[from, to]` when `fromInclusive`; no upper bound without `to`. */
export interface Span {
  readonly from: Date
  readonly fromInclusive?: boolean
  readonly to?: Date
  /**
   * `to` is the present: the rows after it are the few written since, so its partial minute is always read as the
   * minute's sums less those rows, never as the rows of the minute so far (up to a minute of rows under load).
   */
  readonly endsNow?: boolean
}

/**
 * The request rows of `span` matching `where` (on `model_id`, `account_id` and `byok` only, the columns both tables
 * have), as summed rows: the whole minutes inside the span from `request_minutes` (kept by a trigger on every
 * insert, migration 0009), and each partial minute at its two ends from whichever side of the edge is shorter:
 * its rows from `request_log` (a short index range), or its minute's sums less the rows of the minute outside the
 * span (negative rows); a span that `endsNow` always takes the second way at its end, reading the rows after now,
 * which are none or few, instead of the rows of the current minute so far. A span's start reads at most half a
 * minute of rows. The sums are exact whatever the span's edges. Columns: `model_id`, `account_id`, `byok`, `at`
 * (a row's time, a minute's start, or for an edge summed from its minute the edge's whole-minute side),
 * `requests`, `successes`, `failures` (MODEL_FAILURE), `ttfb_sum`/`ttfb_count` and `tps_sum`/`tps_count` (successes
 * with a figure), `input_tokens`, `output_tokens`. Only sums over these rows are meaningful (some rows count
 * negatively).
 */
export const spanned = (sql: SqlClient.SqlClient, where: Statement.Fragment, span: Span): Statement.Fragment => {
  const from = span.from.getTime()
  const inclusive = span.fromInclusive === true
  const lo = inclusive ? Math.ceil(from / MINUTE_MS) * MINUTE_MS : (Math.floor(from / MINUTE_MS) + 1) * MINUTE_MS
  const hi = span.to === undefined ? Number.POSITIVE_INFINITY : Math.floor(span.to.getTime() / MINUTE_MS) * MINUTE_MS
  const after = inclusive ? sql`created_at >= ${span.from}` : sql`created_at > ${span.from}`
  /** Rows of `range`, each counted once, or subtracted (`negative`); `at` the row's time unless given. */
  const raw = (range: Statement.Fragment, negative = false, at?: Date) => {
    const n = sql.literal(negative ? "-" : "")
    return sql`SELECT model_id, account_id, byok, ${at === undefined ? sql`created_at` : sql`${at}::timestamptz`} AS at,
        ${n}1 AS requests,
        ${n}(status = 'success')::int AS successes, ${n}(${sql.literal(MODEL_FAILURE)})::int AS failures,
        ${n}(CASE WHEN status = 'success' AND ttfb_ms IS NOT NULL THEN ttfb_ms ELSE 0 END)::float8 AS ttfb_sum,
        ${n}(status = 'success' AND ttfb_ms IS NOT NULL)::int AS ttfb_count,
        ${n}(CASE WHEN status = 'success' AND tps > 0 THEN tps ELSE 0 END)::float8 AS tps_sum,
        ${n}(status = 'success' AND tps > 0)::int AS tps_count,
        ${n}(input_tokens::bigint) AS input_tokens, ${n}(output_tokens::bigint) AS output_tokens
      FROM request_log WHERE ${where} AND ${range}`
  }
  const minutes = (range: Statement.Fragment, at?: Date) =>
    sql`SELECT model_id, account_id, byok, ${at === undefined ? sql`minute` : sql`${at}::timestamptz`} AS at, requests,
      successes, failures, ttfb_sum, ttfb_count, tps_sum, tps_count, input_tokens, output_tokens
    FROM request_minutes WHERE ${where} AND ${range}`
  // Within one minute (or two adjacent partial ones): rows only.
  if (lo > hi) return sql`(${raw(sql`${after} AND created_at <= ${span.to!}`)})`
  const loDate = new Date(lo)
  const parts: Array<Statement.Fragment> = [
    minutes(span.to === undefined ? sql`minute >= ${loDate}` : sql`minute >= ${loDate} AND minute < ${new Date(hi)}`)
  ]
  // The start's partial minute [lo - 1 min, lo): the span's part of it, (from, lo), or the minute less [.., from].
  if (from < lo) {
    const start = new Date(lo - MINUTE_MS)
    if (lo - from <= from - start.getTime()) parts.push(raw(sql`${after} AND created_at < ${loDate}`))
    else {
      const before = inclusive ? sql`created_at < ${span.from}` : sql`created_at <= ${span.from}`
      parts.push(
        minutes(sql`minute = ${start}`, loDate),
        raw(sql`created_at >= ${start} AND ${before}`, true, loDate)
      )
    }
  }
  // The end's partial minute [hi, hi + 1 min): the span's part of it, [hi, to], or the minute less (to, ..).
  if (span.to !== undefined) {
    const to = span.to.getTime()
    const hiDate = new Date(hi)
    const end = new Date(hi + MINUTE_MS)
    const rowsSoFar = span.endsNow !== true && to - hi <= end.getTime() - to
    if (rowsSoFar) parts.push(raw(sql`created_at >= ${hiDate} AND created_at <= ${span.to}`))
    else {
      parts.push(
        minutes(sql`minute = ${hiDate}`),
        raw(sql`created_at > ${span.to} AND created_at < ${end}`, true, hiDate)
      )
    }
  }
  return sql`(${sql.join(" UNION ALL ", false)(parts)})`
}

// ---------------------------------------------------------------------------------------------
// The public status resources (status/Status.ts). Each runs in the background refresh, never per request.
// Periods are summed through `spanned` (whole minutes from request_minutes, the edges from request_log by index);
// the most recent rows per model read the (model_id, created_at) index, the active accounts the
// (account_id, created_at) index.

/**
 * A failure the model is to blame for: a 5xx of the model or the gateway. Refusals of the caller's own making
 * (4xx, quota and rate limits), capacity refusals (529: the concurrency gate, before any upstream call) and
 * client disconnects (`cancelled`) are not.
 */
const MODEL_FAILURE = "status = 'error' AND http_status >= 500 AND http_status <> 529"

/** Per model: what decides its health and speed. `window` rows are the health window's. */
export interface FleetHealthRow {
  readonly model_id: string
  readonly window_successes: number
  readonly window_failures: number
  /** Mean over the last hour of successful requests; null without any. */
  readonly ttfb_ms: number | null
  readonly tps: number | null
}

export interface FleetRecentRow {
  readonly model_id: string
  readonly attempts: number
  readonly failures: number
}

export interface FleetBucketRow {
  readonly model_id: string
  /** 0: the 10 minutes ending now, 1: the 10 before, ... */
  readonly age: number
  readonly output_tokens: number
}

export interface FleetRows {
  readonly health: ReadonlyArray<FleetHealthRow>
  readonly recent: ReadonlyArray<FleetRecentRow>
  readonly buckets: ReadonlyArray<FleetBucketRow>
  /** Models with any request (any outcome) since `idleSince`. */
  readonly seen: ReadonlyArray<string>
}

export const SPARK_BUCKETS = 7
export const SPARK_BUCKET_MS = 10 * 60_000

/**
 * The fleet's figures at `now` for `models`, from pool traffic only (BYOK requests go to the caller's own
 * provider, not the fleet): rows in `(now - x, now]`.
 */
export const fleetRows = (
  sql: SqlClient.SqlClient,
  input: {
    readonly models: ReadonlyArray<string>
    readonly now: number
    readonly windowMs: number
    readonly recent: number
    readonly idleMs: number
  }
): Effect.Effect<FleetRows> =>
  Effect.gen(function*() {
    if (input.models.length === 0) return { health: [], recent: [], buckets: [], seen: [] }
    const now = new Date(input.now)
    const windowSince = new Date(input.now - input.windowMs)
    const hourAgo = new Date(input.now - 3_600_000)
    const sparkSince = new Date(input.now - SPARK_BUCKETS * SPARK_BUCKET_MS)
    const failure = sql.literal(MODEL_FAILURE)
    const pool = sql`${sql.in("model_id", input.models)} AND NOT byok`

    // Each period summed from whole minutes (`spanned`): what a refresh reads follows the minutes and the active
    // accounts, not the rows.
    const window = yield* sql<{ model_id: string; successes: number; failures: number }>`
      SELECT model_id, sum(successes)::int AS successes, sum(failures)::int AS failures
      FROM ${spanned(sql, pool, { from: windowSince, to: now, endsNow: true })} w GROUP BY model_id`
    const speed = yield* sql<{ model_id: string; ttfb_ms: number | null; tps: number | null }>`
      SELECT model_id, (sum(ttfb_sum) / nullif(sum(ttfb_count), 0))::float8 AS ttfb_ms,
        (sum(tps_sum) / nullif(sum(tps_count), 0))::float8 AS tps
      FROM ${spanned(sql, pool, { from: hourAgo, to: now, endsNow: true })} h GROUP BY model_id`

    // The newest `recent` counted rows of each model: a few steps down the (model_id, created_at) index per model,
    // where numbering every row of the window (a window function) sorted the whole window on every refresh. Without
    // statistics (the embedded database never analyzes) the planner expects a window of a few rows and reads all of
    // it through a bitmap scan to sort it: 1.1 s per refresh at 1,000 requests/s against 1 ms for the index walk
    // (`bench/status-refresh.ts`); bitmap scans are off for this one statement.
    const recent = yield* sql.withTransaction(Effect.andThen(
      sql`SET LOCAL enable_bitmapscan = off`,
      sql<FleetRecentRow>`
      SELECT m.model_id, count(*)::int AS attempts, count(*) FILTER (WHERE newest.failed)::int AS failures
      FROM (SELECT DISTINCT unnest(${input.models}::text[]) AS model_id) m
      CROSS JOIN LATERAL (
        SELECT (${failure}) AS failed FROM request_log
        WHERE model_id = m.model_id AND NOT byok AND created_at <= ${now} AND created_at > ${windowSince}
          AND (status = 'success' OR (${failure}))
        ORDER BY created_at DESC, id DESC LIMIT ${input.recent}::int
      ) newest
      GROUP BY m.model_id`
    ))

    const buckets = yield* sql<FleetBucketRow>`
      SELECT model_id,
        floor(extract(epoch FROM (${now}::timestamptz - at)) * 1000 / ${SPARK_BUCKET_MS}::int)::int AS age,
        coalesce(sum(output_tokens), 0)::bigint AS output_tokens
      FROM ${spanned(sql, pool, { from: sparkSince, to: now, endsNow: true })} s
      GROUP BY 1, 2`

    const byModel = new Map<string, { window_successes: number; window_failures: number; ttfb_ms: number | null; tps: number | null }>()
    const entry = (model: string) => {
      let e = byModel.get(model)
      if (e === undefined) byModel.set(model, e = { window_successes: 0, window_failures: 0, ttfb_ms: null, tps: null })
      return e
    }
    for (const row of window) Object.assign(entry(row.model_id), { window_successes: row.successes, window_failures: row.failures })
    for (const row of speed) Object.assign(entry(row.model_id), { ttfb_ms: row.ttfb_ms, tps: row.tps })
    for (const row of buckets) entry(row.model_id)
    const health: Array<FleetHealthRow> = [...byModel].map(([model_id, e]) => ({ model_id, ...e }))

    // Idle: one index probe per model without traffic in the aggregates above.
    const active = new Set(health.map((row) => row.model_id))
    const seen = [...active]
    const idleSince = new Date(input.now - input.idleMs)
    for (const model of input.models) {
      if (active.has(model)) continue
      const rows = yield* sql<{ one: number }>`
        SELECT 1 AS one FROM request_log
        WHERE model_id = ${model} AND NOT byok AND created_at > ${idleSince} AND created_at <= ${now} LIMIT 1`
      if (rows.length > 0) seen.push(model)
    }
    return { health, recent, buckets, seen }
  }).pipe(Effect.orDie)

/** Successful pool requests to `models` since `since` (the quota day). */
export const requestsSince = (
  sql: SqlClient.SqlClient,
  models: ReadonlyArray<string>,
  since: Date
): Effect.Effect<number> =>
  models.length === 0 ? Effect.succeed(0) : sql<{ n: number }>`
    SELECT coalesce(sum(successes), 0)::int AS n
    FROM ${spanned(sql, sql`${sql.in("model_id", models)} AND NOT byok`, { from: since, fromInclusive: true })} d`.pipe(
    Effect.map((rows) => rows[0]?.n ?? 0),
    Effect.orDie
  )

export interface ServerRow {
  /** Accounts with a request since `activeSince`. */
  readonly users: number
  /** Output tokens of the last 10 minutes. */
  readonly output_tokens: number
}

/** Active accounts since `activeSince`, and the output of the 10 minutes before `now`: all traffic. */
export const serverRow = (sql: SqlClient.SqlClient, activeSince: Date, now: Date): Effect.Effect<ServerRow> =>
  Effect.gen(function*() {
    const tenMinutesAgo = new Date(now.getTime() - SPARK_BUCKET_MS)
    // Every account that ever sent a request, one step along the (account_id, created_at) index each, and one
    // probe of the same index for a row in the period: the work follows the number of accounts, where a count of
    // distinct accounts over the period's rows read every row of the last `active_users_hours` on every refresh.
    // The probe is a LATERAL with LIMIT so that the planner keeps it a probe (an EXISTS became a join over the
    // period's rows).
    const [users] = yield* sql<{ users: number }>`
      WITH RECURSIVE seen(account_id) AS (
        (SELECT account_id FROM request_log ORDER BY account_id LIMIT 1)
        UNION ALL
        SELECT (SELECT r.account_id FROM request_log r WHERE r.account_id > seen.account_id ORDER BY r.account_id LIMIT 1)
        FROM seen WHERE seen.account_id IS NOT NULL
      )
      SELECT count(*)::int AS users FROM seen
      CROSS JOIN LATERAL (
        SELECT 1 FROM request_log r
        WHERE r.account_id = seen.account_id AND r.created_at >= ${activeSince} AND r.created_at <= ${now} LIMIT 1
      ) active
      WHERE seen.account_id IS NOT NULL`
    const [output] = yield* sql<{ output_tokens: number }>`
      SELECT coalesce(sum(output_tokens), 0)::bigint AS output_tokens
      FROM ${spanned(sql, sql`TRUE`, { from: tenMinutesAgo, to: now, endsNow: true })} o`
    return { users: users?.users ?? 0, output_tokens: output?.output_tokens ?? 0 }
  }).pipe(Effect.orDie)

export interface AllTimeRow {
  /** Successful requests. */
  readonly requests: number
  readonly input: number
  readonly output: number
}

/** Totals over every row ever written, from the minute sums (which hold every row). */
export const allTimeRow = (sql: SqlClient.SqlClient): Effect.Effect<AllTimeRow> =>
  sql<AllTimeRow>`
    SELECT coalesce(sum(successes), 0)::bigint AS requests,
      coalesce(sum(input_tokens), 0)::bigint AS input,
      coalesce(sum(output_tokens), 0)::bigint AS output
    FROM request_minutes`.pipe(
    Effect.map((rows) => rows[0] ?? { requests: 0, input: 0, output: 0 }),
    Effect.orDie
  )
