import { Result, Schema, type SchemaAST, type SchemaIssue } from "effect"
import type { LimitsConfig } from "../config/GatewayConfig.js"
import { Catalog, type Code, fail, type GatewayError, InferenceMessages } from "../errors/Catalog.js"
import { Bounded, ID_CHARS, Message, ToolChoice, ToolDefinition } from "../wire/ChatSchemas.js"
import { exceedsJsonBounds, formatPath } from "./JsonGuard.js"

const opt = <S extends Schema.Top>(schema: S) => Schema.optionalKey(schema)

/** Longest `model` accepted (catalog ids are at most 128; BYOK references name a provider, a label and a model). */
export const MODEL_CHARS = 256
/** `stop`: at most this many sequences, each at most `STOP_CHARS` long. */
export const STOP_SEQUENCES = 4
export const STOP_CHARS = 256
export const MAX_TOOLS = 128
/**
 * Content parts and tool calls per request, over all messages: decoding costs about 2 µs per item, so these
 * keep it to milliseconds (160,000 parts in a 4 MB body took 300 ms).
 */
export const MAX_CONTENT_PARTS = 4096
export const MAX_TOOL_CALLS = 4096

// The message and tool shapes are shared with the upstream port (src/wire/ChatSchemas.ts). Bounds fixed by the
// contract live in the schemas; bounds taken from `limits` (config) are checked by `checkRaw` (before decoding)
// and `checkTexts` (after).
/** Documented by OpenApi.ts next to the request. */
export { ToolCall } from "../wire/ChatSchemas.js"

export const ChatRequest = Schema.Struct({
  model: Bounded(MODEL_CHARS),
  messages: Schema.Array(Message).check(Schema.isMinLength(1)),
  stream: opt(Schema.Boolean),
  temperature: opt(Schema.Number.check(Schema.isFinite(), Schema.isBetween({ minimum: 0, maximum: 2 }))),
  max_tokens: opt(Schema.Int.check(Schema.isGreaterThan(0))),
  /** The OpenAI SDK's newer name of the output cap: folded into `max_tokens` (the smaller of both) by the decoder. */
  max_completion_tokens: opt(Schema.Int.check(Schema.isGreaterThan(0))),
  top_p: opt(Schema.Number.check(Schema.isFinite(), Schema.isBetween({ minimum: 0, maximum: 1 }))),
  stop: opt(Schema.Union([Bounded(STOP_CHARS), Schema.Array(Bounded(STOP_CHARS)).check(Schema.isMaxLength(STOP_SEQUENCES))])),
  reasoning_effort: opt(Schema.String),
  tools: opt(Schema.Array(ToolDefinition).check(Schema.isMaxLength(MAX_TOOLS, {
    message: "at most 128 tools"
  }))),
  tool_choice: opt(ToolChoice),
  parallel_tool_calls: opt(Schema.Boolean)
}).annotate({ identifier: "ChatCompletionRequest" })
export type ChatRequest = typeof ChatRequest.Type

const decode = Schema.decodeUnknownResult(ChatRequest)

const has = Object.hasOwn
const finiteIn = (value: unknown, max: number): value is number =>
  typeof value === "number" && Number.isFinite(value) && value >= 0 && value <= max
const positiveInt = (value: unknown): value is number => Number.isSafeInteger(value) && (value as number) > 0
const boundedString = (value: unknown, max: number): value is string => typeof value === "string" && value.length <= max

/** A message of the common forms (text content, no tool calls or reasoning), as the schema decodes it; else undefined. */
const plainMessage = (m: unknown): Message | undefined => {
  if (typeof m !== "object" || m === null || Array.isArray(m)) return undefined
  const { content, role } = m as Record<string, unknown>
  if (role === "user" || role === "system") return typeof content === "string" ? { role, content } : undefined
  if (role === "assistant") {
    if (typeof content !== "string" && content !== null) return undefined
    return has(m, "tool_calls") || has(m, "reasoning") ? undefined : { role, content }
  }
  if (role === "tool") {
    const id = (m as Record<string, unknown>)["tool_call_id"]
    return typeof content === "string" && boundedString(id, ID_CHARS) ? { role, tool_call_id: id, content } : undefined
  }
  return undefined
}

/**
 * The schema's result for the common request (text messages, no tools, scalar options in range), built directly;
 * undefined for anything else, which the schema then decodes (and words the error of). Same keys in the same order
 * as the schema's output wherever it answers (test/inference/chat-fast-decode.test.ts compares the two on generated
 * bodies). The schema's walk was ~3 % of the main thread per request.
 */
export const decodeCommon = (body: Record<string, unknown>): ChatRequest | undefined => {
  const model = body["model"]
  const messages = body["messages"]
  if (!boundedString(model, MODEL_CHARS) || !Array.isArray(messages) || messages.length === 0) return undefined
  if (has(body, "tools") || has(body, "tool_choice")) return undefined
  const decoded: Array<Message> = new Array(messages.length)
  for (let i = 0; i < messages.length; i++) {
    const message = plainMessage(messages[i])
    if (message === undefined) return undefined
    decoded[i] = message
  }
  const out: { -readonly [K in keyof ChatRequest]: ChatRequest[K] } = { model, messages: decoded }
  if (has(body, "stream")) {
    if (typeof body["stream"] !== "boolean") return undefined
    out.stream = body["stream"]
  }
  if (has(body, "temperature")) {
    if (!finiteIn(body["temperature"], 2)) return undefined
    out.temperature = body["temperature"]
  }
  if (has(body, "max_tokens")) {
    if (!positiveInt(body["max_tokens"])) return undefined
    out.max_tokens = body["max_tokens"]
  }
  if (has(body, "max_completion_tokens")) {
    if (!positiveInt(body["max_completion_tokens"])) return undefined
    out.max_completion_tokens = body["max_completion_tokens"]
  }
  if (has(body, "top_p")) {
    if (!finiteIn(body["top_p"], 1)) return undefined
    out.top_p = body["top_p"]
  }
  if (has(body, "stop")) {
    const stop = body["stop"]
    if (boundedString(stop, STOP_CHARS)) out.stop = stop
    else if (Array.isArray(stop) && stop.length <= STOP_SEQUENCES && stop.every((s) => boundedString(s, STOP_CHARS))) {
      out.stop = stop.slice()
    } else return undefined
  }
  if (has(body, "reasoning_effort")) {
    if (typeof body["reasoning_effort"] !== "string") return undefined
    out.reasoning_effort = body["reasoning_effort"]
  }
  if (has(body, "parallel_tool_calls")) {
    if (typeof body["parallel_tool_calls"] !== "boolean") return undefined
    out.parallel_tool_calls = body["parallel_tool_calls"]
  }
  return out
}

/** What the user is told per top-level field; the path of the offending value is appended. */
const FIELD_MESSAGES: Record<string, string> = {
  model: `model 은 ${MODEL_CHARS}자 이하의 문자열이어야 합니다.`,
  messages: "messages 형식이 올바르지 않습니다. 메시지 객체 배열(최소 1개)이어야 하며, role 은 system, user, assistant, tool 중 하나입니다.",
  stream: "stream 은 true 또는 false 여야 합니다.",
  temperature: "temperature 는 0 이상 2 이하의 숫자여야 합니다.",
  top_p: "top_p 는 0 이상 1 이하의 숫자여야 합니다.",
  max_tokens: "max_tokens 는 양의 정수여야 합니다.",
  max_completion_tokens: "max_completion_tokens 는 양의 정수여야 합니다.",
  stop: `stop 은 문자열 또는 최대 ${STOP_SEQUENCES}개의 문자열 배열이어야 하며, 각 문자열은 ${STOP_CHARS}자 이하여야 합니다.`,
  reasoning_effort: "reasoning_effort 는 문자열이어야 합니다.",
  tools: `tools 형식이 올바르지 않습니다. 최대 ${MAX_TOOLS}개, 각 도구는 {type: function, function: {name, parameters}} 형식이며 이름은 ^[a-zA-Z0-9_-]{1,64}$ 형식이어야 합니다.`,
  tool_choice: "tool_choice 는 auto, required, none 또는 {type: function, function: {name}} 이어야 합니다.",
  parallel_tool_calls: "parallel_tool_calls 는 true 또는 false 여야 합니다."
}

interface Located {
  readonly path: ReadonlyArray<PropertyKey>
  readonly missing: boolean
}

/** The value at `key` of `value`, when `value` is an object or an array (what a Pointer into it points at). */
const child = (value: unknown, key: PropertyKey): unknown =>
  typeof value === "object" && value !== null ? (value as Record<PropertyKey, unknown>)[key] : undefined

/** Keys whose value is a literal in some object member of `union` (its discriminators: `role`, `type`), in member order. */
const discriminators = (union: SchemaAST.Union): ReadonlyArray<PropertyKey> => {
  const keys: Array<PropertyKey> = []
  for (const member of union.types) {
    if (member._tag !== "Objects") continue
    for (const property of member.propertySignatures) {
      const type = property.type
      const literal = type._tag === "Literal" ||
        (type._tag === "Union" && type.types.length > 0 && type.types.every((t) => t._tag === "Literal"))
      if (literal && !keys.includes(property.name)) keys.push(property.name)
    }
  }
  return keys
}

/**
 * Where a union that no member applied to went wrong. Effect reports it with no sub-issue (and without the
 * value's path inside it), so this reads the value itself: an object (or array) whose discriminator key (`role`,
 * `type`) is absent or names no member points at that key, as Effect 3 did; anything else points at the value.
 */
const locateUnmatched = (union: SchemaAST.Union, path: ReadonlyArray<PropertyKey>, value: unknown): Located => {
  if (typeof value !== "object" || value === null) return { path, missing: false }
  const key = discriminators(union)[0]
  if (key === undefined) return { path, missing: false }
  return { path: path.concat(key), missing: !(key in value) }
}

/**
 * The path of the most specific leaf issue (the deepest; for a union, the member that got furthest), read off
 * the issue tree without formatting any message (messages must never carry the client's value). `value` is the
 * input at `path`, followed along the pointers.
 */
const locate = (issue: SchemaIssue.Issue, value: unknown, path: ReadonlyArray<PropertyKey> = []): Located => {
  switch (issue._tag) {
    case "Pointer": {
      let at = value
      for (const key of issue.path) at = child(at, key)
      return locate(issue.issue, at, path.concat(issue.path))
    }
    case "Composite":
    case "AnyOf": {
      if (issue._tag === "AnyOf" && issue.issues.length === 0) return locateUnmatched(issue.ast, path, value)
      let best: Located | null = null
      for (const sub of issue.issues) {
        const found = locate(sub, value, path)
        if (best === null || found.path.length > best.path.length) best = found
      }
      return best ?? { path, missing: false }
    }
    case "Filter":
    case "Encoding":
      return locate(issue.issue, value, path)
    case "MissingKey":
      return { path, missing: true }
    default:
      return { path, missing: false }
  }
}

export const NOT_AN_OBJECT = InferenceMessages.notAnObject

/**
 * A decode failure as the user sees it: the message for the offending value's last key under its top-level
 * field (`keyMessages[field][key]`), else the field's (`fieldMessages[field]`), with the value's path; never
 * the value itself nor Effect's English text.
 */
export const describeDecodeFailure = (
  error: Schema.SchemaError,
  fieldMessages: Readonly<Record<string, string>>,
  keyMessages: Readonly<Record<string, Readonly<Record<string, string>>>> = {},
  input?: unknown
): { readonly field: string; readonly message: string } => {
  const { path, missing } = locate(error.issue, input)
  const field = typeof path[0] === "string" ? path[0] : ""
  if (field === "") return { field, message: NOT_AN_OBJECT }
  let lastKey: PropertyKey | undefined
  for (let i = path.length - 1; i > 0 && lastKey === undefined; i--) if (typeof path[i] === "string") lastKey = path[i]
  const known = (typeof lastKey === "string" ? keyMessages[field]?.[lastKey] : undefined) ?? fieldMessages[field] ??
    Catalog.invalid_request.message
  const where = formatPath(path)
  const message = missing
    ? InferenceMessages.fieldRequired(where, known)
    : path.length > 1
    ? InferenceMessages.fieldAt(known, where)
    : known
  return { field, message }
}

/** Within `messages`, what the user is told per key of the offending value (its last named key). */
const MESSAGE_KEY_MESSAGES: Record<string, string> = {
  role: "role 은 system, user, assistant, tool 중 하나여야 합니다.",
  content: "content 는 문자열 또는 콘텐츠 파트 배열이어야 합니다(assistant 는 문자열 또는 null, tool 은 문자열).",
  type: "콘텐츠 파트의 type 은 text 또는 image_url 이어야 하고, tool_calls 의 type 은 function 이어야 합니다.",
  text: "text 는 문자열이어야 합니다.",
  image_url: "image_url 은 {url, detail} 객체여야 합니다.",
  url: "image_url.url 은 https URL 또는 data: URI 여야 합니다.",
  detail: "image_url.detail 은 auto, low, high 중 하나여야 합니다.",
  reasoning: "reasoning 은 문자열이어야 합니다.",
  tool_calls: "tool_calls 는 {id, type: function, function: {name, arguments}} 객체 배열이어야 합니다.",
  id: `tool_calls 의 id 는 ${ID_CHARS}자 이하의 문자열이어야 합니다.`,
  function: "tool_calls 의 function 은 {name, arguments} 객체여야 합니다.",
  name: `function.name 은 ${ID_CHARS}자 이하의 문자열이어야 합니다.`,
  arguments: "function.arguments 는 문자열(JSON 인코딩된 객체)이어야 합니다.",
  tool_call_id: `tool_call_id 는 ${ID_CHARS}자 이하의 문자열이어야 합니다.`
}

const decodeFailure = (error: Schema.SchemaError, input: unknown): GatewayError => {
  const { field, message } = describeDecodeFailure(error, FIELD_MESSAGES, { messages: MESSAGE_KEY_MESSAGES }, input)
  return fail(field === "messages" ? "invalid_messages" : "invalid_request", { message })
}

export const tooLong = (code: Code, path: ReadonlyArray<PropertyKey>, max: number) =>
  fail(code, { message: InferenceMessages.textTooLong(formatPath(path), max) })

const toolBoundsError = (index: number, bound: "depth" | "size", limits: LimitsConfig): GatewayError =>
  bound === "depth"
    ? fail("invalid_request", {
      message: InferenceMessages.toolTooDeep(formatPath(["tools", index]), limits.tool_schema_depth)
    })
    : fail("invalid_request", {
      message: InferenceMessages.toolTooLarge(formatPath(["tools", index]), limits.tool_schema_bytes)
    })

/**
 * Sizes checked on the raw body before decoding, so decoding (about 2 µs per value) never walks an oversized
 * array: message, content part, tool call, tool and `stop` counts, and each tool's size and depth (as sent,
 * unknown fields included; `parameters` sits two levels down in `{type, function: {parameters}}`).
 */
const checkRaw = (body: Record<string, unknown>, limits: LimitsConfig): GatewayError | null => {
  // One choice per request: `n` is refused rather than answered with one choice the client did not ask for.
  if (body.n !== undefined && body.n !== null && body.n !== 1) {
    return fail("invalid_request", { message: InferenceMessages.onlyOneChoice })
  }
  const messages = body.messages
  if (Array.isArray(messages)) {
    if (messages.length > limits.messages) {
      return fail("invalid_messages", { message: InferenceMessages.tooManyMessages(limits.messages) })
    }
    let parts = 0
    let calls = 0
    for (const message of messages) {
      if (typeof message !== "object" || message === null) continue
      const { content, tool_calls } = message as { readonly content?: unknown; readonly tool_calls?: unknown }
      if (Array.isArray(content)) parts += content.length
      if (Array.isArray(tool_calls)) calls += tool_calls.length
    }
    if (parts > MAX_CONTENT_PARTS) {
      return fail("invalid_messages", { message: InferenceMessages.tooManyContentParts(MAX_CONTENT_PARTS) })
    }
    if (calls > MAX_TOOL_CALLS) {
      return fail("invalid_messages", { message: InferenceMessages.tooManyToolCalls(MAX_TOOL_CALLS) })
    }
  }
  const tools = body.tools
  if (Array.isArray(tools)) {
    if (tools.length > MAX_TOOLS) return fail("invalid_request", { message: InferenceMessages.tooManyTools(MAX_TOOLS) })
    for (let t = 0; t < tools.length; t++) {
      const bound = exceedsJsonBounds(tools[t], limits.tool_schema_depth + 2, limits.tool_schema_bytes)
      if (bound !== null) return toolBoundsError(t, bound, limits)
    }
  }
  const stop = body.stop
  if (Array.isArray(stop) && stop.length > STOP_SEQUENCES) return fail("invalid_request", { message: FIELD_MESSAGES.stop! })
  return null
}

/** Text bounds taken from config, checked in one cheap pass over the decoded request (no copies). */
const checkTexts = (req: ChatRequest, limits: LimitsConfig): GatewayError | null => {
  const text = limits.text_chars
  for (let i = 0; i < req.messages.length; i++) {
    const message = req.messages[i]!
    const content = message.content
    if (typeof content === "string") {
      if (content.length > text) return tooLong("invalid_messages", ["messages", i, "content"], text)
    } else if (content !== null) {
      for (let j = 0; j < content.length; j++) {
        const part = content[j]!
        if (part.type === "text") {
          if (part.text.length > text) return tooLong("invalid_messages", ["messages", i, "content", j, "text"], text)
        } else if (part.image_url.url.length > limits.image_url_chars) {
          return tooLong("invalid_messages", ["messages", i, "content", j, "image_url", "url"], limits.image_url_chars)
        }
      }
    }
    if (message.role === "assistant") {
      if (message.reasoning !== undefined && message.reasoning.length > text) {
        return tooLong("invalid_messages", ["messages", i, "reasoning"], text)
      }
      const calls = message.tool_calls ?? []
      for (let k = 0; k < calls.length; k++) {
        if (calls[k]!.function.arguments.length > text) {
          return tooLong("invalid_messages", ["messages", i, "tool_calls", k, "function", "arguments"], text)
        }
      }
    }
  }
  return null
}

/**
 * Decodes a parsed JSON body within `limits`; maps the first problem to the catalog with a Korean message
 * that names the field and its path, never the client's value.
 */
export const decodeChatRequest = (body: unknown, limits: LimitsConfig): Result.Result<ChatRequest, GatewayError> => {
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    return Result.fail(fail("invalid_request", { message: NOT_AN_OBJECT }))
  }
  const raw = checkRaw(body as Record<string, unknown>, limits)
  if (raw) return Result.fail(raw)
  const common = decodeCommon(body as Record<string, unknown>)
  const result = common === undefined ? decode(body) : Result.succeed(common)
  if (Result.isFailure(result)) return Result.fail(decodeFailure(result.failure, body))
  const texts = checkTexts(result.success, limits)
  return texts ? Result.fail(texts) : Result.succeed(foldOutputCap(result.success))
}

/** `max_completion_tokens` and `max_tokens` as one cap in `max_tokens`: the smaller when both are set. */
const foldOutputCap = (req: ChatRequest): ChatRequest => {
  const { max_completion_tokens: completion, ...rest } = req
  if (completion === undefined) return req
  return { ...rest, max_tokens: rest.max_tokens === undefined ? completion : Math.min(rest.max_tokens, completion) }
}

/** Top-level chat fields the gateway reads (`n` only as 1); any other is named in `x-wellspring-ignored-fields`. */
export const CHAT_FIELDS: ReadonlySet<string> = new Set([...Object.keys(ChatRequest.fields), "n"])
