/**
 * Per-key limit on failed requests (4xx of the client's own making: invalid body, schema, model, capability,
 * size). A key over `limits.failed_requests_per_minute` in the last minute gets 429 `too_many_failed_requests`
 * after authentication and before its body is read, so a flood of bad requests costs neither parsing nor rows.
 *
 * Counting is a sliding-window counter per key (this minute's count plus the previous minute's, weighted by the
 * part of it still inside the window): constant memory per key. Keys are held in a Map capped at
 * `MAX_TRACKED_KEYS`; entries expire two windows after their last failure and the oldest entries are evicted
 * first when the cap is reached. In-process: each replica counts its own traffic.
 */
import { Clock, Context, Effect, Layer } from "effect"
import { Settings } from "../config/Live.js"
import { fail, type GatewayError } from "../errors/Catalog.js"

const WINDOW_MS = 60_000
export const MAX_TRACKED_KEYS = 100_000

/** Statuses a client causes by what it sends; 401/403/429/529 and 5xx are not its failures. */
const CLIENT_FAILURES: ReadonlySet<number> = new Set([400, 413, 415])

export const isClientFailure = (error: GatewayError): boolean => CLIENT_FAILURES.has(error.status)

interface Window {
  /** Start of the current window (ms). */
  start: number
  current: number
  previous: number
}

export interface FailureCounter {
  /** Counts one failure of this key at `now`. */
  readonly record: (keyId: number, now: number) => void
  /** Seconds until the key may try again, or 0 when it is under the limit. */
  readonly retryAfter: (keyId: number, now: number) => number
  readonly size: () => number
}

/** The counting, clock-free (tests and the service share it). */
export const makeCounter = (limit: number, maxKeys = MAX_TRACKED_KEYS): FailureCounter => {
  const windows = new Map<number, Window>()

  const advance = (w: Window, now: number) => {
    const elapsed = Math.floor((now - w.start) / WINDOW_MS)
    if (elapsed <= 0) return
    w.previous = elapsed === 1 ? w.current : 0
    w.current = 0
    w.start += elapsed * WINDOW_MS
  }
  const estimate = (w: Window, now: number) => w.previous * (1 - (now - w.start) / WINDOW_MS) + w.current
  const expired = (w: Window, now: number) => now - w.start >= 2 * WINDOW_MS

  const makeRoom = (now: number) => {
    for (const [id, w] of windows) if (expired(w, now)) windows.delete(id)
    // Still full: drop the least recently failing keys (Map order is insertion order; `record` re-inserts).
    const excess = windows.size - maxKeys + 1
    if (excess <= 0) return
    let dropped = 0
    for (const id of windows.keys()) {
      if (dropped++ >= Math.max(excess, Math.ceil(maxKeys / 10))) break
      windows.delete(id)
    }
  }

  return {
    record: (keyId, now) => {
      let w = windows.get(keyId)
      if (w === undefined) {
        if (windows.size >= maxKeys) makeRoom(now)
        w = { start: now, current: 0, previous: 0 }
      } else {
        windows.delete(keyId)
        advance(w, now)
      }
      w.current += 1
      windows.set(keyId, w)
    },
    retryAfter: (keyId, now) => {
      const w = windows.get(keyId)
      if (w === undefined) return 0
      advance(w, now)
      if (estimate(w, now) < limit) return 0
      // The moment the estimate falls to the limit (it is below it right after): later in this window while
      // the previous window's weight fades, or in the next window while this one's does.
      const until = w.current < limit
        ? w.start + WINDOW_MS * (1 - (limit - w.current) / w.previous)
        : w.start + WINDOW_MS + WINDOW_MS * (1 - limit / w.current)
      return Math.floor((until - now) / 1000) + 1
    },
    size: () => windows.size
  }
}

export class FailedRequests extends Context.Service<FailedRequests, {
  /** Fails with 429 `too_many_failed_requests` when the key is over its failed-request limit. */
  readonly check: (keyId: number) => Effect.Effect<void, GatewayError>
  /** Counts the error against the key when it is a failure of the client's own making. */
  readonly record: (keyId: number, error: GatewayError) => Effect.Effect<void>
  readonly trackedKeys: Effect.Effect<number>
}>()("wellspring/http/FailedRequests") {}

export const make = (limit: number, maxKeys = MAX_TRACKED_KEYS) => {
  const counter = makeCounter(limit, maxKeys)
  return FailedRequests.of({
    check: (keyId) =>
      Effect.flatMap(Clock.currentTimeMillis, (now) => {
        const wait = counter.retryAfter(keyId, now)
        return wait === 0 ? Effect.void : Effect.fail(fail("too_many_failed_requests", { retryAfter: wait }))
      }),
    record: (keyId, error) =>
      isClientFailure(error)
        ? Effect.flatMap(Clock.currentTimeMillis, (now) => Effect.sync(() => counter.record(keyId, now)))
        : Effect.void,
    trackedKeys: Effect.sync(counter.size)
  })
}

export const layer = Layer.effect(
  FailedRequests,
  Effect.map(Settings, (settings) => make(settings.config.limits.failed_requests_per_minute))
)

/** After authentication, before the body: 429 when this key has failed too often (no-op for cookie sessions). */
export const guard = (caller: { readonly key: { readonly id: number } | null }) =>
  caller.key === null ? Effect.void : Effect.flatMap(FailedRequests, (f) => f.check(caller.key!.id))

/** Counts a finished request's error against its key. */
export const recordFailure = (caller: { readonly key: { readonly id: number } | null }, error: GatewayError) =>
  caller.key === null ? Effect.void : Effect.flatMap(FailedRequests, (f) => f.record(caller.key!.id, error))
