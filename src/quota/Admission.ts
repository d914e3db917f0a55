import { Context, type Effect, type Scope } from "effect"
import type { ModelConfig, PlanConfig } from "../config/GatewayConfig.js"
import type { GatewayError } from "../errors/Catalog.js"

/** One pool's standing as reported in receipts, headers and /v1/usage. */
export interface PoolStanding {
  readonly used: number
  readonly limit: number
  readonly used_pct: number
  readonly remaining_pct: number
  /** Epoch ms, or null while no window is active. */
  readonly resets_at: number | null
  readonly resets_in_seconds: number
  /** Weekly only: epoch ms of the anchor, or null. */
  readonly anchor_at?: number | null
}

export interface RpmStanding {
  readonly limit: number
  readonly remaining: number
  readonly reset_seconds: number
}

export interface Standing {
  readonly session: PoolStanding
  readonly weekly: PoolStanding
}

export interface AdmitInput {
  readonly accountId: string
  readonly plan: PlanConfig
  readonly model: ModelConfig
  /** Estimated raw input tokens; reserved as `input × weights.input` weighted tokens. */
  readonly estimatedInputTokens: number
  /** BYOK requests count for RPM and abuse only (no pools, no daily cap, no in-flight slot). */
  readonly byok: boolean
}

export interface SettleUsage {
  /** Input tokens, cached ones included. */
  readonly inputTokens: number
  /** The part of `inputTokens` the upstream read from its prompt cache (weighted by `weights.cached_input`). */
  readonly cachedInputTokens?: number
  /** Output tokens including reasoning. */
  readonly outputTokens: number
}

export interface Ticket {
  /** Standing right after the reservation (used for streaming headers). */
  readonly reserved: Standing
  readonly rpm: RpmStanding
  /**
   * Exact weighted charge for the delivered usage; replaces the reservation.
   * Idempotent: only the first call of settle/refund has an effect; later calls return the first result.
   */
  readonly settle: (usage: SettleUsage) => Effect.Effect<{ readonly standing: Standing; readonly weighted: number }>
  /** Gives the reservation back (failure before any output). Idempotent. */
  readonly refund: Effect.Effect<void>
  /**
   * `settle` run at once instead of when the returned effect runs: an `Exit` when the settlement completed on the
   * spot (in-process admission with the account idle), otherwise the effect that finishes it. Optional: a backend
   * without it is settled through `settle`.
   */
  readonly settleNow?: (usage: SettleUsage) => Effect.Effect<{ readonly standing: Standing; readonly weighted: number }>
}

/**
 * Admission: checks in order abuse cooldown -> RPM -> session -> weekly -> model daily cap -> in-flight,
 * and reserves. A rejection consumes nothing. The returned ticket is bound to the Scope: when the scope
 * closes the in-flight slot is released, and an unsettled ticket is refunded.
 */
export class Admission extends Context.Service<Admission, {
  readonly admit: (input: AdmitInput) => Effect.Effect<Ticket, GatewayError, Scope.Scope>
  /** Current standing of an account (no side effects). */
  readonly standing: (accountId: string, plan: PlanConfig) => Effect.Effect<Standing, GatewayError>
  /** Requests in the account's current RPM windows, summed over models (for the dashboard). */
  readonly currentRpm: (accountId: string) => Effect.Effect<number, GatewayError>
  /** Model daily usage in raw tokens since the last 09:00 KST boundary (for /api/quota). */
  readonly dailyUsage: (modelId: string) => Effect.Effect<number, GatewayError>
  /**
   * Fixed-window limiter for account endpoints (reveal, metrics, BYOK...): `RateLimiter.take` with
   * `fixedWindow(max, windowSeconds)` (`runtime/RateWindow.ts`) on the backend's store, so it is shared by every replica
   * exactly when admission is. Callers use `accounts/Limits.ts` `enforce`.
   */
  readonly limit: (key: string, max: number, windowSeconds: number) => Effect.Effect<
    { readonly allowed: boolean; readonly remaining: number; readonly reset_seconds: number },
    GatewayError
  >
}>()("wellspring/quota/Admission") {}
