/**
 * A model's health, passive: decided from the request rows real traffic left (never from probe requests).
 *
 * Counted requests are successes and failures the model is to blame for (a 5xx other than 529; see
 * `telemetry/RequestQueries.ts` `MODEL_FAILURE`). Client errors (4xx), quota and rate-limit refusals, capacity
 * refusals (529) and client disconnects are neither, so they never make a model look unwell.
 *
 * In this order (`status.health` in the config):
 * - `idle`: no request at all (of any outcome) for `idle_hours`;
 * - `down`: of the `down_recent` most recent counted requests in the window (at least `min_requests` of them),
 *   more than `down_error_rate` failed;
 * - `degraded`: of the window's counted requests (at least `min_requests`), at least `degraded_error_rate` failed;
 * - `ok` otherwise, including too little traffic to tell.
 */
import type { HealthRules } from "../config/Status.js"
import { type FleetRows, SPARK_BUCKET_MS, SPARK_BUCKETS } from "../telemetry/RequestQueries.js"

export const MODEL_STATUSES = ["ok", "degraded", "down", "idle"] as const
export type ModelStatus = (typeof MODEL_STATUSES)[number]

export interface HealthFigures {
  /** Any request in the last `idle_hours`. */
  readonly seen: boolean
  readonly windowSuccesses: number
  readonly windowFailures: number
  readonly recentAttempts: number
  readonly recentFailures: number
}

export const classify = (f: HealthFigures, rules: HealthRules): ModelStatus => {
  if (!f.seen) return "idle"
  if (f.recentAttempts >= rules.min_requests && f.recentFailures / f.recentAttempts > rules.down_error_rate) return "down"
  const attempts = f.windowSuccesses + f.windowFailures
  if (attempts >= rules.min_requests && f.windowFailures / attempts >= rules.degraded_error_rate) return "degraded"
  return "ok"
}

/** One model's entry of the fleet resource, as computed in the background. */
export interface ModelHealth {
  readonly status: ModelStatus
  /** Output tokens per second of each 10-minute bucket of the last 70 minutes, oldest first. */
  readonly sparkline: ReadonlyArray<number>
  /** Mean generation speed (output tokens/s) of the last hour's successful requests; null without any. */
  readonly tps: number | null
  /** Mean time to first byte (ms) of the last hour's successful requests; null without any. */
  readonly ttfb_ms: number | null
}

const round2 = (x: number) => Math.round(x * 100) / 100

/** Health of every model in `models` from the aggregates (a model without rows is idle). */
export const fleetHealth = (
  rows: FleetRows,
  models: ReadonlyArray<string>,
  rules: HealthRules
): Record<string, ModelHealth> => {
  const seen = new Set(rows.seen)
  const health = new Map(rows.health.map((r) => [r.model_id, r]))
  const recent = new Map(rows.recent.map((r) => [r.model_id, r]))
  const sparks = new Map<string, Array<number>>()
  for (const b of rows.buckets) {
    if (b.age < 0 || b.age >= SPARK_BUCKETS) continue
    const line = sparks.get(b.model_id) ?? Array.from({ length: SPARK_BUCKETS }, () => 0)
    line[SPARK_BUCKETS - 1 - b.age] = round2(Number(b.output_tokens) / (SPARK_BUCKET_MS / 1000))
    sparks.set(b.model_id, line)
  }
  const out: Record<string, ModelHealth> = {}
  for (const id of models) {
    const h = health.get(id)
    const r = recent.get(id)
    out[id] = {
      status: classify({
        seen: seen.has(id),
        windowSuccesses: h?.window_successes ?? 0,
        windowFailures: h?.window_failures ?? 0,
        recentAttempts: r?.attempts ?? 0,
        recentFailures: r?.failures ?? 0
      }, rules),
      sparkline: sparks.get(id) ?? Array.from({ length: SPARK_BUCKETS }, () => 0),
      tps: h?.tps == null ? null : round2(Number(h.tps)),
      ttfb_ms: h?.ttfb_ms == null ? null : Math.round(Number(h.ttfb_ms))
    }
  }
  return out
}
