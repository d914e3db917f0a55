import type { PlanConfig } from "../config/GatewayConfig.js"
import type { PoolStanding, RpmStanding, Standing } from "../quota/Admission.js"
import { round2 } from "../quota/Policy.js"

/** Reset instants formatted once: an account's pools keep theirs for hours, and every answer names them. */
const resetTexts = new Map<number, string>()
const RESET_TEXTS_MAX = 256

const resetText = (at: number): string => {
  let text = resetTexts.get(at)
  if (text === undefined) {
    if (resetTexts.size >= RESET_TEXTS_MAX) resetTexts.clear()
    text = new Date(at).toISOString()
    resetTexts.set(at, text)
  }
  return text
}

export const poolView = (pool: PoolStanding, requestWeighted?: number) => ({
  used_pct: pool.used_pct,
  remaining_pct: pool.remaining_pct,
  resets_at: pool.resets_at === null ? null : resetText(pool.resets_at),
  resets_in_seconds: pool.resets_in_seconds,
  ...(requestWeighted !== undefined ? { request_pct: round2((requestWeighted / pool.limit) * 100) } : {})
})

/** The `wellspring` block: exact, post-request figures. */
export const receipt = (
  requestId: string,
  standing: Standing,
  rpm: RpmStanding,
  plan: PlanConfig,
  weighted: number
) => {
  const share = plan.show_request_pct ? weighted : undefined
  return {
    request_id: requestId,
    session: poolView(standing.session, share),
    weekly: poolView(standing.weekly, share),
    rpm: { limit: rpm.limit, remaining: rpm.remaining }
  }
}

export const quotaHeaders = (standing: Standing, rpm: RpmStanding, requestRowId: number): Record<string, string> => ({
  "x-request-id": String(requestRowId),
  "x-ratelimit-limit-requests": String(rpm.limit),
  "x-ratelimit-remaining-requests": String(rpm.remaining),
  "x-ratelimit-reset-requests": String(rpm.reset_seconds),
  "x-session-used-pct": String(standing.session.used_pct),
  "x-session-remaining-pct": String(standing.session.remaining_pct),
  "x-session-reset": String(standing.session.resets_in_seconds),
  "x-weekly-used-pct": String(standing.weekly.used_pct),
  "x-weekly-remaining-pct": String(standing.weekly.remaining_pct),
  "x-weekly-reset": String(standing.weekly.resets_in_seconds)
})
