/**
 * Keeps a replica's Redis leases alive: the admission's in-flight leases (`quota/RedisLeases.ts`) and the
 * deployments' slots (`deployments/CapsRedis.ts`) alike. A lease lapses `leaseMs` after it was taken or last
 * extended, so a dead replica's leases come back at most `leaseMs` after its last beat.
 *
 * - One heartbeat fiber (in the scope of `make`) extends every lease held, group by group, every `leaseMs / 3`, and
 *   retries the work that failed (given back through `retry`; it must be idempotent).
 * - The beats keep a fixed rate: a slow round trip delays neither the next beat nor its successors, and a lease
 *   outlives two failed beats in a row.
 * - The heartbeat sleeps only while something is held or waits for a retry.
 */
import { Clock, Duration, Effect, Queue } from "effect"

export interface LeaseKeeper<Retry> {
  /** This replica now holds `id` in `group`: keep it alive. */
  readonly hold: (group: string, id: string) => void
  /** The lease was dropped (or is being dropped): stop extending it. */
  readonly unhold: (group: string, id: string) => void
  /** Work that failed: done again on the next beat. */
  readonly retry: (work: Retry) => void
  /** One beat now: extend what is held, redo what failed. */
  readonly heartbeat: Effect.Effect<void>
}

/** Failed work kept for a retry; past it the oldest leases lapse by themselves. */
const MAX_RETRIES = 10_000

export const make = <Retry>(options: {
  readonly leaseMs: number
  /** Extends the leases `ids` of `group`; a failure is ignored (the next beat extends them again). */
  readonly extend: (group: string, ids: ReadonlyArray<string>) => Effect.Effect<void, unknown>
  /** Does failed work again; a failure gives it back for the next beat. */
  readonly redo: (work: Retry) => Effect.Effect<void, unknown>
}) =>
  Effect.gen(function*() {
    const held = new Map<string, Set<string>>()
    const retries: Array<Retry> = []
    /** Wakes the heartbeat when there is something to extend or redo. */
    const wake = yield* Queue.sliding<void>(1)

    const retry = (work: Retry): void => {
      if (retries.length < MAX_RETRIES) retries.push(work)
      Queue.offerUnsafe(wake, undefined)
    }

    const heartbeat: Effect.Effect<void> = Effect.suspend(() => {
      const extend = [...held].map(([group, ids]) => Effect.ignore(options.extend(group, [...ids])))
      const again = retries.splice(0, retries.length).map((work) =>
        Effect.catch(options.redo(work), () => Effect.sync(() => retry(work)))
      )
      return Effect.all([...extend, ...again], { concurrency: "unbounded", discard: true })
    })

    const beatMs = Math.max(1, Math.floor(options.leaseMs / 3))
    const clock = yield* Clock.Clock
    /** When the next beat is due (fixed rate while something is held); null while idle. */
    let due: number | null = null
    yield* Effect.suspend(() => {
      if (held.size === 0 && retries.length === 0) {
        due = null
        return Queue.take(wake)
      }
      const now = clock.currentTimeMillisUnsafe()
      // The first beat comes one period after the loop wakes; later ones keep the rate whatever a beat took.
      due = due === null ? now + beatMs : due
      const wait = Math.max(0, due - now)
      due = Math.max(due, now) + beatMs
      return Effect.andThen(Effect.sleep(Duration.millis(wait)), heartbeat)
    }).pipe(Effect.forever, Effect.forkScoped)

    const keeper: LeaseKeeper<Retry> = {
      hold: (group, id) => {
        let set = held.get(group)
        if (set === undefined) held.set(group, set = new Set())
        set.add(id)
        Queue.offerUnsafe(wake, undefined)
      },
      unhold: (group, id) => {
        const set = held.get(group)
        if (set === undefined) return
        set.delete(id)
        if (set.size === 0) held.delete(group)
      },
      retry,
      heartbeat
    }
    return keeper
  })
