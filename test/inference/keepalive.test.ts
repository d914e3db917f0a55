/**
 * Event 5 (`: ping` after 8 s idle) and the SSE body fed by an upstream call, driven by TestClock only.
 */
import { describe, expect, it } from "@effect/vitest"
import { afterEach, vi } from "vitest"
import { Duration, Effect, Exit, Fiber, Scope } from "effect"
import { TestClock } from "effect/testing"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import { idlePinger, nodeOutput, PING_FRAME, PING_INTERVAL, sseBody } from "../../src/inference/SseBody.js"
import { attach } from "../support/SseOutput.js"
import { UpstreamError, type UpstreamCall, type UpstreamEvent, type UpstreamSink } from "../../src/upstream/Upstream.js"

const advance = (ms: number) => TestClock.adjust(Duration.millis(ms)).pipe(Effect.andThen(Effect.yieldNow))

const content = (text: string): UpstreamEvent => ({ _tag: "Content", text })

/** A scripted upstream call: the test drives the sink by hand. */
const fakeCall = (first: ReadonlyArray<UpstreamEvent>) => {
  const state = { sink: null as UpstreamSink | null, resumed: 0, aborted: 0 }
  const call: UpstreamCall = {
    first,
    resume: () => void state.resumed++,
    abort: () => void state.aborted++
  }
  const open = (sink: UpstreamSink) => Effect.sync(() => {
    state.sink = sink
    return call
  })
  return { state, open }
}

const handlers = (log: Array<string>) => ({
  frames: (events: ReadonlyArray<UpstreamEvent>) =>
    events.map((e) => (e._tag === "Content" ? `data: ${e.text}\n\n` : "")).join(""),
  end: Effect.sync(() => {
    log.push("end")
    return "data: last\n\ndata: [DONE]\n\n"
  }),
  failed: (error: UpstreamError) => Effect.sync(() => void log.push(`failed:${error.kind}`)),
  cancelled: Effect.sync(() => void log.push("cancelled"))
})

describe("idle pinger", () => {
  it("the interval is 8 seconds", () => {
    expect(Duration.toMillis(PING_INTERVAL)).toBe(8_000)
    expect(PING_FRAME).toBe(": ping\n\n")
  })

  it.effect("pings after 8 s without a touch, not before, and again every 8 s", () =>
    Effect.gen(function*() {
      const scope = yield* Scope.make()
      let pings = 0
      yield* idlePinger(PING_INTERVAL, () => void pings++, scope)
      yield* advance(7_999)
      expect(pings).toBe(0)
      yield* advance(1)
      expect(pings).toBe(1)
      yield* advance(7_999)
      expect(pings).toBe(1)
      yield* advance(1)
      expect(pings).toBe(2)
      yield* Scope.close(scope, Exit.void)
      yield* advance(60_000)
      expect(pings).toBe(2)
    }))

  it.effect("a touch restarts the idle period; a busy stream never pings", () =>
    Effect.gen(function*() {
      const scope = yield* Scope.make()
      let pings = 0
      const { touch } = yield* idlePinger(PING_INTERVAL, () => void pings++, scope)
      for (let i = 0; i < 10; i++) {
        yield* advance(7_000)
        touch()
      }
      expect(pings).toBe(0)
      yield* advance(7_999)
      expect(pings).toBe(0)
      yield* advance(1)
      expect(pings).toBe(1)
      yield* Scope.close(scope, Exit.void)
    }))
})

describe("idle pinger on the live clock (a plain timer, driven here by fake timers)", () => {
  afterEach(() => void vi.useRealTimers())

  it("pings after 8 s without a touch, restarts on touch, stops when the scope closes", () => {
    vi.useFakeTimers()
    const scope = Effect.runSync(Scope.make())
    let pings = 0
    const { touch } = Effect.runSync(idlePinger(PING_INTERVAL, () => void pings++, scope))
    vi.advanceTimersByTime(7_999)
    expect(pings).toBe(0)
    vi.advanceTimersByTime(1)
    expect(pings).toBe(1)
    vi.advanceTimersByTime(5_000)
    touch() // t = 13 s: the next ping is due at 21 s, not 16 s
    vi.advanceTimersByTime(7_999)
    expect(pings).toBe(1)
    vi.advanceTimersByTime(1)
    expect(pings).toBe(2)
    Effect.runSync(Scope.close(scope, Exit.void))
    vi.advanceTimersByTime(60_000)
    expect(pings).toBe(2)
  })
})

describe("SSE body", () => {
  it.effect("writes head and first events, streams later batches, pings when idle, ends with the final frames", () =>
    Effect.gen(function*() {
      const context = yield* Effect.context<never>()
      const scope = yield* Scope.make()
      const log: Array<string> = []
      const { state, open } = fakeCall([content("a")])
      const body = yield* sseBody(context, scope, open, "data: head\n\n", handlers(log))
      const client = yield* attach(body)
      expect(client.take()).toBe("data: head\n\ndata: a\n\n")
      yield* Effect.promise(() => new Promise<void>((r) => queueMicrotask(r)))
      expect(state.resumed).toBe(1)
      expect(state.sink!.onEvents([content("b"), content("c")])).toBe(true)
      expect(client.take()).toBe("data: b\n\ndata: c\n\n")
      yield* advance(8_000)
      expect(client.take()).toBe(PING_FRAME)
      expect(client.fiber.pollUnsafe()).toBeUndefined()
      state.sink!.onEnd()
      yield* Effect.yieldNow
      yield* Effect.yieldNow
      expect(log).toEqual(["end"])
      expect(client.take()).toBe("data: last\n\ndata: [DONE]\n\n")
      expect(client.state.ended).toBe(true)
      // `run` completes with the end: the request's fiber returns.
      expect(client.fiber.pollUnsafe()).toBeDefined()
      yield* Scope.close(scope, Exit.void)
      expect(state.aborted).toBe(1) // the scope's finalizer; a no-op after the end for a real call
    }))

  it.effect("a mid-stream failure cuts the output without the final frames; run ends when the connection closes", () =>
    Effect.gen(function*() {
      const context = yield* Effect.context<never>()
      const scope = yield* Scope.make()
      const log: Array<string> = []
      const { state, open } = fakeCall([content("a")])
      const body = yield* sseBody(context, scope, open, "", handlers(log))
      const client = yield* attach(body)
      client.take()
      state.sink!.onError(new UpstreamError({ kind: "protocol", detail: "dropped" }))
      yield* Effect.yieldNow
      yield* Effect.yieldNow
      expect(log).toEqual(["failed:protocol"])
      expect(client.state.cuts).toBe(1)
      expect(client.state.ended).toBe(false)
      expect(client.take()).not.toContain("[DONE]")
      expect(client.fiber.pollUnsafe()).toBeUndefined()
      body.closed()
      yield* Effect.yieldNow
      expect(client.fiber.pollUnsafe()).toBeDefined()
      expect(log).toEqual(["failed:protocol"])
      yield* Scope.close(scope, Exit.void)
    }))

  it.effect("a client that goes away aborts the upstream call and is recorded as cancelled once", () =>
    Effect.gen(function*() {
      const context = yield* Effect.context<never>()
      const scope = yield* Scope.make()
      const log: Array<string> = []
      const { state, open } = fakeCall([content("a")])
      const body = yield* sseBody(context, scope, open, "", handlers(log))
      const client = yield* attach(body)
      yield* Fiber.interrupt(client.fiber)
      body.closed()
      yield* Effect.yieldNow
      expect(state.aborted).toBe(1)
      expect(log).toEqual(["cancelled"])
      expect(state.sink!.onEvents([content("late")])).toBe(false)
      state.sink!.onEnd()
      yield* Effect.yieldNow
      expect(log).toEqual(["cancelled"])
      expect(client.state.ended).toBe(false)
      yield* Scope.close(scope, Exit.void)
    }))

  it.effect("back-pressure: a full output pauses the upstream until it drains", () =>
    Effect.gen(function*() {
      const context = yield* Effect.context<never>()
      const scope = yield* Scope.make()
      const { state, open } = fakeCall([content("a")])
      const body = yield* sseBody(context, scope, open, "", handlers([]))
      const client = yield* attach(body)
      yield* Effect.promise(() => new Promise<void>((r) => queueMicrotask(r)))
      const resumedBefore = state.resumed
      client.state.full = true
      expect(state.sink!.onEvents([content("x".repeat(20_000))])).toBe(false)
      expect(state.resumed).toBe(resumedBefore)
      // A drain while not paused does nothing; once paused, the drain resumes the upstream once.
      client.state.full = false
      body.drained()
      body.drained()
      expect(state.resumed).toBe(resumedBefore + 1)
      expect(state.sink!.onEvents([content("y")])).toBe(true)
      body.drained()
      expect(state.resumed).toBe(resumedBefore + 1)
      yield* Scope.close(scope, Exit.void)
    }))
})

describe("Node output", () => {
  const serve = (handler: (res: Http.ServerResponse) => void) =>
    new Promise<{ text: string; headers: Headers }>((resolve, reject) => {
      const server = Http.createServer((_req, res) => handler(res))
      server.listen(0, "127.0.0.1", async () => {
        try {
          const port = (server.address() as AddressInfo).port
          const res = await fetch(`http://127.0.0.1:${port}/`)
          resolve({ text: await res.text(), headers: res.headers })
        } catch (error) {
          reject(error)
        } finally {
          server.close()
        }
      })
    })
  const noBody = { run: () => Effect.void, drained: () => {}, closed: () => {} }

  it("frames and the closing frames written in one tick all reach the client, after the headers", async () => {
    const { text, headers } = await serve((res) => {
      const output = nodeOutput(res, { "content-type": "text/event-stream", "x-test": "1" }, noBody)
      output.write("data: a\n\n")
      output.end("data: last\n\ndata: [DONE]\n\n")
    })
    expect(headers.get("x-test")).toBe("1")
    expect(text).toBe("data: a\n\ndata: last\n\ndata: [DONE]\n\n")
  })

  /** Counts the response socket's kernel writes (`_writev` of many chunks, or `_write`) from now on. */
  const countWrites = (res: Http.ServerResponse) => {
    const socket = res.socket as unknown as {
      _writev: (...args: Array<unknown>) => void
      _write: (...args: Array<unknown>) => void
    }
    const counts = { writes: 0 }
    const writev = socket._writev.bind(socket)
    const write = socket._write.bind(socket)
    socket._writev = (...args) => {
      counts.writes++
      writev(...args)
    }
    socket._write = (...args) => {
      counts.writes++
      write(...args)
    }
    return counts
  }

  it("what one turn writes, head to [DONE], leaves in one socket write", async () => {
    let counts = { writes: 0 }
    const { text } = await serve((res) => {
      counts = countWrites(res)
      const output = nodeOutput(res, { "content-type": "text/event-stream" }, noBody)
      output.write("data: a\n\n")
      // Node's own cork lasts until the next tick; the completion may settle in a microtask after it.
      process.nextTick(() =>
        queueMicrotask(() => {
          output.write("data: b\n\n")
          output.end("data: last\n\ndata: [DONE]\n\n")
        })
      )
    })
    expect(text).toBe("data: a\n\ndata: b\n\ndata: last\n\ndata: [DONE]\n\n")
    expect(counts.writes).toBe(1)
  })

  it("frames of later turns are not held back: one write per turn", async () => {
    let counts = { writes: 0 }
    const seen: Array<number> = []
    const { text } = await serve((res) => {
      counts = countWrites(res)
      const output = nodeOutput(res, { "content-type": "text/event-stream" }, noBody)
      output.write("data: a\n\n")
      setImmediate(() => {
        // The first turn's frame has left by the check phase that follows it.
        seen.push(counts.writes)
        output.write("data: b\n\n")
        setImmediate(() => {
          seen.push(counts.writes)
          output.end("data: [DONE]\n\n")
        })
      })
    })
    expect(text).toBe("data: a\n\ndata: b\n\ndata: [DONE]\n\n")
    expect(seen).toEqual([1, 2])
    expect(counts.writes).toBe(3)
  })
})
