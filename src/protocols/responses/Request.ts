/**
 * `POST /v1/responses` request bodies: the Responses wire decoded (every size bounded first) and mapped to the
 * internal chat request (`inference/ChatRequest.ts`) that the pipeline runs. The mapping keeps reasoning on its
 * own channel (a `reasoning` item becomes the next assistant turn's `reasoning`) and tool-call ids one to one
 * (a `function_call`'s `call_id` is the chat tool call's `id`, its `function_call_output` the `tool_call_id`).
 */
import { Result, Schema } from "effect"
import type { LimitsConfig } from "../../config/GatewayConfig.js"
import { fail, type GatewayError, InferenceMessages } from "../../errors/Catalog.js"
import {
  type ChatRequest,
  describeDecodeFailure,
  MAX_CONTENT_PARTS,
  MAX_TOOL_CALLS,
  MAX_TOOLS,
  MODEL_CHARS,
  NOT_AN_OBJECT,
  tooLong
} from "../../inference/ChatRequest.js"
import { exceedsJsonBounds, formatPath } from "../../inference/JsonGuard.js"
import type { ContentPart, Message, ToolCall, ToolDefinition } from "../../upstream/Upstream.js"
import { Bounded, ID_CHARS, ToolName } from "../../wire/ChatSchemas.js"

const opt = <S extends Schema.Top>(schema: S) => Schema.optionalKey(schema)

/** Longest `previous_response_id` accepted (ours are 53 characters). */
export const RESPONSE_ID_CHARS = 128
/** `metadata`: at most 16 keys of at most 64 characters, values of at most 512 (as OpenAI bounds it). */
export const METADATA_KEYS = 16
export const METADATA_KEY_CHARS = 64
export const METADATA_VALUE_CHARS = 512
/** `include`: at most this many entries (they are accepted and ignored). */
export const MAX_INCLUDE = 16

/**
 * Tool types the Responses API runs on OpenAI's side. The gateway runs none of them; naming them in the 400 is
 * safe because only these known names are ever echoed, never a client's own value.
 */
export const BUILT_IN_TOOLS: ReadonlySet<string> = new Set([
  "web_search",
  "web_search_preview",
  "web_search_preview_2025_03_11",
  "web_search_2025_08_26",
  "file_search",
  "code_interpreter",
  "computer_use_preview",
  "computer_use",
  "image_generation",
  "mcp",
  "local_shell",
  "shell",
  "apply_patch",
  "custom"
])

/** Input item types of the Responses API that the gateway does not take (named in the 400, as above). */
export const UNSUPPORTED_ITEMS: ReadonlySet<string> = new Set([
  "item_reference",
  "file_search_call",
  "computer_call",
  "computer_call_output",
  "web_search_call",
  "image_generation_call",
  "code_interpreter_call",
  "local_shell_call",
  "local_shell_call_output",
  "shell_call",
  "shell_call_output",
  "apply_patch_call",
  "apply_patch_call_output",
  "mcp_list_tools",
  "mcp_approval_request",
  "mcp_approval_response",
  "mcp_call",
  "custom_tool_call",
  "custom_tool_call_output",
  "compaction"
])

const SUPPORTED_ITEMS: ReadonlySet<string> = new Set(["message", "function_call", "function_call_output", "reasoning"])

export const ResponsesMessages = {
  builtInTool: (where: string, type: string) =>
    `${where} 의 ${type} 도구는 이 게이트웨이에서 실행할 수 없습니다. type: function 도구만 사용할 수 있습니다.`,
  unknownTool: (where: string) => `${where} 의 도구 type 은 function 이어야 합니다.`,
  unsupportedItem: (where: string, type: string) =>
    `${where} 의 ${type} 항목은 지원하지 않습니다. message, function_call, function_call_output, reasoning 항목만 사용할 수 있습니다.`,
  unknownItem: (where: string) =>
    `${where} 의 type 은 message, function_call, function_call_output, reasoning 중 하나여야 합니다.`,
  tooManyInputItems: (max: number) => `input 은 최대 ${max}개 항목까지 허용됩니다.`,
  textFormat: "text.format 은 text 만 지원합니다. json_schema, json_object 형식의 구조화 출력은 지원하지 않습니다.",
  background: "background 모드는 지원하지 않습니다.",
  conversation: "conversation 은 지원하지 않습니다. previous_response_id 를 사용하세요.",
  prompt: "prompt 템플릿은 지원하지 않습니다.",
  fileInput: "파일 입력(input_file, file_id)은 지원하지 않습니다. 이미지는 image_url 로 보내세요.",
  functionOutputImage: "function_call_output 의 output 은 문자열 또는 input_text 파트 배열이어야 합니다.",
  previousAndConversation: "previous_response_id 와 conversation 은 함께 사용할 수 없습니다.",
  responseNotFound: "응답을 찾을 수 없습니다. 저장되지 않았거나(store: false) 보관 기간이 지났거나 다른 계정의 응답입니다.",
  storedTooLong: "이전 응답 체인이 너무 깁니다. 새 대화를 시작하세요."
} as const

// ----- the wire schema (unknown keys are stripped on decode)

const InputText = Schema.Struct({ type: Schema.Literal("input_text"), text: Schema.String })
const InputImage = Schema.Struct({
  type: Schema.Literal("input_image"),
  image_url: Schema.String.check(Schema.makeFilter((u) => u.startsWith("https://") || u.startsWith("data:"), {
    message: "image_url must be an https URL or a data: URI"
  })),
  detail: opt(Schema.Literals(["auto", "low", "high", "original"]))
})
/** Assistant turns sent back as history. */
const OutputText = Schema.Struct({ type: Schema.Literal("output_text"), text: Schema.String })
const Refusal = Schema.Struct({ type: Schema.Literal("refusal"), refusal: Schema.String })
const InputPart = Schema.Union([InputText, InputImage, OutputText, Refusal])

const MessageItem = Schema.Struct({
  type: opt(Schema.Literal("message")),
  role: Schema.Literals(["user", "system", "developer", "assistant"]),
  content: Schema.Union([Schema.String, Schema.Array(InputPart)])
})
const FunctionCallItem = Schema.Struct({
  type: Schema.Literal("function_call"),
  call_id: Bounded(ID_CHARS),
  name: Bounded(ID_CHARS),
  arguments: Schema.String
})
const FunctionCallOutputItem = Schema.Struct({
  type: Schema.Literal("function_call_output"),
  call_id: Bounded(ID_CHARS),
  output: Schema.Union([Schema.String, Schema.Array(InputText)])
})
const ReasoningItem = Schema.Struct({
  type: Schema.Literal("reasoning"),
  summary: opt(Schema.Array(Schema.Struct({ type: Schema.Literal("summary_text"), text: Schema.String }))),
  content: opt(Schema.NullOr(Schema.Array(Schema.Struct({ type: Schema.Literal("reasoning_text"), text: Schema.String }))))
})
const InputItem = Schema.Union([MessageItem, FunctionCallItem, FunctionCallOutputItem, ReasoningItem])
export type InputItem = typeof InputItem.Type

const FunctionTool = Schema.Struct({
  type: Schema.Literal("function"),
  name: ToolName,
  description: opt(Schema.NullOr(Schema.String)),
  parameters: opt(Schema.NullOr(Schema.Record(Schema.String, Schema.Unknown))),
  strict: opt(Schema.NullOr(Schema.Boolean))
})
export type FunctionTool = typeof FunctionTool.Type

const ToolChoice = Schema.Union([
  Schema.Literals(["auto", "required", "none"]),
  Schema.Struct({ type: Schema.Literal("function"), name: Bounded(ID_CHARS) })
])
export type ResponsesToolChoice = typeof ToolChoice.Type

/** Reasoning efforts of the Responses API; mapped to a model's own efforts by `nearestEffort`. */
export const ResponsesEffort = Schema.Literals(["none", "minimal", "low", "medium", "high", "xhigh"])
export type ResponsesEffort = typeof ResponsesEffort.Type

export const ResponsesRequest = Schema.Struct({
  model: Bounded(MODEL_CHARS),
  input: opt(Schema.Union([Schema.String, Schema.Array(InputItem)])),
  instructions: opt(Schema.NullOr(Schema.String)),
  tools: opt(Schema.Array(FunctionTool)),
  tool_choice: opt(ToolChoice),
  parallel_tool_calls: opt(Schema.NullOr(Schema.Boolean)),
  max_output_tokens: opt(Schema.NullOr(Schema.Int.check(Schema.isGreaterThan(0)))),
  temperature: opt(Schema.NullOr(Schema.Number.check(Schema.isFinite(), Schema.isBetween({ minimum: 0, maximum: 2 })))),
  top_p: opt(Schema.NullOr(Schema.Number.check(Schema.isFinite(), Schema.isBetween({ minimum: 0, maximum: 1 })))),
  reasoning: opt(Schema.NullOr(Schema.Struct({ effort: opt(Schema.NullOr(ResponsesEffort)) }))),
  stream: opt(Schema.NullOr(Schema.Boolean)),
  store: opt(Schema.NullOr(Schema.Boolean)),
  previous_response_id: opt(Schema.NullOr(Bounded(RESPONSE_ID_CHARS))),
  metadata: opt(Schema.NullOr(Schema.Record(Bounded(METADATA_KEY_CHARS), Bounded(METADATA_VALUE_CHARS)))),
  text: opt(Schema.NullOr(Schema.Struct({
    format: opt(Schema.Struct({ type: Schema.Literal("text") }))
  })))
}).annotate({ identifier: "ResponsesRequest" })
type Wire = typeof ResponsesRequest.Type

const decode = Schema.decodeUnknownResult(ResponsesRequest)

/** A decoded Responses request: the internal chat request of its own input, and what the answer echoes. */
export interface ResponsesCall {
  /**
   * The chat request of this request's own turn: `instructions` first (as a system message), then `input`.
   * A stored conversation (`previous_response_id`) goes between the two (`withHistory`).
   */
  readonly chat: ChatRequest
  /** This turn's input as chat messages (no instructions): what a stored response keeps of its request. */
  readonly input: ReadonlyArray<Message>
  readonly instructions: string | null
  readonly effort: ResponsesEffort | null
  readonly store: boolean
  readonly previousResponseId: string | null
  readonly metadata: Readonly<Record<string, string>>
  /** The request's tools and choices as the Responses wire writes them (echoed on the response object). */
  readonly tools: ReadonlyArray<FunctionTool>
  /** As sent (null: not sent; the response object shows the API's defaults, `auto` and true). */
  readonly toolChoice: ResponsesToolChoice | null
  readonly parallelToolCalls: boolean | null
  readonly maxOutputTokens: number | null
  readonly temperature: number | null
  readonly topP: number | null
}

const FIELD_MESSAGES: Record<string, string> = {
  model: `model 은 ${MODEL_CHARS}자 이하의 문자열이어야 합니다.`,
  input: "input 은 문자열 또는 항목 배열이어야 합니다. 항목은 message, function_call, function_call_output, reasoning 입니다.",
  instructions: "instructions 는 문자열이어야 합니다.",
  tools:
    `tools 형식이 올바르지 않습니다. 최대 ${MAX_TOOLS}개, 각 도구는 {type: function, name, parameters} 형식이며 이름은 ^[a-zA-Z0-9_-]{1,64}$ 형식이어야 합니다.`,
  tool_choice: "tool_choice 는 auto, required, none 또는 {type: function, name} 이어야 합니다.",
  parallel_tool_calls: "parallel_tool_calls 는 true 또는 false 여야 합니다.",
  max_output_tokens: "max_output_tokens 는 양의 정수여야 합니다.",
  temperature: "temperature 는 0 이상 2 이하의 숫자여야 합니다.",
  top_p: "top_p 는 0 이상 1 이하의 숫자여야 합니다.",
  reasoning: "reasoning.effort 는 none, minimal, low, medium, high, xhigh 중 하나여야 합니다.",
  stream: "stream 은 true 또는 false 여야 합니다.",
  store: "store 는 true 또는 false 여야 합니다.",
  previous_response_id: `previous_response_id 는 ${RESPONSE_ID_CHARS}자 이하의 문자열이어야 합니다.`,
  metadata:
    `metadata 는 최대 ${METADATA_KEYS}개의 문자열 값을 가진 객체여야 합니다(키 ${METADATA_KEY_CHARS}자, 값 ${METADATA_VALUE_CHARS}자 이하).`,
  text: ResponsesMessages.textFormat
}

const INPUT_KEY_MESSAGES: Record<string, string> = {
  role: "message 의 role 은 user, system, developer, assistant 중 하나여야 합니다.",
  content: "message 의 content 는 문자열 또는 콘텐츠 파트 배열이어야 합니다(input_text, input_image, output_text, refusal).",
  type: "콘텐츠 파트의 type 은 input_text, input_image, output_text, refusal 중 하나여야 합니다.",
  text: "text 는 문자열이어야 합니다.",
  image_url: "input_image 의 image_url 은 https URL 또는 data: URI 여야 합니다.",
  detail: "input_image 의 detail 은 auto, low, high, original 중 하나여야 합니다.",
  call_id: `call_id 는 ${ID_CHARS}자 이하의 문자열이어야 합니다.`,
  name: `function_call 의 name 은 ${ID_CHARS}자 이하의 문자열이어야 합니다.`,
  arguments: "function_call 의 arguments 는 문자열(JSON 인코딩된 객체)이어야 합니다.",
  output: ResponsesMessages.functionOutputImage,
  summary: "reasoning 의 summary 는 {type: summary_text, text} 배열이어야 합니다.",
  refusal: "refusal 은 문자열이어야 합니다."
}

const invalid = (message: string) => fail("invalid_request", { message })

const isObject = (value: unknown): value is Record<string, unknown> =>
  typeof value === "object" && value !== null && !Array.isArray(value)

/**
 * Sizes and kinds checked on the raw body before decoding, so decoding never walks an oversized array and a
 * built-in tool or unsupported item is answered by name: input items, content parts, function calls, tools
 * (count, and each one's size and depth as sent), `metadata` keys, `include` entries.
 */
const checkRaw = (body: Record<string, unknown>, limits: LimitsConfig): GatewayError | null => {
  if (body.background === true) return invalid(ResponsesMessages.background)
  if (body.conversation !== undefined && body.conversation !== null) return invalid(ResponsesMessages.conversation)
  if (body.prompt !== undefined && body.prompt !== null) return invalid(ResponsesMessages.prompt)
  const input = body.input
  if (Array.isArray(input)) {
    if (input.length > limits.messages) return invalid(ResponsesMessages.tooManyInputItems(limits.messages))
    let parts = 0
    let calls = 0
    for (let i = 0; i < input.length; i++) {
      const item = input[i]
      if (!isObject(item)) continue
      const type = item.type
      if (type !== undefined && (typeof type !== "string" || !SUPPORTED_ITEMS.has(type))) {
        const where = formatPath(["input", i])
        return invalid(
          typeof type === "string" && UNSUPPORTED_ITEMS.has(type)
            ? ResponsesMessages.unsupportedItem(where, type)
            : ResponsesMessages.unknownItem(where)
        )
      }
      if (type === "function_call") calls++
      for (const key of ["content", "summary", "output"]) {
        const list = item[key]
        if (!Array.isArray(list)) continue
        parts += list.length
        for (const part of list) {
          if (isObject(part) && (part.type === "input_file" || (part.type === "input_image" && part.file_id !== undefined))) {
            return invalid(ResponsesMessages.fileInput)
          }
        }
      }
    }
    if (parts > MAX_CONTENT_PARTS) return invalid(InferenceMessages.tooManyContentParts(MAX_CONTENT_PARTS))
    if (calls > MAX_TOOL_CALLS) return invalid(InferenceMessages.tooManyToolCalls(MAX_TOOL_CALLS))
  }
  const tools = body.tools
  if (Array.isArray(tools)) {
    if (tools.length > MAX_TOOLS) return invalid(InferenceMessages.tooManyTools(MAX_TOOLS))
    for (let t = 0; t < tools.length; t++) {
      const tool = tools[t]
      const where = formatPath(["tools", t])
      const type = isObject(tool) ? tool.type : undefined
      if (type !== "function") {
        return invalid(
          typeof type === "string" && BUILT_IN_TOOLS.has(type)
            ? ResponsesMessages.builtInTool(where, type)
            : ResponsesMessages.unknownTool(where)
        )
      }
      // `parameters` sits one level down in `{type, name, parameters}`.
      const bound = exceedsJsonBounds(tool, limits.tool_schema_depth + 1, limits.tool_schema_bytes)
      if (bound === "depth") return invalid(InferenceMessages.toolTooDeep(where, limits.tool_schema_depth))
      if (bound === "size") return invalid(InferenceMessages.toolTooLarge(where, limits.tool_schema_bytes))
    }
  }
  const choice = body.tool_choice
  if (isObject(choice) && typeof choice.type === "string" && BUILT_IN_TOOLS.has(choice.type)) {
    return invalid(ResponsesMessages.builtInTool("tool_choice", choice.type))
  }
  const metadata = body.metadata
  if (isObject(metadata) && Object.keys(metadata).length > METADATA_KEYS) return invalid(FIELD_MESSAGES.metadata!)
  const include = body.include
  if (include !== undefined && include !== null && (!Array.isArray(include) || include.length > MAX_INCLUDE)) {
    return invalid(`include 는 최대 ${MAX_INCLUDE}개의 문자열 배열이어야 합니다.`)
  }
  return null
}

/** Text bounds taken from config, in one pass over the decoded request. */
const checkTexts = (req: Wire, limits: LimitsConfig): GatewayError | null => {
  const max = limits.text_chars
  if (typeof req.instructions === "string" && req.instructions.length > max) {
    return tooLong("invalid_request", ["instructions"], max)
  }
  const input = req.input
  if (typeof input === "string") return input.length > max ? tooLong("invalid_request", ["input"], max) : null
  if (input === undefined) return null
  for (let i = 0; i < input.length; i++) {
    const item = input[i]!
    switch (item.type) {
      case "function_call":
        if (item.arguments.length > max) return tooLong("invalid_request", ["input", i, "arguments"], max)
        break
      case "function_call_output": {
        const output = item.output
        if (typeof output === "string") {
          if (output.length > max) return tooLong("invalid_request", ["input", i, "output"], max)
        } else {
          for (let j = 0; j < output.length; j++) {
            if (output[j]!.text.length > max) return tooLong("invalid_request", ["input", i, "output", j, "text"], max)
          }
        }
        break
      }
      case "reasoning": {
        const texts = [...(item.summary ?? []), ...(item.content ?? [])]
        let total = 0
        for (const t of texts) total += t.text.length
        if (total > max) return tooLong("invalid_request", ["input", i], max)
        break
      }
      default: {
        const content = item.content
        if (typeof content === "string") {
          if (content.length > max) return tooLong("invalid_request", ["input", i, "content"], max)
          break
        }
        for (let j = 0; j < content.length; j++) {
          const part = content[j]!
          if (part.type === "input_image") {
            if (part.image_url.length > limits.image_url_chars) {
              return tooLong("invalid_request", ["input", i, "content", j, "image_url"], limits.image_url_chars)
            }
          } else if ((part.type === "refusal" ? part.refusal : part.text).length > max) {
            return tooLong("invalid_request", ["input", i, "content", j], max)
          }
        }
      }
    }
  }
  return null
}

// ----- the mapping to chat messages

const partText = (part: typeof InputPart.Type): string | null =>
  part.type === "input_image" ? null : part.type === "refusal" ? part.refusal : part.text

/** User and system content: text and images as chat parts (a plain string when there is only text). */
const userContent = (content: string | ReadonlyArray<typeof InputPart.Type>): string | Array<ContentPart> => {
  if (typeof content === "string") return content
  if (content.every((p) => p.type !== "input_image")) return content.map(partText).join("")
  return content.map((p): ContentPart =>
    p.type === "input_image"
      ? {
        type: "image_url",
        image_url: p.detail === undefined
          ? { url: p.image_url }
          : { url: p.image_url, detail: p.detail === "original" ? "high" : p.detail }
      }
      : { type: "text", text: partText(p)! }
  )
}

type MutableAssistant = { role: "assistant"; content: string | null; tool_calls?: Array<ToolCall>; reasoning?: string }

/**
 * Input items as chat messages. Consecutive assistant output (text, function calls, and the reasoning before
 * them) is one assistant message, as chat completions carries it; a function call's `call_id` is its tool call
 * id. Reasoning not followed directly by assistant output is dropped (chat has nowhere else to carry it). An assistant
 * message with images keeps only its text (chat assistant content is text).
 */
export const toMessages = (input: string | ReadonlyArray<InputItem>): Array<Message> => {
  if (typeof input === "string") return [{ role: "user", content: input }]
  const out: Array<Message> = []
  let assistant: MutableAssistant | null = null
  let reasoning = ""
  const openAssistant = (): MutableAssistant => {
    if (assistant === null) {
      assistant = { role: "assistant", content: null }
      out.push(assistant)
    }
    if (reasoning.length > 0) {
      assistant.reasoning = (assistant.reasoning ?? "") + reasoning
      reasoning = ""
    }
    return assistant
  }
  for (const item of input) {
    switch (item.type) {
      case "reasoning": {
        // Reasoning after an assistant turn's calls starts the next turn.
        if (assistant !== null && (assistant as MutableAssistant).tool_calls !== undefined) assistant = null
        const text = (item.content ?? []).map((c) => c.text).join("") ||
          (item.summary ?? []).map((s) => s.text).join("\n\n")
        reasoning += text
        break
      }
      case "function_call": {
        const target = openAssistant()
        ;(target.tool_calls ??= []).push({
          id: item.call_id,
          type: "function",
          function: { name: item.name, arguments: item.arguments }
        })
        break
      }
      case "function_call_output":
        assistant = null
        reasoning = ""
        out.push({
          role: "tool",
          tool_call_id: item.call_id,
          content: typeof item.output === "string" ? item.output : item.output.map((p) => p.text).join("")
        })
        break
      default: {
        if (item.role === "assistant") {
          // Text after calls is a new assistant turn.
          if (assistant !== null && (assistant as MutableAssistant).tool_calls !== undefined) assistant = null
          const target = openAssistant()
          const text = typeof item.content === "string"
            ? item.content
            : item.content.map((p) => partText(p) ?? "").join("")
          target.content = (target.content ?? "") + text
          break
        }
        assistant = null
        reasoning = ""
        const role = item.role === "developer" ? "system" : item.role
        out.push({ role, content: userContent(item.content) } as Message)
      }
    }
  }
  return out
}

/** The chat form of a Responses tool. */
const toChatTool = (tool: FunctionTool): ToolDefinition => {
  const fn: { name: string; description?: string; parameters?: Record<string, unknown>; strict?: boolean } = {
    name: tool.name
  }
  if (typeof tool.description === "string") fn.description = tool.description
  if (tool.parameters !== undefined && tool.parameters !== null) fn.parameters = tool.parameters
  if (typeof tool.strict === "boolean") fn.strict = tool.strict
  return { type: "function", function: fn }
}

const toChatChoice = (choice: ResponsesToolChoice): NonNullable<ChatRequest["tool_choice"]> =>
  typeof choice === "string" ? choice : { type: "function", function: { name: choice.name } }

/**
 * The chat request of a turn: instructions, then the stored conversation (`history`), then this turn's input.
 * `reasoning_effort` carries the Responses effort as sent; `nearestEffort` maps it to the model's own.
 */
export const chatRequestOf = (call: ResponsesCall, history: ReadonlyArray<Message>, stream: boolean): ChatRequest => {
  const messages: Array<Message> = []
  if (call.instructions !== null && call.instructions.length > 0) {
    messages.push({ role: "system", content: call.instructions })
  }
  for (const m of history) messages.push(m)
  for (const m of call.input) messages.push(m)
  const out: { -readonly [K in keyof ChatRequest]: ChatRequest[K] } = {
    model: call.chat.model,
    messages,
    stream
  }
  if (call.maxOutputTokens !== null) out.max_tokens = call.maxOutputTokens
  if (call.temperature !== null) out.temperature = call.temperature
  if (call.topP !== null) out.top_p = call.topP
  if (call.effort !== null) out.reasoning_effort = call.effort
  if (call.tools.length > 0) {
    out.tools = call.tools.map(toChatTool)
    if (call.toolChoice !== null) out.tool_choice = toChatChoice(call.toolChoice)
    if (call.parallelToolCalls !== null) out.parallel_tool_calls = call.parallelToolCalls
  }
  return out
}

/** How an effort orders: the Responses names and the catalog's (`none`, `low`, `high`, `max`) on one scale. */
const EFFORT_RANK: Readonly<Record<string, number>> = {
  none: 0,
  minimal: 1,
  low: 1,
  medium: 2,
  high: 3,
  xhigh: 4,
  max: 4
}

/**
 * The model's own effort closest to a Responses effort (a tie goes to the lower, cheaper one): Codex and the SDKs
 * send `medium` by default, which no catalog lists. `none` on a model without reasoning is dropped; any other
 * effort there is returned unchanged, so the chat gate refuses it with the allowed list.
 */
export const nearestEffort = (
  requested: string,
  allowed: ReadonlyArray<string>
): string | undefined => {
  const rank = EFFORT_RANK[requested]
  if (allowed.length === 0) return requested === "none" ? undefined : requested
  if (rank === undefined) return requested
  let best: string | undefined
  let distance = Number.POSITIVE_INFINITY
  for (const effort of allowed) {
    const d = Math.abs((EFFORT_RANK[effort] ?? 0) - rank)
    if (d < distance) {
      best = effort
      distance = d
    }
  }
  return best
}

/**
 * Decodes a parsed JSON body within `limits`: the first problem maps to `invalid_request` with a Korean message
 * naming the field and its path (a built-in tool by its type), never the client's value.
 */
export const decodeResponsesRequest = (body: unknown, limits: LimitsConfig): Result.Result<ResponsesCall, GatewayError> => {
  if (!isObject(body)) return Result.fail(invalid(NOT_AN_OBJECT))
  const raw = checkRaw(body, limits)
  if (raw) return Result.fail(raw)
  const decoded = decode(body)
  if (Result.isFailure(decoded)) {
    const { message } = describeDecodeFailure(decoded.failure, FIELD_MESSAGES, { input: INPUT_KEY_MESSAGES }, body)
    return Result.fail(invalid(message))
  }
  const req = decoded.success
  const texts = checkTexts(req, limits)
  if (texts) return Result.fail(texts)
  const input = toMessages(req.input ?? [])
  const base: ResponsesCall = {
    chat: { model: req.model, messages: input },
    input,
    instructions: req.instructions ?? null,
    effort: req.reasoning?.effort ?? null,
    store: req.store ?? true,
    previousResponseId: req.previous_response_id ?? null,
    metadata: req.metadata ?? {},
    tools: req.tools ?? [],
    toolChoice: req.tool_choice ?? null,
    parallelToolCalls: req.parallel_tool_calls ?? null,
    maxOutputTokens: req.max_output_tokens ?? null,
    temperature: req.temperature ?? null,
    topP: req.top_p ?? null
  }
  const chat = chatRequestOf(base, [], req.stream === true)
  if (chat.messages.length === 0 && base.previousResponseId === null) {
    return Result.fail(invalid("input 이 필요합니다. 문자열 또는 항목 배열을 보내세요."))
  }
  return Result.succeed({ ...base, chat })
}
