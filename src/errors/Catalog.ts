import { Data } from "effect"

export type ErrorType =
  | "invalid_request_error"
  | "rate_limit_error"
  | "rate_limit_exceeded"
  | "quota_exceeded"
  | "access_denied"
  | "overloaded_error"
  | "server_error"
  | "service_unavailable"
  | "not_found_error"

interface Entry {
  readonly status: number
  readonly type: ErrorType
  /** The `code` on the wire; null where the spec shows none. */
  readonly wire: string | null
  /** Korean user-facing message. */
  readonly message: string
}

const entry = (status: number, type: ErrorType, message: string, wire: string | null = "SAME"): Entry => ({
  status,
  type,
  wire,
  message
})

/**
 * The code catalog. Keys are internal names; `wire` is what clients see in `code`
 * ("SAME" means the key itself). Every code of the spec's Errors section is here.
 */
const raw = {
  // chat completions 400
  invalid_json: entry(400, "invalid_request_error", "요청 본문이 올바른 JSON이 아닙니다."),
  invalid_messages: entry(400, "invalid_request_error", "messages 형식이 올바르지 않습니다."),
  invalid_request: entry(400, "invalid_request_error", "요청 형식이 올바르지 않습니다."),
  model_not_found: entry(400, "invalid_request_error", "존재하지 않는 모델입니다. GET /v1/models 로 목록을 확인하세요."),
  model_not_chat: entry(400, "invalid_request_error", "임베딩 전용 모델입니다. /v1/embeddings 를 사용하세요."),
  model_not_embedding: entry(400, "invalid_request_error", "임베딩을 지원하지 않는 모델입니다."),
  input_too_long: entry(400, "invalid_request_error", "입력이 모델의 최대 입력 토큰 수를 초과했습니다."),
  invalid_reasoning_effort: entry(400, "invalid_request_error", "이 모델에서 허용되지 않는 reasoning_effort 값입니다."),
  tools_not_supported: entry(400, "invalid_request_error", "이 모델은 도구 호출(tools)을 지원하지 않습니다."),
  images_not_supported: entry(400, "invalid_request_error", "이 모델은 이미지 입력을 지원하지 않습니다."),
  payload_too_large: entry(413, "invalid_request_error", "요청 본문이 너무 큽니다."),
  unsupported_content_type: entry(415, "invalid_request_error", "요청 본문은 application/json 이어야 합니다."),
  cross_site_request: entry(403, "access_denied", "다른 사이트에서 보낸 요청은 허용되지 않습니다."),
  malformed_http: entry(400, "invalid_request_error", "HTTP 요청 형식이 올바르지 않습니다."),
  request_timeout: entry(408, "invalid_request_error", "요청을 제한 시간 안에 모두 받지 못했습니다."),
  headers_too_large: entry(431, "invalid_request_error", "요청 헤더 또는 URL이 너무 깁니다."),
  too_many_failed_requests: entry(
    429,
    "rate_limit_error",
    "잘못된 요청이 너무 많습니다. 요청 형식을 확인한 뒤 잠시 후 다시 시도하세요."
  ),
  // auth
  invalid_api_key: entry(401, "invalid_request_error", "API 키가 없거나 올바르지 않거나 폐기되었습니다."),
  unauthorized: entry(401, "invalid_request_error", "로그인 세션 또는 API 키가 필요합니다.", null),
  geo_restricted: entry(403, "access_denied", "현재 지역에서는 서비스를 이용할 수 없습니다."),
  account_unlinked: entry(403, "access_denied", "커뮤니티 계정 재인증이 필요합니다."),
  legacy_account_upgrade_required: entry(403, "access_denied", "레거시 계정입니다. 계정 업그레이드가 필요합니다."),
  guest_expired: entry(403, "access_denied", "게스트 이용 기간이 만료되었습니다."),
  email_required: entry(403, "access_denied", "이메일 인증이 필요합니다."),
  // admission
  rate_limited: entry(429, "rate_limit_error", "분당 요청 한도를 초과했습니다. 잠시 후 다시 시도하세요."),
  abuse_cooldown: entry(429, "rate_limit_error", "짧은 시간에 요청이 너무 많아 일시적으로 제한되었습니다."),
  session_exhausted: entry(429, "quota_exceeded", "세션 사용량을 모두 소진했습니다. 초기화 시각 이후 다시 시도하세요."),
  weekly_exhausted: entry(429, "quota_exceeded", "주간 사용량을 모두 소진했습니다. 초기화 시각 이후 다시 시도하세요."),
  model_quota_exceeded: entry(429, "quota_exceeded", "이 모델의 일일 공용 한도가 소진되었습니다. 오전 9시(KST)에 초기화됩니다."),
  model_overloaded: entry(529, "overloaded_error", "모델이 혼잡합니다. 5초 후 다시 시도하세요."),
  // upstream and service
  upstream_error: entry(500, "server_error", "모델 서버에서 오류가 발생했습니다."),
  upstream_rejected: entry(400, "invalid_request_error", "모델 서버가 요청을 거부했습니다. 요청 내용과 매개변수를 확인하세요."),
  internal_error: entry(500, "server_error", "내부 오류가 발생했습니다."),
  service_unavailable: entry(503, "service_unavailable", "서비스를 일시적으로 사용할 수 없습니다."),
  upstream_timeout: entry(503, "service_unavailable", "모델 서버 응답 시간이 초과되었습니다."),
  upstream_rate_limited: entry(503, "service_unavailable", "모델 서버가 혼잡합니다. 잠시 후 다시 시도하세요."),
  not_found: entry(404, "not_found_error", "요청한 경로를 찾을 수 없습니다."),
  /** `GET /v1/models/{id}` of no listed model: the chat code, as a 404 (what `models.retrieve` expects). */
  model_not_listed: entry(
    404,
    "not_found_error",
    "존재하지 않는 모델입니다. GET /v1/models 로 목록을 확인하세요.",
    "model_not_found"
  ),
  // account endpoints
  key_cap_reached: entry(400, "invalid_request_error", "활성 API 키 최대 개수에 도달했습니다."),
  invalid_id: entry(400, "invalid_request_error", "id는 양의 정수여야 합니다.", null),
  key_not_found: entry(404, "not_found_error", "키를 찾을 수 없습니다.", null),
  key_not_revealable: entry(409, "invalid_request_error", "이 키는 원문을 확인할 수 없습니다."),
  rotate_cooldown: entry(429, "rate_limit_exceeded", "키 재발급은 60초에 한 번만 가능합니다.", null),
  invalid_range: entry(400, "invalid_request_error", "range 값이 올바르지 않습니다.", null),
  account_not_found: entry(404, "not_found_error", "계정을 찾을 수 없습니다.", null),
  byok_disabled: entry(403, "access_denied", "BYOK 기능을 사용할 수 없습니다."),
  byok_credential_missing: entry(400, "invalid_request_error", "사용할 수 없는 자격 증명 요청입니다."),
  byok_credential_conflict: entry(400, "invalid_request_error", "자격 증명 개수 한도에 도달했거나 이미 사용 중인 라벨입니다."),
  byok_upstream_error: entry(501, "server_error", "이 제공자는 해당 기능을 지원하지 않습니다."),
  byok_credential_rejected: entry(
    400,
    "invalid_request_error",
    "공급자가 등록된 API 키를 거부했습니다. 자격 증명을 확인한 뒤 모델 목록을 다시 불러와 주세요."
  ),
  /**
   * A user's URL leads somewhere the address guard refuses (issue 16: one answer, whatever the reason): the BYOK
   * API's probe code of the same name says the same.
   */
  address_not_allowed: entry(
    400,
    "invalid_request_error",
    "허용되지 않는 주소입니다. 공개된 https 주소만 사용할 수 있습니다."
  ),
  // image presets and the gallery (account API, wrapped); `preset_invalid` names the field at fault
  preset_invalid: entry(400, "invalid_request_error", "프리셋 값이 올바르지 않습니다."),
  preset_cap_reached: entry(400, "invalid_request_error", "프리셋은 계정당 최대 10개까지 만들 수 있습니다."),
  preset_not_found: entry(404, "not_found_error", "프리셋을 찾을 수 없습니다."),
  image_not_found: entry(404, "not_found_error", "이미지를 찾을 수 없습니다."),
  // image endpoint (`{statusCode, message}`); `message` may be overridden with the field or category at fault
  image_invalid: entry(400, "invalid_request_error", "이미지 요청 형식이 올바르지 않습니다."),
  image_unsupported_action: entry(400, "invalid_request_error", "지원하지 않는 action 입니다. generate 만 사용할 수 있습니다."),
  image_blocked: entry(400, "invalid_request_error", "금지된 내용이 포함된 프롬프트입니다."),
  image_admin_only: entry(403, "access_denied", "현재 이미지 생성은 관리자만 사용할 수 있습니다."),
  image_not_eligible: entry(403, "access_denied", "이 계정은 이미지 생성을 사용할 수 없습니다."),
  image_pending_full: entry(429, "rate_limit_error", "대기 중인 이미지 요청이 너무 많습니다. 이전 요청이 끝난 뒤 다시 시도하세요."),
  image_failed: entry(500, "server_error", "이미지 생성에 실패했습니다."),
  image_disabled: entry(503, "service_unavailable", "이미지 생성 기능이 꺼져 있습니다."),
  image_maintenance: entry(503, "service_unavailable", "이미지 생성 서버 점검 중입니다. 잠시 후 다시 시도하세요."),
  image_congested: entry(503, "service_unavailable", "이미지 생성 대기열이 혼잡합니다. 잠시 후 다시 시도하세요."),
  image_no_worker: entry(503, "service_unavailable", "현재 연결된 이미지 생성 서버가 없습니다. 잠시 후 다시 시도하세요."),
  image_timeout: entry(504, "server_error", "이미지 생성 시간이 180초를 넘어 취소되었습니다.")
} as const satisfies Record<string, Entry>

export type Code = keyof typeof raw

export const Catalog: { readonly [K in Code]: Entry } = Object.fromEntries(
  Object.entries(raw).map(([code, e]) => [code, { ...e, wire: e.wire === "SAME" ? code : e.wire }])
) as { readonly [K in Code]: Entry }

export const codes = Object.keys(Catalog) as ReadonlyArray<Code>

/**
 * The one typed error of the gateway. `code` selects status, type and the default Korean message.
 * `message` overrides the text (e.g. to list allowed values); `resetsAt` (epoch ms) is rendered as
 * `resets_at`; `retryAfter` (seconds) becomes a `Retry-After` header.
 */
export class GatewayError extends Data.TaggedError("GatewayError")<{
  readonly code: Code
  readonly message?: string
  readonly resetsAt?: number
  readonly retryAfter?: number
  /** Rendered as `x-should-retry` (SDKs honour it); unset: decided from the status and the wait. */
  readonly shouldRetry?: boolean
  /** Internal detail for logs only; never rendered. */
  readonly detail?: string
}> {
  get status(): number {
    return Catalog[this.code].status
  }
  get userMessage(): string {
    return this.message || Catalog[this.code].message
  }
}

export const fail = (code: Code, extra: Omit<ConstructorParameters<typeof GatewayError>[0], "code"> = {}) =>
  new GatewayError({ code, ...extra })

// ---------------------------------------------------------------------------------------------
// Message variants: the Korean text of a code when its default must name the request's specifics (a limit,
// the allowed values). Routes and decoders take their texts from here: `fail(code, { message: ... })`.

/** Chat completions and embeddings: variants of `invalid_request`, `invalid_messages` and the model gates. */
export const InferenceMessages = {
  /** `invalid_request`: a body that is JSON but not an object. */
  notAnObject: "요청 본문은 JSON 객체여야 합니다.",
  /** `invalid_request`: nesting deeper than `limits.json_depth`. */
  jsonTooDeep: (maxDepth: number) => `JSON 중첩이 너무 깊습니다. 최대 ${maxDepth}단계까지 허용됩니다.`,
  /** A text over its bound; `where` is the value's path (`messages[0].content`). */
  textTooLong: (where: string, maxChars: number) => `${where} 이(가) 너무 깁니다. 최대 ${maxChars}자까지 허용됩니다.`,
  /** A field's message for a value missing at `where`. */
  fieldRequired: (where: string, fieldMessage: string) => `${where} 필드가 필요합니다. ${fieldMessage}`,
  /** A field's message for a bad value nested at `where`. */
  fieldAt: (fieldMessage: string, where: string) => `${fieldMessage} (위치: ${where})`,
  tooManyMessages: (max: number) => `messages 는 최대 ${max}개까지 허용됩니다.`,
  tooManyContentParts: (max: number) => `콘텐츠 파트는 요청 전체에서 최대 ${max}개까지 허용됩니다.`,
  tooManyToolCalls: (max: number) => `tool_calls 는 요청 전체에서 최대 ${max}개까지 허용됩니다.`,
  tooManyTools: (max: number) => `tools 는 최대 ${max}개까지 허용됩니다.`,
  toolTooDeep: (where: string, maxDepth: number) =>
    `${where} 의 중첩이 너무 깊습니다. function.parameters 는 최대 ${maxDepth}단계까지 허용됩니다.`,
  toolTooLarge: (where: string, maxBytes: number) =>
    `${where} 정의가 너무 큽니다. 도구 하나는 최대 ${maxBytes}바이트까지 허용됩니다.`,
  /** `model_not_found` for a BYOK reference (`@provider/...`) while BYOK is not available. */
  byokModelUnavailable: "BYOK 모델 참조를 사용할 수 없습니다. 등록된 자격 증명이 없거나 기능이 꺼져 있습니다.",
  /** `model_not_found` for a `@...` value that is not `@provider/model` or `@provider:label/model`. */
  byokBadReference: "BYOK 모델은 @공급자/모델 또는 @공급자:라벨/모델 형식이어야 합니다.",
  /** `invalid_reasoning_effort`, listing the model's allowed values (none: the model has no reasoning). */
  reasoningEffortNotAllowed: (allowed: ReadonlyArray<string>) =>
    allowed.length > 0
      ? `이 모델에서 허용되지 않는 reasoning_effort 값입니다. 허용 값: ${allowed.join(", ")}`
      : "이 모델은 reasoning_effort 를 지원하지 않습니다. 허용 값: 없음",
  /** `input_too_long` with the model's limit and the estimate. */
  inputTooLong: (maxInputTokens: number, estimated: number) =>
    `입력이 모델의 최대 입력 토큰 수(${maxInputTokens})를 초과했습니다. (추정 ${estimated})`,
  /** `invalid_request` (embeddings): token arrays as input. */
  tokenArrayInput: "토큰 배열 입력은 지원하지 않습니다. input 은 문자열 또는 문자열 배열이어야 합니다.",
  tooManyEmbeddingInputs: (max: number) => `input 은 최대 ${max}개까지 허용됩니다.`,
  /** `not_found` for a known API path sent without its `/v1` prefix; `path` is the gateway's own. */
  missingV1: (path: string) =>
    `요청한 경로를 찾을 수 없습니다. API 경로는 /v1 로 시작합니다 (예: ${path}). 클라이언트의 base URL 끝에 /v1 을 붙이세요.`,
  /** `invalid_request`: `n` other than 1. */
  onlyOneChoice: "n 은 1만 지원합니다. 여러 응답이 필요하면 요청을 여러 번 보내세요."
} as const

/** Authentication variants. */
export const AuthMessages = {
  /** `too_many_failed_requests` for a client address with too many failed authentications. */
  tooManyFailedAuth: "인증 실패가 너무 많습니다. API 키 또는 로그인 정보를 확인한 뒤 잠시 후 다시 시도하세요."
} as const

/** Image endpoint variants: `image_invalid` naming the field and its bound, `image_blocked` the category. */
export const ImageMessages = {
  notAnObject: "요청 본문은 JSON 객체여야 합니다.",
  inputRequired: "input 필드가 필요합니다. 프롬프트를 문자열로 보내세요.",
  inputType: "input 은 문자열이어야 합니다.",
  inputEmpty: "input 이 비어 있습니다. 프롬프트를 입력하세요.",
  parametersType: "parameters 는 객체여야 합니다.",
  model: (max: number) => `model 은 ${max}자 이하의 문자열이어야 합니다.`,
  tooLong: (where: string, max: number) => `${where} 이(가) 너무 깁니다. 최대 ${max}자까지 허용됩니다.`,
  stringField: (where: string) => `${where} 은(는) 문자열이어야 합니다.`,
  integer: (where: string) => `${where} 은(는) 정수여야 합니다.`,
  intRange: (where: string, min: number, max: number) => `${where} 은(는) ${min} 이상 ${max} 이하의 정수여야 합니다.`,
  numberRange: (where: string, min: number, max: number) => `${where} 은(는) ${min} 이상 ${max} 이하의 숫자여야 합니다.`,
  blocked: (category: string) => `금지된 내용(${category})이 포함된 프롬프트입니다.`,
  timeout: (seconds: number) => `이미지 생성 시간이 ${seconds}초를 넘어 취소되었습니다.`
} as const

/** Account API variants. */
export const AccountMessages = {
  /** `invalid_range`, listing the allowed ranges. */
  invalidRange: (allowed: ReadonlyArray<string>) => `range 값이 올바르지 않습니다. 허용되는 값: ${allowed.join(", ")}`,
  /** `byok_disabled` for a guest account (spec Authentication 6: same code, a different message). */
  byokGuest: "게스트 계정은 BYOK 기능을 사용할 수 없습니다. 정식 계정으로 전환한 뒤 이용하세요.",
  /** `byok_disabled` when the operator has not enabled BYOK or configured its encryption key. */
  byokOff: "이 서버에서는 BYOK 기능이 꺼져 있습니다.",
  byokRateLimited: "BYOK 요청이 너무 많습니다. 1분에 15회까지 가능합니다.",
  byokNotFound: "자격 증명을 찾을 수 없습니다.",
  /** `byok_credential_missing` on `/v1`: the reference names no usable credential. */
  byokNoCredential: "요청한 공급자(또는 라벨)의 자격 증명이 등록되어 있지 않습니다. BYOK 설정에서 먼저 등록하세요.",
  byokBadId: "자격 증명 id는 양의 정수여야 합니다.",
  byokCap: (max: number) => `이 공급자와 인증 방식의 자격 증명은 최대 ${max}개까지 등록할 수 있습니다.`,
  byokLabelTaken: "이미 사용 중인 라벨입니다.",
  byokFallbackEnabled: "enabled 필드는 true, false 또는 null 이어야 합니다.",
  byokPatchField: (field: string) => `${field} 필드는 변경할 수 없습니다. pinned, is_primary, fallback_model_id 만 허용됩니다.`,
  byokPatchType: (field: string, type: string) => `${field} 필드는 ${type} 이어야 합니다.`,
  byokFallbackModel: "fallback_model_id 는 공용 카탈로그의 모델 id 이어야 합니다."
} as const

/** Image presets and the gallery (account API): texts that name the field at fault, never its value. */
export const ImageAccountMessages = {
  notAnObject: "요청 본문은 JSON 객체여야 합니다.",
  required: (field: string) => `${field} 필드가 필요합니다.`,
  unknownField: (field: string, allowed: ReadonlyArray<string>) =>
    `${field} 필드는 쓸 수 없습니다. 허용되는 필드: ${allowed.join(", ")}`,
  unknownFieldUnnamed: (allowed: ReadonlyArray<string>) =>
    `알 수 없는 필드가 있습니다. 허용되는 필드: ${allowed.join(", ")}`,
  text: (field: string, min: number, max: number) =>
    min > 0 ? `${field} 필드는 ${min}~${max}자의 문자열이어야 합니다.` : `${field} 필드는 최대 ${max}자의 문자열이어야 합니다.`,
  nullableText: (field: string, max: number) => `${field} 필드는 null 또는 최대 ${max}자의 문자열이어야 합니다.`,
  badCharacters: (field: string) => `${field} 필드에 허용되지 않는 문자가 있습니다.`,
  integer: (field: string, min: number, max: number) => `${field} 필드는 ${min} 이상 ${max} 이하의 정수여야 합니다.`,
  dimension: (field: string, min: number, max: number, multiple: number) =>
    `${field} 필드는 ${min} 이상 ${max} 이하인 ${multiple}의 배수여야 합니다.`,
  nullableNumber: (field: string, min: number, max: number) =>
    `${field} 필드는 null 또는 ${min} 이상 ${max} 이하의 숫자여야 합니다.`,
  number: (field: string, min: number, max: number) => `${field} 필드는 ${min} 이상 ${max} 이하의 숫자여야 합니다.`,
  oneOf: (field: string, allowed: ReadonlyArray<string>) => `${field} 필드는 다음 중 하나여야 합니다: ${allowed.join(", ")}`,
  loras: (max: number) => `loras 필드는 최대 ${max}개 항목의 배열이어야 합니다.`,
  loraItem: (index: number) => `loras[${index}] 항목은 name 과 weight 만 가진 객체여야 합니다.`,
  presetCap: (max: number) => `프리셋은 계정당 최대 ${max}개까지 만들 수 있습니다.`,
  before: "before 값이 올바르지 않습니다. 이전 응답의 next_before 값을 그대로 보내세요.",
  readLimited: (max: number) => `이미지·프리셋 조회 요청이 너무 많습니다. 1분에 ${max}회까지 가능합니다.`,
  writeLimited: (max: number) => `이미지·프리셋 변경 요청이 너무 많습니다. 1분에 ${max}회까지 가능합니다.`
} as const

// ---------------------------------------------------------------------------------------------------------
// Where each code is answered on the inference API (the OpenAPI document's error responses come from here)

/**
 * The steps of an inference request that can answer with a code: reading the JSON body, validating a chat or an
 * embeddings request, the bearer key, the spending gates (account state, region, failed-request guard), admission,
 * and the upstream call. Codes of the account API and of the HTTP edge have none.
 */
export type InferenceStage = "body" | "chat_request" | "embeddings_request" | "key" | "gate" | "admission" | "upstream"

/** Exhaustive: a new code must say where it is answered (an empty list: never on `/v1` operations). */
const stages: { readonly [K in Code]: ReadonlyArray<InferenceStage> } = {
  invalid_json: ["body"],
  invalid_messages: ["chat_request"],
  invalid_request: ["chat_request", "embeddings_request"],
  model_not_found: ["chat_request", "embeddings_request"],
  model_not_chat: ["chat_request"],
  model_not_embedding: ["embeddings_request"],
  input_too_long: ["chat_request", "embeddings_request"],
  invalid_reasoning_effort: ["chat_request"],
  tools_not_supported: ["chat_request"],
  images_not_supported: ["chat_request"],
  payload_too_large: ["body"],
  unsupported_content_type: [],
  cross_site_request: [],
  malformed_http: [],
  request_timeout: [],
  headers_too_large: [],
  too_many_failed_requests: ["key", "gate"],
  invalid_api_key: ["key"],
  unauthorized: [],
  geo_restricted: ["gate"],
  account_unlinked: ["gate"],
  legacy_account_upgrade_required: ["gate"],
  guest_expired: ["gate"],
  email_required: ["gate"],
  rate_limited: ["admission"],
  abuse_cooldown: ["admission"],
  session_exhausted: ["admission"],
  weekly_exhausted: ["admission"],
  model_quota_exceeded: ["admission"],
  model_overloaded: ["admission"],
  upstream_error: ["upstream"],
  upstream_rejected: ["upstream"],
  internal_error: ["upstream"],
  service_unavailable: ["upstream"],
  upstream_timeout: ["upstream"],
  upstream_rate_limited: ["upstream"],
  not_found: [],
  model_not_listed: [],
  key_cap_reached: [],
  invalid_id: [],
  key_not_found: [],
  key_not_revealable: [],
  rotate_cooldown: [],
  invalid_range: [],
  account_not_found: [],
  byok_disabled: ["chat_request", "embeddings_request"],
  byok_credential_missing: ["chat_request", "embeddings_request"],
  byok_credential_conflict: [],
  byok_upstream_error: [],
  byok_credential_rejected: ["chat_request", "embeddings_request", "upstream"],
  address_not_allowed: ["chat_request", "embeddings_request", "upstream"],
  preset_invalid: [],
  preset_cap_reached: [],
  preset_not_found: [],
  image_not_found: [],
  image_invalid: [],
  image_unsupported_action: [],
  image_blocked: [],
  image_admin_only: [],
  image_not_eligible: [],
  image_pending_full: [],
  image_failed: [],
  image_disabled: [],
  image_maintenance: [],
  image_congested: [],
  image_no_worker: [],
  image_timeout: []
}

/** The codes answered at any of these stages, in catalog order. */
export const codesAnsweredAt = (...at: ReadonlyArray<InferenceStage>): ReadonlyArray<Code> =>
  codes.filter((code) => stages[code].some((stage) => at.includes(stage)))
