import { Effect } from "effect"
import { fail, type GatewayError } from "../errors/Catalog.js"
import { Admission } from "../quota/Admission.js"

/** A named account-endpoint limit: `max` hits per fixed window of `windowSeconds`, per account. */
export interface EndpointLimit {
  readonly name: string
  readonly max: number
  readonly windowSeconds: number
  readonly message: string
}

/** `GET /api/user/me/keys/:id/reveal`: 30 per minute. */
export const REVEAL_LIMIT: EndpointLimit = {
  name: "reveal",
  max: 30,
  windowSeconds: 60,
  message: "키 확인 요청이 너무 많습니다. 1분에 30회까지 가능합니다."
}

/** `GET /api/user/me/metrics` and `GET /api/user/me/requests` share one budget: 120 per minute. */
export const READ_LIMIT: EndpointLimit = {
  name: "metrics",
  max: 120,
  windowSeconds: 60,
  message: "사용 기록 조회 요청이 너무 많습니다. 1분에 120회까지 가능합니다."
}

/** `GET /api/user/me`: `limits.snapshot_per_minute` per account (default 60). */
export const snapshotLimit = (perMinute: number): EndpointLimit => ({
  name: "snapshot",
  max: perMinute,
  windowSeconds: 60,
  message: `계정 정보 조회 요청이 너무 많습니다. 1분에 ${perMinute}회까지 가능합니다.`
})

/** The limiter key; the same for every endpoint sharing a limit, per account. */
export const limitKey = (limit: EndpointLimit, accountId: string): string => `acct:${limit.name}:${accountId}`

/**
 * Counts one hit on the admission engine's fixed-window limiter (memory or Redis, so it holds across
 * replicas); over the limit gives 429 `rate_limited` with `Retry-After` = seconds left in the window.
 */
export const enforce = (limit: EndpointLimit, accountId: string): Effect.Effect<void, GatewayError, Admission> =>
  Effect.flatMap(Admission, (admission) =>
    admission.limit(limitKey(limit, accountId), limit.max, limit.windowSeconds).pipe(
      Effect.flatMap((result) =>
        result.allowed
          ? Effect.void
          : Effect.fail(fail("rate_limited", { message: limit.message, retryAfter: Math.max(1, result.reset_seconds) }))
      )
    ))

/** Key rotation cooldown (spec Limits), enforced through `accounts.last_rotated_at`. */
export const ROTATE_COOLDOWN_MS = 60_000
