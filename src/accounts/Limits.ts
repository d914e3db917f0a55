import { Effect } from "effect"
import { fail, type GatewayError } from "../errors/Catalog.js"
import { Admission } from "../quota/Admission.js"

/**
 * Account-endpoint rate limits, on the one rate-limit primitive (`quota/RateLimit.ts` over `runtime/RateWindow.ts`, fixed windows) that the
 * admission engine serves: in process in embedded mode, in Redis (shared by every replica) when Redis is configured.
 *
 * A limit is a name, a budget and a message; every endpoint that enforces the same limit shares its budget, per
 * account. A new family is one constant and one line per endpoint, e.g. 15 requests a minute shared by seven
 * BYOK endpoints, across replicas:
 *
 * ```ts
 * export const BYOK_LIMIT = endpointLimit("byok", 15, 60, "BYOK 요청이 너무 많습니다. 1분에 15회까지 가능합니다.")
 * yield* enforce(BYOK_LIMIT, caller.account.id) // in each of the seven handlers
 * ```
 *
 * The key-rotation cooldown is not a counter and stays in PostgreSQL (`ROTATE_COOLDOWN_MS`, see Keys.ts).
 */

/** A named account-endpoint limit: `max` hits per fixed window of `windowSeconds`, per account. */
export interface EndpointLimit {
  readonly name: string
  readonly max: number
  readonly windowSeconds: number
  readonly message: string
}

export const endpointLimit = (name: string, max: number, windowSeconds: number, message: string): EndpointLimit => ({
  name,
  max,
  windowSeconds,
  message
})

/** `GET /api/user/me/keys/:id/reveal`: 30 per minute. */
export const REVEAL_LIMIT: EndpointLimit = endpointLimit(
  "reveal",
  30,
  60,
  "키 확인 요청이 너무 많습니다. 1분에 30회까지 가능합니다."
)

/** `GET /api/user/me/metrics` and `GET /api/user/me/requests` share one budget: 120 per minute. */
export const READ_LIMIT: EndpointLimit = endpointLimit(
  "metrics",
  120,
  60,
  "사용 기록 조회 요청이 너무 많습니다. 1분에 120회까지 가능합니다."
)

/** `GET /api/user/me`: `limits.snapshot_per_minute` per account (default 60). */
export const snapshotLimit = (perMinute: number): EndpointLimit =>
  endpointLimit("snapshot", perMinute, 60, `계정 정보 조회 요청이 너무 많습니다. 1분에 ${perMinute}회까지 가능합니다.`)

/** The limiter key; the same for every endpoint sharing a limit, per account. */
export const limitKey = (limit: EndpointLimit, accountId: string): string => `acct:${limit.name}:${accountId}`

/**
 * Counts one hit on the admission engine's limiter (`Admission.limit`: a fixed window started by the first hit;
 * memory or Redis, so it holds across replicas); over the limit gives 429 `rate_limited` with `Retry-After` =
 * seconds left in the window (at least 1). A refused hit is not counted.
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
