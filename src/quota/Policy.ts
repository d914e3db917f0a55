/**
 * Pure quota arithmetic shared by the memory and Redis admission layers (ARCHITECTURE §5, §6): constants, the
 * quota day, standings, rejections. No effects, no clocks: callers pass `now` in epoch milliseconds.
 *
 * The account-state transitions built on it are in `Transitions.ts` (memory backend); the Redis backend runs the
 * same checks in Lua (`AdmissionScripts.ts`). Both follow this order: abuse cooldown -> RPM -> session -> weekly ->
 * model daily cap -> in-flight, and both commit only when every check passed.
 */
import type { AbuseConfig, ModelConfig, PlanConfig } from "../config/GatewayConfig.js"
import { GatewayError } from "../errors/Catalog.js"
import type { PoolStanding, RpmStanding, SettleUsage } from "./Admission.js"

export type AbuseSettings = typeof AbuseConfig.Type

export const SECOND_MS = 1_000
export const HOUR_MS = 3_600_000
export const DAY_MS = 86_400_000
export const WEEK_MS = 7 * DAY_MS
/** RPM is a sliding 60 s window per account and model. */
export const RPM_WINDOW_MS = 60_000
/** 529 `model_overloaded` tells the client to retry after this many seconds (the catalog message says 5). */
export const OVERLOADED_RETRY_SECONDS = 5

export const sessionMs = (plan: PlanConfig): number => plan.session_hours * HOUR_MS

/**
 * Model daily caps reset at 09:00 KST, which is 00:00 UTC: the quota day is the UTC day number.
 * Its label (`model_daily_usage.day`) is the UTC date, i.e. the KST date on which that quota day starts.
 */
export const dayIndex = (now: number): number => Math.floor(now / DAY_MS)
export const nextDailyReset = (now: number): number => (dayIndex(now) + 1) * DAY_MS
export const dayLabel = (day: number): string => new Date(day * DAY_MS).toISOString().slice(0, 10)

export const round2 = (x: number): number => Math.round(x * 100) / 100

export const secondsUntil = (at: number, now: number): number => Math.max(0, Math.ceil((at - now) / SECOND_MS))

/**
 * A pool's standing. `resetsAt` null means no active window (used is then 0).
 * used_pct = min(100, used / limit × 100) rounded to 2 decimals; remaining_pct = 100 − used_pct.
 */
export const poolStanding = (
  used: number,
  limit: number,
  resetsAt: number | null,
  now: number,
  anchorAt?: number | null
): PoolStanding => {
  const active = resetsAt !== null && now < resetsAt
  const u = active ? Math.max(0, used) : 0
  const usedPct = limit > 0 ? round2(Math.min(100, (u / limit) * 100)) : 100
  const base = {
    used: u,
    limit,
    used_pct: usedPct,
    remaining_pct: round2(100 - usedPct),
    resets_at: active ? resetsAt : null,
    resets_in_seconds: active ? secondsUntil(resetsAt, now) : 0
  }
  return anchorAt === undefined ? base : { ...base, anchor_at: active ? anchorAt : null }
}

/**
 * Weighted cost of delivered usage: uncached input × weights.input + cached input × weights.cached_input (default
 * weights.input) + output (reasoning included) × weights.output.
 */
export const weightedCost = (model: ModelConfig, usage: SettleUsage): number => {
  const cached = Math.min(Math.max(0, usage.cachedInputTokens ?? 0), Math.max(0, usage.inputTokens))
  const w = model.weights
  return (usage.inputTokens - cached) * w.input + cached * (w.cached_input ?? w.input) + usage.outputTokens * w.output
}

/** What an admission reserves: weighted input estimate on the pools, raw input estimate on the daily cap. */
export const reservationOf = (model: ModelConfig, estimatedInputTokens: number) => {
  const raw = Math.max(0, Math.ceil(estimatedInputTokens))
  return { weighted: raw * model.weights.input, raw } as const
}

export const rawTokens = (usage: SettleUsage): number =>
  Math.max(0, Math.ceil(usage.inputTokens)) + Math.max(0, Math.ceil(usage.outputTokens))

/**
 * Seconds until enough entries leave a sliding RPM window for one more request.
 * `timestamps` is sorted ascending and already pruned to the window.
 */
export const rpmRetryAfter = (timestamps: ReadonlyArray<number>, limit: number, now: number): number => {
  const idx = Math.max(0, timestamps.length - limit)
  const oldest = timestamps[idx] ?? now
  return Math.max(1, secondsUntil(oldest + RPM_WINDOW_MS, now))
}

export const rpmStanding = (limit: number, count: number, oldest: number | undefined, now: number): RpmStanding => ({
  limit,
  remaining: Math.max(0, limit - count),
  reset_seconds: oldest === undefined ? 0 : secondsUntil(oldest + RPM_WINDOW_MS, now)
})

// ---------------------------------------------------------------------------------------------------------------
// Rejections. Each carries what the spec asks of it: resets_at for abuse/session/weekly (and the daily cap's
// next 09:00 KST), Retry-After for RPM and overload.

/**
 * Why an admission was refused, as both backends decide it (the memory transitions and the Redis script's decoded
 * reply). `rejectionError` turns it into the catalog error.
 */
export type Rejection =
  | { readonly code: "abuse_cooldown"; readonly resetsAt: number }
  | { readonly code: "rate_limited"; readonly retryAfter: number }
  | { readonly code: "session_exhausted"; readonly resetsAt: number }
  | { readonly code: "weekly_exhausted"; readonly resetsAt: number }
  | { readonly code: "model_quota_exceeded"; readonly resetsAt: number }
  | { readonly code: "model_overloaded" }

export const rejectionError = (r: Rejection): GatewayError => {
  switch (r.code) {
    case "abuse_cooldown":
      return abuseCooldown(r.resetsAt)
    case "rate_limited":
      return rateLimited(r.retryAfter)
    case "session_exhausted":
      return sessionExhausted(r.resetsAt)
    case "weekly_exhausted":
      return weeklyExhausted(r.resetsAt)
    case "model_quota_exceeded":
      return modelQuotaExceeded(r.resetsAt)
    case "model_overloaded":
      return modelOverloaded()
  }
}

export const abuseCooldown = (resetsAt: number) => new GatewayError({ code: "abuse_cooldown", resetsAt })
export const rateLimited = (retryAfter: number) => new GatewayError({ code: "rate_limited", retryAfter })
export const sessionExhausted = (resetsAt: number) => new GatewayError({ code: "session_exhausted", resetsAt })
export const weeklyExhausted = (resetsAt: number) => new GatewayError({ code: "weekly_exhausted", resetsAt })
/** `resetsAt` is the next 09:00 KST (`nextDailyReset(now)`). */
export const modelQuotaExceeded = (resetsAt: number) => new GatewayError({ code: "model_quota_exceeded", resetsAt })
export const modelOverloaded = () =>
  new GatewayError({ code: "model_overloaded", retryAfter: OVERLOADED_RETRY_SECONDS })
export const unavailable = (detail: string) => new GatewayError({ code: "service_unavailable", detail })
