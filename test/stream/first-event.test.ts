/**
 * Finding 11 (spec Events 5 and 7): a stream waits for the upstream's first event at most 8 s. In time, it
 * behaves as before (a failure is still a JSON error); otherwise the body is committed with `: ping`, pinged
 * every 8 s while idle, and a failure then cuts it. Driven by TestClock only.
 */
import { describe, expect, it } from "@effect/vitest"
import { Cause, Duration, Effect, Exit, Fiber, Scope } from "effect"
import { TestClock } from "effect/testing"
import { PING_FRAME, PING_INTERVAL, sseBody, streamTiming } from "../../src/inference/SseBody.js"
import { attach } from "../support/SseOutput.js"
import { type UpstreamCall, UpstreamError, type UpstreamEvent, type UpstreamSink } from "../../src/upstream/Upstream.js"

const advance = (ms: number) =>
  TestClock.adjust(Duration.millis(ms)).pipe(Effect.andThen(Effect.yieldNow), Effect.andThen(Effect.yieldNow))
const settle = Effect.yieldNow.pipe(Effect.repeat({ times: 3 }))
const nextMacrotask = Effect.promise(() => new Promise<void>((r) => setImmediate(r)))


const content = (text: string): UpstreamEvent => ({ _tag: "Content", text })

/** An upstream call whose opening the test resolves or fails by hand, and whose interruption it counts. */
const slowCall = () => {
  const state = {
    sink: null as UpstreamSink | null,
    resume: null as ((effect: Effect.Effect<UpstreamCall, UpstreamError>) => void) | null,
    interrupted: 0,
    resumed: 0,
    aborted: 0
  }
  const open = (sink: UpstreamSink) =>
    Effect.callback<UpstreamCall, UpstreamError>((resume) => {
      state.sink = sink
      state.resume = resume
      return Effect.sync(() => void state.interrupted++)
    })
  const succeed = (first: ReadonlyArray<UpstreamEvent>) =>
    state.resume!(Effect.succeed({
      first,
      resume: () => void state.resumed++,
      abort: () => void state.aborted++
    }))
  const failWith = (error: UpstreamError) => state.resume!(Effect.fail(error))
  return { state, open, succeed, failWith }
}

const handlers = (log: Array<string>) => ({
  frames: (events: ReadonlyArray<UpstreamEvent>) =>
    events.map((e) => (e._tag === "Content" ? `data: ${e.text}\n\n` : "")).join(""),
  end: Effect.sync(() => {
    log.push("end")
    return "data: last\n\ndata: [DONE]\n\n"
  }),
  failed: (error: UpstreamError) => Effect.sync(() => void log.push(`failed:${error.kind}`)),
  cancelled: Effect.sync(() => void log.push("cancelled")),
  started: () => void log.push("started")
})

const HEAD = "data: head\n\n"

/** Starts `sseBody` in a fiber (it resolves only once the first event came or the wait ran out). */
const start = (call: ReturnType<typeof slowCall>, log: Array<string>, wait?: Duration.Input) =>
  Effect.gen(function*() {
    const context = yield* Effect.context<never>()
    const scope = yield* Scope.make()
    const fiber = yield* Effect.forkChild(sseBody(context, scope, call.open, HEAD, handlers(log), wait))
    yield* settle
    return { scope, fiber }
  })

describe("stream first-event wait", () => {
  it("waits 8 s by default, the ping interval", () => {
    expect(Duration.toMillis(Duration.fromInputUnsafe(streamTiming.firstEventWait))).toBe(8_000)
    expect(Duration.toMillis(PING_INTERVAL)).toBe(8_000)
  })

  it.effect("a first event within the wait: no ping, the body starts with the head and the first frames", () =>
    Effect.gen(function*() {
      const call = slowCall()
      const log: Array<string> = []
      const { fiber, scope } = yield* start(call, log)
      yield* advance(7_000)
      expect(fiber.pollUnsafe()).toBeUndefined()
      call.succeed([content("a")])
      const client = yield* attach(yield* Fiber.join(fiber))
      expect(client.take()).toBe(`${HEAD}data: a\n\n`)
      expect(log).toEqual(["started"])
      yield* nextMacrotask
      expect(call.state.resumed).toBe(1)
      yield* Scope.close(scope, Exit.void)
    }))

  it.effect("a failure within the wait fails the effect, so the client still gets a JSON error", () =>
    Effect.gen(function*() {
      const call = slowCall()
      const log: Array<string> = []
      const { fiber, scope } = yield* start(call, log)
      yield* advance(3_000)
      call.failWith(new UpstreamError({ kind: "status", status: 400, detail: "nope" }))
      const exit = yield* Fiber.await(fiber)
      expect(Exit.isFailure(exit)).toBe(true)
      if (Exit.isFailure(exit)) {
        const reasons = exit.cause.reasons
        const error = reasons.length === 1 && Cause.isFailReason(reasons[0]!) ? reasons[0].error : null
        expect(error).toMatchObject({ kind: "status", status: 400 })
      }
      expect(log).toEqual([])
      yield* Scope.close(scope, Exit.void)
    }))

  it.effect("no event within 8 s: the body starts with `: ping`, pings every 8 s, then head, frames and the end", () =>
    Effect.gen(function*() {
      const call = slowCall()
      const log: Array<string> = []
      const { fiber, scope } = yield* start(call, log)
      yield* advance(7_999)
      expect(fiber.pollUnsafe()).toBeUndefined()
      yield* advance(1)
      const client = yield* attach(yield* Fiber.join(fiber))
      expect(client.take()).toBe(PING_FRAME)
      yield* advance(7_999)
      expect(client.take()).toBe("")
      yield* advance(1)
      expect(client.take()).toBe(PING_FRAME)
      yield* advance(8_000)
      expect(client.take()).toBe(PING_FRAME)
      // The first event at 24.5 s: the head and its frames; pinging restarts from there.
      yield* advance(500)
      call.succeed([content("a")])
      yield* settle
      expect(client.take()).toBe(`${HEAD}data: a\n\n`)
      expect(log).toEqual(["started"])
      yield* nextMacrotask
      expect(call.state.resumed).toBe(1)
      expect(call.state.sink!.onEvents([content("b")])).toBe(true)
      expect(client.take()).toBe("data: b\n\n")
      yield* advance(7_999)
      expect(client.take()).toBe("")
      yield* advance(1)
      expect(client.take()).toBe(PING_FRAME)
      call.state.sink!.onEnd()
      yield* settle
      expect(log).toEqual(["started", "end"])
      expect(client.take()).toBe("data: last\n\ndata: [DONE]\n\n")
      yield* Scope.close(scope, Exit.void)
    }))

  it.effect("a failure after the commit goes to `failed` and cuts the body, without head or [DONE]", () =>
    Effect.gen(function*() {
      const call = slowCall()
      const log: Array<string> = []
      const { fiber, scope } = yield* start(call, log)
      yield* advance(8_000)
      const body = yield* Fiber.join(fiber)
      const client = yield* attach(body)
      expect(client.take()).toBe(PING_FRAME)
      yield* advance(10_000)
      expect(client.take()).toBe(PING_FRAME)
      call.failWith(new UpstreamError({ kind: "timeout", detail: "no first token within 60000 ms" }))
      yield* settle
      expect(log).toEqual(["failed:timeout"])
      // Cut once: no head, no frames, no [DONE] after it; run ends when the connection has closed.
      expect(client.state.cuts).toBe(1)
      expect(client.state.ended).toBe(false)
      expect(client.take()).toBe("")
      expect(client.fiber.pollUnsafe()).toBeUndefined()
      body.closed()
      yield* settle
      expect(client.fiber.pollUnsafe()).toBeDefined()
      yield* advance(30_000)
      expect(client.take()).toBe("")
      expect(log).toEqual(["failed:timeout"])
      yield* Scope.close(scope, Exit.void)
    }))

  it.effect("the client leaves after the commit: the opening is interrupted (upstream aborted), cancelled once", () =>
    Effect.gen(function*() {
      const call = slowCall()
      const log: Array<string> = []
      const { fiber, scope } = yield* start(call, log)
      yield* advance(8_000)
      const client = yield* attach(yield* Fiber.join(fiber))
      expect(client.take()).toBe(PING_FRAME)
      yield* Fiber.interrupt(client.fiber)
      yield* settle
      expect(call.state.interrupted).toBe(1)
      expect(log).toEqual(["cancelled"])
      // No more pings into a destroyed body, and nothing else is recorded.
      yield* advance(30_000)
      expect(log).toEqual(["cancelled"])
      yield* Scope.close(scope, Exit.void)
    }))

  it.effect("the request's scope closing before the first event interrupts the opening and cuts the body", () =>
    Effect.gen(function*() {
      const call = slowCall()
      const log: Array<string> = []
      const { fiber, scope } = yield* start(call, log)
      yield* advance(8_000)
      const client = yield* attach(yield* Fiber.join(fiber))
      client.take()
      yield* Scope.close(scope, Exit.void)
      yield* settle
      expect(call.state.interrupted).toBe(1)
      expect(client.state.cuts).toBe(1)
      // The request was settled by whoever closed its scope: no handler runs here.
      expect(log).toEqual([])
    }))

  it.effect("the wait is a parameter: with 250 ms the body commits at 250 ms", () =>
    Effect.gen(function*() {
      const call = slowCall()
      const log: Array<string> = []
      const { fiber, scope } = yield* start(call, log, Duration.millis(250))
      yield* advance(249)
      expect(fiber.pollUnsafe()).toBeUndefined()
      yield* advance(1)
      const client = yield* attach(yield* Fiber.join(fiber))
      expect(client.take()).toBe(PING_FRAME)
      // Pings keep the 8 s interval.
      yield* advance(7_999)
      expect(client.take()).toBe("")
      yield* advance(1)
      expect(client.take()).toBe(PING_FRAME)
      call.succeed([content("a")])
      yield* settle
      expect(client.take()).toBe(`${HEAD}data: a\n\n`)
      yield* Scope.close(scope, Exit.void)
      expect(call.state.aborted).toBe(1)
    }))
})
