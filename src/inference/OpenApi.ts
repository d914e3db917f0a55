import { Effect, Schema } from "effect"
import { HttpRouter, HttpServerResponse } from "effect/http"
import { HttpApi, HttpApiEndpoint, HttpApiGroup, HttpApiSchema, OpenApi } from "effect/http-api"
import { Catalog, type Code, codesAnsweredAt, fail, type InferenceStage } from "../errors/Catalog.js"
import { inferenceBody } from "../errors/Render.js"
import { ChatRequest, ToolCall } from "./ChatRequest.js"
import { EmbeddingsRequest } from "./EmbeddingsRequest.js"

// Response schemas document the wire format (numbers are Finite: JSON carries no Infinity or NaN, and a plain
// Number would document them as strings); requests reuse the schemas that validate them.
const ErrorEnvelope = Schema.Struct({
  error: Schema.Struct({
    message: Schema.String,
    type: Schema.String,
    code: Schema.optionalKey(Schema.String),
    resets_at: Schema.optionalKey(Schema.String)
  })
}).annotate({ identifier: "ErrorEnvelope" })

const Pool = Schema.Struct({
  used_pct: Schema.Finite,
  remaining_pct: Schema.Finite,
  resets_at: Schema.NullOr(Schema.String),
  resets_in_seconds: Schema.Int,
  request_pct: Schema.optionalKey(Schema.Finite)
}).annotate({ identifier: "Pool" })

const Receipt = Schema.Struct({
  request_id: Schema.String,
  session: Pool,
  weekly: Pool,
  rpm: Schema.Struct({ limit: Schema.Int, remaining: Schema.Int })
}).annotate({ identifier: "QuotaReceipt" })

const TokenUsage = Schema.Struct({
  prompt_tokens: Schema.Int,
  completion_tokens: Schema.Int,
  total_tokens: Schema.Int
}).annotate({ identifier: "TokenUsage" })

const ChatCompletion = Schema.Struct({
  id: Schema.String,
  object: Schema.Literal("chat.completion"),
  created: Schema.Int,
  model: Schema.String,
  choices: Schema.Array(Schema.Struct({
    index: Schema.Int,
    message: Schema.Struct({
      role: Schema.Literal("assistant"),
      content: Schema.NullOr(Schema.String),
      reasoning: Schema.optionalKey(Schema.String),
      tool_calls: Schema.optionalKey(Schema.Array(ToolCall))
    }),
    finish_reason: Schema.Literals(["stop", "length", "tool_calls"])
  })),
  usage: TokenUsage,
  wellspring: Schema.optionalKey(Receipt)
}).annotate({ identifier: "ChatCompletion", description: "With stream: true the body is an SSE stream of chat.completion.chunk frames ending in data: [DONE]." })

const Model = Schema.Struct({
  id: Schema.String,
  object: Schema.Literal("model"),
  created: Schema.Int,
  owned_by: Schema.String,
  supports_tools: Schema.Boolean,
  supports_reasoning: Schema.Boolean,
  supports_images: Schema.Boolean,
  supports_embeddings: Schema.Boolean,
  max_output_tokens: Schema.Int,
  max_input_tokens: Schema.Int,
  rate_limit_rpm: Schema.Int
}).annotate({ identifier: "Model" })

const Account = Schema.Struct({
  object: Schema.Literal("account"),
  id: Schema.String,
  display_id: Schema.Int,
  display_name: Schema.String,
  username: Schema.String,
  is_legacy: Schema.Boolean,
  is_admin: Schema.Boolean,
  key_label: Schema.String,
  created_at: Schema.Int,
  last_rotated_at: Schema.Int,
  email_registered: Schema.Boolean
}).annotate({ identifier: "Account" })

const UsageBucket = Schema.Struct({
  used_pct: Schema.Finite,
  remaining_pct: Schema.Finite,
  resets_at: Schema.NullOr(Schema.String),
  resets_in_seconds: Schema.Int,
  by_model: Schema.Array(Schema.Struct({ model_id: Schema.String, request_count: Schema.Int, pct_of_total: Schema.Finite }))
})

const EmbeddingsRequestDoc = EmbeddingsRequest.annotate({
  identifier: "EmbeddingsRequest",
  description: "encoding_format: `float` (default) or `base64` (little-endian float32, base64-encoded)."
})

const Embeddings = Schema.Struct({
  object: Schema.Literal("list"),
  data: Schema.Array(Schema.Struct({
    object: Schema.Literal("embedding"),
    index: Schema.Int,
    embedding: Schema.Union([Schema.Array(Schema.Finite), Schema.String])
  })),
  model: Schema.String,
  usage: Schema.Struct({ prompt_tokens: Schema.Int, total_tokens: Schema.Int })
}).annotate({ identifier: "Embeddings", description: "Each embedding has exactly 1024 dimensions." })

class InferenceGroup extends HttpApiGroup.make("inference").add(
  HttpApiEndpoint.post("chatCompletions", "/v1/chat/completions", {
    payload: ChatRequest,
    success: ChatCompletion,
    error: ErrorEnvelope.pipe(HttpApiSchema.status(400))
  }),
  HttpApiEndpoint.post("embeddings", "/v1/embeddings", {
    payload: EmbeddingsRequestDoc,
    success: Embeddings,
    error: ErrorEnvelope.pipe(HttpApiSchema.status(400))
  }),
  HttpApiEndpoint.get("models", "/v1/models", {
    success: Schema.Struct({ object: Schema.Literal("list"), data: Schema.Array(Model) })
  }),
  HttpApiEndpoint.get("me", "/v1/me", { success: Account, error: ErrorEnvelope.pipe(HttpApiSchema.status(401)) }),
  HttpApiEndpoint.get("usage", "/v1/usage", {
    success: Schema.Struct({ object: Schema.Literal("usage"), session: UsageBucket, weekly: UsageBucket })
  })
) {}

export class InferenceApi extends HttpApi.make("wellspring").add(InferenceGroup).annotate(OpenApi.Title, "wellspring inference API")
  .annotate(OpenApi.Version, "1.0.0")
{}

/**
 * The request steps each operation runs. Its error responses are the catalog's codes answered at those steps
 * (`codesAnsweredAt`), each with the status, type and wire code the catalog gives it: nothing is listed here by hand.
 */
const OPERATION_STAGES: Readonly<Record<string, ReadonlyArray<InferenceStage>>> = {
  "inference.chatCompletions": ["body", "chat_request", "key", "gate", "admission", "upstream"],
  "inference.embeddings": ["body", "embeddings_request", "key", "gate", "admission", "upstream"],
  "inference.models": ["key"],
  "inference.me": ["key"],
  "inference.usage": ["key"]
}

/**
 * One response per status: the wire codes as its description, and per code an example body rendered by the
 * server's own renderer (so its `type`, `code` and Korean message are exactly what a client receives).
 */
const errorResponses = (codes: ReadonlyArray<Code>, envelope: unknown): Record<string, unknown> => {
  const groups = new Map<number, Array<Code>>()
  for (const code of codes) {
    const status = Catalog[code].status
    groups.set(status, [...(groups.get(status) ?? []), code])
  }
  return Object.fromEntries([...groups].sort(([a], [b]) => a - b).map(([status, group]) => [String(status), {
    description: group.map((code) => Catalog[code].wire ?? `${code} (no code field)`).join(", "),
    content: {
      "application/json": {
        schema: envelope,
        examples: Object.fromEntries(group.map((code) => [code, {
          summary: `${Catalog[code].wire ?? "(no code)"}: ${Catalog[code].type}`,
          value: inferenceBody(fail(code))
        }]))
      }
    }
  }]))
}

/**
 * A `$ref` to `schema` among the document's component schemas, adding its definitions when the generated
 * document lacks them (v3's `OpenApiJsonSchema.makeWithDefs`).
 */
const componentRef = (schema: Schema.Top, schemas: Record<string, unknown>): unknown => {
  const document = Schema.toJsonSchemaDocument(schema, { onExcessProperty: "error" }) // as OpenApi.fromApi does
  for (const [name, definition] of Object.entries(document.definitions)) {
    if (!(name in schemas)) schemas[name] = JSON.parse(JSON.stringify(definition).replaceAll("#/$defs/", "#/components/schemas/"))
  }
  return JSON.parse(JSON.stringify(document.schema).replaceAll("#/$defs/", "#/components/schemas/"))
}

/**
 * The generated document, corrected where the HttpApi defaults do not describe this server: requests
 * that fail to decode get our error envelope (never `HttpApiDecodeError`), every operation needs the
 * bearer key, and a streamed chat answer is `text/event-stream`.
 */
const finalize = (generated: OpenApi.OpenAPISpec): OpenApi.OpenAPISpec => {
  const doc = structuredClone(generated) as any
  const schemas = doc.components.schemas as Record<string, unknown>
  for (const name of ["HttpApiDecodeError", "Issue", "PropertyKey"]) delete schemas[name]
  const envelope = componentRef(ErrorEnvelope, schemas)
  doc.components.securitySchemes = { bearer: { type: "http", scheme: "bearer", description: "An API key (sk-ws-... or legacy ws-...)" } }
  doc.security = [{ bearer: [] }]
  for (const operations of Object.values(doc.paths as Record<string, Record<string, any>>)) {
    for (const operation of Object.values(operations)) {
      operation.security = [{ bearer: [] }]
      const responses: Record<string, any> = {}
      for (const [status, response] of Object.entries(operation.responses as Record<string, any>)) {
        if (status.startsWith("2")) responses[status] = response
      }
      const stages = OPERATION_STAGES[operation.operationId]
      if (stages === undefined) throw new Error(`OpenAPI: no request steps listed for ${operation.operationId}`)
      Object.assign(responses, errorResponses(codesAnsweredAt(...stages), envelope))
      operation.responses = responses
    }
  }
  const chat = doc.paths["/v1/chat/completions"].post.responses["200"]
  chat.content["text/event-stream"] = {
    schema: {
      type: "string",
      description: "With stream: true: `data: <chat.completion.chunk JSON>` frames, `: ping` comments while the upstream is idle, and `data: [DONE]` last."
    }
  }
  return doc
}

export const spec = finalize(OpenApi.fromApi(InferenceApi))

const specText = JSON.stringify(spec)

export const openApiRoute = HttpRouter.add(
  "GET",
  "/v1/openapi.json",
  Effect.sync(() => HttpServerResponse.text(specText, { contentType: "application/json" }))
)
