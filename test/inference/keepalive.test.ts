/**
 * Event 5: `: ping` when the upstream is idle for more than 8 s. Driven by TestClock only.
 */
import { describe, expect, it } from "@effect/vitest"
import { Chunk, Deferred, Duration, Effect, Exit, Fiber, Option, Ref, Stream, TestClock } from "effect"
import { keepAlive, PING_INTERVAL } from "../../src/inference/KeepAlive.js"

const PING = ": ping"

/** Runs `stream` in the background, collecting what it emits so far. */
const collect = <E>(stream: Stream.Stream<string, E>) =>
  Effect.gen(function*() {
    const seen = yield* Ref.make<ReadonlyArray<string>>([])
    const fiber = yield* stream.pipe(
      Stream.runForEach((item) => Ref.update(seen, (items) => [...items, item])),
      Effect.fork
    )
    return { seen: Ref.get(seen), fiber }
  })

/** Advances the TestClock by `ms` and lets every woken fiber run. */
const advance = (ms: number) => TestClock.adjust(Duration.millis(ms)).pipe(Effect.zipRight(Effect.yieldNow()))

/** A source that sleeps `gapMs` before each of `items`. */
const slowSource = (items: ReadonlyArray<string>, gapMs: number) =>
  Stream.fromIterable(items).pipe(Stream.mapEffect((item) => Effect.as(Effect.sleep(Duration.millis(gapMs)), item)))

describe("keepAlive", () => {
  it("the interval is 8 seconds", () => {
    expect(Duration.toMillis(PING_INTERVAL)).toBe(8_000)
  })

  it.effect("a source idle for 20 s gets a ping after 8 s, not before; items pass through in order", () =>
    Effect.gen(function*() {
      const { fiber, seen } = yield* collect(keepAlive(slowSource(["a", "b"], 20_000), PING_INTERVAL, PING))
      yield* advance(7_999)
      expect(yield* seen).toEqual([])
      yield* advance(1)
      expect(yield* seen).toEqual([PING])
      yield* advance(7_999)
      expect(yield* seen).toEqual([PING])
      yield* advance(1)
      expect(yield* seen).toEqual([PING, PING])
      yield* advance(4_000) // t = 20 s: first item; the idle timer restarts from here
      expect(yield* seen).toEqual([PING, PING, "a"])
      yield* advance(7_999)
      expect(yield* seen).toEqual([PING, PING, "a"])
      yield* advance(1)
      expect(yield* seen).toEqual([PING, PING, "a", PING])
      yield* advance(12_000) // t = 40 s: second item, then the end
      expect(yield* seen).toEqual([PING, PING, "a", PING, PING, "b"])
      const exit = yield* Fiber.await(fiber)
      expect(Exit.isSuccess(exit)).toBe(true)
    }))

  it.effect("a busy source never gets a ping", () =>
    Effect.gen(function*() {
      const items = Array.from({ length: 10 }, (_, i) => `item${i}`)
      const { fiber, seen } = yield* collect(keepAlive(slowSource(items, 7_000), PING_INTERVAL, PING))
      for (let i = 0; i < 10; i++) yield* advance(7_000)
      yield* Fiber.join(fiber)
      expect(yield* seen).toEqual(items)
    }))

  it.effect("no item is lost when an item and the ping deadline fall on the same instant", () =>
    Effect.gen(function*() {
      const items = Array.from({ length: 6 }, (_, i) => `item${i}`)
      const { fiber, seen } = yield* collect(keepAlive(slowSource(items, 8_000), PING_INTERVAL, PING))
      for (let i = 0; i < 6; i++) yield* advance(8_000)
      yield* advance(8_000)
      yield* Fiber.join(fiber)
      expect((yield* seen).filter((s) => s !== PING)).toEqual(items)
    }))

  it.effect("a failure of the source propagates after the items before it", () =>
    Effect.gen(function*() {
      const source = Stream.concat(slowSource(["a"], 1_000), Stream.fail("upstream broke" as const))
      const { fiber, seen } = yield* collect(keepAlive(source, PING_INTERVAL, PING))
      yield* advance(1_000)
      const exit = yield* Fiber.await(fiber)
      expect(yield* seen).toEqual(["a"])
      expect(exit).toEqual(Exit.fail("upstream broke"))
    }))

  it.effect("a failure after a long silence propagates after the pings", () =>
    Effect.gen(function*() {
      const source = Stream.fromEffect(Effect.sleep("10 seconds").pipe(Effect.zipRight(Effect.fail("late failure" as const))))
      const { fiber, seen } = yield* collect(keepAlive(source, PING_INTERVAL, PING))
      yield* advance(10_000)
      const exit = yield* Fiber.await(fiber)
      expect(yield* seen).toEqual([PING])
      expect(exit).toEqual(Exit.fail("late failure"))
    }))

  it.effect("a defect of the source propagates", () =>
    Effect.gen(function*() {
      const exit = yield* keepAlive(Stream.die(new Error("boom")), PING_INTERVAL, PING).pipe(Stream.runCollect, Effect.exit)
      expect(Exit.isFailure(exit) && !Exit.isInterrupted(exit)).toBe(true)
    }))

  it.effect("interrupting the consumer interrupts the source and runs its finalizers", () =>
    Effect.gen(function*() {
      const released = yield* Deferred.make<void>()
      const started = yield* Deferred.make<void>()
      const source = Stream.acquireRelease(Deferred.succeed(started, undefined), () => Deferred.succeed(released, undefined)).pipe(
        Stream.flatMap(() => Stream.never)
      )
      const { fiber, seen } = yield* collect(keepAlive(source as Stream.Stream<string>, PING_INTERVAL, PING))
      yield* Deferred.await(started)
      yield* advance(8_000)
      expect(yield* seen).toEqual([PING])
      yield* Fiber.interrupt(fiber)
      expect(yield* Deferred.isDone(released)).toBe(true)
    }))

  it.effect("the source is back-pressured: it does not run ahead of a stalled consumer", () =>
    Effect.gen(function*() {
      const produced = yield* Ref.make(0)
      const source = Stream.range(1, 1_000).pipe(Stream.tap(() => Ref.update(produced, (n) => n + 1)))
      const pull = yield* Stream.toPull(keepAlive(source.pipe(Stream.map(String)), PING_INTERVAL, PING))
      const first = yield* pull
      expect(Chunk.toReadonlyArray(first)).toEqual(["1"])
      yield* Effect.yieldNow()
      expect(yield* Ref.get(produced)).toBeLessThanOrEqual(3)
      const rest = yield* Effect.forEach(Array.from({ length: 999 }), () => pull).pipe(Effect.map((cs) => cs.flatMap(Chunk.toReadonlyArray)))
      expect(rest).toEqual(Array.from({ length: 999 }, (_, i) => String(i + 2)))
      const end = yield* Effect.either(pull)
      expect(end._tag === "Left" && Option.isNone(end.left)).toBe(true)
    }).pipe(Effect.scoped))
})
