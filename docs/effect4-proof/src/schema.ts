/**
 * Schema v3 -> v4 equivalents for every Schema API wellspring uses (config + request bodies).
 * Each `// v3:` comment shows the call it replaces.
 */
import { Effect, Result, Schema, SchemaIssue } from "effect"

// v3: Schema.Int.pipe(Schema.positive())  (positive/nonNegative were removed in v4)
export const PositiveInt = Schema.Int.check(Schema.isGreaterThan(0))
// v3: Schema.Int.pipe(Schema.nonNegative())
export const NonNegativeInt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))
// v3: Schema.Number.pipe(Schema.finite(), Schema.between(0, 2))
export const Temperature = Schema.Number.check(Schema.isFinite(), Schema.isBetween({ minimum: 0, maximum: 2 }))

/**
 * v3: Schema.optionalWith(schema, { default: () => value })
 * Key absent or `undefined` -> the default (a fresh value per decode: `Effect.sync`).
 */
export const withDefault = <S extends Schema.Top>(value: () => S["Type"]) => (schema: S) =>
  Schema.withDecodingDefaultType<S>(Effect.sync(value))(schema)

// v3: Schema.Literal("inference", "account", "status")
export const Origin = Schema.Literals(["inference", "account", "status"])
export type Origin = typeof Origin.Type

export const Listener = Schema.Struct({
  // v3: Schema.optionalWith(Schema.String, { default: () => "127.0.0.1" })
  host: Schema.String.pipe(withDefault(() => "127.0.0.1")),
  port: NonNegativeInt,
  // v3: Schema.optionalWith(Schema.Array(Origin), { default: () => [...] as const })
  origins: Schema.Array(Origin).pipe(withDefault((): ReadonlyArray<Origin> => ["inference", "account", "status"]))
})
export type Listener = typeof Listener.Type

export const Limits = Schema.Struct({
  body_bytes: PositiveInt.pipe(withDefault(() => 4 * 1024 * 1024)),
  messages: PositiveInt.pipe(withDefault(() => 1024))
})

export const Model = Schema.Struct({
  // v3: Schema.String.pipe(Schema.pattern(/^.../))
  id: Schema.String.check(Schema.isPattern(/^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$/)),
  route: Schema.Struct({ provider: Schema.String, model: Schema.String }),
  supports_reasoning: Schema.Boolean.pipe(withDefault(() => false)),
  // v3: Schema.optionalWith(Schema.NullOr(PositiveInt), { default: () => null })
  daily_cap: Schema.NullOr(PositiveInt).pipe(withDefault(() => null)),
  // v3: Schema.optional(Schema.String)   (unchanged: key absent or undefined)
  display_name: Schema.optional(Schema.String)
})

export const Provider = Schema.Union([
  Schema.Struct({ kind: Schema.Literal("simulated") }),
  Schema.Struct({
    kind: Schema.Literal("openai-compatible"),
    // v3: Schema.pattern(re, { message: () => "..." })
    api_key_env: Schema.optional(Schema.String.check(Schema.isPattern(/^WELLSPRING_UPSTREAM_[A-Z0-9_]{1,64}$/, {
      message: "api_key_env must name a variable WELLSPRING_UPSTREAM_<NAME> (A-Z, 0-9, _)"
    })))
  })
])

/** v3: Schema.Struct({...}).pipe(Schema.filter((c) => issues)) with `{ path, message }` issues. */
export const Catalog = Schema.Struct({
  models: Schema.Array(Model),
  // v3: Schema.Record({ key: Schema.String, value: Provider })
  providers: Schema.Record(Schema.String, Provider)
}).check(Schema.makeFilter((catalog) => {
  // v3 Schema.FilterIssue was { path, message }; v4 is { path, issue } (or a string / SchemaIssue.Issue)
  const issues: Array<Schema.FilterIssue> = []
  const seen = new Set<string>()
  catalog.models.forEach((model, i) => {
    if (seen.has(model.id)) issues.push({ path: ["models", i, "id"], issue: `duplicate model id ${model.id}` })
    seen.add(model.id)
    if (!(model.route.provider in catalog.providers)) {
      issues.push({ path: ["models", i, "route", "provider"], issue: `unknown provider ${model.route.provider}` })
    }
  })
  return issues
}))

export const GatewayConfig = Schema.Struct({
  listeners: Schema.NonEmptyArray(Listener).pipe(
    withDefault((): readonly [Listener, ...Array<Listener>] => [{ host: "127.0.0.1", port: 8080, origins: ["inference"] }])
  ),
  // v3: Schema.optional(Schema.Redacted(Schema.String))  -> v4 RedactedFromValue (v4 `Redacted` = v3 RedactedFromSelf)
  database_url: Schema.optional(Schema.RedactedFromValue(Schema.String)),
  // v3: Schema.optionalWith(LimitsConfig, { default: () => LimitsConfig.make({}) })
  // v4 `make` does not apply decoding defaults; decode `{}` instead.
  limits: Limits.pipe(withDefault(() => Schema.decodeSync(Limits)({}))),
  default_plan: Schema.String.pipe(withDefault(() => "default")),
  plans: Schema.Record(Schema.String, Schema.Struct({ session_limit: PositiveInt })),
  catalog: Catalog
}).check(Schema.makeFilter((config) =>
  // v3 returned { path, message } | undefined
  config.default_plan in config.plans
    ? undefined
    : { path: ["default_plan"], issue: `no plan named ${config.default_plan}` }
))
export type GatewayConfig = typeof GatewayConfig.Type

/** v3: ParseResult.ArrayFormatter.formatErrorSync(error) -> [{ path, message }] */
const standard = SchemaIssue.makeFormatterStandardSchemaV1()
export const formatIssues = (error: Schema.SchemaError): string =>
  standard(error.issue).issues
    .map((issue) => {
      const path = (issue.path ?? []).map((p) => (typeof p === "object" ? p.key : p))
      return `${path.length ? path.join(".") : "(root)"}: ${issue.message}`
    })
    .join("; ")

// v3: Schema.decodeUnknownEither(GatewayConfig, { errors: "all", onExcessProperty: "error" })
const decodeConfig = Schema.decodeUnknownResult(GatewayConfig, { errors: "all", onExcessProperty: "error" })

export const decodeGatewayConfig = (raw: unknown): Result.Result<GatewayConfig, string> => {
  const result = decodeConfig(raw)
  // v3: Either.isLeft(result) / result.left / result.right
  return Result.isFailure(result) ? Result.fail(formatIssues(result.failure)) : Result.succeed(result.success)
}

// ---------------------------------------------------------------------------------------------
// Request bodies: optionalWith({ exact: true }) and the issue-tree walk of ChatRequest.ts

// v3: const opt = (s) => Schema.optionalWith(s, { exact: true })
const opt = Schema.optionalKey

export const ChatRequest = Schema.Struct({
  // v3: Schema.String.pipe(Schema.maxLength(256))
  model: Schema.String.check(Schema.isMaxLength(256)),
  // v3: Schema.Array(Message).pipe(Schema.minItems(1))
  messages: Schema.Array(Schema.Union([
    Schema.Struct({ role: Schema.Literal("user"), content: Schema.String }),
    Schema.Struct({ role: Schema.Literal("assistant"), content: Schema.NullOr(Schema.String) })
  ])).check(Schema.isMinLength(1)),
  stream: opt(Schema.Boolean),
  temperature: opt(Temperature),
  // v3: Schema.filter(predicate, { message: () => "..." })
  image_url: opt(Schema.String.check(Schema.makeFilter((u) => u.startsWith("https://") || u.startsWith("data:"), {
    message: "image_url.url must be an https URL or a data: URI"
  }))),
  tool_choice: opt(Schema.Union([
    Schema.Literals(["auto", "required", "none"]),
    Schema.Struct({ type: Schema.Literal("function"), function: Schema.Struct({ name: Schema.String }) })
  ])),
  parameters: opt(Schema.Record(Schema.String, Schema.Unknown))
  // v3: .annotations({ identifier }) -> v4 .annotate({ identifier })
}).annotate({ identifier: "ChatCompletionRequest" })
export type ChatRequest = typeof ChatRequest.Type

export interface Located {
  readonly path: ReadonlyArray<PropertyKey>
  readonly missing: boolean
}

/**
 * v3 walked ParseResult.ParseIssue: Pointer | Composite | Refinement | Transformation | Missing | ...
 * v4 SchemaIssue.Issue: Pointer | Composite | AnyOf | Filter | Encoding | MissingKey | InvalidType | InvalidValue |
 * UnexpectedKey | Forbidden | OneOf. Messages do not embed the input unless `reportInput: true`.
 */
export const locate = (issue: SchemaIssue.Issue, path: ReadonlyArray<PropertyKey> = []): Located => {
  switch (issue._tag) {
    case "Pointer":
      return locate(issue.issue, path.concat(issue.path))
    case "Composite":
    case "AnyOf": {
      let best: Located | null = null
      for (const sub of issue.issues) {
        const found = locate(sub, path)
        if (best === null || found.path.length > best.path.length) best = found
      }
      return best ?? { path, missing: false }
    }
    case "Filter":
    case "Encoding":
      return locate(issue.issue, path)
    case "MissingKey":
      return { path, missing: true }
    default:
      return { path, missing: false }
  }
}

const decodeChat = Schema.decodeUnknownResult(ChatRequest)

export const decodeChatRequest = (body: unknown): Result.Result<ChatRequest, Located> => {
  const result = decodeChat(body)
  return Result.isFailure(result) ? Result.fail(locate(result.failure.issue)) : Result.succeed(result.success)
}
