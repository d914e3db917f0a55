/**
 * The `byok` section of the gateway config (a fragment: `config/GatewayConfig.ts` embeds it as
 * `byok: ByokConfig.pipe(withDefault(() => Schema.decodeSync(ByokConfig)({})))`). How the effective switch and
 * key are decided from it is `byok/Switch.ts`.
 *
 * ```yaml
 * byok:
 *   enabled: true                      # default: on in embedded mode, off in production
 *   encryption_key: "<64 hex or base64 of 32 bytes>"   # env WELLSPRING_BYOK_KEY; embedded: data/byok.key
 *   max_per_provider: 5
 *   fallback_default_on: false
 *   http_allowlist: ["http://127.0.0.1:9000"]   # plain-http origins a user base URL may name
 *   allowed_cidrs: []                   # private ranges a user base URL may reach (default none)
 *   model_list_cache_seconds: 60
 *   probe_timeout_ms: 10000
 *   connect_timeout_ms: 5000
 *   rate_limit_rpm: 60                 # per account and provider
 *   dispatch_timeouts: { first_token_ms: 60000, idle_ms: 60000, total_ms: 600000 }
 *   providers:
 *     openai: { base_url: "http://127.0.0.1:9001/v1" }   # operator override (tests, proxies)
 *     azure: { base_url: "http://127.0.0.1:9002/{resource}/openai" }
 *     openrouter: { enabled: false }
 * ```
 */
import { Effect, Schema } from "effect"
import ipaddr from "ipaddr.js"

export const PROVIDER_IDS = ["openai", "anthropic", "openrouter", "gemini", "azure", "custom"] as const
export type ProviderId = (typeof PROVIDER_IDS)[number]

const withDefault = <S extends Schema.Top>(value: () => S["Type"]) => (schema: S) =>
  Schema.withDecodingDefaultType<S>(Effect.sync(value))(schema)

const PositiveInt = Schema.Int.check(Schema.isGreaterThan(0))

const HttpUrl = Schema.String.check(
  Schema.isPattern(/^https?:\/\/[^\s#]+$/, { message: "must be an http(s) URL without spaces or fragment" })
)
const HttpOrigin = Schema.String.check(
  Schema.isPattern(/^https?:\/\/[^/\s@#?]+$/, { message: "must be an origin: scheme://host[:port], no path" })
)
const Cidr = Schema.String.check(Schema.makeFilter((s: string) =>
  ipaddr.isValidCIDR(s) ? undefined : "must be an address range in CIDR form (10.0.0.0/8, fd00::/8)"
))

export const ProviderOverride = Schema.Struct({
  /** False hides the provider: not listed, not usable, its saved credentials fail as missing. */
  enabled: Schema.Boolean.pipe(withDefault(() => true)),
  /**
   * Replaces the provider's default base URL. Azure's may contain `{resource}`. An operator's base URL is
   * trusted: its origin joins the guard's allow-list (plain http and private addresses allowed there).
   */
  base_url: Schema.optional(HttpUrl),
  /** Replaces per-region base URLs (OpenAI: `us`, `eu`); same trust as `base_url`. */
  regions: Schema.optional(Schema.Record(Schema.String, HttpUrl))
})
export type ProviderOverride = typeof ProviderOverride.Type

const overrideField = Schema.optional(ProviderOverride)

export const ByokConfig = Schema.Struct({
  /** Absent: on in embedded mode (its generated key makes it safe), off in production. */
  enabled: Schema.optional(Schema.Boolean),
  /** 32 bytes as 64 hex digits or base64. Without it (and outside embedded mode) BYOK is off. */
  encryption_key: Schema.optional(Schema.RedactedFromValue(Schema.String)),
  /** Active credentials per account, provider and auth scheme. */
  max_per_provider: PositiveInt.check(Schema.isLessThanOrEqualTo(50)).pipe(withDefault(() => 5)),
  /** Operator's default for fallback to the pool (`fallback_default_on`). */
  fallback_default_on: Schema.Boolean.pipe(withDefault(() => false)),
  /** Origins a user-supplied base URL may reach over plain http (and without address checks). */
  http_allowlist: Schema.Array(HttpOrigin).pipe(withDefault((): ReadonlyArray<string> => [])),
  /** Private address ranges user-supplied URLs may reach (e.g. a self-hosted model server). Default none. */
  allowed_cidrs: Schema.Array(Cidr).pipe(withDefault((): ReadonlyArray<string> => [])),
  /** Lifetime of a credential's cached model list. */
  model_list_cache_seconds: PositiveInt.pipe(withDefault(() => 60)),
  /** Whole probe (connect, answer, body). */
  probe_timeout_ms: PositiveInt.pipe(withDefault(() => 10_000)),
  connect_timeout_ms: PositiveInt.pipe(withDefault(() => 5_000)),
  /**
   * Requests per minute an account may send through its credentials, per provider (`@openai/...` of every model
   * counts in one window). BYOK requests count here and toward the abuse cooldown only, never the pools.
   */
  rate_limit_rpm: PositiveInt.pipe(withDefault(() => 60)),
  /** Chat and embeddings calls through a credential (the connect timeout is `connect_timeout_ms`). */
  dispatch_timeouts: Schema.Struct({
    first_token_ms: PositiveInt.pipe(withDefault(() => 60_000)),
    idle_ms: PositiveInt.pipe(withDefault(() => 60_000)),
    total_ms: PositiveInt.pipe(withDefault(() => 600_000))
  }).pipe(withDefault(() => ({ first_token_ms: 60_000, idle_ms: 60_000, total_ms: 600_000 }))),
  /** Connections kept open per provider origin (shared by every credential on it). */
  connections_per_origin: PositiveInt.pipe(withDefault(() => 16)),
  providers: Schema.Struct({
    openai: overrideField,
    anthropic: overrideField,
    openrouter: overrideField,
    gemini: overrideField,
    azure: overrideField,
    custom: overrideField
  }).pipe(withDefault(() => ({})))
})
export type ByokConfig = typeof ByokConfig.Type
export type ByokConfigEncoded = typeof ByokConfig.Encoded

export const decodeByokConfig = Schema.decodeUnknownSync(ByokConfig, { onExcessProperty: "error" })
