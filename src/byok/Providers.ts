/**
 * The BYOK provider catalog: server data, one entry per provider, each with its wire kind, base URL (operator-
 * overridable), auth scheme(s), the `meta` fields it accepts (with bounds), its probe and its model listing.
 * Built from the `byok` config section by `makeProviderCatalog` (cheap: rebuild it on every config reload).
 *
 * Also here: validation and normalization of a verify/save body (`validateCredentialInput`), the assembled base
 * URL (`resolveBaseUrl`, the spec's `resolved_base_url`), request targets and headers for a credential, the
 * non-secret columns derived at save (`derivedColumns`), the `providers[]` rows of the list response
 * (`describeProviders`) and the model-list parser.
 */
import type { ByokConfig, ProviderId } from "../config/Byok.js"
import { normalizeOrigin } from "./AddressGuard.js"

export { PROVIDER_IDS, type ProviderId } from "../config/Byok.js"

export type WireKind = "openai-compatible" | "anthropic"

export type AuthSchemeId = "bearer" | "api-key" | "x-api-key"

export interface AuthScheme {
  readonly id: AuthSchemeId
  /** Lower-case header name. */
  readonly header: string
  /** Text before the secret in the header value. */
  readonly prefix: string
}

const BEARER: AuthScheme = { id: "bearer", header: "authorization", prefix: "Bearer " }
const AZURE_API_KEY: AuthScheme = { id: "api-key", header: "api-key", prefix: "" }
const ANTHROPIC_KEY: AuthScheme = { id: "x-api-key", header: "x-api-key", prefix: "" }

/** Where a `meta` value goes. */
export type MetaUse =
  | { readonly kind: "header"; readonly header: string }
  | { readonly kind: "placeholder"; readonly name: string }
  | { readonly kind: "query"; readonly name: string }
  | { readonly kind: "base_url" }
  | { readonly kind: "region" }

export interface MetaField {
  readonly name: string
  readonly required: boolean
  readonly maxLength: number
  readonly pattern: RegExp
  /** Lower-cases the value before checking it (DNS labels). */
  readonly lowercase?: boolean
  readonly use: MetaUse
  /** Applied when the field is absent (not stored: the credential keeps what the user sent). */
  readonly default?: string
  /** The presence flag shown on the credential (values are never returned). */
  readonly presence?: "has_org_id" | "has_project_id"
}

export type ModelListFormat = "openai" | "anthropic"

export interface ProviderDef {
  readonly id: ProviderId
  /** Display name (`providers[].label`). */
  readonly label: string
  readonly wire: WireKind
  readonly schemes: ReadonlyArray<AuthScheme>
  /** Base URL template (`{resource}` placeholders); null when the user supplies it (`meta.base_url`). */
  readonly baseUrl: string | null
  /** Base URLs per `meta.region` value. */
  readonly regions: Readonly<Record<string, string>>
  /**
   * Origins of the operator's own base URL and region overrides (those whose origin has no placeholder). URLs of
   * this provider on these origins are operator data: sent without the address checks (test fakes, an internal
   * proxy). A user-supplied URL on the same origin gets no such trust.
   */
  readonly operatorOrigins: ReadonlyArray<string>
  readonly meta: ReadonlyArray<MetaField>
  /** Headers sent on every request (not secret). */
  readonly staticHeaders: Readonly<Record<string, string>>
  /** Path (relative to the base URL, may carry a query) of the probe that checks the secret. */
  readonly probePath: string
  /** Path of the model listing; null when the provider has none. */
  readonly modelsPath: string | null
  readonly modelsFormat: ModelListFormat
  /** Chat path relative to the base URL; `{model}` is the URL-encoded model id. */
  readonly chatPath: string
  readonly embeddingsPath: string | null
}

// ---------------------------------------------------------------------------------------------
// The built-in catalog

const ID_LIKE = /^[A-Za-z0-9_-]+$/

const BUILT_IN: ReadonlyArray<ProviderDef> = [
  {
    id: "openai",
    label: "OpenAI",
    wire: "openai-compatible",
    schemes: [BEARER],
    baseUrl: "https://api.openai.com/v1",
    // Data-residency endpoints (the `region` of the credential).
    regions: { us: "https://us.api.openai.com/v1", eu: "https://eu.api.openai.com/v1" },
    operatorOrigins: [],
    meta: [
      {
        name: "organization_id",
        required: false,
        maxLength: 64,
        pattern: ID_LIKE,
        use: { kind: "header", header: "openai-organization" },
        presence: "has_org_id"
      },
      {
        name: "project_id",
        required: false,
        maxLength: 64,
        pattern: ID_LIKE,
        use: { kind: "header", header: "openai-project" },
        presence: "has_project_id"
      },
      { name: "region", required: false, maxLength: 8, pattern: /^(us|eu)$/, lowercase: true, use: { kind: "region" } }
    ],
    staticHeaders: {},
    probePath: "/models",
    modelsPath: "/models",
    modelsFormat: "openai",
    chatPath: "/chat/completions",
    embeddingsPath: "/embeddings"
  },
  {
    id: "anthropic",
    label: "Anthropic",
    wire: "anthropic",
    schemes: [ANTHROPIC_KEY],
    baseUrl: "https://api.anthropic.com/v1",
    regions: {},
    operatorOrigins: [],
    meta: [],
    staticHeaders: { "anthropic-version": "2023-06-01" },
    probePath: "/models?limit=1000",
    modelsPath: "/models?limit=1000",
    modelsFormat: "anthropic",
    chatPath: "/messages",
    embeddingsPath: null
  },
  {
    id: "openrouter",
    label: "OpenRouter",
    wire: "openai-compatible",
    schemes: [BEARER],
    baseUrl: "https://openrouter.ai/api/v1",
    regions: {},
    operatorOrigins: [],
    meta: [],
    staticHeaders: {},
    // OpenRouter lists models without a key: the probe asks about the key itself.
    probePath: "/key",
    modelsPath: "/models",
    modelsFormat: "openai",
    chatPath: "/chat/completions",
    embeddingsPath: "/embeddings"
  },
  {
    id: "gemini",
    label: "Google Gemini",
    wire: "openai-compatible",
    schemes: [BEARER],
    baseUrl: "https://generativelanguage.googleapis.com/v1beta/openai",
    regions: {},
    operatorOrigins: [],
    meta: [],
    staticHeaders: {},
    probePath: "/models",
    modelsPath: "/models",
    modelsFormat: "openai",
    chatPath: "/chat/completions",
    embeddingsPath: "/embeddings"
  },
  {
    id: "azure",
    label: "Azure OpenAI",
    wire: "openai-compatible",
    schemes: [AZURE_API_KEY, BEARER],
    baseUrl: "https://{resource}.openai.azure.com/openai",
    regions: {},
    operatorOrigins: [],
    meta: [
      {
        name: "resource",
        required: true,
        maxLength: 64,
        // One DNS label: the resource name becomes part of the host.
        pattern: /^[a-z0-9](?:[a-z0-9-]{0,62}[a-z0-9])?$/,
        lowercase: true,
        use: { kind: "placeholder", name: "resource" }
      },
      {
        name: "api_version",
        required: false,
        maxLength: 24,
        pattern: /^\d{4}-\d{2}-\d{2}(-preview)?$/,
        use: { kind: "query", name: "api-version" },
        default: "2024-10-21"
      }
    ],
    staticHeaders: {},
    probePath: "/models",
    modelsPath: "/models",
    modelsFormat: "openai",
    // The model id of `@azure/<id>` is the deployment name.
    chatPath: "/deployments/{model}/chat/completions",
    embeddingsPath: "/deployments/{model}/embeddings"
  },
  {
    id: "custom",
    label: "OpenAI 호환 (직접 입력)",
    wire: "openai-compatible",
    schemes: [BEARER],
    baseUrl: null,
    regions: {},
    operatorOrigins: [],
    meta: [
      { name: "base_url", required: true, maxLength: 2048, pattern: /^https?:\/\/\S+$/i, use: { kind: "base_url" } }
    ],
    staticHeaders: {},
    probePath: "/models",
    modelsPath: "/models",
    modelsFormat: "openai",
    chatPath: "/chat/completions",
    embeddingsPath: "/embeddings"
  }
]

export interface ProviderCatalog {
  /** Enabled providers, in display order. */
  readonly providers: ReadonlyArray<ProviderDef>
  readonly byId: ReadonlyMap<string, ProviderDef>
  readonly maxPerProvider: number
}

const originOfTemplate = (template: string): string | null => {
  const origin = /^[a-z]+:\/\/[^/?#]*/i.exec(template)?.[0] ?? ""
  return origin.includes("{") ? null : normalizeOrigin(origin)
}

export const makeProviderCatalog = (config: ByokConfig): ProviderCatalog => {
  const providers: Array<ProviderDef> = []
  for (const def of BUILT_IN) {
    const trusted = new Set<string>()
    const override = config.providers[def.id]
    if (override?.enabled === false) continue
    const baseUrl = override?.base_url === undefined || def.baseUrl === null ? def.baseUrl : trimSlash(override.base_url)
    // An operator who moves the base URL (a proxy, a test fake) moves the regions with it unless it names them.
    const regions = override?.regions !== undefined
      ? { ...def.regions, ...mapValues(override.regions, trimSlash) }
      : override?.base_url !== undefined
      ? {}
      : def.regions
    if (override?.base_url !== undefined && def.baseUrl !== null) {
      const origin = originOfTemplate(baseUrl!)
      if (origin !== null) trusted.add(origin)
    }
    for (const url of Object.values(override?.regions ?? {})) {
      const origin = originOfTemplate(url)
      if (origin !== null) trusted.add(origin)
    }
    // The custom provider's URL is always the user's: nothing of it is operator data.
    providers.push({ ...def, baseUrl, regions, operatorOrigins: def.baseUrl === null ? [] : [...trusted] })
  }
  return {
    providers,
    byId: new Map(providers.map((p) => [p.id, p])),
    maxPerProvider: config.max_per_provider
  }
}

/** True when `url` is on one of the provider's operator-configured origins (see `operatorOrigins`). */
export const isOperatorUrl = (provider: ProviderDef, url: string): boolean => {
  if (provider.operatorOrigins.length === 0) return false
  const origin = normalizeOrigin(url)
  return origin !== null && provider.operatorOrigins.includes(origin)
}

const trimSlash = (url: string): string => url.replace(/\/+$/, "")

const mapValues = (record: Readonly<Record<string, string>>, f: (s: string) => string): Record<string, string> => {
  const out: Record<string, string> = {}
  for (const [k, v] of Object.entries(record)) out[k] = f(v)
  return out
}

// ---------------------------------------------------------------------------------------------
// `providers[]` of the list response

export interface ProviderRow {
  readonly id: string
  readonly label: string
  readonly auth_scheme: string
  readonly required_fields: ReadonlyArray<string>
  readonly optional_fields: ReadonlyArray<string>
  readonly supports_models_list: boolean
  readonly multi_scheme: boolean
}

/** One row per (provider, auth scheme) pair; a provider with two schemes appears twice (`multi_scheme`). */
export const describeProviders = (catalog: ProviderCatalog): ReadonlyArray<ProviderRow> =>
  catalog.providers.flatMap((p) =>
    p.schemes.map((scheme) => ({
      id: p.id,
      label: p.label,
      auth_scheme: scheme.id,
      required_fields: p.meta.filter((f) => f.required).map((f) => f.name),
      optional_fields: p.meta.filter((f) => !f.required).map((f) => f.name),
      supports_models_list: p.modelsPath !== null,
      multi_scheme: p.schemes.length > 1
    }))
  )

// ---------------------------------------------------------------------------------------------
// Input validation (verify and save bodies)

export type Meta = Readonly<Record<string, string>>

/** Longest label (spec, Limits). */
export const MAX_LABEL_CHARS = 40
/** Longest secret accepted (Azure Entra tokens run to a few kilobytes). */
export const MAX_SECRET_CHARS = 8192
/** Most keys in a `meta` object, empty ones included. */
export const MAX_META_KEYS = 16

/** Letters, digits, `.`, `_`, `-`: labels appear in `@provider:label/model`, so no `/`, `:`, `@` or spaces. */
const LABEL = /^[\p{L}\p{N}._-]+$/u

/** Whether `label` is one a credential can carry (NFC, 1–40 characters of the label alphabet). */
export const isValidLabel = (label: string): boolean =>
  label !== "" && label === label.normalize("NFC") && Array.from(label).length <= MAX_LABEL_CHARS && LABEL.test(label)

export interface CredentialInput {
  readonly provider: ProviderDef
  readonly scheme: AuthScheme
  /** Null: the server assigns the lowest unused `key-N`. */
  readonly label: string | null
  readonly secret: string
  /** Normalized, non-empty values of known fields only. */
  readonly meta: Meta
}

export type InputErrorCode = "invalid_request" | "byok_credential_missing"

export interface InputError {
  readonly code: InputErrorCode
  /** `provider`, `auth_scheme`, `secret`, `label`, `meta`, `meta.<name>`. */
  readonly field: string
  /** Korean, names the field, never repeats the value. */
  readonly message: string
}

export type Validated<A> = { readonly ok: true; readonly value: A } | { readonly ok: false; readonly error: InputError }

const invalid = (code: InputErrorCode, field: string, message: string): Validated<never> => ({
  ok: false,
  error: { code, field, message }
})

const isRecord = (u: unknown): u is Record<string, unknown> => typeof u === "object" && u !== null && !Array.isArray(u)

/** The label as stored, or null for "assign one"; an error for a label that cannot be used. */
export const normalizeLabel = (raw: unknown): Validated<string | null> => {
  if (raw === undefined || raw === null) return { ok: true, value: null }
  if (typeof raw !== "string") return invalid("invalid_request", "label", "label은 문자열이어야 합니다.")
  if (raw.length > MAX_LABEL_CHARS * 4) {
    return invalid("invalid_request", "label", `label은 ${MAX_LABEL_CHARS}자 이하여야 합니다.`)
  }
  const label = raw.trim().normalize("NFC")
  if (label === "") return { ok: true, value: null }
  if (Array.from(label).length > MAX_LABEL_CHARS) {
    return invalid("invalid_request", "label", `label은 ${MAX_LABEL_CHARS}자 이하여야 합니다.`)
  }
  if (!LABEL.test(label)) {
    return invalid("invalid_request", "label", "label에는 글자, 숫자, '.', '_', '-'만 쓸 수 있습니다.")
  }
  return { ok: true, value: label }
}

/**
 * Validates a verify/save body `{provider, auth_scheme, label?, secret, meta}`. Codes (spec, account error table):
 * `byok_credential_missing` for an unusable request (unknown provider, unsupported scheme, empty secret, missing
 * required `meta` field); `invalid_request` for a malformed field (message names it). Order: provider, scheme,
 * secret, label, meta. `auth_scheme` may be left out for a provider with one scheme. A `meta` key the provider
 * does not know is refused unless its value is empty; empty values count as absent. The URL in `meta.base_url`
 * is only bounded here: the address guard judges it when the probe runs (its refusal is the probe's `kind`).
 */
export const validateCredentialInput = (catalog: ProviderCatalog, body: unknown): Validated<CredentialInput> => {
  if (!isRecord(body)) return invalid("invalid_request", "body", "요청 본문은 JSON 객체여야 합니다.")
  const provider = typeof body.provider === "string" ? catalog.byId.get(body.provider) : undefined
  if (provider === undefined) {
    return invalid("byok_credential_missing", "provider", "지원하지 않는 공급자입니다.")
  }
  const schemeId = body.auth_scheme
  const scheme = schemeId === undefined || schemeId === null || schemeId === ""
    ? (provider.schemes.length === 1 ? provider.schemes[0] : undefined)
    : provider.schemes.find((s) => s.id === schemeId)
  if (scheme === undefined) {
    return invalid("byok_credential_missing", "auth_scheme", "이 공급자가 지원하지 않는 인증 방식입니다.")
  }
  const rawSecret = body.secret
  if (rawSecret !== undefined && rawSecret !== null && typeof rawSecret !== "string") {
    return invalid("invalid_request", "secret", "secret은 문자열이어야 합니다.")
  }
  if (typeof rawSecret === "string" && rawSecret.length > MAX_SECRET_CHARS * 2) {
    return invalid("invalid_request", "secret", `secret은 ${MAX_SECRET_CHARS}자 이하여야 합니다.`)
  }
  const secret = typeof rawSecret === "string" ? rawSecret.trim() : ""
  if (secret === "") return invalid("byok_credential_missing", "secret", "API 키(secret)를 입력하세요.")
  if (secret.length > MAX_SECRET_CHARS) {
    return invalid("invalid_request", "secret", `secret은 ${MAX_SECRET_CHARS}자 이하여야 합니다.`)
  }
  // It goes into an HTTP header: printable ASCII, no spaces.
  if (!/^[\x21-\x7e]+$/.test(secret)) {
    return invalid("invalid_request", "secret", "secret에는 공백이나 제어 문자, 영문 이외의 문자를 넣을 수 없습니다.")
  }
  const label = normalizeLabel(body.label)
  if (!label.ok) return label
  const meta = validateMeta(provider, body.meta)
  if (!meta.ok) return meta
  return { ok: true, value: { provider, scheme, label: label.value, secret, meta: meta.value } }
}

const validateMeta = (provider: ProviderDef, raw: unknown): Validated<Meta> => {
  if (raw === undefined || raw === null) raw = {}
  if (!isRecord(raw)) return invalid("invalid_request", "meta", "meta는 JSON 객체여야 합니다.")
  const entries = Object.entries(raw)
  if (entries.length > MAX_META_KEYS) {
    return invalid("invalid_request", "meta", `meta에는 항목을 ${MAX_META_KEYS}개까지 넣을 수 있습니다.`)
  }
  const out: Record<string, string> = {}
  for (const [name, value] of entries) {
    const field = provider.meta.find((f) => f.name === name)
    const shown = name.length > 40 ? name.slice(0, 40) + "…" : name
    if (value === null || value === undefined || value === "") continue
    if (field === undefined) {
      return invalid("invalid_request", `meta.${shown}`, `meta.${shown}: 이 공급자에는 없는 항목입니다.`)
    }
    if (typeof value !== "string") {
      return invalid("invalid_request", `meta.${name}`, `meta.${name}: 문자열이어야 합니다.`)
    }
    if (value.length > field.maxLength * 2) {
      return invalid("invalid_request", `meta.${name}`, `meta.${name}: ${field.maxLength}자 이하여야 합니다.`)
    }
    let normalized = value.trim()
    if (field.lowercase) normalized = normalized.toLowerCase()
    if (field.use.kind === "base_url") normalized = trimSlash(normalized)
    if (normalized === "") continue
    if (normalized.length > field.maxLength) {
      return invalid("invalid_request", `meta.${name}`, `meta.${name}: ${field.maxLength}자 이하여야 합니다.`)
    }
    if (!field.pattern.test(normalized)) {
      return invalid("invalid_request", `meta.${name}`, `meta.${name}: 형식이 올바르지 않습니다.`)
    }
    out[name] = normalized
  }
  for (const field of provider.meta) {
    if (field.required && out[field.name] === undefined) {
      return invalid("byok_credential_missing", `meta.${field.name}`, `meta.${field.name}: 필수 항목입니다.`)
    }
  }
  return { ok: true, value: out }
}

// ---------------------------------------------------------------------------------------------
// Base URL, request targets, headers

export interface ResolvedBase {
  /** The base URL requests are built on (no trailing slash, no query). */
  readonly url: string
  /**
   * True when a user value shaped it (custom base URL, Azure resource): the spec's `resolved_base_url` is shown
   * for these, and the address guard judges them like any user URL.
   */
  readonly userShaped: boolean
}

const valueOf = (provider: ProviderDef, meta: Meta, name: string): string | undefined => {
  const field = provider.meta.find((f) => f.name === name)
  return meta[name] ?? field?.default
}

/** The assembled base URL (spec: `resolved_base_url`). */
export const resolveBaseUrl = (provider: ProviderDef, meta: Meta): ResolvedBase => {
  if (provider.baseUrl === null) {
    return { url: trimSlash(meta.base_url ?? ""), userShaped: true }
  }
  const region = provider.meta.find((f) => f.use.kind === "region")
  const regionValue = region === undefined ? undefined : meta[region.name]
  let url = regionValue !== undefined && provider.regions[regionValue] !== undefined
    ? provider.regions[regionValue]!
    : provider.baseUrl
  let userShaped = false
  for (const field of provider.meta) {
    if (field.use.kind !== "placeholder") continue
    const token = `{${field.use.name}}`
    if (!url.includes(token)) continue
    // Values of placeholder fields are single DNS labels (validated), so nothing here can change the URL's shape.
    url = url.split(token).join(valueOf(provider, meta, field.name) ?? "")
    userShaped = true
  }
  return { url, userShaped }
}

export type Operation = "probe" | "models" | "chat" | "embeddings"

/** The full URL of one operation for a credential; null when the provider has no such endpoint. */
export const requestUrl = (provider: ProviderDef, meta: Meta, operation: Operation, model?: string): string | null => {
  const path = operation === "probe"
    ? provider.probePath
    : operation === "models"
    ? provider.modelsPath
    : operation === "chat"
    ? provider.chatPath
    : provider.embeddingsPath
  if (path === null) return null
  const base = resolveBaseUrl(provider, meta).url
  const filled = path.split("{model}").join(encodeURIComponent(model ?? ""))
  const query = new URLSearchParams()
  for (const field of provider.meta) {
    if (field.use.kind !== "query") continue
    const value = valueOf(provider, meta, field.name)
    if (value !== undefined) query.set(field.use.name, value)
  }
  const extra = query.toString()
  if (extra === "") return base + filled
  return base + filled + (filled.includes("?") ? "&" : "?") + extra
}

/** Headers of every request made with a credential: static headers, meta headers, then the auth header. */
export const requestHeaders = (
  provider: ProviderDef,
  scheme: AuthScheme,
  secret: string,
  meta: Meta
): Record<string, string> => {
  const headers: Record<string, string> = { ...provider.staticHeaders }
  for (const field of provider.meta) {
    if (field.use.kind !== "header") continue
    const value = meta[field.name]
    if (value !== undefined) headers[field.use.header] = value
  }
  headers[scheme.header] = scheme.prefix + secret
  return headers
}

/** Non-secret columns stored beside the sealed secret and meta, shown on the credential. */
export interface DerivedColumns {
  readonly base_url_origin: string | null
  readonly region: string | null
  readonly has_org_id: boolean
  readonly has_project_id: boolean
}

export const derivedColumns = (provider: ProviderDef, meta: Meta): DerivedColumns => {
  const base = resolveBaseUrl(provider, meta)
  const presence = (flag: "has_org_id" | "has_project_id") =>
    provider.meta.some((f) => f.presence === flag && meta[f.name] !== undefined)
  const region = provider.meta.find((f) => f.use.kind === "region")
  return {
    base_url_origin: base.userShaped ? normalizeOrigin(base.url) : null,
    region: region === undefined ? null : meta[region.name] ?? null,
    has_org_id: presence("has_org_id"),
    has_project_id: presence("has_project_id")
  }
}

// ---------------------------------------------------------------------------------------------
// Model lists

/** One item of a credential's model list (the spec leaves the shape open). */
export interface ModelListItem {
  readonly id: string
  readonly display_name: string | null
}

/** Most models kept from one listing, and the longest id kept. */
export const MAX_LISTED_MODELS = 2000
export const MAX_MODEL_ID_CHARS = 256

/**
 * The models of a listing body (`{data: [{id, ...}]}` for both formats; Anthropic adds `display_name`,
 * OpenRouter `name`). Null when the body is not a listing. Ids are kept verbatim (they follow `@provider/`),
 * skipped when empty, too long or repeated; at most `MAX_LISTED_MODELS`.
 */
export const parseModelList = (format: ModelListFormat, body: unknown): ReadonlyArray<ModelListItem> | null => {
  if (!isRecord(body) || !Array.isArray(body.data)) return null
  const seen = new Set<string>()
  const out: Array<ModelListItem> = []
  for (const item of body.data) {
    if (out.length >= MAX_LISTED_MODELS) break
    if (!isRecord(item) || typeof item.id !== "string") continue
    const id = item.id
    if (id === "" || id.length > MAX_MODEL_ID_CHARS || seen.has(id)) continue
    seen.add(id)
    const name = format === "anthropic" ? item.display_name : item.name ?? item.display_name
    out.push({ id, display_name: typeof name === "string" && name !== "" ? name.slice(0, 200) : null })
  }
  return out
}
