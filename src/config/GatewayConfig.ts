import { Effect, Result, Schema, SchemaIssue } from "effect"
import * as Fs from "node:fs"
import * as Path from "node:path"
import * as Yaml from "yaml"
import { ByokConfig } from "./Byok.js"
import { isRange } from "../http/ClientAddress.js"
import { ImagesConfig } from "./Images.js"
import { ResponsesConfig } from "./Responses.js"
import { StatusConfig } from "./Status.js"
import { decodeKey32 } from "../store/Sealer.js"
import { ReasoningEffort } from "../wire/ChatSchemas.js"

const PositiveInt = Schema.Int.check(Schema.isGreaterThan(0))
const NonNegativeInt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))
const NonNegative = Schema.Number.check(Schema.isGreaterThanOrEqualTo(0))
const Positive = Schema.Number.check(Schema.isGreaterThan(0))

/**
 * A field that may be left out (or be `undefined`) in the file; decoding fills in `value()`, a fresh value per
 * decode. The decoded type keeps the field required.
 */
const withDefault = <S extends Schema.Top>(value: () => S["Type"]) => (schema: S) =>
  Schema.withDecodingDefaultType<S>(Effect.sync(value))(schema)

const pattern = (regex: RegExp, message?: string) =>
  Schema.String.check(Schema.isPattern(regex, message === undefined ? undefined : { message }))

// Defined with the chat wire shapes; re-exported for the catalog's `reasoning_efforts`.
export { ReasoningEffort }

/** `operator`: `/metrics` (status/Operator.ts); no listener serves it unless the config names it. */
export const Origin = Schema.Literals(["inference", "account", "status", "operator"])
export type Origin = typeof Origin.Type

export const Listener = Schema.Struct({
  host: Schema.String.pipe(withDefault(() => "127.0.0.1")),
  port: NonNegativeInt,
  origins: Schema.Array(Origin).pipe(withDefault((): ReadonlyArray<Origin> => ["inference", "account", "status"]))
})
export type Listener = typeof Listener.Type

export const Timeouts = Schema.Struct({
  connect_ms: PositiveInt.pipe(withDefault(() => 5_000)),
  first_token_ms: PositiveInt.pipe(withDefault(() => 60_000)),
  idle_ms: PositiveInt.pipe(withDefault(() => 60_000)),
  total_ms: PositiveInt.pipe(withDefault(() => 600_000))
})
export type Timeouts = typeof Timeouts.Type

export const SimulatedProvider = Schema.Struct({
  kind: Schema.Literal("simulated"),
  /** Delay before the first token. */
  first_token_ms: NonNegative.pipe(withDefault(() => 0)),
  /** 0 emits every token at once. */
  tokens_per_second: NonNegative.pipe(withDefault(() => 0))
})

/**
 * Name of the environment variable holding an upstream API key. Restricted to `WELLSPRING_UPSTREAM_*` so a catalog
 * edit cannot send another secret of the process (DATABASE_URL, the encryption key) to an upstream.
 */
const ApiKeyEnv = pattern(
  /^WELLSPRING_UPSTREAM_[A-Z0-9_]{1,64}$/,
  "api_key_env must name a variable WELLSPRING_UPSTREAM_<NAME> (A-Z, 0-9, _)"
)

export const OpenAiCompatibleProvider = Schema.Struct({
  kind: Schema.Literal("openai-compatible"),
  base_url: pattern(/^https?:\/\//),
  api_key_env: Schema.optional(ApiKeyEnv),
  connections: PositiveInt.pipe(withDefault(() => 64)),
  // Decoding defaults are not constructor defaults in v4: decode `{}` to get the defaulted record.
  timeouts: Timeouts.pipe(withDefault(() => Schema.decodeSync(Timeouts)({})))
})

/** Anthropic's Messages API (`<base_url>/v1/messages`, key sent as `x-api-key`). It has no embeddings API. */
export const AnthropicProvider = Schema.Struct({
  kind: Schema.Literal("anthropic"),
  base_url: pattern(/^https?:\/\//).pipe(withDefault(() => "https://api.anthropic.com")),
  api_key_env: Schema.optional(ApiKeyEnv),
  connections: PositiveInt.pipe(withDefault(() => 64)),
  timeouts: Timeouts.pipe(withDefault(() => Schema.decodeSync(Timeouts)({})))
})

export const Provider = Schema.Union([SimulatedProvider, OpenAiCompatibleProvider, AnthropicProvider])
export type Provider = typeof Provider.Type

/** A name shown in rows, metrics and the operator CLI. */
const DeploymentId = pattern(/^[A-Za-z0-9][A-Za-z0-9._:\-]{0,63}$/)

/**
 * One place a catalog model is served: a provider and the model id it knows. Requests are spread by `weight` among
 * the healthy deployments of the lowest `priority` number that has one; the others take over when none is left.
 */
export const Deployment = Schema.Struct({
  /** Unique within the model; defaults to the provider name (with `#n` when a provider is listed twice). */
  id: Schema.optional(DeploymentId),
  provider: Schema.String,
  model: Schema.String,
  weight: Positive.pipe(withDefault(() => 1)),
  /** Lower is preferred: a higher number is used only while no deployment with a lower one is available. */
  priority: NonNegativeInt.pipe(withDefault(() => 0)),
  /**
   * Requests in flight on this deployment; past it the deployment is skipped. Across every replica in production
   * (Redis), in the process in embedded mode.
   */
  concurrency: Schema.optional(PositiveInt),
  /**
   * Requests sent to this deployment per minute; past it the deployment is skipped. Across every replica in a
   * sliding 60 s window in production (Redis), per clock minute in the process in embedded mode.
   */
  rate_limit_rpm: Schema.optional(PositiveInt)
})
export type Deployment = typeof Deployment.Type

export const ModelConfig = Schema.Struct({
  id: pattern(/^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$/),
  owned_by: Schema.String,
  display_name: Schema.optional(Schema.String),
  created: NonNegativeInt.pipe(withDefault(() => 1_767_225_600)),
  supports_tools: Schema.Boolean.pipe(withDefault(() => false)),
  supports_reasoning: Schema.Boolean.pipe(withDefault(() => false)),
  supports_images: Schema.Boolean.pipe(withDefault(() => false)),
  supports_embeddings: Schema.Boolean.pipe(withDefault(() => false)),
  /** False for embedding-only models. */
  supports_chat: Schema.Boolean.pipe(withDefault(() => true)),
  reasoning_efforts: Schema.Array(ReasoningEffort).pipe(withDefault((): ReadonlyArray<ReasoningEffort> => [])),
  max_input_tokens: PositiveInt,
  max_output_tokens: PositiveInt,
  rate_limit_rpm: PositiveInt,
  /** Concurrent in-flight requests across all accounts; full gives 529. */
  concurrency: PositiveInt,
  /** Raw tokens per day shared by all accounts, reset at 09:00 KST. Null: no cap. */
  daily_cap: Schema.NullOr(PositiveInt).pipe(withDefault((): number | null => null)),
  /** Quota weights per token; `cached_input` (input read from the upstream's prompt cache) defaults to `input`. */
  weights: Schema.Struct({ input: NonNegative, output: NonNegative, cached_input: Schema.optional(NonNegative) }).pipe(
    withDefault(() => ({ input: 1, output: 1 }))
  ),
  disabled: Schema.Boolean.pipe(withDefault(() => false)),
  disabled_note: Schema.optional(Schema.String),
  /** A single upstream (the original form): the same as one deployment. */
  route: Schema.optional(Schema.Struct({ provider: Schema.String, model: Schema.String })),
  /** Several upstreams serving the model (balanced, with failover); exactly one of `route` and `deployments`. */
  deployments: Schema.optional(Schema.Array(Deployment))
})
export type ModelConfig = typeof ModelConfig.Type

/** A deployment with its defaults settled: what the router works with. */
export interface ResolvedDeployment {
  readonly id: string
  readonly provider: string
  readonly model: string
  readonly weight: number
  readonly priority: number
  readonly concurrency: number | null
  readonly rate_limit_rpm: number | null
}

const resolvedDeployments = new WeakMap<ModelConfig, ReadonlyArray<ResolvedDeployment>>()

/**
 * A model's deployments (its `route` as one deployment), ids settled: the provider name, `#n` appended from the
 * second time a provider appears without an id. Cached per model object (the catalog replaces objects on reload).
 */
export const deploymentsOf = (model: ModelConfig): ReadonlyArray<ResolvedDeployment> => {
  const cached = resolvedDeployments.get(model)
  if (cached !== undefined) return cached
  const listed: ReadonlyArray<Deployment> = model.deployments !== undefined && model.deployments.length > 0
    ? model.deployments
    : model.route !== undefined
    ? [{ provider: model.route.provider, model: model.route.model, weight: 1, priority: 0 }]
    : []
  const counts = new Map<string, number>()
  const resolved = listed.map((d): ResolvedDeployment => {
    const n = (counts.get(d.provider) ?? 0) + 1
    counts.set(d.provider, n)
    return {
      id: d.id ?? (n === 1 ? d.provider : `${d.provider}#${n}`),
      provider: d.provider,
      model: d.model,
      weight: d.weight,
      priority: d.priority,
      concurrency: d.concurrency ?? null,
      rate_limit_rpm: d.rate_limit_rpm ?? null
    }
  })
  resolvedDeployments.set(model, resolved)
  return resolved
}

/** The model's first deployment (the catalog check guarantees one). */
export const primaryDeployment = (model: ModelConfig): ResolvedDeployment => {
  const first = deploymentsOf(model)[0]
  if (first === undefined) throw new Error(`model ${model.id} has no deployment`)
  return first
}

/** How long a failing deployment is left out, and when it is. */
export const HealthPolicy = Schema.Struct({
  /** Failures in a row (5xx, timeouts, connect errors, upstream 429s) that eject a deployment. */
  consecutive_failures: PositiveInt.pipe(withDefault(() => 3)),
  /** Share of failed requests over `window_seconds` (with at least `min_requests`) that ejects a deployment. */
  failure_rate: Schema.Number.check(Schema.isGreaterThan(0), Schema.isLessThanOrEqualTo(1)).pipe(withDefault(() => 0.5)),
  window_seconds: PositiveInt.pipe(withDefault(() => 60)),
  min_requests: PositiveInt.pipe(withDefault(() => 10)),
  /** The first ejection's length; each ejection that follows a failed trial request doubles it. */
  open_seconds: Positive.pipe(withDefault(() => 5)),
  max_open_seconds: Positive.pipe(withDefault(() => 300)),
  /** The longest an upstream's `Retry-After` keeps a deployment out. */
  max_retry_after_seconds: Positive.pipe(withDefault(() => 300))
})
export type HealthPolicy = typeof HealthPolicy.Type

/** Retrying a request on another deployment, before anything reached the client. */
export const FailoverPolicy = Schema.Struct({
  /** Upstream attempts per request, the first included. */
  max_attempts: PositiveInt.pipe(withDefault(() => 3)),
  /** No new attempt starts this long after the first one did. */
  budget_seconds: Positive.pipe(withDefault(() => 30))
})
export type FailoverPolicy = typeof FailoverPolicy.Type

export const RoutingConfig = Schema.Struct({
  health: HealthPolicy.pipe(withDefault(() => Schema.decodeSync(HealthPolicy)({}))),
  failover: FailoverPolicy.pipe(withDefault(() => Schema.decodeSync(FailoverPolicy)({})))
})
export type RoutingConfig = typeof RoutingConfig.Type

export const PlanConfig = Schema.Struct({
  session_limit: PositiveInt,
  weekly_limit: PositiveInt,
  session_hours: Positive.pipe(withDefault(() => 5)),
  hide_absolutes: Schema.Boolean.pipe(withDefault(() => false)),
  show_request_pct: Schema.Boolean.pipe(withDefault(() => false))
})
export type PlanConfig = typeof PlanConfig.Type

export const AbuseConfig = Schema.Struct({
  burst: PositiveInt,
  window_seconds: PositiveInt,
  cooldown_seconds: PositiveInt
})

export const AccessConfig = Schema.Struct({
  email_enforcement: Schema.Boolean.pipe(withDefault(() => false)),
  region_lock: Schema.Struct({
    enabled: Schema.Boolean,
    /** Header set by a trusted proxy with the ISO country code. */
    header: Schema.String.pipe(withDefault(() => "cf-ipcountry")),
    allowed_countries: Schema.Array(Schema.String)
  }).pipe(withDefault(() => ({ enabled: false, header: "cf-ipcountry", allowed_countries: [] })))
})

/** An alias name: what a client may send as `model` (Claude Code sends its own model ids). */
const AliasName = pattern(/^[A-Za-z0-9][A-Za-z0-9._:@\-]{0,127}$/)

export const Catalog = Schema.Struct({
  models: Schema.Array(ModelConfig),
  providers: Schema.Record(Schema.String, Provider),
  /** Alias name -> catalog model id; resolved for every API, never listed by /v1/models. */
  aliases: Schema.Record(AliasName, Schema.String).pipe(withDefault((): Readonly<Record<string, string>> => ({})))
}).check(Schema.makeFilter((catalog) => {
  const issues: Array<Schema.FilterIssue> = []
  const seen = new Set<string>()
  const ids = new Set(catalog.models.map((m) => m.id))
  for (const [alias, target] of Object.entries(catalog.aliases)) {
    if (ids.has(alias)) issues.push({ path: ["aliases", alias], issue: `alias ${alias} is a model id` })
    else if (!ids.has(target)) issues.push({ path: ["aliases", alias], issue: `alias ${alias} names unknown model ${target}` })
  }
  catalog.models.forEach((model, i) => {
    if (seen.has(model.id)) issues.push({ path: ["models", i, "id"], issue: `duplicate model id ${model.id}` })
    seen.add(model.id)
    const listed = model.deployments !== undefined
    if (listed === (model.route !== undefined)) {
      issues.push({ path: ["models", i], issue: "a model needs exactly one of route and deployments" })
    } else if (listed && model.deployments!.length === 0) {
      issues.push({ path: ["models", i, "deployments"], issue: "deployments must not be empty" })
    }
    const where = listed ? "deployments" : "route"
    const ids = new Set<string>()
    deploymentsOf(model).forEach((d, j) => {
      const path = listed ? ["models", i, where, j] : ["models", i, where]
      if (ids.has(d.id)) issues.push({ path: [...path, "id"], issue: `duplicate deployment id ${d.id}` })
      ids.add(d.id)
      if (!(d.provider in catalog.providers)) {
        issues.push({ path: [...path, "provider"], issue: `unknown provider ${d.provider}` })
      } else if (model.supports_embeddings && catalog.providers[d.provider]!.kind === "anthropic") {
        issues.push({
          path: ["models", i, "supports_embeddings"],
          issue: `provider ${d.provider} is anthropic, which has no embeddings API`
        })
      }
    })
    if (model.supports_reasoning && model.reasoning_efforts.length === 0) {
      issues.push({ path: ["models", i, "reasoning_efforts"], issue: "a reasoning model needs allowed efforts" })
    }
  })
  return issues
}))
export type Catalog = typeof Catalog.Type

/**
 * Bounds on what a client may send; every one is checked before the input costs CPU, memory or a write.
 * Defaults are listed in the README's limits table.
 */
export const LimitsConfig = Schema.Struct({
  /** Largest request body, enforced while reading (413 before the whole body arrives). */
  body_bytes: PositiveInt.pipe(withDefault(() => 4 * 1024 * 1024)),
  /** Deepest JSON nesting of a body (objects and arrays). */
  json_depth: PositiveInt.pipe(withDefault(() => 64)),
  /** Messages per chat request. */
  messages: PositiveInt.pipe(withDefault(() => 1024)),
  /** Characters of one text (a message content, text part, reasoning, tool arguments). */
  text_chars: PositiveInt.pipe(withDefault(() => 1024 * 1024)),
  /** Characters of one `image_url.url` (data: URIs included). */
  image_url_chars: PositiveInt.pipe(withDefault(() => 2 * 1024 * 1024)),
  /** Nesting depth of a tool's `parameters` JSON Schema. */
  tool_schema_depth: PositiveInt.pipe(withDefault(() => 16)),
  /** Serialized size of one tool definition. */
  tool_schema_bytes: PositiveInt.pipe(withDefault(() => 64 * 1024)),
  /** Inputs of one embeddings request. */
  embedding_inputs: PositiveInt.pipe(withDefault(() => 256)),
  /** Failed requests (4xx of the client's own making) per key per minute before 429 without parsing. */
  failed_requests_per_minute: PositiveInt.pipe(withDefault(() => 60)),
  /** `GET /api/user/me` per account per minute. */
  snapshot_per_minute: PositiveInt.pipe(withDefault(() => 60)),
  /** Open connections per listener; beyond it new connections are refused. */
  connections: PositiveInt.pipe(withDefault(() => 4096)),
  /**
   * Listening sockets per listener sharing its port (`SO_REUSEPORT`; Linux and FreeBSD): the event loop accepts
   * one connection per socket per turn, and a saturated turn takes milliseconds (http/Server.ts, `listen`). 1: one
   * plain socket, the default where the platform has no `SO_REUSEPORT` balancing.
   */
  accept_sockets: PositiveInt.check(Schema.isLessThanOrEqualTo(256)).pipe(
    withDefault(() => (process.platform === "linux" || process.platform === "freebsd" ? 16 : 1))
  ),
  /**
   * Connections that have not yet completed a request, per listener. Past it the oldest such connection is
   * closed to make room, so silent or slow sockets cannot hold the listener.
   */
  pending_connections: PositiveInt.pipe(withDefault(() => 256)),
  /** Open connections from one client address (trusted proxies exempt); past it new ones are closed on accept. */
  connections_per_address: PositiveInt.pipe(withDefault(() => 512)),
  /** A new connection that sends no byte within this time is closed without an answer. */
  first_byte_timeout_seconds: PositiveInt.pipe(withDefault(() => 5)),
  /**
   * The busy gate (http/BusyGate.ts): while the event loop is busy at least `busy_utilization` of the time,
   * requests that do work past `busy_concurrency` unanswered ones (per listener; 0: off; absent: 8 per MB of
   * young-generation semi-space, 32 embedded and 256 in production) wait, at most `busy_max_wait_ms`, before
   * they are read; a request counts for at most `busy_max_wait_ms`.
   */
  busy_concurrency: Schema.optional(NonNegativeInt),
  busy_utilization: NonNegative.check(Schema.isLessThanOrEqualTo(1)).pipe(withDefault(() => 0.9)),
  busy_max_wait_ms: PositiveInt.check(Schema.isLessThanOrEqualTo(60_000)).pipe(withDefault(() => 1000)),
  /** Failed authentications (401) per client address per minute; past it 429 before any lookup. */
  failed_auth_per_minute: PositiveInt.pipe(withDefault(() => 30)),
  /** Time to receive the request headers. */
  headers_timeout_seconds: PositiveInt.pipe(withDefault(() => 15)),
  /** Time to receive the whole request (headers and body). */
  body_timeout_seconds: PositiveInt.pipe(withDefault(() => 30)),
  /** Idle time of a kept-alive connection between requests. */
  keep_alive_seconds: PositiveInt.pipe(withDefault(() => 65))
})
export type LimitsConfig = typeof LimitsConfig.Type

export const GatewayConfig = Schema.Struct({
  listeners: Schema.NonEmptyArray(Listener).pipe(
    withDefault((): readonly [Listener, ...Array<Listener>] => [
      { host: "127.0.0.1", port: 8080, origins: ["inference", "account", "status"] }
    ])
  ),
  data_dir: Schema.String.pipe(withDefault(() => "./data")),
  database_url: Schema.optional(Schema.RedactedFromValue(Schema.String)),
  redis_url: Schema.optional(Schema.RedactedFromValue(Schema.String)),
  /** Prefix of every admission key in Redis (env `WELLSPRING_REDIS_PREFIX`); lets deployments share one Redis. */
  redis_key_prefix: pattern(/^[A-Za-z0-9:_.\-]{1,64}$/).pipe(withDefault(() => "ws:q:")),
  /** 32 bytes as 64 hex digits or base64; enables key reveal. Generated into data_dir in embedded mode. */
  encryption_key: Schema.optional(Schema.RedactedFromValue(
    Schema.String.check(Schema.makeFilter((s: string) => isKey32(s) ? undefined : KEY32_MESSAGE))
  )),
  key_prefix: pattern(/^[a-z][a-z0-9-]{1,15}$/).pipe(withDefault(() => "sk-ws-")),
  catalog_reload_seconds: Positive.pipe(withDefault(() => 5)),
  access: AccessConfig.pipe(withDefault(() => Schema.decodeSync(AccessConfig)({}))),
  default_plan: Schema.String.pipe(withDefault(() => "default")),
  plans: Schema.Record(Schema.String, PlanConfig),
  abuse: AbuseConfig,
  /**
   * Request rows are written every `flush_ms`, at most `batch_size` per statement. Each statement has a fixed cost
   * (the minute-sum trigger, the commit; ~2.7 ms in the embedded database), so a flush is one statement up to
   * 10,000 requests/s (docs/decisions.md, "Request rows: one statement per flush").
   */
  request_log: Schema.Struct({
    batch_size: PositiveInt.pipe(withDefault(() => 2000)),
    flush_ms: PositiveInt.pipe(withDefault(() => 200))
  }).pipe(withDefault(() => ({ batch_size: 2000, flush_ms: 200 }))),
  shutdown_grace_seconds: NonNegative.pipe(withDefault(() => 20)),
  /**
   * After SIGTERM / SIGINT, `/readyz` answers 503 for this long while everything else is still served, so a load
   * balancer stops sending before the listeners close; then the drain (`shutdown_grace_seconds`) begins.
   */
  shutdown_delay_seconds: NonNegative.pipe(withDefault(() => 0)),
  limits: LimitsConfig.pipe(withDefault(() => Schema.decodeSync(LimitsConfig)({}))),
  /**
   * Proxies (CIDR ranges or addresses) whose `X-Forwarded-For` names the client (src/http/ClientAddress.ts).
   * Empty: the TCP peer is the client.
   */
  trusted_proxies: Schema.Array(Schema.String.check(Schema.makeFilter((s: string) => isRange(s) ? undefined : "not an address or CIDR range"))).pipe(
    withDefault((): ReadonlyArray<string> => [])
  ),
  /**
   * Origins (scheme://host[:port]) besides the request's own host from which cookie-authenticated
   * mutations of the account API are accepted (a dashboard served from another origin).
   */
  dashboard_origins: Schema.Array(pattern(/^https?:\/\/[^/\s]+$/)).pipe(
    withDefault((): ReadonlyArray<string> => [])
  ),
  dev_account: Schema.Boolean.pipe(withDefault(() => true)),
  /**
   * Users' own provider credentials (src/config/Byok.ts). Absent: defaults; BYOK is then on in embedded mode
   * (key generated into `<data_dir>/byok.key`) and off in production. Env `WELLSPRING_BYOK_KEY` sets
   * `byok.encryption_key`.
   */
  byok: ByokConfig.pipe(withDefault(() => Schema.decodeSync(ByokConfig)({}))),
  /** Image generation (src/config/Images.ts). */
  images: ImagesConfig.pipe(withDefault(() => Schema.decodeSync(ImagesConfig)({}))),
  /** Public status resources and the status page (src/config/Status.ts). */
  status: StatusConfig.pipe(withDefault(() => Schema.decodeSync(StatusConfig)({}))),
  /** Balancing, health and failover over a model's deployments. */
  routing: RoutingConfig.pipe(withDefault(() => Schema.decodeSync(RoutingConfig)({}))),
  /** Stored responses of the Responses API (src/config/Responses.ts). */
  responses: ResponsesConfig.pipe(withDefault(() => Schema.decodeSync(ResponsesConfig)({}))),
  catalog: Catalog
}).check(Schema.makeFilter((config) =>
  config.default_plan in config.plans
    ? undefined
    : { path: ["default_plan"], issue: `no plan named ${config.default_plan}` }
))
export type GatewayConfig = typeof GatewayConfig.Type
export type GatewayConfigEncoded = typeof GatewayConfig.Encoded

export class ConfigLoadError extends Error {
  override readonly name = "ConfigLoadError"
}

const KEY32_MESSAGE = "must be 32 bytes, as 64 hex digits or base64"

const isKey32 = (text: string) => decodeKey32(text) !== null

export const parseYaml = (text: string, source: string): unknown => {
  try {
    return Yaml.parse(text)
  } catch (cause) {
    throw new ConfigLoadError(`${source}: not valid YAML: ${(cause as Error).message}`)
  }
}

const standardFormatter = SchemaIssue.makeFormatterStandardSchemaV1()

/** `path.to.field: message; ...`, one entry per issue (the layout of v3's ArrayFormatter). */
const formatIssues = (error: Schema.SchemaError): string =>
  standardFormatter(error.issue).issues
    .map((issue) => {
      const path = (issue.path ?? []).map((p) => String(typeof p === "object" ? p.key : p))
      return `${path.length ? path.join(".") : "(root)"}: ${issue.message}`
    })
    .join("; ")

const decodeConfig = Schema.decodeUnknownResult(GatewayConfig, { errors: "all", onExcessProperty: "error" })
const decodeCatalogResult = Schema.decodeUnknownResult(Catalog, { errors: "all", onExcessProperty: "error" })

export const decodeGatewayConfig = (raw: unknown, source: string): GatewayConfig => {
  const result = decodeConfig(raw)
  if (Result.isFailure(result)) throw new ConfigLoadError(`${source}: ${formatIssues(result.failure)}`)
  return result.success
}

/** Decodes the catalog part of a config file; used by live reload. */
export const decodeCatalog = (raw: unknown, source: string): Catalog => {
  const catalog = typeof raw === "object" && raw !== null ? (raw as Record<string, unknown>).catalog : undefined
  const result = decodeCatalogResult(catalog)
  if (Result.isFailure(result)) throw new ConfigLoadError(`${source}: catalog.${formatIssues(result.failure)}`)
  return result.success
}

/** Command-line flags recognised by `npm start -- --flag value`. */
export interface Overrides {
  readonly configPath?: string | undefined
  readonly port?: number | undefined
  readonly host?: string | undefined
  readonly dataDir?: string | undefined
  readonly databaseUrl?: string | undefined
  readonly redisUrl?: string | undefined
}

export const parseFlags = (argv: ReadonlyArray<string>): Overrides => {
  const flags: Record<string, string> = {}
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!
    if (!arg.startsWith("--")) throw new ConfigLoadError(`unexpected argument ${arg}`)
    const eq = arg.indexOf("=")
    const name = eq > 0 ? arg.slice(2, eq) : arg.slice(2)
    const value = eq > 0 ? arg.slice(eq + 1) : argv[++i]
    if (value === undefined) throw new ConfigLoadError(`flag --${name} needs a value`)
    flags[name] = value
  }
  const known = new Set(["config", "port", "host", "data-dir", "database-url", "redis-url"])
  for (const name of Object.keys(flags)) if (!known.has(name)) throw new ConfigLoadError(`unknown flag --${name}`)
  const port = flags.port === undefined ? undefined : Number(flags.port)
  if (port !== undefined && !(Number.isInteger(port) && port >= 0 && port < 65536)) {
    throw new ConfigLoadError(`--port must be an integer 0-65535, got ${flags.port}`)
  }
  return {
    configPath: flags.config,
    port,
    host: flags.host,
    dataDir: flags["data-dir"],
    databaseUrl: flags["database-url"],
    redisUrl: flags["redis-url"]
  }
}

const envOverrides = (env: NodeJS.ProcessEnv): Overrides => {
  const port = env.WELLSPRING_PORT
  if (port !== undefined && !/^\d+$/.test(port)) {
    throw new ConfigLoadError(`WELLSPRING_PORT must be an integer, got ${port}`)
  }
  return {
    configPath: env.WELLSPRING_CONFIG,
    port: port === undefined ? undefined : Number(port),
    host: env.WELLSPRING_HOST,
    dataDir: env.WELLSPRING_DATA_DIR,
    databaseUrl: env.DATABASE_URL || undefined,
    redisUrl: env.REDIS_URL || undefined
  }
}

export const defaultConfigPath = "config/gateway.yaml"

export interface LoadedConfig {
  readonly config: GatewayConfig
  readonly path: string
}

/**
 * Layers: the YAML file, then `WELLSPRING_*` / `DATABASE_URL` / `REDIS_URL`, then CLI flags.
 * Throws ConfigLoadError naming the offending field.
 */
export const loadConfig = (
  options: { readonly env?: NodeJS.ProcessEnv; readonly flags?: Overrides; readonly path?: string } = {}
): LoadedConfig => {
  const env = envOverrides(options.env ?? process.env)
  const flags = options.flags ?? {}
  const path = Path.resolve(options.path ?? flags.configPath ?? env.configPath ?? defaultConfigPath)
  let text: string
  try {
    text = Fs.readFileSync(path, "utf8")
  } catch (cause) {
    throw new ConfigLoadError(`cannot read config file ${path}: ${(cause as Error).message}`)
  }
  return { config: decodeLayered(parseYaml(text, path), path, options.env ?? process.env, flags), path }
}

/**
 * A parsed config file with the env and flag layers on top, decoded. Throws ConfigLoadError naming the field, or
 * the environment variable when its value is the bad one.
 */
export const decodeLayered = (raw: unknown, path: string, env2: NodeJS.ProcessEnv, flags: Overrides = {}): GatewayConfig => {
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) {
    throw new ConfigLoadError(`${path}: expected a mapping at the top`)
  }
  const env = envOverrides(env2)
  const doc = { ...(raw as Record<string, unknown>) }
  for (const layer of [env, flags]) {
    if (layer.port !== undefined || layer.host !== undefined) {
      const listeners = Array.isArray(doc.listeners) && doc.listeners.length > 0
        ? (doc.listeners as Array<Record<string, unknown>>)
        : [{ port: 8080 }]
      const [first, ...rest] = listeners
      doc.listeners = [
        { ...first, ...(layer.port !== undefined ? { port: layer.port } : {}), ...(layer.host ? { host: layer.host } : {}) },
        ...rest
      ]
    }
    if (layer.dataDir) doc.data_dir = layer.dataDir
    if (layer.databaseUrl) doc.database_url = layer.databaseUrl
    if (layer.redisUrl) doc.redis_url = layer.redisUrl
  }
  // A bad key from the environment is named as the variable, not as the field it lands in.
  for (const name of ["WELLSPRING_ENCRYPTION_KEY", "WELLSPRING_BYOK_KEY"] as const) {
    const value = env2[name]
    if (value && !isKey32(value)) {
      throw new ConfigLoadError(`${name} ${KEY32_MESSAGE} (got ${value.trim().length} characters)`)
    }
  }
  if (env2.WELLSPRING_ENCRYPTION_KEY) doc.encryption_key = env2.WELLSPRING_ENCRYPTION_KEY
  if (env2.WELLSPRING_BYOK_KEY) {
    const byok = typeof doc.byok === "object" && doc.byok !== null ? doc.byok as Record<string, unknown> : {}
    doc.byok = { ...byok, encryption_key: env2.WELLSPRING_BYOK_KEY }
  }
  if (env2.WELLSPRING_KEY_PREFIX) doc.key_prefix = env2.WELLSPRING_KEY_PREFIX
  if (env2.WELLSPRING_REDIS_PREFIX) doc.redis_key_prefix = env2.WELLSPRING_REDIS_PREFIX
  return decodeGatewayConfig(doc, path)
}

export const readCatalogFile = (path: string): Catalog => {
  const text = Fs.readFileSync(path, "utf8")
  return decodeCatalog(parseYaml(text, path), path)
}
