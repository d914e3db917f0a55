import { Either, ParseResult, Schema } from "effect"
import { fail, type GatewayError } from "../errors/Catalog.js"

const opt = <S extends Schema.Schema.All>(schema: S) => Schema.optionalWith(schema, { exact: true })

// Flat schemas built once at module scope; unknown fields are stripped on decode (never forwarded).

export const TextPart = Schema.Struct({ type: Schema.Literal("text"), text: Schema.String })
export const ImagePart = Schema.Struct({
  type: Schema.Literal("image_url"),
  image_url: Schema.Struct({
    url: Schema.String.pipe(Schema.filter((u) => u.startsWith("https://") || u.startsWith("data:"), {
      message: () => "image_url.url must be an https URL or a data: URI"
    })),
    detail: opt(Schema.Literal("auto", "low", "high"))
  })
})
export const ContentPart = Schema.Union(TextPart, ImagePart)
const Content = Schema.Union(Schema.String, Schema.Array(ContentPart))

export const ToolCall = Schema.Struct({
  id: Schema.String,
  type: Schema.Literal("function"),
  function: Schema.Struct({ name: Schema.String, arguments: Schema.String })
})

export const SystemMessage = Schema.Struct({ role: Schema.Literal("system"), content: Content })
export const UserMessage = Schema.Struct({ role: Schema.Literal("user"), content: Content })
export const AssistantMessage = Schema.Struct({
  role: Schema.Literal("assistant"),
  content: Schema.NullOr(Schema.String),
  tool_calls: opt(Schema.Array(ToolCall)),
  reasoning: opt(Schema.String)
})
export const ToolMessage = Schema.Struct({
  role: Schema.Literal("tool"),
  tool_call_id: Schema.String,
  content: Schema.String
})
export const Message = Schema.Union(SystemMessage, UserMessage, AssistantMessage, ToolMessage)

export const ToolName = Schema.String.pipe(Schema.pattern(/^[a-zA-Z0-9_-]{1,64}$/, {
  message: () => "tool name must match ^[a-zA-Z0-9_-]{1,64}$"
}))

export const ToolDefinition = Schema.Struct({
  type: Schema.Literal("function"),
  function: Schema.Struct({
    name: ToolName,
    description: opt(Schema.String),
    parameters: opt(Schema.Record({ key: Schema.String, value: Schema.Unknown })),
    strict: opt(Schema.Boolean)
  })
})

export const ToolChoice = Schema.Union(
  Schema.Literal("auto", "required", "none"),
  Schema.Struct({ type: Schema.Literal("function"), function: Schema.Struct({ name: Schema.String }) })
)

export const ChatRequest = Schema.Struct({
  model: Schema.String,
  messages: Schema.Array(Message).pipe(Schema.minItems(1)),
  stream: opt(Schema.Boolean),
  temperature: opt(Schema.Number),
  max_tokens: opt(Schema.Int.pipe(Schema.positive())),
  top_p: opt(Schema.Number),
  stop: opt(Schema.Union(Schema.String, Schema.Array(Schema.String))),
  reasoning_effort: opt(Schema.String),
  tools: opt(Schema.Array(ToolDefinition).pipe(Schema.maxItems(128, {
    message: () => "at most 128 tools"
  }))),
  tool_choice: opt(ToolChoice),
  parallel_tool_calls: opt(Schema.Boolean)
}).annotations({ identifier: "ChatCompletionRequest" })
export type ChatRequest = typeof ChatRequest.Type

const decode = Schema.decodeUnknownEither(ChatRequest)

const firstIssue = (error: ParseResult.ParseError) => ParseResult.ArrayFormatter.formatErrorSync(error)[0]

const FIELD_MESSAGES: Record<string, string> = {
  model: "model 필드(문자열)가 필요합니다.",
  tools: "tools 형식이 올바르지 않습니다. 최대 128개, 이름은 ^[a-zA-Z0-9_-]{1,64}$ 형식이어야 합니다.",
  tool_choice: "tool_choice 는 auto, required, none 또는 {type: function, function: {name}} 이어야 합니다.",
  max_tokens: "max_tokens 는 양의 정수여야 합니다.",
  stream: "stream 은 boolean 이어야 합니다.",
  stop: "stop 은 문자열 또는 문자열 배열이어야 합니다."
}

/** Decodes a parsed JSON body; maps the first issue to the catalog. */
export const decodeChatRequest = (body: unknown): Either.Either<ChatRequest, GatewayError> => {
  const result = decode(body)
  if (Either.isRight(result)) return Either.right(result.right)
  const issue = firstIssue(result.left)
  const field = String(issue?.path[0] ?? "")
  const where = issue ? `${issue.path.join(".") || "(body)"}: ${issue.message}` : "invalid body"
  if (field === "") {
    return Either.left(fail("invalid_request", { message: "요청 본문은 JSON 객체여야 합니다.", detail: where }))
  }
  if (field === "messages") {
    return Either.left(fail("invalid_messages", { message: `messages 형식이 올바르지 않습니다. (${where})`, detail: where }))
  }
  if (field === "tools" && issue?.message === "at most 128 tools") {
    return Either.left(fail("invalid_request", { message: "tools 는 최대 128개까지 허용됩니다.", detail: where }))
  }
  const message = FIELD_MESSAGES[field] ?? `${field} 값이 올바르지 않습니다.`
  return Either.left(fail("invalid_request", { message: `${message} (${where})`, detail: where }))
}
