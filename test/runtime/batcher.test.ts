/**
 * The one batched writer (runtime/Batcher.ts), queue form, on the TestClock with a recording store: a batch is
 * written one interval after the first item, `batchSize` at a time and in order; a failed write keeps its items
 * (in order, ahead of newer ones) and is retried an interval later without a new item; items the store refuses
 * are dropped, counted and not retried; past `maxPending` the oldest go; closing the scope writes what is left.
 * The users (request rows, key stamps, quota write-behind) are tested against real databases in their own files.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Scope } from "effect"
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
