/**
 * `complete` and `open` of the in-process simulated adapter (TestClock and live clock), and of the
 * OpenAI-compatible adapter against the HTTP sim server: both give the engine's plan.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import { TestClock } from "effect/testing"
import { openAiCompatibleAdapter } from "../../src/upstream/openai-compatible/Adapter.js"
import { makeSimulatedAdapter, planChat } from "../../src/upstream/simulated/Engine.js"
import { startSimServer } from "../../src/upstream/simulated/server.js"
import type {
  ToolDefinition,
  UpstreamCall,
  UpstreamEvent,
  UpstreamRequest,
  UpstreamSink
} from "../../src/upstream/Upstream.js"
import { completeChat } from "../../src/upstream/Complete.js"

const ask = (text: string, extra: Partial<UpstreamRequest> = {}): UpstreamRequest => ({
  model: "sim-pro",
  stream: true,
  max_tokens: 4096,
  messages: [{ role: "user", content: text }],
  ...extra
})

const weather: ToolDefinition = {
  type: "function",
  function: {
    name: "get_weather",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] }
  }
}
const search: ToolDefinition = {
  type: "function",
  function: { name: "search", parameters: { type: "object", properties: { q: { type: "string" } }, required: ["q"] } }
}

const recorder = (onEvents: (events: ReadonlyArray<UpstreamEvent>) => boolean = () => true) => {
  const events: Array<UpstreamEvent> = []
  const batches: Array<number> = []
  let ends = 0
  let errors = 0
  let settle: () => void = () => {}
  const settled = new Promise<void>((resolve) => (settle = resolve))
  const sink: UpstreamSink = {
    onEvents(batch) {
      batches.push(batch.length)
      events.push(...batch)
      return onEvents(batch)
    },
    onEnd() {
      ends++
      settle()
    },
    onError() {
      errors++
      settle()
    }
  }
  return { sink, events, batches, ends: () => ends, errors: () => errors, settled: Effect.promise(() => settled) }
}

const drain = (call: UpstreamCall, rec: ReturnType<typeof recorder>) =>
  Effect.gen(function*() {
    rec.events.unshift(...call.first)
    call.resume()
    yield* rec.settled
    return rec.events
  })

describe("simulated adapter: complete and open", () => {
  const instant = makeSimulatedAdapter({ kind: "simulated", first_token_ms: 0, tokens_per_second: 0 })

  it.effect("complete: the plan's events at once without latency settings", () =>
    Effect.gen(function*() {
      const request = ask("hello there", { reasoning_effort: "low" })
      expect(yield* completeChat(instant, request)).toEqual(planChat(request).events)
    }))

  it.effect("complete: after the last event's due time on the TestClock", () =>
    Effect.gen(function*() {
      const adapter = makeSimulatedAdapter({ kind: "simulated", first_token_ms: 100, tokens_per_second: 10 })
      const request = ask("Tell me about rivers in spring")
      const plan = planChat(request)
      const total = 100 + plan.costs.slice(1).reduce((a, b) => a + b, 0) * 100
      const fiber = yield* Effect.forkChild(completeChat(adapter, request))
      yield* TestClock.adjust(`${total - 1} millis`)
      expect(fiber.pollUnsafe()).toBeUndefined()
      yield* TestClock.adjust("1 millis")
      expect(yield* Fiber.join(fiber)).toEqual(plan.events)
    }))

  it.effect("open: everything in first, onEnd at the first resume()", () =>
    Effect.gen(function*() {
      const request = ask("hi", { tools: [weather, search], parallel_tool_calls: true })
      const rec = recorder()
      const call = yield* instant.open(request, rec.sink)
      expect(call.first).toEqual(planChat(request).events)
      expect(rec.ends()).toBe(0)
      call.resume()
      expect(rec.batches).toEqual([])
      expect(rec.ends()).toBe(1)
      call.resume()
      call.abort()
      expect(rec.ends()).toBe(1)
    }))

  it.effect("open: paced on the TestClock, nothing while paused, held events in one batch at resume()", () =>
    Effect.gen(function*() {
      const adapter = makeSimulatedAdapter({ kind: "simulated", first_token_ms: 100, tokens_per_second: 10 })
      const request = ask("Tell me about rivers in spring")
      const plan = planChat(request)
      let pause = false
      const rec = recorder(() => !pause)
      const opening = yield* Effect.forkChild(adapter.open(request, rec.sink))
      yield* TestClock.adjust("99 millis")
      expect(opening.pollUnsafe()).toBeUndefined()
      yield* TestClock.adjust("1 millis")
      const call = yield* Fiber.join(opening)
      expect(call.first).toEqual([plan.events[0]])
      // Held until resume(), even when more events are due.
      yield* TestClock.adjust(`${plan.costs[1]! * 100} millis`)
      expect(rec.batches).toEqual([])
      call.resume()
      expect(rec.events).toEqual([plan.events[1]])
      // The consumer backs up: events come due but none is delivered until resume().
      pause = true
      yield* TestClock.adjust(`${plan.costs[2]! * 100} millis`)
      expect(rec.events).toEqual([plan.events[1], plan.events[2]])
      yield* TestClock.adjust(`${(plan.costs[3]! + plan.costs[4]!) * 100} millis`)
      expect(rec.events).toHaveLength(2)
      pause = false
      call.resume()
      expect(rec.events).toEqual(plan.events.slice(1, 5))
      expect(rec.batches.at(-1)).toBe(2)
      const total = 100 + plan.costs.slice(1).reduce((a, b) => a + b, 0) * 100
      yield* TestClock.setTime(total - 1)
      expect(rec.ends()).toBe(0)
      yield* TestClock.setTime(total)
      expect(rec.ends()).toBe(1)
      expect([...call.first, ...rec.events]).toEqual(plan.events)
    }))

  it.effect("open: abort() stops the pacing and every callback; interruption before resolution is clean", () =>
    Effect.gen(function*() {
      const adapter = makeSimulatedAdapter({ kind: "simulated", first_token_ms: 100, tokens_per_second: 10 })
      const request = ask("Tell me about rivers in spring")
      const rec = recorder()
      const opening = yield* Effect.forkChild(adapter.open(request, rec.sink))
      yield* TestClock.adjust("50 millis")
      yield* Fiber.interrupt(opening)
      yield* TestClock.adjust("10 seconds")
      expect(rec.batches).toEqual([])

      const call = yield* Effect.forkChild(adapter.open(request, rec.sink)).pipe(
        Effect.tap(() => TestClock.adjust("100 millis")),
        Effect.flatMap(Fiber.join)
      )
      call.resume()
      yield* TestClock.adjust("1 seconds")
      const seen = rec.events.length
      expect(seen).toBeGreaterThan(0)
      call.abort()
      yield* TestClock.adjust("1 minute")
      expect(rec.events.length).toBe(seen)
      expect(rec.ends()).toBe(0)
    }))

  it.live("open: paced with timers on the live clock", () =>
    Effect.gen(function*() {
      const adapter = makeSimulatedAdapter({ kind: "simulated", first_token_ms: 20, tokens_per_second: 2_000 })
      const request = ask("Tell me a long story about the old river in spring")
      const rec = recorder()
      const started = Date.now()
      const call = yield* adapter.open(request, rec.sink)
      expect(Date.now() - started).toBeGreaterThanOrEqual(15)
      const events = yield* drain(call, rec)
      expect(events).toEqual(planChat(request).events)
      expect(rec.batches.length).toBeGreaterThan(1)
      expect(rec.ends()).toBe(1)
    }))
})

describe("openai-compatible adapter against the sim server", () => {
  const simServer = Effect.acquireRelease(
    Effect.promise(() => startSimServer({ port: 0 })),
    (server) => Effect.promise(() => server.close())
  )
  const adapterFor = (url: string) =>
    openAiCompatibleAdapter({
      kind: "openai-compatible",
      base_url: `${url}/v1`,
      connections: 2,
      timeouts: { connect_ms: 2_000, first_token_ms: 5_000, idle_ms: 5_000, total_ms: 10_000 }
    })

  const requests = [
    ask("Tell me a long story about the old river that runs through the quiet valley in spring"),
    ask("Why is the sky blue?", { reasoning_effort: "high" }),
    ask("weather in Paris", { tools: [weather, search], parallel_tool_calls: true }),
    ask("count to ten", { max_tokens: 7 })
  ]

  it.live("open yields exactly the plan's events, complete the same answer merged", () =>
    Effect.gen(function*() {
      const adapter = yield* adapterFor((yield* simServer).url)
      for (const request of requests) {
        const plan = planChat(request)
        const rec = recorder()
        expect(yield* drain(yield* adapter.open(request, rec.sink), rec)).toEqual(plan.events)
        expect(rec.ends()).toBe(1)

        const merged: Array<UpstreamEvent> = []
        if (plan.reasoning !== "") merged.push({ _tag: "Reasoning", text: plan.reasoning })
        if (plan.content !== "") merged.push({ _tag: "Content", text: plan.content })
        plan.toolCalls.forEach((call, index) => {
          merged.push({ _tag: "ToolCallStart", index, id: call.id, name: call.name })
          if (call.arguments !== "") merged.push({ _tag: "ToolCallArgs", index, fragment: call.arguments })
        })
        merged.push({ _tag: "Finish", reason: plan.finish }, { _tag: "Usage", usage: plan.usage })
        expect(yield* completeChat(adapter, { ...request, stream: false })).toEqual(merged)
      }
    }))

  it.live("open over a paced sim server delivers in several batches", () =>
    Effect.gen(function*() {
      const server = yield* Effect.acquireRelease(
        Effect.promise(() => startSimServer({ port: 0, first_token_ms: 10, tokens_per_second: 400 })),
        (s) => Effect.promise(() => s.close())
      )
      const adapter = yield* adapterFor(server.url)
      const request = requests[0]!
      const rec = recorder()
      const events = yield* drain(yield* adapter.open(request, rec.sink), rec)
      expect(events).toEqual(planChat(request).events)
      // Frames come over ~250 ms; reads may merge under load, not into a single one.
      expect(rec.batches.length).toBeGreaterThan(1)
    }))
})
