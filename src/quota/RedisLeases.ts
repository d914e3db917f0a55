/**
 * The Redis backend's side of the model gates: the in-flight slots are leases in `m:{model}:lease` (taken and
 * dropped atomically by the admission and settle scripts); this module keeps this replica's leases alive and
 * finishes what could not be finished, on the shared lease keeper (`runtime/LeaseKeeper.ts`).
 *
 * - A lease expires `leaseMs` (`DEFAULT_LEASE_MS`, 9 s) after it was taken or last extended; a dead replica's
 *   leases lapse and are pruned by the next admission, so its slots come back at most 9 s after it died.
 * - The keeper's heartbeat extends every lease this replica holds every `leaseMs / 3` (3 s), at a fixed rate, and
 *   retries the settles/releases that failed (they are idempotent: the reservation record is deleted by the first).
 */
import type { Effect, Scope } from "effect"
import * as LeaseKeeper from "../runtime/LeaseKeeper.js"
import type { AdmissionScripts, SettleCall } from "./AdmissionScripts.js"

export interface RedisLeases {
  /** This replica now holds `leaseId` on `modelId`: keep it alive. */
  readonly hold: (modelId: string, leaseId: string) => void
  /** The lease was dropped (or is being dropped): stop extending it. */
  readonly unhold: (modelId: string, leaseId: string) => void
  /** A settle or release that failed: retry it on the next beat. */
  readonly retry: (call: SettleCall) => void
  /** One beat now: extend what is held, retry what failed. */
  readonly heartbeat: Effect.Effect<void>
}

/** Lease lifetime without a heartbeat: a dead replica's slots come back within this time. */
export const DEFAULT_LEASE_MS = 9_000

/** Starts the heartbeat in the current scope. */
export const make = (options: {
  readonly scripts: AdmissionScripts
  readonly leaseMs: number
  /** The scripts' time (undefined: Redis `TIME`). */
  readonly now: () => number | undefined
}): Effect.Effect<RedisLeases, never, Scope.Scope> => {
  const { scripts, leaseMs, now } = options
  return LeaseKeeper.make<SettleCall>({
    leaseMs,
    extend: (modelId, leaseIds) => scripts.extend({ modelId, now: now(), leaseMs, leaseIds }),
    redo: (call) => scripts.settle({ ...call, now: now() })
  })
}
