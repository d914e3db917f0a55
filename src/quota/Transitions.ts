/**
 * Account-state transitions of the in-process admission (ARCHITECTURE §4–§6): plain functions over plain state
 * and an explicit `now` (epoch ms). No effects, no clock, no actor: `test/quota/Transitions.test.ts` drives them
 * directly.
 *
 * The state is mutated in place: its owner (the account actor, `runtime/Actors.ts`) serializes every call, and a
 * copy per admission would cost allocations on the request path. Every transition checks everything first and
 * writes only when the outcome is known, so a transition that throws leaves the state as it was.
 *
 * The Redis backend runs the same rules in Lua (`AdmissionScripts.ts`); the contract suite
 * (`test/quota/contract.ts`) holds both to the same behaviour.
 */
import type { ModelConfig, PlanConfig } from "../config/GatewayConfig.js"
import type { Standing } from "./Admission.js"
import {
  type AbuseSettings,
  DAY_MS,
  dayIndex,
  nextDailyReset,
  poolStanding,
  type Rejection,
  RPM_WINDOW_MS,
  rpmRetryAfter,
  sessionMs,
  WEEK_MS
} from "./Policy.js"

// ---------------------------------------------------------------------------------------------------------------
// State

/** One account: pools, cooldown, and the short sliding windows (abuse, RPM per model). */
export interface AccountState {
  /** Epoch ms; null while no session window is active. */
  sessionStart: number | null
  sessionUsed: number
  /** Epoch ms; null while no weekly window is active. */
  weeklyAnchor: number | null
  weeklyUsed: number
  /** Epoch ms; 0 = none. */
  cooldownUntil: number
  /** Admission times, ascending; the abuse window is what `pruneUpTo` leaves of it (expired ones may lead). */
  abuse: Array<number>
  /** Admission times per model, ascending; the last 60 s are what `pruneUpTo` leaves (expired ones may lead). */
  rpm: Map<string, Array<number>>
}

/** One model's shared counters: in-flight slots and the raw tokens of one quota day. */
export interface GateState {
  inFlight: number
  /** Quota day of `tokens` (`Policy.dayIndex`). */
  day: number
  tokens: number
}

/** The abuse rule in milliseconds. */
export interface AbuseRule {
  readonly burst: number
  readonly windowMs: number
  readonly cooldownMs: number
}

export const abuseRule = (settings: AbuseSettings): AbuseRule => ({
  burst: settings.burst,
  windowMs: settings.window_seconds * 1000,
  cooldownMs: settings.cooldown_seconds * 1000
})

/** What an admission asks for (`AdmitInput` without the account id). */
export interface AdmitRequest {
  readonly model: ModelConfig
  readonly plan: PlanConfig
  readonly estimatedInputTokens: number
  readonly byok: boolean
}

/** What an admission reserved, and in which windows: what a settle or refund needs. */
export interface Reservation {
  readonly reserveWeighted: number
  readonly reserveRaw: number
  /** The session window the reservation went into (null for BYOK). */
  readonly sessionStart: number | null
  readonly weeklyAnchor: number | null
  /** Quota day of the raw reservation. */
  readonly day: number
}

export interface Admitted extends Reservation {
  readonly _tag: "Admitted"
  /** Entries in the model's RPM window after this admission, and the oldest one's time. */
  readonly rpmCount: number
  readonly rpmOldest: number
}

export interface Rejected {
  readonly _tag: "Rejected"
  readonly rejection: Rejection
}

export type AdmitDecision = Admitted | Rejected

export const emptyAccount = (): AccountState => ({
  sessionStart: null,
  sessionUsed: 0,
  weeklyAnchor: null,
  weeklyUsed: 0,
  cooldownUntil: 0,
  abuse: [],
  rpm: new Map()
})

const finiteOr = (x: unknown, fallback: number): number => typeof x === "number" && Number.isFinite(x) ? x : fallback
const finiteOrNull = (x: unknown): number | null => (typeof x === "number" && Number.isFinite(x) ? x : null)
const sortedTimes = (xs: ReadonlyArray<number>): Array<number> =>
  xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b)

/** A deep copy, validated (non-finite numbers dropped, negative pools clamped, windows sorted). */
export const copyAccount = (s: AccountState): AccountState => {
  const rpm = new Map<string, Array<number>>()
  s.rpm.forEach((times, model) => {
    const t = sortedTimes(times)
    if (t.length > 0) rpm.set(model, t)
  })
  return {
    sessionStart: finiteOrNull(s.sessionStart),
    sessionUsed: Math.max(0, finiteOr(s.sessionUsed, 0)),
    weeklyAnchor: finiteOrNull(s.weeklyAnchor),
    weeklyUsed: Math.max(0, finiteOr(s.weeklyUsed, 0)),
    cooldownUntil: finiteOr(s.cooldownUntil, 0),
    abuse: sortedTimes(s.abuse),
    rpm
  }
}

// ---------------------------------------------------------------------------------------------------------------
// Windows

/** Appends `now`, never below the last entry: a wall clock stepped back keeps the array ascending. */
const appendTime = (times: Array<number>, now: number): void => {
  const last = times[times.length - 1]
  times.push(last !== undefined && last > now ? last : now)
}

/** Expired entries at the front of a window that may stay there (and up to a quarter of the array). */
const PRUNE_SLACK = 64

/**
 * Forgets the entries at or before `cutoff` of an ascending array and returns the index of the first one left: the
 * window is `times` from there. Expired entries leave the array once they are at least `PRUNE_SLACK` and a quarter
 * of it, so a window of N entries costs a few moves per entry amortized and at most N / 3 + 64 entries more, not
 * an N-entry move per request (an account allowed 200,000 requests a minute that sends 3,000 a second keeps
 * ~180,000 entries: 6.4 µs per admission before, 0.05 after, in a loop of that shape).
 */
export const pruneUpTo = (times: Array<number>, cutoff: number): number => {
  let lo = 0
  let hi = times.length
  while (lo < hi) {
    const mid = (lo + hi) >>> 1
    if (times[mid]! <= cutoff) lo = mid + 1
    else hi = mid
  }
  if (lo === times.length) {
    times.length = 0
    return 0
  }
  if (lo >= PRUNE_SLACK && lo * 4 >= times.length) {
    times.splice(0, lo)
    return 0
  }
  return lo
}

/** Ends the session and weekly windows whose time is up (`now` at or after their end). */
export const rollWindows = (s: AccountState, plan: PlanConfig, now: number): void => {
  if (s.sessionStart !== null && now >= s.sessionStart + sessionMs(plan)) {
    s.sessionStart = null
    s.sessionUsed = 0
  }
  if (s.weeklyAnchor !== null && now >= s.weeklyAnchor + WEEK_MS) {
    s.weeklyAnchor = null
    s.weeklyUsed = 0
  }
}

/** Moves a gate to the quota day of `now` (09:00 KST = 00:00 UTC). Returns the total of the day it left, if any. */
export const rollDay = (gate: GateState, now: number): { readonly day: number; readonly tokens: number } | undefined => {
  const today = dayIndex(now)
  if (gate.day === today) return undefined
  const left = { day: gate.day, tokens: gate.tokens }
  gate.day = today
  gate.tokens = 0
  return left
}

/** Raw tokens of the gate's model in the quota day of `now`. */
export const dailyUsage = (gate: GateState | undefined, now: number): number =>
  gate === undefined || gate.day !== dayIndex(now) ? 0 : gate.tokens

/** The account's standing (no side effects; windows whose time is up show as inactive). */
export const standingOf = (s: AccountState, plan: PlanConfig, now: number): Standing => ({
  session: poolStanding(
    s.sessionUsed,
    plan.session_limit,
    s.sessionStart === null ? null : s.sessionStart + sessionMs(plan),
    now
  ),
  weekly: poolStanding(
    s.weeklyUsed,
    plan.weekly_limit,
    s.weeklyAnchor === null ? null : s.weeklyAnchor + WEEK_MS,
    now,
    s.weeklyAnchor
  )
})

/** Requests in the account's RPM windows, summed over models; prunes what left the window. */
export const rpmCount = (s: AccountState, now: number): number => {
  let n = 0
  s.rpm.forEach((times, model) => {
    const from = pruneUpTo(times, now - RPM_WINDOW_MS)
    if (times.length === 0) s.rpm.delete(model)
    n += times.length - from
  })
  return n
}

/**
 * Nothing in the state can affect a future decision: safe to forget (pure in-process mode). Conservative: a
 * session window is kept up to a week (no plan at hand), the abuse history a day.
 */
export const isIdle = (s: AccountState, now: number): boolean =>
  (s.weeklyAnchor === null || now >= s.weeklyAnchor + WEEK_MS) &&
  (s.sessionStart === null || now >= s.sessionStart + WEEK_MS) &&
  now >= s.cooldownUntil &&
  (s.abuse.length === 0 || now - s.abuse[s.abuse.length - 1]! > DAY_MS) &&
  [...s.rpm.values()].every((t) => t.length === 0 || now - t[t.length - 1]! > RPM_WINDOW_MS)

// ---------------------------------------------------------------------------------------------------------------
// Admission

const rejected = (rejection: Rejection): Rejected => ({ _tag: "Rejected", rejection })

/**
 * Admission of one request: abuse cooldown -> RPM -> session -> weekly -> model daily cap -> in-flight, then the
 * reservation. A rejection writes nothing, except the rejection that starts an abuse cooldown (it sets
 * `cooldownUntil` and clears the burst window).
 *
 * `gate` is the model's gate, already on the quota day of `now` (`rollDay`); BYOK requests pass none: they count
 * for abuse and RPM only (no pools, no daily cap, no in-flight slot).
 */
export const admit = (
  s: AccountState,
  gate: GateState | undefined,
  request: AdmitRequest,
  abuse: AbuseRule,
  now: number
): AdmitDecision => {
  const { model, plan } = request
  // 1. abuse cooldown
  if (now < s.cooldownUntil) return rejected({ code: "abuse_cooldown", resetsAt: s.cooldownUntil })
  const abuseFrom = pruneUpTo(s.abuse, now - abuse.windowMs)
  if (s.abuse.length - abuseFrom >= abuse.burst) {
    s.cooldownUntil = now + abuse.cooldownMs
    s.abuse.length = 0
    return rejected({ code: "abuse_cooldown", resetsAt: s.cooldownUntil })
  }
  // 2. RPM
  let times = s.rpm.get(model.id)
  // The window is `times` from `from` on (see `pruneUpTo`).
  const from = times === undefined ? 0 : pruneUpTo(times, now - RPM_WINDOW_MS)
  if (times !== undefined && times.length - from >= model.rate_limit_rpm) {
    // The entry that must leave is at `length - limit`, at or after `from`.
    return rejected({ code: "rate_limited", retryAfter: rpmRetryAfter(times, model.rate_limit_rpm, now) })
  }
  let raw = 0
  const pooled = !request.byok
  if (pooled) {
    if (gate === undefined) throw new Error(`admission of ${model.id} without its model gate`)
    rollWindows(s, plan, now)
    // 3. session, 4. weekly
    if (s.sessionStart !== null && s.sessionUsed >= plan.session_limit) {
      return rejected({ code: "session_exhausted", resetsAt: s.sessionStart + sessionMs(plan) })
    }
    if (s.weeklyAnchor !== null && s.weeklyUsed >= plan.weekly_limit) {
      return rejected({ code: "weekly_exhausted", resetsAt: s.weeklyAnchor + WEEK_MS })
    }
    // 5. model daily cap, 6. in-flight
    if (model.daily_cap !== null && gate.tokens >= model.daily_cap) {
      return rejected({ code: "model_quota_exceeded", resetsAt: nextDailyReset(now) })
    }
    if (gate.inFlight >= model.concurrency) return rejected({ code: "model_overloaded" })
    raw = Math.max(0, Math.ceil(request.estimatedInputTokens))
  }
  const weighted = raw * model.weights.input
  // commit
  if (times === undefined) {
    times = []
    s.rpm.set(model.id, times)
  }
  appendTime(times, now)
  appendTime(s.abuse, now)
  if (pooled) {
    if (s.sessionStart === null) {
      s.sessionStart = now
      s.sessionUsed = 0
    }
    if (s.weeklyAnchor === null) {
      s.weeklyAnchor = now
      s.weeklyUsed = 0
    }
    s.sessionUsed += weighted
    s.weeklyUsed += weighted
    gate!.tokens += raw
    gate!.inFlight++
  }
  return {
    _tag: "Admitted",
    reserveWeighted: weighted,
    reserveRaw: raw,
    sessionStart: pooled ? s.sessionStart : null,
    weeklyAnchor: pooled ? s.weeklyAnchor : null,
    day: dayIndex(now),
    rpmCount: times.length - from,
    rpmOldest: times[from]!
  }
}

/**
 * Replaces a reservation with the exact charge (`weighted` on the pools, `raw` on the daily total); a refund is
 * a settle of 0 and 0. Only windows and the quota day the reservation went into are moved: after a roll-over the
 * delta is dropped. Counters never go below 0. `gate` is the model's gate, if it exists.
 */
export const settle = (
  s: AccountState,
  gate: GateState | undefined,
  r: Reservation,
  weighted: number,
  raw: number
): void => {
  const dw = weighted - r.reserveWeighted
  if (r.sessionStart !== null && s.sessionStart === r.sessionStart) s.sessionUsed = Math.max(0, s.sessionUsed + dw)
  if (r.weeklyAnchor !== null && s.weeklyAnchor === r.weeklyAnchor) s.weeklyUsed = Math.max(0, s.weeklyUsed + dw)
  if (gate !== undefined && gate.day === r.day) gate.tokens = Math.max(0, gate.tokens + raw - r.reserveRaw)
}
