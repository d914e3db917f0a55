/**
 * The `Upstreams` service: provider name -> adapter, built on first use and cached. When the live
 * catalog changes a provider's config (or its API key variable changes), the adapter is rebuilt and
 * the old pool closes gracefully; every pool closes with the service scope.
 */
import { type Context, Effect, Layer, type Scope } from "effect"
import type { Provider } from "../config/GatewayConfig.js"
import { makeAnthropicAdapter } from "./anthropic/Adapter.js"
import { makeOpenAiCompatibleAdapter } from "./openai-compatible/Adapter.js"
import { makeSimulatedAdapter } from "./simulated/Engine.js"
import { type UpstreamAdapter, UpstreamError, Upstreams } from "./Upstream.js"

export type GetProviders = Effect.Effect<Readonly<Record<string, Provider>>>

interface Entry {
  /** The config object the adapter was built from (identity check first, then fingerprint). */
  provider: Provider
  readonly fingerprint: string
  readonly adapter: UpstreamAdapter
  readonly close: Effect.Effect<void>
}

/** The variable holding the provider's API key (HTTP kinds only). */
const keyEnvOf = (provider: Provider): string | undefined =>
  provider.kind === "simulated" ? undefined : provider.api_key_env

const apiKeyOf = (provider: Provider): string | undefined => {
  const env = keyEnvOf(provider)
  return env === undefined ? undefined : process.env[env]
}

const fingerprintOf = (provider: Provider): string => JSON.stringify([provider, apiKeyOf(provider) ?? null])

const build = (provider: Provider): Entry => {
  if (provider.kind === "simulated") {
    return { provider, fingerprint: fingerprintOf(provider), adapter: makeSimulatedAdapter(provider), close: Effect.void }
  }
  const adapter = provider.kind === "anthropic"
    ? makeAnthropicAdapter(provider, apiKeyOf(provider))
    : makeOpenAiCompatibleAdapter(provider, apiKeyOf(provider))
  return { provider, fingerprint: fingerprintOf(provider), adapter, close: adapter.close() }
}

export const makeUpstreams: (
  getProviders: GetProviders
) => Effect.Effect<Context.Service.Shape<typeof Upstreams>, never, Scope.Scope> = Effect.fnUntraced(function*(
  getProviders: GetProviders
) {
  const scope = yield* Effect.scope
  const cache = new Map<string, Entry>()
  yield* Effect.addFinalizer(() =>
    Effect.suspend(() => {
      const entries = [...cache.values()]
      cache.clear()
      return Effect.forEach(entries, (entry) => entry.close, { concurrency: "unbounded", discard: true })
    })
  )

  const lookup = (providers: Readonly<Record<string, Provider>>, name: string) =>
    Effect.suspend(() => {
      const provider = Object.prototype.hasOwnProperty.call(providers, name) ? providers[name] : undefined
      if (provider === undefined) {
        return Effect.fail(new UpstreamError({ kind: "connect", detail: `unknown upstream provider "${name}"` }))
      }
      const cached = cache.get(name)
      if (cached !== undefined && cached.provider === provider) return Effect.succeed(cached.adapter)
      const fingerprint = fingerprintOf(provider)
      if (cached !== undefined && cached.fingerprint === fingerprint) {
        cached.provider = provider
        return Effect.succeed(cached.adapter)
      }
      const entry = build(provider)
      cache.set(name, entry)
      const keyEnv = keyEnvOf(provider)
      const warnings = keyEnv !== undefined && !process.env[keyEnv]
        ? Effect.logWarning(`upstream provider "${name}": environment variable ${keyEnv} is empty; no API key sent`)
        : provider.kind === "anthropic" && keyEnv === undefined
        ? Effect.logWarning(`upstream provider "${name}": anthropic provider without api_key_env; no API key sent`)
        : Effect.void
      if (cached === undefined) return Effect.as(warnings, entry.adapter)
      // In-flight requests keep the old pool until they finish (or the grace period ends).
      return Effect.as(
        Effect.logInfo(`upstream provider "${name}" changed; adapter rebuilt`).pipe(
          Effect.andThen(warnings),
          Effect.andThen(Effect.forkIn(cached.close, scope))
        ),
        entry.adapter
      )
    })

  return Upstreams.of({
    get: (name) => Effect.flatMap(getProviders, (providers) => lookup(providers, name))
  })
})

/** The service over a source of the current providers (e.g. the live catalog's). */
export const layer = (getProviders: GetProviders): Layer.Layer<Upstreams> =>
  Layer.effect(Upstreams, makeUpstreams(getProviders))

/** Like `layer`, when the providers source itself needs services to be built. */
export const layerEffect = <E, R>(getProviders: Effect.Effect<GetProviders, E, R>): Layer.Layer<Upstreams, E, R> =>
  Layer.effect(Upstreams, Effect.flatMap(getProviders, makeUpstreams))

/** A fixed provider set (tests, tools). */
export const layerStatic = (providers: Readonly<Record<string, Provider>>): Layer.Layer<Upstreams> =>
  layer(Effect.succeed(providers))
