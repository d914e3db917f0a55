/**
 * The Redis backend's side of the model gates: the in-flight slots are leases in `m:{model}:lease` (taken and
 * dropped atomically by the admission and settle scripts); this module keeps this replica's leases alive and
 * finishes what could not be finished.
 *
 * - A lease expires `leaseMs` (30 s) after it was taken or last extended; a dead replica's leases lapse and are
 *   pruned by the next admission.
 * - One heartbeat fiber per layer extends every lease this replica holds every `leaseMs / 3`, and retries the
 *   settles/releases that failed (they are idempotent: the reservation record is deleted by the first).
 * - The heartbeat sleeps only while something is held or waits for a retry.
 */
import { Duration, Effect, Queue } from "effect"
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

    const beatEvery = Duration.millis(Math.max(1, Math.floor(leaseMs / 3)))
    yield* Effect.suspend(() =>
      held.size === 0 && retries.length === 0
        ? Queue.take(beat)
        : Effect.andThen(Effect.sleep(beatEvery), heartbeat)
    ).pipe(Effect.forever, Effect.forkScoped)

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
