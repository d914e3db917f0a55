/**
 * Per-deployment `concurrency` and `rate_limit_rpm` counted for the whole fleet (production: `CapsRedis.ts`). The
 * router asks only for deployments that have a cap; without this service (embedded mode) it counts them itself.
 */
import type { Effect } from "effect"

/** A deployment's caps, as the catalog has them now (null: none). */
export interface Caps {
  readonly concurrency: number | null
  readonly rate_limit_rpm: number | null
}

/** What asking for one attempt on a capped deployment answered. */
export type TakeResult =
  /** Taken: `slot` is the in-flight slot to give back (null when the deployment has no `concurrency`). */
  | { readonly _tag: "Taken"; readonly slot: string | null }
  /** Every slot is held (by any replica). */
  | { readonly _tag: "Full" }
  /** `rate_limit_rpm` starts in the last minute; the oldest leaves the window in `retryMs`. */
  | { readonly _tag: "RateLimited"; readonly retryMs: number }
  /** The shared store did not answer (or answered nonsense): the deployment is skipped, as when full. */
  | { readonly _tag: "Unavailable"; readonly detail: string }

export interface SharedCaps {
  /**
   * Counts one attempt on deployment `key` (`<model>/<deployment>`) against its caps, atomically: an in-flight slot
   * (a lease kept alive while this replica lives) and a start in the minute's window, both or neither. Never fails.
   */
  readonly take: (key: string, caps: Caps) => Effect.Effect<TakeResult>
  /** Gives a taken slot back; the caller calls it once per slot. Never fails: a lost release lapses with its lease. */
  readonly release: (key: string, slot: string) => void
  /**
   * What the fleet holds on deployment `key` now: slots in flight (leases not lapsed) and attempt starts in the last
   * 60 s, for the operator's listing; null when the shared store did not answer. Never fails.
   */
  readonly usage: (key: string) => Effect.Effect<FleetUsage | null>
}

/** One deployment's fleet-wide figures (`SharedCaps.usage`). */
export interface FleetUsage {
  readonly inFlight: number
  readonly startsLastMinute: number
}
