import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Ref, Scope, Stream } from "effect"
import type { Provider } from "../../src/config/GatewayConfig.js"
import { layerStatic, makeUpstreams } from "../../src/upstream/Upstreams.js"
import { planChat } from "../../src/upstream/simulated/Engine.js"
import { type UpstreamRequest, Upstreams } from "../../src/upstream/Upstream.js"
import { Behaviour, Chunks, startMockUpstream } from "../support/MockUpstream.js"
import { upstreamStream } from "../support/UpstreamStream.js"

const ask: UpstreamRequest = { model: "m", stream: true, max_tokens: 50, messages: [{ role: "user", content: "hello" }] }
const sim: Provider = { kind: "simulated", first_token_ms: 0, tokens_per_second: 0 }
const openAi = (base_url: string, api_key_env?: string): Provider => ({
  kind: "openai-compatible",
  base_url,
  ...(api_key_env !== undefined ? { api_key_env } : {}),
  connections: 2,
  timeouts: { connect_ms: 1_000, first_token_ms: 2_000, idle_ms: 2_000, total_ms: 5_000 }
})

const mockUpstream = Effect.acquireRelease(
  Effect.promise(() => startMockUpstream()),
  (mock) => Effect.promise(() => mock.close())
)

describe("Upstreams", () => {
  it.effect("resolves a simulated provider and fails on an unknown one", () =>
    Effect.gen(function*() {
      const upstreams = yield* Upstreams
      const adapter = yield* upstreams.get("sim")
      const events = yield* Stream.runCollect(upstreamStream(adapter, ask))
      expect(events).toEqual(planChat(ask).events)
      expect(yield* upstreams.get("sim")).toBe(adapter)
      const error = yield* Effect.flip(upstreams.get("nope"))
      expect(error).toMatchObject({ _tag: "UpstreamError", kind: "connect" })
      expect(error.detail).toContain("nope")
      expect((yield* Effect.flip(upstreams.get("toString"))).kind).toBe("connect")
    }).pipe(Effect.provide(layerStatic({ sim }))))

  it.live("rebuilds an adapter when its provider config changes and closes the old pool", () =>
    Effect.gen(function*() {
      const mock = yield* mockUpstream
      mock.script(Behaviour.stream([Chunks.content("up"), Chunks.finish("stop")]))
      const providers = yield* Ref.make<Record<string, Provider>>({ up: openAi(mock.url), sim })
      const upstreams = yield* makeUpstreams(Ref.get(providers))

      const first = yield* upstreams.get("up")
      yield* Ref.update(providers, (p) => ({ ...p, up: openAi(mock.url) }))
      expect(yield* upstreams.get("up")).toBe(first) // equal config, new object: kept

      yield* Ref.update(providers, (p) => ({ ...p, up: { ...openAi(mock.url), connections: 3 } }))
      const second = yield* upstreams.get("up")
      expect(second).not.toBe(first)
      const events = yield* Stream.runCollect(upstreamStream(second, ask))
      expect(events[0]).toEqual({ _tag: "Content", text: "up" })
      // The old pool is closing: new requests on it are refused.
      yield* Effect.sleep("20 millis")
      const old = yield* Effect.flip(Stream.runCollect(upstreamStream(first, ask)))
      expect(old.kind).toBe("connect")
      expect(mock.requests).toHaveLength(1)
    }))

  it.live("reads the API key from the provider's environment variable", () =>
    Effect.gen(function*() {
      const mock = yield* mockUpstream
      mock.script(Behaviour.stream([Chunks.content("x"), Chunks.finish("stop")]))
      process.env.WELLSPRING_UPSTREAM_TEST_KEY = "sk-from-env"
      yield* Effect.addFinalizer(() => Effect.sync(() => delete process.env.WELLSPRING_UPSTREAM_TEST_KEY))
      const upstreams = yield* makeUpstreams(Effect.succeed({ up: openAi(mock.url, "WELLSPRING_UPSTREAM_TEST_KEY") }))
      yield* Stream.runCollect(upstreamStream(yield* upstreams.get("up"), ask))
      expect(mock.requests[0]!.headers.authorization).toBe("Bearer sk-from-env")
    }))

  it.live("closes every pool when its scope closes", () =>
    Effect.gen(function*() {
      const mock = yield* Effect.promise(() => startMockUpstream())
      const scope = yield* Scope.make()
      const upstreams = yield* makeUpstreams(Effect.succeed({ up: openAi(mock.url) })).pipe(Scope.provide(scope))
      const adapter = yield* upstreams.get("up")
      yield* Stream.runCollect(upstreamStream(adapter, ask))
      expect(mock.connections()).toMatchObject({ opened: 1, closed: 0 })
      yield* Scope.close(scope, Exit.void)
      expect((yield* Effect.flip(Stream.runCollect(upstreamStream(adapter, ask)))).kind).toBe("connect")
      yield* Effect.promise(() =>
        new Promise<void>((resolve) => {
          const check = () => (mock.connections().closed === 1 ? resolve() : setTimeout(check, 5))
          check()
        })
      )
      yield* Effect.promise(() => mock.close())
    }))
})
