/**
 * Per-key limit on failed requests (4xx of the client's own making: invalid body, schema, model, capability,
 * size). A key over `limits.failed_requests_per_minute` in the last minute gets 429 `too_many_failed_requests`
 * after authentication and before its body is read, so a flood of bad requests costs neither parsing nor rows.
 *
 * Counting is the rate-limit primitive's sliding-window counter (`runtime/RateWindow.ts`, rule `sliding`: this
 * minute's count plus the previous minute's, weighted by the part of it still inside the window): constant
 * memory per key, at most `MAX_TRACKED_KEYS` keys (idle keys swept first, then the least recently failing).
 * In-process on purpose: the check runs on every inference request, before its body, and a Redis round trip
 * there would cost every request; each replica bounds its own share of a flood.
 */
import { Clock, Context, Effect, Layer } from "effect"
import { fail, type GatewayError } from "../errors/Catalog.js"
import { makeWindowStore, MAX_TRACKED_KEYS, type RateRule, slidingWindow } from "../runtime/RateWindow.js"

export { MAX_TRACKED_KEYS }

/** Statuses a client causes by what it sends; 401/403/429/529 and 5xx are not its failures. */
const CLIENT_FAILURES: ReadonlySet<number> = new Set([400, 413, 415])

export const isClientFailure = (error: GatewayError): boolean => CLIENT_FAILURES.has(error.status)

/** `limit` failures per sliding minute. */
export const failureRule = (limit: number): RateRule => slidingWindow(limit, 60)

export interface FailureCounter {
  /** Counts one failure of this key at `now`. */
  readonly record: (keyId: number, now: number) => void
  /** Seconds until the key may try again, or 0 when it is under the limit. */
  readonly retryAfter: (keyId: number, now: number) => number
  readonly size: () => number
}

/** The counting, clock-free (tests and the service share it). */
export const makeCounter = (limit: number, maxKeys = MAX_TRACKED_KEYS): FailureCounter => {
  const rule = failureRule(limit)
  const store = makeWindowStore(maxKeys)
  return {
    record: (keyId, now) => store.record(keyId, rule, now),
    retryAfter: (keyId, now) => store.retryAfter(keyId, rule, now),
    size: store.size
  }
}

export class FailedRequests extends Context.Service<FailedRequests, {
  /** Fails with 429 `too_many_failed_requests` when the key is over its failed-request limit. */
  readonly check: (keyId: number) => Effect.Effect<void, GatewayError>
  /** `check` as a plain call at `now`: the 429, or undefined. */
  readonly refusal: (keyId: number, now: number) => GatewayError | undefined
  /** Counts the error against the key when it is a failure of the client's own making. */
  readonly record: (keyId: number, error: GatewayError) => Effect.Effect<void>
  readonly trackedKeys: Effect.Effect<number>
}>()("wellspring/http/FailedRequests") {}

export const make = (limit: number, maxKeys = MAX_TRACKED_KEYS) => {
  const counter = makeCounter(limit, maxKeys)
  const refusal = (keyId: number, now: number): GatewayError | undefined => {
    const wait = counter.retryAfter(keyId, now)
    return wait === 0 ? undefined : fail("too_many_failed_requests", { retryAfter: wait })
  }
  return FailedRequests.of({
    check: (keyId) =>
      Effect.flatMap(Clock.currentTimeMillis, (now) => {
        const refused = refusal(keyId, now)
        return refused === undefined ? Effect.void : Effect.fail(refused)
      }),
    refusal,
    record: (keyId, error) =>
      isClientFailure(error)
        ? Effect.flatMap(Clock.currentTimeMillis, (now) => Effect.sync(() => counter.record(keyId, now)))
        : Effect.void,
    trackedKeys: Effect.sync(counter.size)
  })
}

/** `limit`: the config's `limits.failed_requests_per_minute`. */
export const layer = (limit: number) => Layer.sync(FailedRequests, () => make(limit))

/** After authentication, before the body: 429 when this key has failed too often (no-op for cookie sessions). */
export const guard = (caller: { readonly key: { readonly id: number } | null }) =>
  caller.key === null ? Effect.void : Effect.flatMap(FailedRequests, (f) => f.check(caller.key!.id))

/** Counts a finished request's error against its key. */
export const recordFailure = (caller: { readonly key: { readonly id: number } | null }, error: GatewayError) =>
  caller.key === null ? Effect.void : Effect.flatMap(FailedRequests, (f) => f.record(caller.key!.id, error))
