/**
 * The steps of an embeddings request (Pipeline.ts runs them and records their results): decode within
 * `limits`, check the model, measure the input. Also the answer: the list shape and its vector encodings.
 */
import { Effect, Result, Schema } from "effect"
import type { LimitsConfig, ModelConfig } from "../config/GatewayConfig.js"
import { fail, GatewayError, InferenceMessages } from "../errors/Catalog.js"
import { json } from "../http/Respond.js"
import { Bounded } from "../wire/ChatSchemas.js"
import { describeDecodeFailure, MODEL_CHARS, NOT_AN_OBJECT, tooLong } from "./ChatRequest.js"
import { exceedsLimit } from "./Tokens.js"

/** Output dimension fixed by the spec. */
export const EMBEDDING_DIMENSIONS = 1024

/** The validating schema (OpenApi.ts may reuse it); counts and sizes from `limits` are checked around it. */
export const EmbeddingsRequest = Schema.Struct({
  model: Bounded(MODEL_CHARS),
  input: Schema.Union([Schema.String, Schema.Array(Schema.String).check(Schema.isMinLength(1))]),
  encoding_format: Schema.optionalKey(Schema.Literals(["float", "base64"]))
})
export type EmbeddingsRequest = typeof EmbeddingsRequest.Type
const decode = Schema.decodeUnknownResult(EmbeddingsRequest)

const FIELD_MESSAGES: Record<string, string> = {
  model: `model 은 ${MODEL_CHARS}자 이하의 문자열이어야 합니다.`,
  input: "input 은 문자열 또는 문자열 배열(1개 이상)이어야 합니다.",
  encoding_format: "encoding_format 은 float 또는 base64 여야 합니다."
}

/** Decodes a parsed embeddings body within `limits`, with Korean messages naming the field, never its value. */
export const decodeEmbeddingsRequest = (
  body: unknown,
  limits: LimitsConfig
): Result.Result<EmbeddingsRequest, GatewayError> => {
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    return Result.fail(fail("invalid_request", { message: NOT_AN_OBJECT }))
  }
  const input = (body as { readonly input?: unknown }).input
  if (Array.isArray(input)) {
    const first: unknown = input[0]
    if (typeof first === "number" || Array.isArray(first)) {
      return Result.fail(fail("invalid_request", { message: InferenceMessages.tokenArrayInput }))
    }
    if (input.length > limits.embedding_inputs) {
      return Result.fail(fail("invalid_request", { message: InferenceMessages.tooManyEmbeddingInputs(limits.embedding_inputs) }))
    }
  }
  const result = decode(body)
  if (Result.isFailure(result)) {
    return Result.fail(fail("invalid_request", { message: describeDecodeFailure(result.failure, FIELD_MESSAGES, {}, body).message }))
  }
  const req = result.success
  if (typeof req.input === "string") {
    if (req.input.length > limits.text_chars) return Result.fail(tooLong("invalid_request", ["input"], limits.text_chars))
  } else {
    for (let i = 0; i < req.input.length; i++) {
      if (req.input[i]!.length > limits.text_chars) {
        return Result.fail(tooLong("invalid_request", ["input", i], limits.text_chars))
      }
    }
  }
  return Result.succeed(req)
}

/** A request for a catalog embedding model, ready for admission and dispatch. */
export interface PoolEmbeddings {
  readonly _tag: "Pool"
  readonly model: ModelConfig
  /** The input estimate (the row's, and what admission reserves). */
  readonly estimatedInput: number
  readonly inputs: ReadonlyArray<string>
}

/** A request through the caller's credential: the provider's model id verbatim. */
export interface ByokEmbeddings {
  readonly _tag: "Byok"
  /** The input estimate (the row's; BYOK admission reserves nothing). */
  readonly estimatedInput: number
  readonly inputs: ReadonlyArray<string>
}

const inputsOf = (req: EmbeddingsRequest): ReadonlyArray<string> => (typeof req.input === "string" ? [req.input] : req.input)

const bytesOf = (inputs: ReadonlyArray<string>): number => inputs.reduce((n, s) => n + Buffer.byteLength(s), 0)

/** The model step: the catalog model an embeddings request may use, or the refusal (`model_not_found`, `model_not_embedding`). */
export const checkEmbeddingsModel = (model: ModelConfig | undefined): ModelConfig | GatewayError => {
  if (!model || model.disabled) return fail("model_not_found")
  if (!model.supports_embeddings) return fail("model_not_embedding")
  return model
}

/** The size step on a catalog model that passed `checkEmbeddingsModel`: `input_too_long`. */
export const embeddingsOnModel = (req: EmbeddingsRequest, model: ModelConfig): Effect.Effect<PoolEmbeddings, GatewayError> => {
  const inputs = inputsOf(req)
  return Effect.flatMap(
    exceedsLimit({ bytes: bytesOf(inputs), images: 0, texts: inputs }, model.max_input_tokens),
    ({ exceeds, tokens }) =>
      exceeds
        ? Effect.fail(fail("input_too_long"))
        : Effect.succeed({ _tag: "Pool", model, estimatedInput: tokens, inputs } as const)
  )
}

/** Both steps at once: a BYOK request's fallback to its pool model. */
export const embeddingsForModel = (
  req: EmbeddingsRequest,
  model: ModelConfig | undefined
): Effect.Effect<PoolEmbeddings, GatewayError> => {
  const checked = checkEmbeddingsModel(model)
  return checked instanceof GatewayError ? Effect.fail(checked) : embeddingsOnModel(req, checked)
}

/** The size step of a BYOK request (after its reference parsed): the input measured for the row. */
export const embeddingsThroughCredential = (req: EmbeddingsRequest): Effect.Effect<ByokEmbeddings> => {
  const inputs = inputsOf(req)
  return Effect.map(
    exceedsLimit({ bytes: bytesOf(inputs), images: 0, texts: inputs }, Number.MAX_SAFE_INTEGER),
    ({ tokens }) => ({ _tag: "Byok", estimatedInput: tokens, inputs } as const)
  )
}

/**
 * The OpenAI list shape; vectors of catalog models fitted to the spec's fixed size, BYOK vectors as they came.
 * `model` is the model that answered (a BYOK request that fell back names the pool model).
 */
export const embeddingsAnswer = (
  rowId: number,
  model: string,
  req: EmbeddingsRequest,
  result: { readonly vectors: ReadonlyArray<ReadonlyArray<number>>; readonly prompt_tokens: number },
  fitted: boolean
) =>
  json({
    object: "list",
    data: result.vectors.map((v, index) => {
      const vector = fitted ? fit(v) : v
      return {
        object: "embedding",
        index,
        embedding: req.encoding_format === "base64" ? toBase64Float32(vector) : vector
      }
    }),
    model,
    usage: { prompt_tokens: result.prompt_tokens, total_tokens: result.prompt_tokens }
  }, 200, { "x-request-id": String(rowId) })

/** `encoding_format: "base64"`: the vector as little-endian float32, base64-encoded (what the openai SDK decodes). */
export const toBase64Float32 = (vector: ReadonlyArray<number>): string => {
  const bytes = Buffer.allocUnsafe(vector.length * 4)
  for (let i = 0; i < vector.length; i++) bytes.writeFloatLE(vector[i]!, i * 4)
  return bytes.toString("base64")
}

/** Pads or truncates to exactly 1024 dimensions, then re-normalizes. */
export const fit = (vector: ReadonlyArray<number>): Array<number> => {
  const out = vector.slice(0, EMBEDDING_DIMENSIONS)
  while (out.length < EMBEDDING_DIMENSIONS) out.push(0)
  const norm = Math.sqrt(out.reduce((s, v) => s + v * v, 0)) || 1
  return out.map((v) => v / norm)
}
