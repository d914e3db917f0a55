/**
 * The Anthropic adapter as a pool provider: the `anthropic` provider schema, the adapter built by `Upstreams`
 * (key from `api_key_env`, base path, no embeddings), against the fake Anthropic server on 127.0.0.1.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Ref, Result, Schema, Stream } from "effect"
import { type AnthropicProvider, Catalog, type Provider, Provider as ProviderSchema } from "../../../src/config/GatewayConfig.js"
import { makeAnthropicAdapter } from "../../../src/upstream/anthropic/Adapter.js"
import { completeChat } from "../../../src/upstream/Complete.js"
import type { UpstreamRequest } from "../../../src/upstream/Upstream.js"
import { makeUpstreams } from "../../../src/upstream/Upstreams.js"
import { FakeBehaviour, FakeMessages, startFakeAnthropic } from "../../support/FakeAnthropic.js"
import { upstreamStream } from "../../support/UpstreamStream.js"

const KEY = "sk-ant-api03-adapter-test-key-0123456789"
const ENV = "WELLSPRING_UPSTREAM_ANTHROPIC_ADAPTER_TEST"

const ask: UpstreamRequest = {
  model: "claude-fake-4",
  stream: true,
  max_tokens: 256,
  messages: [{ role: "user", content: "hi" }]
}

const decodeProvider = Schema.decodeUnknownResult(ProviderSchema)
const decodeCatalog = Schema.decodeUnknownResult(Catalog)

const anthropic = (base_url: string, api_key_env?: string): typeof AnthropicProvider.Type => ({
  kind: "anthropic",
  base_url,
  ...(api_key_env !== undefined ? { api_key_env } : {}),
  connections: 2,
  timeouts: { connect_ms: 1_000, first_token_ms: 2_000, idle_ms: 2_000, total_ms: 5_000 }
})

const fakeAnthropic = Effect.acquireRelease(
  Effect.promise(() => startFakeAnthropic({ apiKey: KEY })),
  (fake) => Effect.promise(() => fake.close())
)

const withKeyEnv = (value: string) =>
  Effect.acquireRelease(
    Effect.sync(() => {
      process.env[ENV] = value
    }),
    () => Effect.sync(() => delete process.env[ENV])
  )

const model = (provider: string, extra: Record<string, unknown> = {}) => ({
  id: "claude-test",
  owned_by: "anthropic",
  max_input_tokens: 1000,
  max_output_tokens: 100,
  rate_limit_rpm: 10,
  concurrency: 1,
  route: { provider, model: "claude-fake-4" },
  ...extra
})

describe("the anthropic provider config", () => {
  it("defaults base_url to Anthropic's API and restricts api_key_env to WELLSPRING_UPSTREAM_*", () => {
    const ok = decodeProvider({ kind: "anthropic", api_key_env: "WELLSPRING_UPSTREAM_ANTHROPIC" })
    expect(Result.isSuccess(ok) && ok.success).toMatchObject({
      kind: "anthropic",
      base_url: "https://api.anthropic.com",
      api_key_env: "WELLSPRING_UPSTREAM_ANTHROPIC",
      connections: 64,
      timeouts: { connect_ms: 5_000, first_token_ms: 60_000 }
    })
    for (const bad of ["DATABASE_URL", "WELLSPRING_ENCRYPTION_KEY", "WELLSPRING_UPSTREAM_lower"]) {
      expect(Result.isFailure(decodeProvider({ kind: "anthropic", api_key_env: bad })), bad).toBe(true)
    }
    expect(Result.isFailure(decodeProvider({ kind: "anthropic", base_url: "ftp://example.com" }))).toBe(true)
  })

  it("refuses supports_embeddings on a model routed to an anthropic provider", () => {
    const providers = { claude: { kind: "anthropic" }, sim: { kind: "simulated" } }
    expect(Result.isSuccess(decodeCatalog({ providers, models: [model("claude")] }))).toBe(true)
    const refused = decodeCatalog({ providers, models: [model("claude", { supports_embeddings: true })] })
    expect(Result.isFailure(refused)).toBe(true)
    if (Result.isFailure(refused)) expect(String(refused.failure)).toContain("no embeddings API")
    expect(Result.isSuccess(decodeCatalog({ providers, models: [model("sim", { supports_embeddings: true })] })))
      .toBe(true)
  })
})

describe("the Anthropic adapter", () => {
  it.live("is built by Upstreams for kind anthropic, with the key of its api_key_env", () =>
    Effect.gen(function*() {
      const fake = yield* fakeAnthropic
      yield* withKeyEnv(KEY)
      fake.script(FakeBehaviour.message(FakeMessages.text("Hi from Claude.", { input_tokens: 3, output_tokens: 4 })))
      const upstreams = yield* makeUpstreams(Effect.succeed({ claude: anthropic(`${fake.url}/`, ENV) }))
      const adapter = yield* upstreams.get("claude")
      const events = yield* Stream.runCollect(upstreamStream(adapter, ask))
      expect(events).toEqual([
        { _tag: "Content", text: "Hi fr" },
        { _tag: "Content", text: "om Cl" },
        { _tag: "Content", text: "aude." },
        { _tag: "Finish", reason: "stop" },
        { _tag: "Usage", usage: { prompt_tokens: 3, completion_tokens: 4, reasoning_tokens: 0, cached_tokens: 0 } }
      ])
      expect(fake.requests).toHaveLength(1)
      expect(fake.requests[0]).toMatchObject({ path: "/v1/messages", headers: { "x-api-key": KEY } })
      expect(fake.requests[0]!.headers.authorization).toBeUndefined()
    }))

  it.live("without a key it sends none, and the upstream's 401 keeps no secret", () =>
    Effect.gen(function*() {
      const fake = yield* fakeAnthropic
      const upstreams = yield* makeUpstreams(Effect.succeed({ claude: anthropic(fake.url) }))
      const error = yield* Effect.flip(completeChat(yield* upstreams.get("claude"), { ...ask, stream: false }))
      expect(error).toMatchObject({ kind: "status", status: 401 })
      expect(fake.requests[0]!.headers["x-api-key"]).toBeUndefined()
    }))

  it.live("rebuilds when the key variable changed at the next catalog reload", () =>
    Effect.gen(function*() {
      const fake = yield* fakeAnthropic
      yield* withKeyEnv("sk-ant-wrong-key-000000000000")
      const providers = yield* Ref.make<Record<string, Provider>>({ claude: anthropic(fake.url, ENV) })
      const upstreams = yield* makeUpstreams(Ref.get(providers))
      const first = yield* upstreams.get("claude")
      const refused = yield* Effect.flip(completeChat(first, { ...ask, stream: false }))
      expect(refused).toMatchObject({ kind: "status", status: 401 })
      expect(refused.detail).not.toContain("sk-ant-wrong-key")
      process.env[ENV] = KEY
      // A reload decodes the catalog again: an equal config, a new object, so the fingerprint (key included) is checked.
      yield* Ref.set(providers, { claude: anthropic(fake.url, ENV) })
      const second = yield* upstreams.get("claude")
      expect(second).not.toBe(first)
      const events = yield* completeChat(second, { ...ask, stream: false })
      expect(events[0]).toEqual({ _tag: "Content", text: "Hello from the fake." })
      expect(fake.requests.map((r) => r.headers["x-api-key"])).toEqual(["sk-ant-wrong-key-000000000000", KEY])
    }))

  it.live("puts the base URL's path in front of /v1/messages", () =>
    Effect.gen(function*() {
      const fake = yield* fakeAnthropic
      const adapter = yield* Effect.acquireRelease(
        Effect.sync(() => makeAnthropicAdapter(anthropic(`${fake.url}/proxy/anthropic/`), KEY)),
        (a) => a.close()
      )
      // The fake serves only /v1/messages: the prefixed path is answered with Anthropic's 404.
      const error = yield* Effect.flip(completeChat(adapter, ask))
      expect(fake.requests.map((r) => r.path)).toEqual(["/proxy/anthropic/v1/messages"])
      expect(error).toMatchObject({ kind: "status", status: 404 })
    }))

  it.live("embed fails with a 400 and sends nothing", () =>
    Effect.gen(function*() {
      const fake = yield* fakeAnthropic
      const adapter = yield* Effect.acquireRelease(
        Effect.sync(() => makeAnthropicAdapter(anthropic(fake.url), KEY)),
        (a) => a.close()
      )
      const error = yield* Effect.flip(adapter.embed("claude-fake-4", ["hello"]))
      expect(error).toMatchObject({ _tag: "UpstreamError", kind: "status", status: 400 })
      expect(error.detail).toContain("no embeddings")
      expect(fake.requests).toHaveLength(0)
    }))
})
