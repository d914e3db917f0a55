/**
 * The router with fleet-wide caps (`SharedCaps`), against a counting stand-in for Redis and real HTTP fake
 * upstreams: a deployment without a cap is never asked about; a capped one found full is skipped without counting
 * as an attempt (and when nothing is left the client's error is the one it always was); every slot taken is given
 * back exactly once however the attempt ends (answer, failure and failover, a stream that ends or is cut, the
 * caller's abort, interruption while waiting); a full minute is remembered until it has room, on the TestClock.
 * Without shared caps (embedded mode) the router counts `rate_limit_rpm` itself, over the same sliding 60 s.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Fiber, Layer, Schema } from "effect"
import { TestClock } from "effect/testing"
import { ModelConfig, Provider, RoutingConfig } from "../../src/config/GatewayConfig.js"
import { seeded } from "../../src/deployments/Balancer.js"
import { Deployments, layer as routerLayer } from "../../src/deployments/Router.js"
import type { Caps, SharedCaps, TakeResult } from "../../src/deployments/SharedCaps.js"
import { completeChat } from "../../src/upstream/Complete.js"
import { classify } from "../../src/upstream/Failure.js"
import type { UpstreamError, UpstreamRequest, UpstreamSink } from "../../src/upstream/Upstream.js"
import * as Upstreams from "../../src/upstream/Upstreams.js"
import { eventually } from "../support/Eventually.js"
import { type FakeDeployment, providerFor, startFakeDeployment } from "../support/FakeDeployment.js"

const fakes = (names: ReadonlyArray<string>) =>
  Effect.acquireRelease(
    Effect.promise(() => Promise.all(names.map((n) => startFakeDeployment(n)))),
    (all) => Effect.promise(() => Promise.all(all.map((f) => f.kill())))
  )

const routing = Schema.decodeUnknownSync(RoutingConfig)({
  health: { consecutive_failures: 1_000 },
  failover: { max_attempts: 3, budget_seconds: 30 }
})

type DeploymentCaps = { readonly concurrency?: number; readonly rate_limit_rpm?: number }

const modelOf = (ups: ReadonlyArray<FakeDeployment>, caps: Record<string, DeploymentCaps> = {}) =>
  Schema.decodeUnknownSync(ModelConfig)({
    id: "m",
    owned_by: "test",
    max_input_tokens: 1000,
    max_output_tokens: 100,
    rate_limit_rpm: 1000,
    concurrency: 100,
    deployments: ups.map((u) => ({ provider: u.name, model: `${u.name}-model`, ...caps[u.name] }))
  })

/**
 * A stand-in for the fleet's counters: a real concurrency count per deployment key, or the answer `force` gives;
 * it records every question and every release.
 */
const countingCaps = (force: (key: string) => TakeResult | null = () => null) => {
  const asked: Array<string> = []
  const live = new Map<string, Set<string>>()
  const releases = new Map<string, number>()
  const slots: Array<string> = []
  let n = 0
  const caps: SharedCaps = {
    take: (key: string, c: Caps) =>
      Effect.sync((): TakeResult => {
        asked.push(key)
        const forced = force(key)
        if (forced !== null) return forced
        const held = live.get(key) ?? new Set()
        live.set(key, held)
        if (c.concurrency !== null && held.size >= c.concurrency) return { _tag: "Full" }
        if (c.concurrency === null) return { _tag: "Taken", slot: null }
        const slot = `slot-${++n}`
        held.add(slot)
        slots.push(slot)
        return { _tag: "Taken", slot }
      }),
    release: (key, slot) => {
      live.get(key)?.delete(slot)
      releases.set(slot, (releases.get(slot) ?? 0) + 1)
    },
    usage: (key) => Effect.sync(() => ({ inFlight: live.get(key)?.size ?? 0, startsLastMinute: 0 }))
  }
  return {
    caps,
    asked,
    held: () => [...live.values()].reduce((total, set) => total + set.size, 0),
    /** Slots taken and how often each was released. */
    ledger: () => slots.map((slot) => [slot, releases.get(slot) ?? 0] as const),
    releasedUnknown: () => [...releases.keys()].filter((slot) => !slots.includes(slot))
  }
}

const request: UpstreamRequest = { model: "ignored", stream: false, max_tokens: 10, messages: [{ role: "user", content: "hi" }] }

const setup = (ups: ReadonlyArray<FakeDeployment>, caps: SharedCaps | undefined, settings: RoutingConfig = routing) =>
  Effect.gen(function*() {
    const providers = Object.fromEntries(ups.map((u) => [u.name, Schema.decodeUnknownSync(Provider)(providerFor(u))]))
    const context = yield* Layer.build(
      Layer.provide(routerLayer({ routing: () => settings, random: seeded(7), caps }), Upstreams.layerStatic(providers))
    )
    const deployments = context.mapUnsafe.get(Deployments.key) as typeof Deployments.Service
    const send = (model: ModelConfig) =>
      Effect.suspend(() => {
        const attempts: Array<string> = []
        return completeChat(deployments.forModel(model, { attempt: (d) => attempts.push(d) }), request).pipe(
          Effect.map(() => ({ ok: true as const, attempts })),
          Effect.catch((error: UpstreamError) => Effect.succeed({ ok: false as const, attempts, error }))
        )
      })
    return { deployments, send }
  })

/** Opens a stream on `model` and returns the call with a promise of how its sink ended. */
const openStream = (deployments: typeof Deployments.Service, model: ModelConfig) =>
  Effect.gen(function*() {
    let settle: (how: "end" | "error") => void = () => {}
    const ended = new Promise<"end" | "error">((resolve) => (settle = resolve))
    const sink: UpstreamSink = { onEvents: () => true, onEnd: () => settle("end"), onError: () => settle("error") }
    const call = yield* deployments.forModel(model, { attempt: () => {} }).open({ ...request, stream: true }, sink)
    return { call, ended }
  })

const expectEachReleasedOnce = (ledger: ReadonlyArray<readonly [string, number]>) => {
  expect(ledger.length).toBeGreaterThan(0)
  for (const [slot, releases] of ledger) expect([slot, releases]).toEqual([slot, 1])
}

describe("deployment router with fleet-wide caps", () => {
  it.live("deployments without a cap are never asked about", () =>
    Effect.gen(function*() {
      const ups = yield* fakes(["a", "b"])
      const fleet = countingCaps()
      const { send } = yield* setup(ups, fleet.caps)
      const model = modelOf(ups)
      for (let i = 0; i < 20; i++) expect((yield* send(model)).ok).toBe(true)
      expect(fleet.asked).toEqual([])
      expect(ups[0]!.requests() + ups[1]!.requests()).toBe(20)
    }).pipe(Effect.scoped))

  it.live("a full deployment is skipped without an attempt; with none left the answer is 503 service_unavailable", () =>
    Effect.gen(function*() {
      const [a, b] = yield* fakes(["a", "b"])
      const fleet = countingCaps((key) => (key === "m/a" ? { _tag: "Full" } : null))
      const { send } = yield* setup([a!, b!], fleet.caps)
      const model = modelOf([a!, b!], { a: { concurrency: 4 } })
      for (let i = 0; i < 10; i++) expect(yield* send(model)).toMatchObject({ ok: true, attempts: ["b"] })
      expect(a!.requests()).toBe(0)
      expect(fleet.asked.length).toBeGreaterThan(0)

      // Only the full one left: the same error as when every deployment is out.
      const alone = modelOf([a!], { a: { concurrency: 4 } })
      const r = yield* send(alone)
      expect(r.ok).toBe(false)
      expect(r.attempts).toEqual([])
      if (!r.ok) expect(classify(r.error, "catalog").error).toMatchObject({ code: "service_unavailable", status: 503 })

      // A skip is not an attempt: with two attempts allowed, a failure on b still fails over to c.
      const [c] = yield* fakes(["c"])
      b!.mode = { _tag: "status", status: 500 }
      const twoAttempts = yield* setup(
        [a!, b!, c!],
        fleet.caps,
        Schema.decodeUnknownSync(RoutingConfig)({ health: { consecutive_failures: 1_000 }, failover: { max_attempts: 2 } })
      )
      const ordered = Schema.decodeUnknownSync(ModelConfig)({
        ...alone,
        deployments: [
          { provider: "a", model: "a-model", concurrency: 4 },
          { provider: "b", model: "b-model", priority: 1 },
          { provider: "c", model: "c-model", priority: 2 }
        ]
      })
      expect(yield* twoAttempts.send(ordered)).toMatchObject({ ok: true, attempts: ["b", "c"] })
      b!.mode = { _tag: "ok" }

      // A store that does not answer: skipped the same way.
      const down = countingCaps(() => ({ _tag: "Unavailable", detail: "redis down" }))
      const other = yield* setup([a!, b!], down.caps)
      expect(yield* other.send(model)).toMatchObject({ ok: true, attempts: ["b"] })
      expect(a!.requests()).toBe(0)
    }).pipe(Effect.scoped))

  it.live("requests beyond a deployment's concurrency go to another deployment, and every slot comes back once", () =>
    Effect.gen(function*() {
      const [a, b] = yield* fakes(["a", "b"])
      a!.mode = { _tag: "slow", delayMs: 150 }
      b!.mode = { _tag: "slow", delayMs: 150 }
      const fleet = countingCaps()
      const { send } = yield* setup([a!, b!], fleet.caps)
      const model = modelOf([a!, b!], { a: { concurrency: 2 } })
      const results = yield* Effect.forEach(Array.from({ length: 12 }), () => send(model), { concurrency: "unbounded" })
      expect(results.every((r) => r.ok && r.attempts.length === 1)).toBe(true)
      expect(a!.maxInFlight()).toBe(2)
      expect(b!.requests()).toBe(12 - a!.requests())
      expect(fleet.held()).toBe(0)
      expectEachReleasedOnce(fleet.ledger())
    }).pipe(Effect.scoped))

  it.live("a slot comes back exactly once however the attempt ends", () =>
    Effect.gen(function*() {
      const [a, b] = yield* fakes(["a", "b"])
      const fleet = countingCaps()
      const { send, deployments } = yield* setup([a!, b!], fleet.caps)
      // a is preferred (priority 0) and capped; b takes over.
      const model = Schema.decodeUnknownSync(ModelConfig)({
        ...modelOf([a!, b!]),
        deployments: [
          { provider: "a", model: "a-model", concurrency: 1 },
          { provider: "b", model: "b-model", priority: 1 }
        ]
      })
      const settled = (count: number) => {
        expect(fleet.ledger()).toHaveLength(count)
        expect(fleet.held()).toBe(0)
        expectEachReleasedOnce(fleet.ledger())
        expect(fleet.releasedUnknown()).toEqual([])
      }

      // 1. A whole answer.
      expect(yield* send(model)).toMatchObject({ ok: true, attempts: ["a"] })
      settled(1)
      // 2. A failure before the first byte, and failover to b.
      a!.mode = { _tag: "status", status: 500 }
      expect(yield* send(model)).toMatchObject({ ok: true, attempts: ["a", "b"] })
      settled(2)
      // 3. A stream that ends.
      a!.mode = { _tag: "ok" }
      const whole = yield* openStream(deployments, model)
      whole.call.resume()
      expect(yield* Effect.promise(() => whole.ended)).toBe("end")
      settled(3)
      // 4. A stream cut after its first frame.
      a!.mode = { _tag: "cut_after_first" }
      const cut = yield* openStream(deployments, model)
      cut.call.resume()
      expect(yield* Effect.promise(() => cut.ended)).toBe("error")
      settled(4)
      // 5. The caller gives up on a stream (the client left), and again (idempotent).
      const left = yield* openStream(deployments, model)
      left.call.abort()
      left.call.abort()
      settled(5)
      // 6. Interrupted while waiting for the first byte.
      a!.mode = { _tag: "hang" }
      const before = a!.requests()
      const waiting = yield* Effect.forkChild(openStream(deployments, model))
      yield* Effect.promise(() => eventually(() => a!.requests() > before))
      expect(fleet.held()).toBe(1)
      yield* Fiber.interrupt(waiting)
      settled(6)
    }).pipe(Effect.scoped))

  it.effect("a full minute is not asked about again until it has room, unless its cap changed", () =>
    Effect.gen(function*() {
      const [a, b] = yield* fakes(["a", "b"])
      let full = true
      const fleet = countingCaps((key) =>
        key === "m/a" ? (full ? { _tag: "RateLimited", retryMs: 30_000 } : { _tag: "Taken", slot: null }) : null
      )
      const { send } = yield* setup([a!, b!], fleet.caps)
      const model = modelOf([a!, b!], { a: { rate_limit_rpm: 5 } })
      const askedAboutA = () => fleet.asked.filter((k) => k === "m/a").length
      while (askedAboutA() === 0) expect(yield* send(model)).toMatchObject({ ok: true, attempts: ["b"] })
      for (let i = 0; i < 10; i++) expect(yield* send(model)).toMatchObject({ ok: true, attempts: ["b"] })
      expect(askedAboutA()).toBe(1)
      yield* TestClock.adjust("29999 millis")
      for (let i = 0; i < 10; i++) yield* send(model)
      expect(askedAboutA()).toBe(1)

      // A reload that raises the cap asks again at once.
      const raised = modelOf([a!, b!], { a: { rate_limit_rpm: 6 } })
      for (let i = 0; i < 20 && askedAboutA() === 1; i++) yield* send(raised)
      expect(askedAboutA()).toBe(2)

      // Room again after the minute: a takes requests.
      full = false
      yield* TestClock.adjust("30 seconds")
      const seen = a!.requests()
      for (let i = 0; i < 20; i++) expect((yield* send(model)).ok).toBe(true)
      expect(a!.requests()).toBeGreaterThan(seen)
    }).pipe(Effect.scoped))

  it.effect("embedded: rate_limit_rpm counts the last 60 s, sliding, not the clock's minute", () =>
    Effect.gen(function*() {
      const [a, b] = yield* fakes(["a", "b"])
      const { deployments, send } = yield* setup([a!, b!], undefined)
      const model = Schema.decodeUnknownSync(ModelConfig)({
        ...modelOf([a!, b!]),
        deployments: [
          { provider: "a", model: "a-model", rate_limit_rpm: 5 },
          { provider: "b", model: "b-model", priority: 1 }
        ]
      })
      const firstTried = function*(n: number) {
        const seen: Array<string> = []
        for (let i = 0; i < n; i++) {
          const sent = yield* send(model)
          expect(sent.ok).toBe(true)
          seen.push(sent.attempts[0]!)
        }
        return seen
      }
      // Half a minute into a clock minute: five starts fill a's window, the sixth request goes to b.
      const t0 = 20_000 * 60_000 + 30_000
      yield* TestClock.setTime(t0)
      expect(yield* firstTried(6)).toEqual(["a", "a", "a", "a", "a", "b"])
      // A new clock minute has begun, but the five starts are still within the last 60 s.
      yield* TestClock.setTime(t0 + 31_000)
      expect(yield* firstTried(3)).toEqual(["b", "b", "b"])
      yield* TestClock.setTime(t0 + 59_999)
      expect(yield* firstTried(1)).toEqual(["b"])
      // The operator's listing counts the same starts; the uncapped deployment has no such figure.
      const listed = yield* deployments.status([model])
      expect(listed.map((d) => [d.deployment, d.startsLastMinute, d.fleetInFlight])).toEqual([["a", 5, null], ["b", null, null]])
      // 60 s after them the five starts have left the window: five more for a, then b again.
      yield* TestClock.setTime(t0 + 60_000)
      expect(yield* firstTried(6)).toEqual(["a", "a", "a", "a", "a", "b"])
      // Starts are spread: one leaves the window at a time.
      yield* TestClock.setTime(t0 + 120_000)
      expect(yield* firstTried(1)).toEqual(["a"])
      yield* TestClock.setTime(t0 + 130_000)
      expect(yield* firstTried(5)).toEqual(["a", "a", "a", "a", "b"])
      yield* TestClock.setTime(t0 + 180_000)
      expect(yield* firstTried(2)).toEqual(["a", "b"])
    }).pipe(Effect.scoped))

  it.effect("a half-open deployment refused by the fleet keeps its trial for a later request", () =>
    Effect.gen(function*() {
      const [a, b] = yield* fakes(["a", "b"])
      let full = false
      const fleet = countingCaps((key) => (key === "m/a" && full ? { _tag: "Full" } : null))
      const { send, deployments } = yield* setup(
        [a!, b!],
        fleet.caps,
        Schema.decodeUnknownSync(RoutingConfig)({ health: { consecutive_failures: 1, open_seconds: 10 } })
      )
      const model = Schema.decodeUnknownSync(ModelConfig)({
        ...modelOf([a!, b!]),
        deployments: [
          { provider: "a", model: "a-model", concurrency: 4 },
          { provider: "b", model: "b-model", priority: 1 }
        ]
      })
      const stateOfA = Effect.map(deployments.status([model]), (all) => all.find((d) => d.deployment === "a")!.state)
      a!.mode = { _tag: "status", status: 500 }
      expect(yield* send(model)).toMatchObject({ ok: true, attempts: ["a", "b"] })
      expect(yield* stateOfA).toBe("open")
      yield* TestClock.adjust("10 seconds")
      expect(yield* stateOfA).toBe("half_open")

      // The fleet has no slot: the trial is not spent on the skip.
      full = true
      expect(yield* send(model)).toMatchObject({ ok: true, attempts: ["b"] })
      // A slot again: the next request is the trial, which closes the circuit.
      full = false
      a!.mode = { _tag: "ok" }
      expect(yield* send(model)).toMatchObject({ ok: true, attempts: ["a"] })
      expect(yield* stateOfA).toBe("closed")
      expect(fleet.held()).toBe(0)
    }).pipe(Effect.scoped))
})
