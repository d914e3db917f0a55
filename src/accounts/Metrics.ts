import { Clock, Effect } from "effect"
import type { SqlClient } from "effect/sql"
import { AccountMessages, fail, type GatewayError } from "../errors/Catalog.js"
import { type GroupRow, metricsRows, recentRequestRows, type Tier } from "../telemetry/RequestQueries.js"
import { cleanText } from "../telemetry/RequestRow.js"

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
/** `range`: absent or empty gives 24h; anything outside the set is 400 listing the allowed values. */
export const parseRange = (raw: string | null): Effect.Effect<Range, GatewayError> => {
  if (raw === null || raw === "") return Effect.succeed(DEFAULT_RANGE)
  if (Object.prototype.hasOwnProperty.call(RANGES, raw)) return Effect.succeed(raw as Range)
  return Effect.fail(fail("invalid_range", { message: AccountMessages.invalidRange(RANGE_NAMES) }))
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
 * Non-number, negative, zero or empty → the default (20); fractions are floored; above the cap (50) → the cap.
 * (Zero gives the default as well: a page of no rows is never what a client means.) `GET /api/incidents` uses the
 * same rule with its own default and cap.
 */
export const parseLimit = (raw: string | null, fallback = REQUESTS_DEFAULT, max = REQUESTS_MAX): number => {
  const text = raw?.trim() ?? ""
  if (text === "") return fallback
  const n = Number(text)
  if (!Number.isFinite(n)) return fallback
  const whole = Math.floor(n)
  if (whole <= 0) return fallback
  return Math.min(whole, max)
}

const ratio = (part: number, whole: number): number | null =>
  whole > 0 ? Math.round((part / whole) * 10_000) / 10_000 : null
const ms = (x: number | null): number | null => (x === null ? null : Math.round(x))
const r2 = (x: number | null): number | null => (x === null ? null : Math.round(x * 100) / 100)

/**
 * `GET /api/user/me/metrics`: every figure is aggregated in SQL over the caller's `request_log` rows in
 * `[since, until]`, optionally of one model. Ratios and percentiles are null when their sample is empty.
 */
export const metrics = (accountId: string, range: Range, model: string | null) =>
  Effect.gen(function*() {
    const { bucket, seconds } = RANGES[range]
    const until = yield* Clock.currentTimeMillis
    const since = until - seconds * 1000
    const sinceDate = new Date(since)
    const untilDate = new Date(until)
    const { buckets, choices, codes, models, providers, totals: t } = yield* metricsRows(
      accountId,
      sinceDate,
      untilDate,
      model,
      bucket
    )

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
  })

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
export const recentRequests = (
  accountId: string,
  limit: number
): Effect.Effect<Array<RequestRowView>, never, SqlClient.SqlClient> =>
  Effect.map(recentRequestRows(accountId, limit), (rows) =>
    rows.map((r): RequestRowView => ({
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
    })))
