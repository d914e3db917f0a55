import { Clock, Effect } from "effect"
import { SqlClient, type Statement } from "effect/sql"
import { fail, type GatewayError } from "../errors/Catalog.js"
import { cleanText } from "../telemetry/RequestLog.js"

/** Allowed `range` values, their length and the series bucket size (about 50–60 buckets each). */
export const RANGES = {
  "1h": { seconds: 3_600, bucket: 60 },
  "4h": { seconds: 14_400, bucket: 300 },
  "24h": { seconds: 86_400, bucket: 1_800 },
  "7d": { seconds: 604_800, bucket: 10_800 },
  "30d": { seconds: 2_592_000, bucket: 43_200 }
} as const
export type Range = keyof typeof RANGES
export const RANGE_NAMES = Object.keys(RANGES) as ReadonlyArray<Range>
export const DEFAULT_RANGE: Range = "24h"

/** Longest `model` filter; longer values are truncated, never rejected. */
export const MODEL_FILTER_MAX = 128
/** Entries of `tools.choices`, and the longest choice text returned. */
export const TOOL_CHOICES_TOP = 10
export const TOOL_CHOICE_MAX_CHARS = 64
/** Rows of `by_model` and `byok.by_provider`. */
const GROUPS_MAX = 50

/** Error tiers of `errors.by_code[].tier` and `errors.by_tier`. */
export const TIERS = ["client", "limit", "server"] as const
export type Tier = (typeof TIERS)[number]

/** `range`: absent or empty gives 24h; anything outside the set is 400 listing the allowed values. */
export const parseRange = (raw: string | null): Effect.Effect<Range, GatewayError> => {
  if (raw === null || raw === "") return Effect.succeed(DEFAULT_RANGE)
  if (Object.prototype.hasOwnProperty.call(RANGES, raw)) return Effect.succeed(raw as Range)
  return Effect.fail(fail("invalid_range", {
    message: `range 값이 올바르지 않습니다. 허용되는 값: ${RANGE_NAMES.join(", ")}`
  }))
}

/**
 * `model`: not validated against the catalog, truncated to 128 characters; empty means unset. Control characters
 * and lone surrogates are cleaned as they are in stored rows (a NUL would be refused by the database), so the
 * filter matches what was recorded.
 */
export const parseModel = (raw: string | null): string | null => {
  if (raw === null || raw === "") return null
  const cut = Array.from(raw).slice(0, MODEL_FILTER_MAX).join("")
  return cleanText(cut, cut.length)
}

/** `limit` of the requests endpoint. */
export const REQUESTS_DEFAULT = 20
export const REQUESTS_MAX = 50

/**
 * Non-number, negative, zero or empty → 20; fractions are floored; above 50 → 50.
 * (Zero gives 20 as well: a page of no rows is never what a client means.)
 */
export const parseLimit = (raw: string | null): number => {
  const text = raw?.trim() ?? ""
  if (text === "") return REQUESTS_DEFAULT
  const n = Number(text)
  if (!Number.isFinite(n)) return REQUESTS_DEFAULT
  const whole = Math.floor(n)
  if (whole <= 0) return REQUESTS_DEFAULT
  return Math.min(whole, REQUESTS_MAX)
}

const ratio = (part: number, whole: number): number | null =>
  whole > 0 ? Math.round((part / whole) * 10_000) / 10_000 : null
const ms = (x: number | null): number | null => (x === null ? null : Math.round(x))
const r2 = (x: number | null): number | null => (x === null ? null : Math.round(x * 100) / 100)

interface TotalsRow {
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

interface CodeRow {
  readonly code: string
  readonly tier: Tier
  readonly count: number
}

interface GroupRow {
  readonly name: string
  readonly requests: number
  readonly success: number
  readonly errors: number
  readonly input_tokens: number
  readonly output_tokens: number
}

interface BucketRow {
  readonly bucket: number
  readonly requests: number
  readonly success: number
  readonly errors: number
  readonly input_tokens: number
  readonly output_tokens: number
}

/**
 * `GET /api/user/me/metrics`: every figure is aggregated in SQL over the caller's `request_log` rows in
 * `[since, until]`, optionally of one model. Ratios and percentiles are null when their sample is empty.
 */
export const metrics = (accountId: string, range: Range, model: string | null) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const { bucket, seconds } = RANGES[range]
    const until = yield* Clock.currentTimeMillis
    const since = until - seconds * 1000
    const sinceDate = new Date(since)
    const untilDate = new Date(until)
    // One filter for every query below.
    const scope = sql`account_id = ${accountId} AND created_at >= ${sinceDate} AND created_at <= ${untilDate}
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

    const choices = yield* sql<{ readonly choice: string; readonly count: number }>`
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
      SELECT (floor(extract(epoch FROM created_at) / ${bucket}::int) * ${bucket}::int)::bigint AS bucket,
        count(*) AS requests,
        count(*) FILTER (WHERE status = 'success') AS success,
        count(*) FILTER (WHERE status <> 'success') AS errors,
        coalesce(sum(input_tokens), 0)::bigint AS input_tokens,
        coalesce(sum(output_tokens), 0)::bigint AS output_tokens
      FROM request_log WHERE ${scope}
      GROUP BY 1 ORDER BY 1`

    const t = totals!
    const byTier: Record<Tier, number> = { client: 0, limit: 0, server: 0 }
    for (const row of codes) byTier[row.tier] += row.count

    // Dense series: every bucket from the one holding `since` to the one holding `until`, zeros included.
    const byStart = new Map(buckets.map((b) => [Number(b.bucket), b]))
    const series: Array<Record<string, unknown>> = []
    const first = Math.floor(since / 1000 / bucket) * bucket
    const last = Math.floor(until / 1000 / bucket) * bucket
    for (let start = first; start <= last; start += bucket) {
      const b = byStart.get(start)
      series.push({
        start: new Date(start * 1000).toISOString(),
        requests: b?.requests ?? 0,
        success: b?.success ?? 0,
        errors: b?.errors ?? 0,
        input_tokens: b?.input_tokens ?? 0,
        output_tokens: b?.output_tokens ?? 0,
        total_tokens: (b?.input_tokens ?? 0) + (b?.output_tokens ?? 0)
      })
    }

    const groupView = (g: GroupRow) => ({
      requests: g.requests,
      success: g.success,
      errors: g.errors,
      success_rate: ratio(g.success, g.requests),
      input_tokens: g.input_tokens,
      output_tokens: g.output_tokens,
      total_tokens: g.input_tokens + g.output_tokens
    })

    return {
      range,
      model,
      since: sinceDate.toISOString(),
      until: untilDate.toISOString(),
      bucket_seconds: bucket,
      totals: {
        requests: t.requests,
        success: t.success,
        errors: t.errors,
        cancelled: t.cancelled,
        success_rate: ratio(t.success, t.requests)
      },
      latency: {
        ttfb_p50: ms(t.ttfb_p50),
        ttfb_p95: ms(t.ttfb_p95),
        duration_p50: ms(t.duration_p50),
        duration_p95: ms(t.duration_p95)
      },
      tps: { avg: r2(t.tps_avg), p50: r2(t.tps_p50), max: r2(t.tps_max) },
      tokens: {
        input: t.input_tokens,
        output: t.output_tokens,
        reasoning: t.reasoning_tokens,
        cached: t.cached_tokens,
        total: t.input_tokens + t.output_tokens,
        cache_rate: ratio(t.cached_tokens, t.input_tokens)
      },
      tools: {
        with_tools: t.with_tools,
        with_tools_rate: ratio(t.with_tools, t.requests),
        choices: choices.map((c) => ({ choice: c.choice, count: c.count }))
      },
      errors: {
        total: t.requests - t.success,
        by_code: codes.map((c) => ({ code: c.code, tier: c.tier, count: c.count })),
        by_tier: byTier
      },
      by_model: models.map((g) => ({ model_id: g.name, ...groupView(g) })),
      byok: {
        requests: t.byok_requests,
        success: t.byok_success,
        errors: t.byok_errors,
        fell_back: t.byok_fell_back,
        input_tokens: t.byok_input_tokens,
        output_tokens: t.byok_output_tokens,
        total_tokens: t.byok_input_tokens + t.byok_output_tokens,
        by_provider: providers.map((g) => ({ provider: g.name, ...groupView(g) }))
      },
      series
    }
  }).pipe(Effect.orDie)

/** The spec's Request row, exactly these fields (the provider is not on the row). */
export interface RequestRowView {
  readonly id: number
  readonly created_at: string
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

/** `GET /api/user/me/requests`: the caller's newest rows first, no cursor. */
export const recentRequests = (accountId: string, limit: number) =>
  Effect.gen(function*() {
    const sql = yield* SqlClient.SqlClient
    const rows = yield* sql<Omit<RequestRowView, "created_at"> & { readonly created_at: Date }>`
      SELECT id, created_at, model_id, status, error_code, input_tokens, output_tokens, reasoning_tokens,
        prompt_cached_tokens, duration_ms, tps, had_tools, byok, fell_back
      FROM request_log WHERE account_id = ${accountId}
      ORDER BY created_at DESC, id DESC LIMIT ${limit}::int`
    return rows.map((r): RequestRowView => ({
      id: r.id,
      created_at: r.created_at.toISOString(),
      model_id: r.model_id,
      status: r.status,
      error_code: r.error_code,
      input_tokens: r.input_tokens,
      output_tokens: r.output_tokens,
      reasoning_tokens: r.reasoning_tokens,
      prompt_cached_tokens: r.prompt_cached_tokens,
      duration_ms: r.duration_ms,
      tps: r.tps,
      had_tools: r.had_tools,
      byok: r.byok,
      fell_back: r.fell_back
    }))
  }).pipe(Effect.orDie)
