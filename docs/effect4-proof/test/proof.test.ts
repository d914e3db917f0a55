import { assert, describe, expect, it } from "@effect/vitest"
import { Clock, Context, Deferred, Duration, Effect, Exit, Fiber, Layer, Queue, RcMap, Ref, Result, Schedule, Scope, Stream, SubscriptionRef } from "effect"
import { TestClock } from "effect/testing"
import { decodeGatewayConfig } from "../src/schema.js"

// v3: Context.get(DefaultServices.liveServices, Clock.Clock)
const liveClock = Context.get(Context.empty(), Clock.Clock)

class Counter extends Context.Service<Counter, { readonly next: Effect.Effect<number> }>()("proof/Counter") {
  static readonly layer = Layer.effect(
    Counter,
    Effect.gen(function*() {
      const ref = yield* Ref.make(0)
      yield* Effect.addFinalizer(() => Effect.void) // v3 Layer.scoped: the layer scope is provided by Layer.effect
      return { next: Ref.updateAndGet(ref, (n) => n + 1) }
    })
  )
}

describe("@effect/vitest 4", () => {
  it.effect("TestClock.adjust wakes sleepers; it.effect provides the TestClock", () =>
    Effect.gen(function*() {
      const clock = yield* Clock.Clock
      assert.notStrictEqual(clock, liveClock) // SseBody/Adapter "clock === liveClock" dispatch still works
      expect(clock.currentTimeMillisUnsafe()).toBe(0) // TestClock starts at epoch 0, like v3
      const fiber = yield* Effect.forkChild(Effect.sleep(Duration.seconds(8))) // v3: Effect.fork
      yield* TestClock.adjust(Duration.seconds(7))
      expect(fiber.pollUnsafe()).toBeUndefined() // v3: yield* Fiber.poll(fiber) -> Option
      yield* TestClock.adjust(Duration.seconds(1))
      expect(Exit.isSuccess(yield* Fiber.await(fiber))).toBe(true)
      yield* TestClock.setTime(Date.UTC(2026, 0, 1))
      expect(yield* Clock.currentTimeMillis).toBe(Date.UTC(2026, 0, 1))
    }))

  it.effect("v3 it.scoped -> it.effect (a Scope is always provided)", () =>
    Effect.gen(function*() {
      const released = yield* Ref.make(false)
      yield* Effect.addFinalizer(() => Ref.set(released, true))
      const counter = yield* Counter
      expect(yield* counter.next).toBe(1)
    }).pipe(Effect.provide(Counter.layer)))

  it.effect("a polling loop on Schedule.spaced + SubscriptionRef.changes under TestClock (LiveCatalog)", () =>
    Effect.gen(function*() {
      const ref = yield* SubscriptionRef.make(0)
      let polls = 0
      yield* Effect.sync(() => polls++).pipe(
        Effect.andThen((n) => SubscriptionRef.set(ref, n + 1)),
        Effect.repeat(Schedule.spaced(Duration.seconds(5))),
        Effect.forkScoped
      )
      const seen = yield* SubscriptionRef.changes(ref).pipe(Stream.take(3), Stream.runCollect, Effect.forkChild)
      yield* TestClock.adjust(Duration.seconds(10))
      expect(polls).toBe(3)
      expect(yield* Fiber.join(seen)).toEqual([1, 2, 3])
    }))

  it.effect("RcMap idleTimeToLive passivates on the TestClock (AdmissionMemory actors)", () =>
    Effect.gen(function*() {
      const released: Array<string> = []
      const map = yield* RcMap.make({
        lookup: (key: string) => Effect.acquireRelease(Effect.succeed(key), () => Effect.sync(() => released.push(key))),
        idleTimeToLive: Duration.seconds(30)
      })
      yield* Effect.scoped(RcMap.get(map, "a"))
      expect(Array.from(yield* RcMap.keys(map))).toEqual(["a"]) // v4 returns an Iterable (v3: Array; AdmissionMemory uses .length)
      yield* TestClock.adjust(Duration.seconds(31))
      expect(released).toEqual(["a"])
    }))

  it.effect("a root fiber started from a callback with the captured context follows the TestClock", () =>
    Effect.gen(function*() {
      const context = yield* Effect.context<never>() // v3: Effect.runtime<never>()
      const done = yield* Deferred.make<void>()
      setImmediate(() => Effect.runForkWith(context)(Effect.sleep("5 seconds").pipe(Effect.andThen(Deferred.succeed(done, undefined)))))
      yield* Effect.promise(() => new Promise((r) => setImmediate(r)))
      yield* TestClock.adjust("5 seconds")
      yield* Deferred.await(done)
    }))

  it.effect("Queue.sliding + offerUnsafe (AdmissionMemory wake queue)", () =>
    Effect.gen(function*() {
      const wake = yield* Queue.sliding<void>(1)
      Queue.offerUnsafe(wake, undefined) // v3: wake.unsafeOffer(undefined)
      Queue.offerUnsafe(wake, undefined)
      yield* Queue.take(wake)
      expect(yield* Queue.size(wake)).toBe(0)
    }))

  it.live("it.live runs on the real clock (v3 it.live / it.scopedLive)", () =>
    Effect.gen(function*() {
      expect(yield* Clock.Clock).toBe(liveClock)
      yield* Effect.addFinalizer(() => Effect.void)
    }))

  it("plain vitest tests still work (schema decode)", () => {
    expect(Result.isFailure(decodeGatewayConfig({}))).toBe(true)
  })

  // v3 tests that did `.pipe(Effect.provide(TestContext.TestContext))` outside it.effect:
  it("TestContext.TestContext -> TestClock.layer() (runPromise outside it.effect)", async () => {
    const at = await Effect.runPromise(
      Effect.gen(function*() {
        yield* TestClock.adjust("1 minute")
        return yield* Clock.currentTimeMillis
      }).pipe(Effect.provide(TestClock.layer()), Effect.scoped)
    )
    expect(at).toBe(60_000)
    const scope = Effect.runSync(Scope.make())
    await Effect.runPromise(Scope.close(scope, Exit.void))
  })
})
