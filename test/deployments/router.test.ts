/**
 * The deployment router over real HTTP fake upstreams, its time on the TestClock: ejection after failures and
 * re-admission through one trial request (backoff doubling after a failed trial), `Retry-After` cooling for exactly
 * its length, failover that never repeats a deployment and stops at the attempt limit and the time budget,
 * refusals of the request itself answered without failover, and no retry after the first byte.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Fiber, Layer, Schema } from "effect"
import { TestClock } from "effect/testing"
import { ModelConfig, Provider, RoutingConfig } from "../../src/config/GatewayConfig.js"
import { seeded } from "../../src/deployments/Balancer.js"
import { Deployments, layer as routerLayer } from "../../src/deployments/Router.js"
import { completeChat } from "../../src/upstream/Complete.js"
import { classify } from "../../src/upstream/Failure.js"
import type { UpstreamError, UpstreamEvent, UpstreamRequest } from "../../src/upstream/Upstream.js"
import * as Upstreams from "../../src/upstream/Upstreams.js"
import { eventually } from "../support/Eventually.js"
import { type FakeDeployment, providerFor, startFakeDeployment } from "../support/FakeDeployment.js"

const fakes = (names: ReadonlyArray<string>) =>
  Effect.acquireRelease(
    Effect.promise(() => Promise.all(names.map((n) => startFakeDeployment(n)))),
    (all) => Effect.promise(() => Promise.all(all.map((f) => f.kill())))
  )

const routing = (overrides: { health?: object; failover?: object } = {}) =>
  Schema.decodeUnknownSync(RoutingConfig)({
    health: { consecutive_failures: 2, open_seconds: 10, max_open_seconds: 60, ...overrides.health },
    failover: { max_attempts: 3, budget_seconds: 30, ...overrides.failover }
  })

const modelOf = (ups: ReadonlyArray<FakeDeployment>) =>
  Schema.decodeUnknownSync(ModelConfig)({
    id: "m",
    owned_by: "test",
    max_input_tokens: 1000,
    max_output_tokens: 100,
    rate_limit_rpm: 1000,
    concurrency: 100,
    deployments: ups.map((u) => ({ provider: u.name, model: `${u.name}-model` }))
  })

const request: UpstreamRequest = { model: "ignored", stream: false, max_tokens: 10, messages: [{ role: "user", content: "hi" }] }

/** A router over `ups` (first-token timeout `firstTokenMs`), and a way to send one request through it. */
const setup = (ups: ReadonlyArray<FakeDeployment>, options: { routing?: ReturnType<typeof routing>; firstTokenMs?: number } = {}) =>
  Effect.gen(function*() {
    const providers = Object.fromEntries(
      ups.map((u) => [u.name, Schema.decodeUnknownSync(Provider)(providerFor(u, options.firstTokenMs))])
    )
    const context = yield* Layer.build(
      Layer.provide(routerLayer({ routing: () => options.routing ?? routing(), random: seeded(7) }), Upstreams.layerStatic(providers))
    )
    const deployments = context.mapUnsafe.get(Deployments.key) as typeof Deployments.Service
    const model = modelOf(ups)
    const send = Effect.suspend(() => {
      const attempts: Array<string> = []
      return completeChat(deployments.forModel(model, { attempt: (d) => attempts.push(d) }), request).pipe(
        Effect.map((events) => ({ ok: true as const, attempts, text: textOf(events) })),
        Effect.catch((error: UpstreamError) => Effect.succeed({ ok: false as const, attempts, error }))
      )
    })
    return { deployments, model, send }
  })

const textOf = (events: ReadonlyArray<UpstreamEvent>) =>
  events.map((e) => (e._tag === "Content" ? e.text : "")).join("")

const sendMany = <A>(n: number, send: Effect.Effect<A>) => Effect.forEach(Array.from({ length: n }, (_, i) => i), () => send)

describe("deployment router", () => {
  it.live("fails over to a deployment not yet tried and answers with it", () =>
    Effect.gen(function*() {
      const [a, b, c] = yield* fakes(["a", "b", "c"])
      a!.mode = { _tag: "status", status: 500 }
      b!.mode = { _tag: "drop" }
      const { send } = yield* setup([a!, b!, c!], { routing: routing({ health: { consecutive_failures: 100 } }) })
      const results = yield* sendMany(30, send)
      for (const r of results) {
        expect(r.ok).toBe(true)
        if (r.ok) expect(r.text).toBe("from c")
        // Never the same deployment twice in one request; c answers last.
        expect(new Set(r.attempts).size).toBe(r.attempts.length)
        expect(r.attempts.at(-1)).toBe("c")
      }
      expect(results.some((r) => r.attempts.length === 3)).toBe(true)
      expect(c!.requests()).toBe(30)
    }).pipe(Effect.scoped))

  it.effect("ejects after consecutive failures, re-admits through one trial, and doubles the ejection when the trial fails", () =>
    Effect.gen(function*() {
      const [a, b] = yield* fakes(["a", "b"])
      a!.mode = { _tag: "status", status: 503 }
      const { send, deployments, model } = yield* setup([a!, b!])
      // Until `a` has failed twice, requests that pick it fail over to b; none is lost.
      while (a!.requests() < 2) expect((yield* send).ok).toBe(true)
      const states = yield* deployments.status([model])
      expect(states.find((s) => s.deployment === "a")).toMatchObject({ state: "open", retryInSeconds: 10 })
      const seenByA = a!.requests()
      for (const r of yield* sendMany(20, send)) expect(r.attempts).toEqual(["b"])
      expect(a!.requests()).toBe(seenByA)

      // 9.999 s later: still out. At 10 s: one trial, which fails -> out for 20 s.
      yield* TestClock.adjust("9999 millis")
      yield* sendMany(5, send)
      expect(a!.requests()).toBe(seenByA)
      yield* TestClock.adjust("1 millis")
      yield* sendMany(20, send)
      expect(a!.requests()).toBe(seenByA + 1)
      expect((yield* deployments.status([model])).find((s) => s.deployment === "a")).toMatchObject({
        state: "open",
        retryInSeconds: 20
      })
      yield* TestClock.adjust("19 seconds")
      yield* sendMany(10, send)
      expect(a!.requests()).toBe(seenByA + 1)

      // Healthy again: the next trial succeeds and closes the circuit; a takes its share again.
      a!.mode = { _tag: "ok" }
      yield* TestClock.adjust("1 second")
      yield* sendMany(40, send)
      expect((yield* deployments.status([model])).find((s) => s.deployment === "a")?.state).toBe("closed")
      expect(a!.requests()).toBeGreaterThan(seenByA + 10)
    }).pipe(Effect.scoped))

  it.effect("a failure rate over the window ejects a deployment that never fails twice in a row", () =>
    Effect.gen(function*() {
      const [a, b] = yield* fakes(["a", "b"])
      const { send, deployments, model } = yield* setup([a!, b!], {
        routing: routing({ health: { consecutive_failures: 100, failure_rate: 0.5, min_requests: 6, window_seconds: 60 } })
      })
      // a alternates: fail, succeed, fail, succeed... (its streak never passes 1).
      let failNext = true
      while ((yield* deployments.status([model])).find((s) => s.deployment === "a")!.state === "closed") {
        const before = a!.requests()
        a!.mode = failNext ? { _tag: "status", status: 500 } : { _tag: "ok" }
        expect((yield* send).ok).toBe(true)
        if (a!.requests() > before) failNext = !failNext
        expect(a!.requests()).toBeLessThanOrEqual(7)
      }
      // F S F S F S: 6 outcomes, half failed, but the rate is checked on a failure: the 7th (4 of 7) trips it.
      expect(a!.requests()).toBe(7)
    }).pipe(Effect.scoped))

  it.effect("an upstream Retry-After keeps the deployment out for exactly that long", () =>
    Effect.gen(function*() {
      const [a, b] = yield* fakes(["a", "b"])
      a!.mode = { _tag: "rate_limited", retryAfterSeconds: 30 }
      const { send } = yield* setup([a!, b!], { routing: routing({ health: { consecutive_failures: 5 } }) })
      while (a!.requests() < 1) expect((yield* send).ok).toBe(true)
      a!.mode = { _tag: "ok" }
      yield* sendMany(20, send)
      expect(a!.requests()).toBe(1)
      yield* TestClock.adjust("29999 millis")
      yield* sendMany(20, send)
      expect(a!.requests()).toBe(1)
      yield* TestClock.adjust("1 millis")
      yield* sendMany(20, send)
      expect(a!.requests()).toBeGreaterThan(3)
    }).pipe(Effect.scoped))

  it.effect("stops at max_attempts, and answers with the last failure", () =>
    Effect.gen(function*() {
      const ups = yield* fakes(["a", "b", "c"])
      for (const u of ups) u.mode = { _tag: "status", status: 502 }
      const { send } = yield* setup(ups, {
        routing: routing({ health: { consecutive_failures: 100 }, failover: { max_attempts: 2 } })
      })
      const r = yield* send
      expect(r.ok).toBe(false)
      expect(r.attempts).toHaveLength(2)
      expect(ups.reduce((n, u) => n + u.requests(), 0)).toBe(2)
      if (!r.ok) expect(classify(r.error, "catalog").error.code).toBe("upstream_error")
    }).pipe(Effect.scoped))

  it.effect("starts no attempt after the budget: a first attempt that timed out at 20 s with a 15 s budget is the answer", () =>
    Effect.gen(function*() {
      const [a, b] = yield* fakes(["a", "b"])
      a!.mode = { _tag: "hang" }
      b!.mode = { _tag: "hang" }
      const { send } = yield* setup([a!, b!], {
        routing: routing({ failover: { budget_seconds: 15 } }),
        firstTokenMs: 20_000
      })
      const fiber = yield* Effect.forkChild(send)
      // Both deployments hang; whichever is tried first times out at 20 s, past the budget.
      yield* Effect.promise(() => eventually(() => a!.requests() + b!.requests() === 1))
      yield* TestClock.adjust("20 seconds")
      const r = yield* Fiber.join(fiber)
      expect(r.ok).toBe(false)
      expect(r.attempts).toHaveLength(1)
      if (!r.ok) expect(r.error.kind).toBe("timeout")
      expect(a!.requests() + b!.requests()).toBe(1)
    }).pipe(Effect.scoped))

  it.effect("a refusal of the request itself (400) is answered without failover and does not count against health", () =>
    Effect.gen(function*() {
      const [a, b] = yield* fakes(["a", "b"])
      a!.mode = { _tag: "status", status: 400 }
      const { send, deployments, model } = yield* setup([a!, b!])
      const results = yield* sendMany(20, send)
      const refused = results.filter((r) => !r.ok)
      expect(refused.length).toBe(a!.requests())
      expect(refused.length).toBeGreaterThan(2)
      for (const r of refused) {
        expect(r.attempts).toEqual(["a"])
        if (!r.ok) expect(classify(r.error, "catalog").error.code).toBe("upstream_rejected")
      }
      expect((yield* deployments.status([model])).find((s) => s.deployment === "a")?.state).toBe("closed")
    }).pipe(Effect.scoped))

  it.live("a failure after the first byte is not retried", () =>
    Effect.gen(function*() {
      const [a, b] = yield* fakes(["a", "b"])
      a!.mode = { _tag: "cut_after_first" }
      b!.mode = { _tag: "cut_after_first" }
      const { deployments, model } = yield* setup([a!, b!])
      const attempts: Array<string> = []
      let failed: UpstreamError | null = null
      let resolveEnded = () => {}
      const ended = new Promise<void>((resolve) => (resolveEnded = resolve))
      const call = yield* deployments.forModel(model, { attempt: (d) => attempts.push(d) }).open(
        { ...request, stream: true },
        {
          onEvents: () => true,
          onEnd: () => resolveEnded(),
          onError: (error) => {
            failed = error
            resolveEnded()
          }
        }
      )
      expect(textOf(call.first)).toMatch(/^from [ab]$/)
      call.resume()
      yield* Effect.promise(() => ended)
      expect(failed).not.toBeNull()
      expect(attempts).toHaveLength(1)
      expect(a!.requests() + b!.requests()).toBe(1)
    }).pipe(Effect.scoped))
})
