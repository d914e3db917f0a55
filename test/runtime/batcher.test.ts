/**
 * The one batched writer (runtime/Batcher.ts), queue form, on the TestClock with a recording store: a batch is
 * written one interval after the first item, `batchSize` at a time and in order; a failed write keeps its items
 * (in order, ahead of newer ones) and is retried an interval later without a new item; items the store refuses
 * are dropped, counted and not retried; past `maxPending` the oldest go; items added while the interval's flush
 * writes wait for the next interval, while `flush` writes them too; closing the scope writes what is left.
 * The users (request rows, key stamps, quota write-behind) are tested against real databases in their own files.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Scope } from "effect"
import { TestClock } from "effect/testing"
import * as Batcher from "../../src/runtime/Batcher.js"

/** A store that records each batch it accepted; fails while `down`; refuses items named in `refuse`. */
const recordingStore = () => {
  const batches: Array<ReadonlyArray<string>> = []
  const state = { down: false, refuse: new Set<string>(), attempts: 0 }
  const write = (batch: ReadonlyArray<string>, drop: (item: string) => void) =>
    Effect.suspend(() => {
      state.attempts++
      if (state.down) return Effect.fail(new Error("store down"))
      for (const item of batch) if (state.refuse.has(item)) drop(item)
      batches.push(batch.filter((item) => !state.refuse.has(item)))
      return Effect.void
    })
  return { batches, state, write }
}

describe("batched writer (queue)", () => {
  it.effect("an interval after the first item, batchSize at a time, in order; idle writes nothing", () =>
    Effect.gen(function*() {
      const store = recordingStore()
      const scope = yield* Scope.make()
      const q = yield* Batcher.queue({ label: "test", interval: "1 second", batchSize: 2, maxPending: 100, write: store.write })
        .pipe(Scope.provide(scope))
      q.add("a")
      yield* TestClock.adjust(600)
      q.add("b")
      q.add("c")
      expect(store.batches).toEqual([])
      yield* TestClock.adjust(400)
      expect(store.batches).toEqual([["a", "b"], ["c"]])
      expect(q.pending()).toBe(0)
      yield* TestClock.adjust("1 minute")
      expect(store.state.attempts).toBe(2)
      yield* Scope.close(scope, Exit.void)
    }))

  it.effect("a failure keeps the items in order and retries an interval later by itself", () =>
    Effect.gen(function*() {
      const store = recordingStore()
      const scope = yield* Scope.make()
      const q = yield* Batcher.queue({ label: "test", interval: "1 second", batchSize: 10, maxPending: 100, write: store.write })
        .pipe(Scope.provide(scope))
      store.state.down = true
      q.add("a")
      q.add("b")
      yield* TestClock.adjust("1 second")
      expect(store.state.attempts).toBe(1)
      expect(q.pending()).toBe(2)
      q.add("c")
      store.state.down = false
      yield* TestClock.adjust("1 second") // no new wake-up needed: the failure re-armed the writer
      expect(store.batches).toEqual([["a", "b", "c"]])
      expect(q.dropped()).toBe(0)
      yield* Scope.close(scope, Exit.void)
    }))

  it.effect("refused items are dropped and counted, not retried; past maxPending the oldest go", () =>
    Effect.gen(function*() {
      const store = recordingStore()
      const scope = yield* Scope.make()
      const q = yield* Batcher.queue({ label: "test", interval: "1 second", batchSize: 10, maxPending: 3, write: store.write })
        .pipe(Scope.provide(scope))
      store.state.refuse.add("bad")
      q.add("x")
      q.add("bad")
      yield* q.flush
      expect(store.batches).toEqual([["x"]])
      expect(q.dropped()).toBe(1)
      yield* q.flush
      expect(store.state.attempts).toBe(1)

      store.state.down = true
      for (const item of ["1", "2", "3", "4", "5"]) q.add(item)
      yield* q.flush
      expect(q.pending()).toBe(3)
      expect(q.dropped()).toBe(3)
      store.state.down = false
      yield* q.flush
      expect(store.batches.at(-1)).toEqual(["3", "4", "5"])
      yield* Scope.close(scope, Exit.void)
    }))

  it.effect("items added while the interval's flush writes wait for the next interval; flush writes them all", () =>
    Effect.gen(function*() {
      const batches: Array<ReadonlyArray<string>> = []
      // Each write takes 100 ms, during which the test adds items.
      const write = (batch: ReadonlyArray<string>) =>
        Effect.sleep("100 millis").pipe(Effect.andThen(Effect.sync(() => batches.push(batch))))
      const scope = yield* Scope.make()
      const q = yield* Batcher.queue({ label: "test", interval: "1 second", batchSize: 2, maxPending: 100, write })
        .pipe(Scope.provide(scope))
      for (const item of ["a", "b", "c"]) q.add(item)
      yield* TestClock.adjust("1 second") // the interval's flush begins with a, b, c pending
      q.add("d")
      yield* TestClock.adjust("100 millis")
      q.add("e")
      yield* TestClock.adjust("100 millis")
      // Two writes for what was pending at its start; d and e are left to the next interval.
      expect(batches).toEqual([["a", "b"], ["c"]])
      expect(q.pending()).toBe(2)
      yield* TestClock.adjust("1 minute")
      expect(batches).toEqual([["a", "b"], ["c"], ["d", "e"]])

      // `flush` (tests, shutdown) writes until nothing is pending, items added while it writes included.
      q.add("f")
      const flushing = yield* Effect.forkChild(q.flush)
      yield* TestClock.adjust("50 millis")
      q.add("g")
      yield* TestClock.adjust("200 millis")
      yield* Fiber.join(flushing)
      expect(batches.slice(3)).toEqual([["f"], ["g"]])
      expect(q.pending()).toBe(0)
      yield* Scope.close(scope, Exit.void)
    }))

  it.effect("closing the scope writes what is pending without waiting for the interval", () =>
    Effect.gen(function*() {
      const store = recordingStore()
      const scope = yield* Scope.make()
      const q = yield* Batcher.queue({ label: "test", interval: "1 hour", batchSize: 10, maxPending: 100, write: store.write })
        .pipe(Scope.provide(scope))
      q.add("last")
      yield* Scope.close(scope, Exit.void)
      expect(store.batches).toEqual([["last"]])
    }))
})

describe("batched writer (a take of everything changed)", () => {
  it.effect("changes made while the interval's flush writes are written an interval later, not right after", () =>
    Effect.gen(function*() {
      // What the quota write-behind does: a take clears every mark, and each change signals.
      const changed = new Set<string>()
      const writes: Array<ReadonlyArray<string>> = []
      const scope = yield* Scope.make()
      const batcher: Batcher.Batcher = yield* Batcher.make({
        label: "test",
        interval: "1 second",
        take: () => {
          if (changed.size === 0) return undefined
          const taken = [...changed]
          changed.clear()
          return { write: Effect.sleep("100 millis").pipe(Effect.andThen(Effect.sync(() => writes.push(taken)))) }
        }
      }).pipe(Scope.provide(scope))
      const change = (key: string) => {
        changed.add(key)
        batcher.signal()
      }
      change("a")
      yield* TestClock.adjust("1 second")
      change("b") // while "a" is being written
      yield* TestClock.adjust("100 millis")
      change("c")
      yield* TestClock.adjust("500 millis")
      expect(writes).toEqual([["a"]])
      yield* TestClock.adjust("1 second")
      expect(writes).toEqual([["a"], ["b", "c"]])

      // `flush` writes the changes made while it writes too.
      change("d")
      const flushing = yield* Effect.forkChild(batcher.flush)
      yield* TestClock.adjust("50 millis")
      change("e")
      yield* TestClock.adjust("200 millis")
      yield* Fiber.join(flushing)
      expect(writes.slice(2)).toEqual([["d"], ["e"]])
      yield* Scope.close(scope, Exit.void)
    }))
})
