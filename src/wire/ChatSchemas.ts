/**
 * The chat wire shapes shared by the request decoder (`inference/ChatRequest.ts`) and the upstream port
 * (`upstream/Upstream.ts`): one Schema per shape, and its TypeScript type derived from it (`typeof X.Type`),
 * so what the gateway validates is, by construction, what it forwards. No runtime dependency but `effect`.
 *
 * Bounds fixed by the contract live here; bounds taken from config (`limits`) are checked around decoding, in
 * `inference/ChatRequest.ts`. Unknown fields are stripped on decode (never forwarded).
 */
import { Schema } from "effect"

const opt = <S extends Schema.Top>(schema: S) => Schema.optionalKey(schema)

/** Longest id or name a client echoes back (tool call ids, `tool_call_id`, tool call and tool choice names). */
export const ID_CHARS = 256

export const Bounded = (max: number) => Schema.String.check(Schema.isMaxLength(max))

export const TextPart = Schema.Struct({ type: Schema.Literal("text"), text: Schema.String })
export const ImagePart = Schema.Struct({
  type: Schema.Literal("image_url"),
  image_url: Schema.Struct({
    url: Schema.String.check(Schema.makeFilter((u) => u.startsWith("https://") || u.startsWith("data:"), {
      message: "image_url.url must be an https URL or a data: URI"
    })),
    detail: opt(Schema.Literals(["auto", "low", "high"]))
  })
})
export const ContentPart = Schema.Union([TextPart, ImagePart])
export type ContentPart = typeof ContentPart.Type
const Content = Schema.Union([Schema.String, Schema.Array(ContentPart)])

export const ToolCall = Schema.Struct({
  id: Bounded(ID_CHARS),
  type: Schema.Literal("function"),
  function: Schema.Struct({ name: Bounded(ID_CHARS), arguments: Schema.String })
})
export type ToolCall = typeof ToolCall.Type

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
  tool_call_id: Bounded(ID_CHARS),
  content: Schema.String
})
/** A chat message as the gateway forwards it (the spec's Message shape). */
export const Message = Schema.Union([SystemMessage, UserMessage, AssistantMessage, ToolMessage])
export type Message = typeof Message.Type

// The `u` flag lets Effect 4 put the pattern in the JSON Schema (it exports no pattern without it); same matches.
export const ToolName = Schema.String.check(Schema.isPattern(/^[a-zA-Z0-9_-]{1,64}$/u, {
  message: "tool name must match ^[a-zA-Z0-9_-]{1,64}$"
}))

export const ToolDefinition = Schema.Struct({
  type: Schema.Literal("function"),
  function: Schema.Struct({
    name: ToolName,
    description: opt(Schema.String),
    parameters: opt(Schema.Record(Schema.String, Schema.Unknown)),
    strict: opt(Schema.Boolean)
  })
})
export type ToolDefinition = typeof ToolDefinition.Type

export const ToolChoice = Schema.Union([
  Schema.Literals(["auto", "required", "none"]),
  Schema.Struct({ type: Schema.Literal("function"), function: Schema.Struct({ name: Bounded(ID_CHARS) }) })
])
export type ToolChoice = typeof ToolChoice.Type

/**
 * The reasoning efforts a model may allow (`reasoning_efforts` in the catalog). A request's `reasoning_effort`
 * is decoded as any string and checked against the model's list, so an unknown value is answered with
 * `invalid_reasoning_effort` (listing the allowed ones) rather than a schema error.
 */
export const ReasoningEffort = Schema.Literals(["none", "low", "high", "max"])
export type ReasoningEffort = typeof ReasoningEffort.Type
