/**
 * The request row's layout: its columns, their bounds (`sanitizeRow`), and how a finished request becomes a
 * row (`requestRow`). Written by `RequestLog.ts`; read by `RequestQueries.ts`.
 */
import { Catalog, type GatewayError } from "../errors/Catalog.js"

/** One `request_log` row (columns in store/migrations/0001_init.ts). */
export interface RequestRow {
  readonly id: number
  readonly request_id: string
  readonly account_id: string
  readonly key_id: number | null
  readonly model_id: string
  readonly status: "success" | "error" | "cancelled"
  readonly error_code: string | null
  readonly http_status: number
  readonly stream: boolean
  readonly input_tokens: number
  readonly output_tokens: number
  readonly reasoning_tokens: number
  readonly prompt_cached_tokens: number
  readonly weighted_cost: number
  readonly ttfb_ms: number | null
  readonly duration_ms: number
  readonly tps: number
  readonly had_tools: boolean
  readonly tool_choice: string | null
  readonly byok: boolean
  readonly provider: string | null
  readonly fell_back: boolean
  readonly error: string | null
  readonly created_at: Date
  /** The client protocol (operator-visible, migrations/0006_request_routing.ts). */
  readonly api: string
  /** The deployment that answered, or the last one tried (operator-visible). */
  readonly deployment: string | null
  /** Upstream attempts made (operator-visible). */
  readonly attempts: number
}

/** Each column's PostgreSQL type (store/migrations/0001_init.ts, 0006_request_routing.ts), in insert order. */
export const REQUEST_ROW_TYPES = {
  id: "int8",
  request_id: "text",
  account_id: "text",
  key_id: "int8",
  model_id: "text",
  status: "text",
  error_code: "text",
  http_status: "int4",
  stream: "bool",
  input_tokens: "int4",
  output_tokens: "int4",
  reasoning_tokens: "int4",
  prompt_cached_tokens: "int4",
  weighted_cost: "float8",
  ttfb_ms: "int4",
  duration_ms: "int4",
  tps: "float8",
  had_tools: "bool",
  tool_choice: "text",
  byok: "bool",
  provider: "text",
  fell_back: "bool",
  error: "text",
  created_at: "timestamptz",
  api: "text",
  deployment: "text",
  attempts: "int4"
} as const satisfies { readonly [K in keyof RequestRow]-?: "int8" | "int4" | "float8" | "bool" | "text" | "timestamptz" }

/** Longest text stored per column (characters); longer values are cut. */
export const TEXT_LIMITS = {
  request_id: 64,
  account_id: 64,
  model_id: 128,
  error_code: 64,
  tool_choice: 80,
  provider: 64,
  error: 500,
  api: 32,
  deployment: 128
} as const

const INT4_MAX = 2_147_483_647

/** C0 controls and DEL; `error` keeps tab and newline. */
const CONTROLS = /[\u0000-\u001f\u007f]/g
const CONTROLS_BUT_SPACING = /[\u0000-\u0008\u000b-\u001f\u007f]/g
/** A high surrogate without its low half, or a low one without its high half (not encodable as UTF-8). */
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g
/** Any character the two replacements could touch; most texts (ids, codes, names) have none and skip them. */
const MAY_NEED_CLEANING = /[\u0000-\u001f\u007f\ud800-\udfff]/

/**
 * A text as a column can hold it: at most `max` characters (cut first, so the work is bounded whatever
 * arrives), no NUL or other control characters, no lone surrogates.
 */
export const cleanText = (value: unknown, max: number, keepSpacing = false): string => {
  let s = typeof value === "string" ? value : value === null || value === undefined ? "" : String(value)
  if (s.length > max) {
    s = s.slice(0, max)
    // Do not leave half of a surrogate pair at the cut.
    const last = s.charCodeAt(s.length - 1)
    if (last >= 0xd800 && last <= 0xdbff) s = s.slice(0, -1)
  }
  if (!MAY_NEED_CLEANING.test(s)) return s
  return s.replace(keepSpacing ? CONTROLS_BUT_SPACING : CONTROLS, "").replace(LONE_SURROGATE, "\ufffd")
}

const cleanNullableText = (value: unknown, max: number, keepSpacing = false): string | null =>
  value === null || value === undefined ? null : cleanText(value, max, keepSpacing)

/** A non-negative `integer` (int4) column value: rounded, clamped, 0 when not a finite number. */
const int4 = (value: unknown): number =>
  typeof value === "number" && Number.isFinite(value) ? Math.min(INT4_MAX, Math.max(0, Math.round(value))) : 0

const nullableInt4 = (value: unknown): number | null => (value === null || value === undefined ? null : int4(value))

/** A `double precision` column value: finite, else 0. */
const float8 = (value: unknown): number => (typeof value === "number" && Number.isFinite(value) ? value : 0)

/** A `bigint` id: a positive safe integer, else null. */
const bigintId = (value: unknown): number | null =>
  typeof value === "number" && Number.isSafeInteger(value) && value > 0 ? value : null

const STATUSES: ReadonlySet<string> = new Set(["success", "error", "cancelled"])

/**
 * The row as the `request_log` columns accept it (types in migrations/0001_init.ts): every text bounded and
 * valid UTF-8, every integer in int4 range, every double finite. Null when the row has no usable id.
 */
export const sanitizeRow = (row: RequestRow): RequestRow | null => {
  const id = bigintId(row.id)
  if (id === null) return null
  const createdAt = row.created_at instanceof Date && Number.isFinite(row.created_at.getTime())
    ? row.created_at
    : new Date()
  const status = STATUSES.has(row.status) ? row.status : "error"
  return {
    id,
    request_id: cleanText(row.request_id, TEXT_LIMITS.request_id),
    account_id: cleanText(row.account_id, TEXT_LIMITS.account_id),
    key_id: bigintId(row.key_id),
    model_id: cleanText(row.model_id, TEXT_LIMITS.model_id),
    status,
    error_code: cleanNullableText(row.error_code, TEXT_LIMITS.error_code),
    http_status: Math.min(999, int4(row.http_status)),
    stream: row.stream === true,
    input_tokens: int4(row.input_tokens),
    output_tokens: int4(row.output_tokens),
    reasoning_tokens: int4(row.reasoning_tokens),
    prompt_cached_tokens: int4(row.prompt_cached_tokens),
    weighted_cost: float8(row.weighted_cost),
    ttfb_ms: nullableInt4(row.ttfb_ms),
    duration_ms: int4(row.duration_ms),
    tps: float8(row.tps),
    had_tools: row.had_tools === true,
    tool_choice: cleanNullableText(row.tool_choice, TEXT_LIMITS.tool_choice),
    byok: row.byok === true,
    provider: cleanNullableText(row.provider, TEXT_LIMITS.provider),
    fell_back: row.fell_back === true,
    error: cleanNullableText(row.error, TEXT_LIMITS.error, true),
    created_at: createdAt,
    api: cleanText(row.api, TEXT_LIMITS.api),
    deployment: cleanNullableText(row.deployment, TEXT_LIMITS.deployment),
    attempts: Math.min(1000, int4(row.attempts))
  }
}

/**
 * Output tokens per second of generation, rounded to 2 decimals; 0 without output or time. Generation time is
 * from dispatch to the answer for a non-stream, from the first event to the end for a stream (from dispatch
 * when the whole stream came in one burst).
 */
export const tokensPerSecond = (outputTokens: number, generationMs: number | null): number => {
  if (!(outputTokens > 0) || generationMs === null || !(generationMs > 0)) return 0
  const tps = Math.round((outputTokens / (generationMs / 1000)) * 100) / 100
  return Number.isFinite(tps) ? tps : 0
}

/** How a request ended: its one completion. */
export type Completion =
  | { readonly status: "success" }
  | { readonly status: "failed"; readonly error: GatewayError }
  | { readonly status: "cancelled" }

/** Token figures of a row (an upstream `Usage` fits). */
export interface TokenCounts {
  readonly prompt_tokens: number
  readonly completion_tokens: number
  readonly reasoning_tokens: number
  readonly cached_tokens: number
}

/** What a finished request knows about itself (an inference `Exchange` once completed). */
export interface RowSource {
  readonly rowId: number
  readonly requestId: string
  readonly accountId: string
  readonly keyId: number | null
  /** The catalog id, the body's bounded `model` while unresolved, or a placeholder before the body is read. */
  readonly modelId: string
  readonly stream: boolean
  readonly hadTools: boolean
  readonly toolChoice: string | null
  readonly provider: string | null
  readonly byok: boolean
  readonly fellBack: boolean
  /** The client protocol the request came in on. */
  readonly api: string
  /** The deployment that answered, or the last one tried; null when nothing was sent upstream. */
  readonly deployment: string | null
  /** Upstream attempts made. */
  readonly attempts: number
  readonly createdAt: Date
  readonly ttfbMs: number | null
  readonly durationMs: number
  /** Tokens recorded: null when nothing was delivered (nothing is charged then). */
  readonly counted: TokenCounts | null
  readonly weighted: number
  readonly tps: number
}

/**
 * The row of a finished request. `detailIsPrivate`: the error's `detail` is server-side (a 5xx, or an
 * upstream's own text): the row, which the account sees (`recentRequests`), then records the code and status
 * only; otherwise the detail (or the user message), cut to 500 characters.
 */
export const requestRow = (source: RowSource, completion: Completion, detailIsPrivate: boolean): RequestRow => {
  const error = completion.status === "failed" ? completion.error : undefined
  const counted = source.counted
  const wire = error === undefined ? null : Catalog[error.code].wire ?? error.code
  return {
    id: source.rowId,
    request_id: source.requestId,
    account_id: source.accountId,
    key_id: source.keyId,
    model_id: source.modelId,
    status: completion.status === "failed" ? "error" : completion.status,
    // A cancelled row says so in `error_code` too, as the metrics' `errors.by_code` does.
    error_code: error !== undefined ? wire : completion.status === "cancelled" ? "cancelled" : null,
    http_status: error !== undefined ? error.status : completion.status === "cancelled" ? 499 : 200,
    stream: source.stream,
    input_tokens: counted?.prompt_tokens ?? 0,
    output_tokens: counted?.completion_tokens ?? 0,
    reasoning_tokens: counted?.reasoning_tokens ?? 0,
    prompt_cached_tokens: counted?.cached_tokens ?? 0,
    weighted_cost: source.weighted,
    ttfb_ms: source.ttfbMs,
    duration_ms: source.durationMs,
    tps: source.tps,
    had_tools: source.hadTools,
    tool_choice: source.toolChoice,
    byok: source.byok,
    provider: source.provider,
    fell_back: source.fellBack,
    error: error === undefined
      ? null
      : detailIsPrivate
      ? `${wire} (${error.status})`
      : (error.detail ?? error.userMessage).slice(0, 500),
    created_at: source.createdAt,
    api: source.api,
    deployment: source.deployment,
    attempts: source.attempts
  }
}
