/**
 * The Redis backend's side of the model gates: the in-flight slots are leases in `m:{model}:lease` (taken and
 * dropped atomically by the admission and settle scripts); this module keeps this replica's leases alive and
 * finishes what could not be finished.
 *
 * - A lease expires `leaseMs` (`DEFAULT_LEASE_MS`, 9 s) after it was taken or last extended; a dead replica's
 *   leases lapse and are pruned by the next admission, so its slots come back at most 9 s after it died.
 * - One heartbeat fiber per layer extends every lease this replica holds every `leaseMs / 3` (3 s), and retries
 *   the settles/releases that failed (they are idempotent: the reservation record is deleted by the first).
 * - The beats keep a fixed rate: a slow round trip (bounded by the client's command timeout, 500 ms) delays
 *   neither the next beat nor its successors, and a lease outlives two failed beats in a row.
 * - The heartbeat sleeps only while something is held or waits for a retry.
 */
import { Clock, Duration, Effect, Queue } from "effect"
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

const MAX_RETRIES = 10_000

/** Lease lifetime without a heartbeat: a dead replica's slots come back within this time. */
export const DEFAULT_LEASE_MS = 9_000

/** Starts the heartbeat in the current scope. */
export const make = (options: {
  readonly scripts: AdmissionScripts
  readonly leaseMs: number
  /** The scripts' time (undefined: Redis `TIME`). */
  readonly now: () => number | undefined
}) =>
  Effect.gen(function*() {
    const { scripts, leaseMs, now } = options
    /** model id -> lease ids held by this replica. */
    const held = new Map<string, Set<string>>()
    const retries: Array<SettleCall> = []
    /** Wakes the heartbeat when there is something to extend or retry. */
    const beat = yield* Queue.sliding<void>(1)

    const retry = (call: SettleCall) => {
      if (retries.length < MAX_RETRIES) retries.push(call)
      Queue.offerUnsafe(beat, undefined)
    }

    const heartbeat: Effect.Effect<void> = Effect.suspend(() => {
      const at = now()
      const extend = [...held].map(([modelId, ids]) =>
        scripts.extend({ modelId, now: at, leaseMs, leaseIds: [...ids] }).pipe(Effect.ignore)
      )
      const again = retries.splice(0, retries.length).map((call) =>
        scripts.settle({ ...call, now: now() }).pipe(Effect.catch(() => Effect.sync(() => retry(call))))
      )
      return Effect.all([...extend, ...again], { concurrency: "unbounded", discard: true })
    })

    const beatMs = Math.max(1, Math.floor(leaseMs / 3))
    const clock = yield* Clock.Clock
    /** When the next beat is due (fixed rate while something is held); null while idle. */
    let due: number | null = null
    yield* Effect.suspend(() => {
      if (held.size === 0 && retries.length === 0) {
        due = null
        return Queue.take(beat)
      }
      const now = clock.currentTimeMillisUnsafe()
      // The first beat comes one period after the loop wakes; later ones keep the rate whatever a beat took.
      due = due === null ? now + beatMs : due
      const wait = Math.max(0, due - now)
      due = Math.max(due, now) + beatMs
      return Effect.andThen(Effect.sleep(Duration.millis(wait)), heartbeat)
    }).pipe(Effect.forever, Effect.forkScoped)

    const leases: RedisLeases = {
      hold: (modelId, leaseId) => {
        let set = held.get(modelId)
        if (set === undefined) held.set(modelId, set = new Set())
        set.add(leaseId)
        Queue.offerUnsafe(beat, undefined)
      },
      unhold: (modelId, leaseId) => {
        const set = held.get(modelId)
        if (set === undefined) return
        set.delete(leaseId)
        if (set.size === 0) held.delete(modelId)
      },
      retry,
      heartbeat
    }
    return leases
  })
