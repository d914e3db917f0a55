/**
 * An Anthropic Messages request (`POST /v1/messages`) to the internal chat request: bounded on the raw body,
 * decoded (unknown fields stripped), translated (system, blocks, tool use and results, thinking, tool choice),
 * then checked again as a chat request so the same text bounds apply to every wire.
 */
import { Result, Schema } from "effect"
import type { LimitsConfig } from "../../config/GatewayConfig.js"
import { fail, type GatewayError, InferenceMessages } from "../../errors/Catalog.js"
import {
  type ChatRequest,
  decodeChatRequest,
  describeDecodeFailure,
  MAX_CONTENT_PARTS,
  MAX_TOOLS,
  MODEL_CHARS,
  NOT_AN_OBJECT,
  STOP_CHARS,
  STOP_SEQUENCES
} from "../../inference/ChatRequest.js"
import { exceedsJsonBounds, formatPath } from "../../inference/JsonGuard.js"
import { type Decoded, FIELD_NAME, ignoredFields } from "../../inference/Codec.js"
import { Bounded, ID_CHARS, ToolName } from "../../wire/ChatSchemas.js"
import { AnthropicMessages } from "./Messages.js"

const opt = <S extends Schema.Top>(schema: S) => Schema.optionalKey(schema)

const TextBlock = Schema.Struct({ type: Schema.Literal("text"), text: Schema.String })
const ImageSource = Schema.Union([
  Schema.Struct({
    type: Schema.Literal("base64"),
    media_type: Schema.Literals(["image/jpeg", "image/png", "image/gif", "image/webp"]),
    data: Schema.String
  }),
  Schema.Struct({ type: Schema.Literal("url"), url: Schema.String })
])
const ImageBlock = Schema.Struct({ type: Schema.Literal("image"), source: ImageSource })
const ToolUseBlock = Schema.Struct({
  type: Schema.Literal("tool_use"),
  id: Bounded(ID_CHARS),
  name: Bounded(ID_CHARS),
  input: Schema.Record(Schema.String, Schema.Unknown)
})
const ToolResultBlock = Schema.Struct({
  type: Schema.Literal("tool_result"),
  tool_use_id: Bounded(ID_CHARS),
  content: opt(Schema.Union([Schema.String, Schema.Array(Schema.Union([TextBlock, ImageBlock]))])),
  is_error: opt(Schema.Boolean)
})
const ThinkingBlock = Schema.Struct({ type: Schema.Literal("thinking"), thinking: Schema.String })
const RedactedThinkingBlock = Schema.Struct({ type: Schema.Literal("redacted_thinking") })
const Block = Schema.Union([TextBlock, ImageBlock, ToolUseBlock, ToolResultBlock, ThinkingBlock, RedactedThinkingBlock])
type Block = typeof Block.Type

const Message = Schema.Struct({
  role: Schema.Literals(["user", "assistant"]),
  content: Schema.Union([Schema.String, Schema.Array(Block)])
})

const Tool = Schema.Struct({
  name: ToolName,
  description: opt(Schema.String),
  input_schema: Schema.Record(Schema.String, Schema.Unknown)
})

const ToolChoice = Schema.Union([
  Schema.Struct({ type: Schema.Literal("auto"), disable_parallel_tool_use: opt(Schema.Boolean) }),
  Schema.Struct({ type: Schema.Literal("any"), disable_parallel_tool_use: opt(Schema.Boolean) }),
  Schema.Struct({ type: Schema.Literal("tool"), name: Bounded(ID_CHARS), disable_parallel_tool_use: opt(Schema.Boolean) }),
  Schema.Struct({ type: Schema.Literal("none") })
])

const Thinking = Schema.Union([
  Schema.Struct({ type: Schema.Literal("enabled"), budget_tokens: Schema.Int.check(Schema.isGreaterThan(0)) }),
  Schema.Struct({ type: Schema.Literals(["disabled", "adaptive"]) })
])

const Positive = Schema.Int.check(Schema.isGreaterThan(0))
const Unit = Schema.Number.check(Schema.isFinite(), Schema.isBetween({ minimum: 0, maximum: 1 }))

export const MessagesRequest = Schema.Struct({
  model: Bounded(MODEL_CHARS),
  max_tokens: Positive,
  messages: Schema.Array(Message).check(Schema.isMinLength(1)),
  system: opt(Schema.Union([Schema.String, Schema.Array(TextBlock)])),
  tools: opt(Schema.Array(Tool)),
  tool_choice: opt(ToolChoice),
  stop_sequences: opt(Schema.Array(Bounded(STOP_CHARS))),
  temperature: opt(Unit),
  top_p: opt(Unit),
  top_k: opt(Positive),
  stream: opt(Schema.Boolean),
  thinking: opt(Thinking),
  metadata: opt(Schema.Record(Schema.String, Schema.Unknown))
}).annotate({ identifier: "AnthropicMessagesRequest" })
export type MessagesRequest = typeof MessagesRequest.Type

/** `count_tokens` takes the same body without `max_tokens`. */
export const CountTokensRequest = MessagesRequest.mapFields(({ max_tokens: _, ...rest }) => ({
  ...rest,
  max_tokens: opt(Positive)
}))

/** Fields of the request that are read; any other top-level field is named as ignored. `top_k` is accepted and dropped. */
const HONOURED = new Set([
  "model",
  "max_tokens",
  "messages",
  "system",
  "tools",
  "tool_choice",
  "stop_sequences",
  "temperature",
  "top_p",
  "stream",
  "thinking",
  "metadata"
])
/** Block types of the Messages API the gateway cannot translate (documents, search results, server tools' blocks). */
const SUPPORTED_BLOCKS = new Set(["text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking"])

const safeName = (value: unknown): string =>
  typeof value === "string" && FIELD_NAME.test(value) ? value : "(알 수 없음)"

/** Bounds checked on the raw body before decoding: counts, unsupported block and tool types, tool sizes. */
const checkRaw = (body: Record<string, unknown>, limits: LimitsConfig): GatewayError | null => {
  const messages = body.messages
  if (Array.isArray(messages)) {
    if (messages.length > limits.messages) {
      return fail("invalid_messages", { message: InferenceMessages.tooManyMessages(limits.messages) })
    }
    let blocks = 0
    for (let i = 0; i < messages.length; i++) {
      const content = (messages[i] as { readonly content?: unknown } | null)?.content
      if (!Array.isArray(content)) continue
      blocks += content.length
      for (let j = 0; j < content.length; j++) {
        const block = content[j] as { readonly type?: unknown; readonly content?: unknown } | null
        // A tool result's own blocks count too: decoding walks them all.
        if (Array.isArray(block?.content)) blocks += block.content.length
        const type = block?.type
        if (typeof type === "string" && !SUPPORTED_BLOCKS.has(type)) {
          return fail("invalid_messages", {
            message: AnthropicMessages.unsupportedBlock(safeName(type), formatPath(["messages", i, "content", j, "type"]))
          })
        }
      }
      if (blocks > MAX_CONTENT_PARTS) {
        return fail("invalid_messages", { message: InferenceMessages.tooManyContentParts(MAX_CONTENT_PARTS) })
      }
    }
  }
  const system = body.system
  if (Array.isArray(system) && system.length > MAX_CONTENT_PARTS) {
    return fail("invalid_request", { message: InferenceMessages.tooManyContentParts(MAX_CONTENT_PARTS) })
  }
  const tools = body.tools
  if (Array.isArray(tools)) {
    if (tools.length > MAX_TOOLS) return fail("invalid_request", { message: InferenceMessages.tooManyTools(MAX_TOOLS) })
    for (let t = 0; t < tools.length; t++) {
      const type = (tools[t] as { readonly type?: unknown } | null)?.type
      if (type !== undefined && type !== "custom") {
        return fail("invalid_request", { message: AnthropicMessages.serverTool(safeName(type)) })
      }
      const bound = exceedsJsonBounds(tools[t], limits.tool_schema_depth + 1, limits.tool_schema_bytes)
      if (bound !== null) {
        const where = formatPath(["tools", t])
        return fail("invalid_request", {
          message: bound === "depth"
            ? InferenceMessages.toolTooDeep(where, limits.tool_schema_depth)
            : InferenceMessages.toolTooLarge(where, limits.tool_schema_bytes)
        })
      }
    }
  }
  const stops = body.stop_sequences
  if (Array.isArray(stops) && stops.length > STOP_SEQUENCES) {
    return fail("invalid_request", { message: AnthropicMessages.field.stop_sequences })
  }
  return null
}

// ----- ids

/** `toolu_X` for an internal `call_X`: the same id in Anthropic's shape, so a conversation round-trips. */
export const toAnthropicId = (id: string): string => id.startsWith("call_") ? `toolu_${id.slice(5)}` : id
/** `call_X` for a client's `toolu_X` (the inverse of `toAnthropicId`); other ids pass unchanged. */
export const toInternalId = (id: string): string => id.startsWith("toolu_") ? `call_${id.slice(6)}` : id

// ----- translation

type ChatPart = { type: "text"; text: string } | { type: "image_url"; image_url: { url: string } }
type ChatMessage = Record<string, unknown>

const imagePart = (block: Extract<Block, { type: "image" }>): ChatPart => ({
  type: "image_url",
  image_url: {
    url: block.source.type === "base64" ? `data:${block.source.media_type};base64,${block.source.data}` : block.source.url
  }
})

/** A tool error is marked in the text the model reads (chat tool messages have no error flag). */
export const TOOL_ERROR_PREFIX = "[tool error] "

const userMessages = (content: ReadonlyArray<Block>, out: Array<ChatMessage>): void => {
  const parts: Array<ChatPart> = []
  for (const block of content) {
    switch (block.type) {
      case "text":
        parts.push({ type: "text", text: block.text })
        break
      case "image":
        parts.push(imagePart(block))
        break
      case "tool_result": {
        let text = ""
        if (typeof block.content === "string") text = block.content
        else {
          for (const item of block.content ?? []) {
            if (item.type === "text") text += (text.length > 0 ? "\n" : "") + item.text
            // Images a tool returned follow the tool results, in the user turn that carries them.
            else parts.push(imagePart(item))
          }
        }
        out.push({
          role: "tool",
          tool_call_id: toInternalId(block.tool_use_id),
          content: block.is_error === true ? TOOL_ERROR_PREFIX + text : text
        })
        break
      }
      // A user turn carries no tool use or thinking of its own; such blocks are dropped.
      default:
        break
    }
  }
  if (parts.length > 0) out.push({ role: "user", content: parts })
}

const assistantMessage = (content: ReadonlyArray<Block>): ChatMessage | GatewayError => {
  let text = ""
  let reasoning = ""
  const calls: Array<unknown> = []
  for (const block of content) {
    switch (block.type) {
      case "text":
        text += block.text
        break
      case "thinking":
        reasoning += block.thinking
        break
      case "tool_use":
        calls.push({
          id: toInternalId(block.id),
          type: "function",
          function: { name: block.name, arguments: JSON.stringify(block.input) }
        })
        break
      case "image":
      case "tool_result":
        return fail("invalid_messages", { message: AnthropicMessages.assistantBlock })
      default:
        break
    }
  }
  return {
    role: "assistant",
    content: text.length > 0 || calls.length === 0 ? text : null,
    ...(calls.length > 0 ? { tool_calls: calls } : {}),
    ...(reasoning.length > 0 ? { reasoning } : {})
  }
}

/** The effort a thinking budget asks for (the pipeline settles it against the model's efforts). */
export const effortOfBudget = (budget: number): string => budget < 4096 ? "low" : budget < 16384 ? "high" : "max"

/** The chat-shaped body of a decoded Messages request. */
const toChatBody = (req: Omit<MessagesRequest, "max_tokens"> & { readonly max_tokens?: number }): Record<string, unknown> | GatewayError => {
  const messages: Array<ChatMessage> = []
  if (req.system !== undefined) {
    const system = typeof req.system === "string" ? req.system : req.system.map((b) => b.text).join("\n\n")
    if (system.length > 0) messages.push({ role: "system", content: system })
  }
  for (const message of req.messages) {
    if (typeof message.content === "string") {
      messages.push({ role: message.role, content: message.content })
    } else if (message.role === "user") {
      userMessages(message.content, messages)
    } else {
      const assistant = assistantMessage(message.content)
      if (assistant instanceof Error) return assistant
      messages.push(assistant)
    }
  }
  const body: Record<string, unknown> = { model: req.model, messages, stream: req.stream === true }
  if (req.max_tokens !== undefined) body.max_tokens = req.max_tokens
  if (req.temperature !== undefined) body.temperature = req.temperature
  if (req.top_p !== undefined) body.top_p = req.top_p
  if (req.stop_sequences !== undefined && req.stop_sequences.length > 0) body.stop = req.stop_sequences
  if (req.tools !== undefined && req.tools.length > 0) {
    body.tools = req.tools.map((t) => ({
      type: "function",
      function: {
        name: t.name,
        ...(t.description !== undefined ? { description: t.description } : {}),
        parameters: t.input_schema
      }
    }))
  }
  const choice = req.tool_choice
  if (choice !== undefined) {
    body.tool_choice = choice.type === "auto"
      ? "auto"
      : choice.type === "any"
      ? "required"
      : choice.type === "none"
      ? "none"
      : { type: "function", function: { name: choice.name } }
    if (choice.type !== "none" && choice.disable_parallel_tool_use === true) body.parallel_tool_calls = false
  }
  const thinking = req.thinking
  if (thinking !== undefined) {
    body.reasoning_effort = thinking.type === "enabled"
      ? effortOfBudget(thinking.budget_tokens)
      : thinking.type === "disabled"
      ? "none"
      : "high"
  }
  return body
}

/** Messages that are empty after translation (a user turn of only dropped blocks) are not an error upstream. */
const decodeMessages = Schema.decodeUnknownResult(MessagesRequest)
const decodeCount = Schema.decodeUnknownResult(CountTokensRequest)

/** Translates a parsed body; `counting` for `count_tokens` (no `max_tokens` needed, never a stream). */
export const decodeMessagesRequest = (
  body: unknown,
  limits: LimitsConfig,
  counting = false
): Result.Result<Decoded, GatewayError> => {
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    return Result.fail(fail("invalid_request", { message: NOT_AN_OBJECT }))
  }
  const record = body as Record<string, unknown>
  const raw = checkRaw(record, limits)
  if (raw !== null) return Result.fail(raw)
  const decoded = counting ? decodeCount(body) : decodeMessages(body)
  if (Result.isFailure(decoded)) {
    const { field, message } = describeDecodeFailure(
      decoded.failure,
      AnthropicMessages.field,
      { messages: AnthropicMessages.messageKey },
      body
    )
    return Result.fail(fail(field === "messages" ? "invalid_messages" : "invalid_request", { message }))
  }
  const chat = toChatBody(decoded.success)
  if (chat instanceof Error) return Result.fail(chat)
  const request = decodeChatRequest(chat, limits)
  if (Result.isFailure(request)) return Result.fail(request.failure)
  const internal: ChatRequest = request.success
  return Result.succeed({ request: internal, ignored: ignoredFields(record, HONOURED), effortPreference: true })
}
