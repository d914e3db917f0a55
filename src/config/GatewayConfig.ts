import { Either, ParseResult, Schema } from "effect"
import * as Fs from "node:fs"
import * as Path from "node:path"
import * as Yaml from "yaml"

const PositiveInt = Schema.Int.pipe(Schema.positive())
const NonNegativeInt = Schema.Int.pipe(Schema.nonNegative())
const NonNegative = Schema.Number.pipe(Schema.nonNegative())

export const ReasoningEffort = Schema.Literal("none", "low", "high", "max")
export type ReasoningEffort = typeof ReasoningEffort.Type

export const Origin = Schema.Literal("inference", "account", "status")
export type Origin = typeof Origin.Type

export const Listener = Schema.Struct({
  host: Schema.optionalWith(Schema.String, { default: () => "127.0.0.1" }),
  port: NonNegativeInt,
  origins: Schema.optionalWith(Schema.Array(Origin), { default: () => ["inference", "account", "status"] as const })
})
export type Listener = typeof Listener.Type

export const Timeouts = Schema.Struct({
  connect_ms: Schema.optionalWith(PositiveInt, { default: () => 5_000 }),
  first_token_ms: Schema.optionalWith(PositiveInt, { default: () => 60_000 }),
  idle_ms: Schema.optionalWith(PositiveInt, { default: () => 60_000 }),
  total_ms: Schema.optionalWith(PositiveInt, { default: () => 600_000 })
})
export type Timeouts = typeof Timeouts.Type

export const SimulatedProvider = Schema.Struct({
  kind: Schema.Literal("simulated"),
  /** Delay before the first token. */
  first_token_ms: Schema.optionalWith(NonNegative, { default: () => 0 }),
  /** 0 emits every token at once. */
  tokens_per_second: Schema.optionalWith(NonNegative, { default: () => 0 })
})

export const OpenAiCompatibleProvider = Schema.Struct({
  kind: Schema.Literal("openai-compatible"),
  base_url: Schema.String.pipe(Schema.pattern(/^https?:\/\//)),
  /**
   * Name of the environment variable holding the upstream API key. Restricted to `WELLSPRING_UPSTREAM_*` so a
   * catalog edit cannot send another secret of the process (DATABASE_URL, the encryption key) to an upstream.
   */
  api_key_env: Schema.optional(Schema.String.pipe(Schema.pattern(/^WELLSPRING_UPSTREAM_[A-Z0-9_]{1,64}$/, {
    message: () => "api_key_env must name a variable WELLSPRING_UPSTREAM_<NAME> (A-Z, 0-9, _)"
  }))),
  connections: Schema.optionalWith(PositiveInt, { default: () => 64 }),
  timeouts: Schema.optionalWith(Timeouts, { default: () => Timeouts.make({}) })
})

export const Provider = Schema.Union(SimulatedProvider, OpenAiCompatibleProvider)
export type Provider = typeof Provider.Type

export const ModelConfig = Schema.Struct({
  id: Schema.String.pipe(Schema.pattern(/^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$/)),
  owned_by: Schema.String,
  display_name: Schema.optional(Schema.String),
  created: Schema.optionalWith(NonNegativeInt, { default: () => 1_767_225_600 }),
  supports_tools: Schema.optionalWith(Schema.Boolean, { default: () => false }),
  supports_reasoning: Schema.optionalWith(Schema.Boolean, { default: () => false }),
  supports_images: Schema.optionalWith(Schema.Boolean, { default: () => false }),
  supports_embeddings: Schema.optionalWith(Schema.Boolean, { default: () => false }),
  /** False for embedding-only models. */
  supports_chat: Schema.optionalWith(Schema.Boolean, { default: () => true }),
  reasoning_efforts: Schema.optionalWith(Schema.Array(ReasoningEffort), { default: () => [] }),
  max_input_tokens: PositiveInt,
  max_output_tokens: PositiveInt,
  rate_limit_rpm: PositiveInt,
  /** Concurrent in-flight requests across all accounts; full gives 529. */
  concurrency: PositiveInt,
  /** Raw tokens per day shared by all accounts, reset at 09:00 KST. Null: no cap. */
  daily_cap: Schema.optionalWith(Schema.NullOr(PositiveInt), { default: () => null }),
  weights: Schema.optionalWith(Schema.Struct({ input: NonNegative, output: NonNegative }), {
    default: () => ({ input: 1, output: 1 })
  }),
  disabled: Schema.optionalWith(Schema.Boolean, { default: () => false }),
  disabled_note: Schema.optional(Schema.String),
  route: Schema.Struct({ provider: Schema.String, model: Schema.String })
})
export type ModelConfig = typeof ModelConfig.Type

export const PlanConfig = Schema.Struct({
  session_limit: PositiveInt,
  weekly_limit: PositiveInt,
  session_hours: Schema.optionalWith(Schema.Number.pipe(Schema.positive()), { default: () => 5 }),
  hide_absolutes: Schema.optionalWith(Schema.Boolean, { default: () => false }),
  show_request_pct: Schema.optionalWith(Schema.Boolean, { default: () => false })
})
export type PlanConfig = typeof PlanConfig.Type

export const AbuseConfig = Schema.Struct({
  burst: PositiveInt,
  window_seconds: PositiveInt,
  cooldown_seconds: PositiveInt
})

export const AccessConfig = Schema.Struct({
  email_enforcement: Schema.optionalWith(Schema.Boolean, { default: () => false }),
  region_lock: Schema.optionalWith(
    Schema.Struct({
      enabled: Schema.Boolean,
      /** Header set by a trusted proxy with the ISO country code. */
      header: Schema.optionalWith(Schema.String, { default: () => "cf-ipcountry" }),
      allowed_countries: Schema.Array(Schema.String)
    }),
    { default: () => ({ enabled: false, header: "cf-ipcountry", allowed_countries: [] }) }
  )
})

export const Catalog = Schema.Struct({
  models: Schema.Array(ModelConfig),
  providers: Schema.Record({ key: Schema.String, value: Provider })
}).pipe(
  Schema.filter((catalog) => {
    const issues: Array<Schema.FilterIssue> = []
    const seen = new Set<string>()
    catalog.models.forEach((model, i) => {
      if (seen.has(model.id)) issues.push({ path: ["models", i, "id"], message: `duplicate model id ${model.id}` })
      seen.add(model.id)
      if (!(model.route.provider in catalog.providers)) {
        issues.push({ path: ["models", i, "route", "provider"], message: `unknown provider ${model.route.provider}` })
      }
      if (model.supports_reasoning && model.reasoning_efforts.length === 0) {
        issues.push({ path: ["models", i, "reasoning_efforts"], message: "a reasoning model needs allowed efforts" })
      }
    })
    return issues
  })
)
export type Catalog = typeof Catalog.Type

/**
 * Bounds on what a client may send; every one is checked before the input costs CPU, memory or a write.
 * Defaults are listed in the README's limits table.
 */
export const LimitsConfig = Schema.Struct({
  /** Largest request body, enforced while reading (413 before the whole body arrives). */
  body_bytes: Schema.optionalWith(PositiveInt, { default: () => 4 * 1024 * 1024 }),
  /** Deepest JSON nesting of a body (objects and arrays). */
  json_depth: Schema.optionalWith(PositiveInt, { default: () => 64 }),
  /** Messages per chat request. */
  messages: Schema.optionalWith(PositiveInt, { default: () => 1024 }),
  /** Characters of one text (a message content, text part, reasoning, tool arguments). */
  text_chars: Schema.optionalWith(PositiveInt, { default: () => 1024 * 1024 }),
  /** Characters of one `image_url.url` (data: URIs included). */
  image_url_chars: Schema.optionalWith(PositiveInt, { default: () => 2 * 1024 * 1024 }),
  /** Nesting depth of a tool's `parameters` JSON Schema. */
  tool_schema_depth: Schema.optionalWith(PositiveInt, { default: () => 16 }),
  /** Serialized size of one tool definition. */
  tool_schema_bytes: Schema.optionalWith(PositiveInt, { default: () => 64 * 1024 }),
  /** Inputs of one embeddings request. */
  embedding_inputs: Schema.optionalWith(PositiveInt, { default: () => 256 }),
  /** Failed requests (4xx of the client's own making) per key per minute before 429 without parsing. */
  failed_requests_per_minute: Schema.optionalWith(PositiveInt, { default: () => 60 }),
  /** `GET /api/user/me` per account per minute. */
  snapshot_per_minute: Schema.optionalWith(PositiveInt, { default: () => 60 }),
  /** Open connections per listener; beyond it new connections are refused. */
  connections: Schema.optionalWith(PositiveInt, { default: () => 4096 }),
  /** Time to receive the request headers. */
  headers_timeout_seconds: Schema.optionalWith(PositiveInt, { default: () => 15 }),
  /** Time to receive the whole request (headers and body). */
  body_timeout_seconds: Schema.optionalWith(PositiveInt, { default: () => 30 }),
  /** Idle time of a kept-alive connection between requests. */
  keep_alive_seconds: Schema.optionalWith(PositiveInt, { default: () => 65 })
})
export type LimitsConfig = typeof LimitsConfig.Type

export const GatewayConfig = Schema.Struct({
  listeners: Schema.optionalWith(Schema.NonEmptyArray(Listener), {
    default: () => [{ host: "127.0.0.1", port: 8080, origins: ["inference", "account", "status"] as const }]
  }),
  data_dir: Schema.optionalWith(Schema.String, { default: () => "./data" }),
  database_url: Schema.optional(Schema.Redacted(Schema.String)),
  redis_url: Schema.optional(Schema.Redacted(Schema.String)),
  /** Prefix of every admission key in Redis (env `WELLSPRING_REDIS_PREFIX`); lets deployments share one Redis. */
  redis_key_prefix: Schema.optionalWith(Schema.String.pipe(Schema.pattern(/^[A-Za-z0-9:_.\-]{1,64}$/)), {
    default: () => "ws:q:"
  }),
  /** Base64 of 32 bytes; enables key reveal and BYOK. Generated into data_dir in embedded mode. */
  encryption_key: Schema.optional(Schema.Redacted(Schema.String)),
  key_prefix: Schema.optionalWith(Schema.String.pipe(Schema.pattern(/^[a-z][a-z0-9-]{1,15}$/)), {
    default: () => "sk-ws-"
  }),
  catalog_reload_seconds: Schema.optionalWith(Schema.Number.pipe(Schema.positive()), { default: () => 5 }),
  access: Schema.optionalWith(AccessConfig, { default: () => AccessConfig.make({}) }),
  default_plan: Schema.optionalWith(Schema.String, { default: () => "default" }),
  plans: Schema.Record({ key: Schema.String, value: PlanConfig }),
  abuse: AbuseConfig,
  request_log: Schema.optionalWith(
    Schema.Struct({
      batch_size: Schema.optionalWith(PositiveInt, { default: () => 500 }),
      flush_ms: Schema.optionalWith(PositiveInt, { default: () => 200 })
    }),
    { default: () => ({ batch_size: 500, flush_ms: 200 }) }
  ),
  shutdown_grace_seconds: Schema.optionalWith(NonNegative, { default: () => 20 }),
  limits: Schema.optionalWith(LimitsConfig, { default: () => LimitsConfig.make({}) }),
  /**
   * Origins (scheme://host[:port]) besides the request's own host from which cookie-authenticated
   * mutations of the account API are accepted (a dashboard served from another origin).
   */
  dashboard_origins: Schema.optionalWith(Schema.Array(Schema.String.pipe(Schema.pattern(/^https?:\/\/[^/\s]+$/))), {
    default: () => []
  }),
  dev_account: Schema.optionalWith(Schema.Boolean, { default: () => true }),
  catalog: Catalog
}).pipe(
  Schema.filter((config) =>
    config.default_plan in config.plans
      ? undefined
      : { path: ["default_plan"], message: `no plan named ${config.default_plan}` }
  )
)
export type GatewayConfig = typeof GatewayConfig.Type
export type GatewayConfigEncoded = typeof GatewayConfig.Encoded

export class ConfigLoadError extends Error {
  override readonly name = "ConfigLoadError"
}

export const parseYaml = (text: string, source: string): unknown => {
  try {
    return Yaml.parse(text)
  } catch (cause) {
    throw new ConfigLoadError(`${source}: not valid YAML: ${(cause as Error).message}`)
  }
}

const formatIssues = (error: ParseResult.ParseError): string =>
  ParseResult.ArrayFormatter.formatErrorSync(error)
    .map((issue) => `${issue.path.length ? issue.path.join(".") : "(root)"}: ${issue.message}`)
    .join("; ")

const decodeConfig = Schema.decodeUnknownEither(GatewayConfig, { errors: "all", onExcessProperty: "error" })
const decodeCatalogEither = Schema.decodeUnknownEither(Catalog, { errors: "all", onExcessProperty: "error" })

export const decodeGatewayConfig = (raw: unknown, source: string): GatewayConfig => {
  const result = decodeConfig(raw)
  if (Either.isLeft(result)) throw new ConfigLoadError(`${source}: ${formatIssues(result.left)}`)
  return result.right
}

/** Decodes the catalog part of a config file; used by live reload. */
export const decodeCatalog = (raw: unknown, source: string): Catalog => {
  const catalog = typeof raw === "object" && raw !== null ? (raw as Record<string, unknown>).catalog : undefined
  const result = decodeCatalogEither(catalog)
  if (Either.isLeft(result)) throw new ConfigLoadError(`${source}: catalog.${formatIssues(result.left)}`)
  return result.right
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
  const raw = parseYaml(text, path)
  if (typeof raw !== "object" || raw === null || Array.isArray(raw)) {
    throw new ConfigLoadError(`${path}: expected a mapping at the top`)
  }
  const doc = { ...(raw as Record<string, unknown>) }
  const env2 = options.env ?? process.env
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
  if (env2.WELLSPRING_ENCRYPTION_KEY) doc.encryption_key = env2.WELLSPRING_ENCRYPTION_KEY
  if (env2.WELLSPRING_KEY_PREFIX) doc.key_prefix = env2.WELLSPRING_KEY_PREFIX
  if (env2.WELLSPRING_REDIS_PREFIX) doc.redis_key_prefix = env2.WELLSPRING_REDIS_PREFIX
  return { config: decodeGatewayConfig(doc, path), path }
}

export const readCatalogFile = (path: string): Catalog => {
  const text = Fs.readFileSync(path, "utf8")
  return decodeCatalog(parseYaml(text, path), path)
}
