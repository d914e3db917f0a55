/**
 * Failed authentication per client address (issue 16, finding 5). An address with `limits.failed_auth_per_minute`
 * failed authentications in the last sliding minute is refused (429 `too_many_failed_requests`) before its next
 * key or session lookup; a key already in the positive key cache is still served (see `Auth.ts`). Once an address
 * has failed, its lookups under way count too, so concurrent guesses cannot overshoot the limit.
 *
 * Counting is the rate-limit primitive's sliding-window counter (`runtime/RateWindow.ts`), at most `MAX_TRACKED_KEYS`
 * addresses. In-process on purpose, like the per-key failed-request limit: the check runs on every request that
 * is not a cache hit, before any lookup, and a Redis round trip there would cost what it saves; each replica bounds
 * its own share (N replicas behind a balancer allow at most N × the limit per address).
 *
 * IPv6 addresses are counted per /64: one host usually holds a whole /64 and could otherwise take a fresh
 * address for every guess. The address comes from `http/ClientAddress.ts` (already normalized: never header text).
 */
import ipaddr from "ipaddr.js"
import { makeWindowStore, MAX_TRACKED_KEYS, type RateRule, slidingWindow } from "../runtime/RateWindow.js"

/** A refused address is logged at most this often. */
export const LOG_EVERY_MS = 60_000

/** What is counted for an address: the address itself, or its /64 for IPv6. */
export const bucketOf = (address: string): string => {
  if (!address.includes(":")) return address
  try {
    const ip = ipaddr.IPv6.parse(address)
    const parts = ip.parts.slice(0, 4).concat([0, 0, 0, 0])
    return `${new ipaddr.IPv6(parts).toString()}/64`
  } catch {
    return address
  }
}

/** A log line due for a refused address. */
export interface RefusalReport {
  readonly address: string
  /** Failed authentications counted in the last sliding minute. */
  readonly failures: number
  /** Requests refused since the previous line for this address (this one included). */
  readonly refused: number
}

export interface FailedAuthLimiter {
  /**
   * Seconds until `address` may have another credential looked up; 0 while it may. Once the address has a failure
   * in the window, its lookups under way count as failures until they end, so concurrent guesses cannot overshoot
   * the limit; many valid credentials looked up at once from a clean address are never held back.
   */
  readonly retryAfter: (address: string, now: number) => number
  /** Counts one failed authentication of `address` that needed no lookup (malformed, cached as unknown). */
  readonly record: (address: string, now: number) => void
  /** A lookup for `address` starts. */
  readonly begin: (address: string) => void
  /** That lookup ended; counted when the credential was unknown. */
  readonly end: (address: string, now: number, failed: boolean) => void
  /** Notes a refusal; returns the log line's fields when one is due (at most once a minute per address). */
  readonly refused: (address: string, now: number) => RefusalReport | null
  /** Addresses tracked by the counter, the log throttle and lookups under way (each bounded). */
  readonly size: () => { readonly counted: number; readonly logged: number; readonly pending: number }
}

/** The counting, clock-free (`now` in ms): tests and `Auth` share it. */
export const makeLimiter = (limit: number, maxAddresses = MAX_TRACKED_KEYS): FailedAuthLimiter => {
  const rule: RateRule = slidingWindow(limit, 60)
  const windows = makeWindowStore(maxAddresses)
  /** Lookups under way per address (entries go at 0: bounded by the requests in flight). */
  const pending = new Map<string, number>()
  /** Per refused address: when it was last logged and the refusals since (Map order: oldest line first). */
  const logged = new Map<string, { at: number; refused: number }>()

  const makeRoom = (now: number) => {
    for (const [address, entry] of logged) if (now - entry.at >= LOG_EVERY_MS) logged.delete(address)
    for (const address of logged.keys()) {
      if (logged.size < maxAddresses) break
      logged.delete(address)
    }
  }

  return {
    retryAfter: (address, now) => {
      const bucket = bucketOf(address)
      const wait = windows.retryAfter(bucket, rule, now)
      if (wait > 0) return wait
      const inFlight = pending.get(bucket) ?? 0
      if (inFlight === 0) return 0
      // Once the address has failed, its lookups under way count as failures until they end (they end within a
      // request's time: try again in a second). An address without failures is not held back by its concurrency.
      const failures = windows.count(bucket, rule, now)
      return failures > 0 && failures + inFlight >= limit ? 1 : 0
    },
    record: (address, now) => windows.record(bucketOf(address), rule, now),
    begin: (address) => {
      const bucket = bucketOf(address)
      pending.set(bucket, (pending.get(bucket) ?? 0) + 1)
    },
    end: (address, now, failed) => {
      const bucket = bucketOf(address)
      if (failed) windows.record(bucket, rule, now)
      const left = (pending.get(bucket) ?? 1) - 1
      if (left > 0) pending.set(bucket, left)
      else pending.delete(bucket)
    },
    refused: (address, now) => {
      const bucket = bucketOf(address)
      const entry = logged.get(bucket)
      if (entry !== undefined && now - entry.at < LOG_EVERY_MS) {
        entry.refused++
        return null
      }
      const refused = (entry?.refused ?? 0) + 1
      logged.delete(bucket)
      if (logged.size >= maxAddresses) makeRoom(now)
      logged.set(bucket, { at: now, refused: 0 })
      return { address: bucket, failures: Math.round(windows.count(bucket, rule, now)), refused }
    },
    size: () => ({ counted: windows.size(), logged: logged.size, pending: pending.size })
  }
}
