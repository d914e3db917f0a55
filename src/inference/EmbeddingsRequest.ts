/**
 * An embeddings request from its body to what is sent upstream: read, parse under the depth guard, decode
 * within `limits`, check the model and measure the input. Also the vector encodings of the answer.
 */
import { Effect, Result, Schema } from "effect"
import type { HttpServerRequest } from "effect/http"
import { type ByokReference, isByokModel, parseReference } from "../byok/Reference.js"
import type { LimitsConfig, ModelConfig } from "../config/GatewayConfig.js"
import { fail, type GatewayError, InferenceMessages } from "../errors/Catalog.js"
import { readJsonWith } from "../http/Body.js"
import { Bounded } from "../wire/ChatSchemas.js"
import { describeDecodeFailure, MODEL_CHARS, NOT_AN_OBJECT, tooLong } from "./ChatRequest.js"
import type { Exchange } from "./Exchange.js"
import { modelIdOfBody } from "./JsonGuard.js"
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
  readonly request: EmbeddingsRequest
  readonly model: ModelConfig
  readonly inputs: ReadonlyArray<string>
}

/** A request through the caller's credential: the provider's model id verbatim. */
export interface ByokEmbeddings {
  readonly _tag: "Byok"
  readonly request: EmbeddingsRequest
  readonly reference: ByokReference
  readonly inputs: ReadonlyArray<string>
}

export type PreparedEmbeddings = PoolEmbeddings | ByokEmbeddings

const inputsOf = (req: EmbeddingsRequest): ReadonlyArray<string> => (typeof req.input === "string" ? [req.input] : req.input)

/** The checks of a catalog model (also a BYOK request's fallback): `model_not_found`, `model_not_embedding`, size. */
export const embeddingsForModel = (
  exchange: Exchange,
  req: EmbeddingsRequest,
  model: ModelConfig | undefined
): Effect.Effect<PoolEmbeddings, GatewayError> => {
  if (!model || model.disabled) return Effect.fail(fail("model_not_found"))
  if (!model.supports_embeddings) return Effect.fail(fail("model_not_embedding"))
  exchange.resolveModel(model.id)
  const inputs = inputsOf(req)
  const bytes = inputs.reduce((n, s) => n + Buffer.byteLength(s), 0)
  return Effect.flatMap(exceedsLimit({ bytes, images: 0, texts: inputs }, model.max_input_tokens), ({ exceeds, tokens }) => {
    if (exceeds) return Effect.fail(fail("input_too_long"))
    exchange.setEstimatedInput(tokens)
    return Effect.succeed({ _tag: "Pool", request: req, model, inputs } as const)
  })
}

const byokEmbeddings = (exchange: Exchange, req: EmbeddingsRequest): Effect.Effect<ByokEmbeddings, GatewayError> => {
  const reference = parseReference(req.model)
  if (reference === null) return Effect.fail(fail("model_not_found", { message: InferenceMessages.byokBadReference }))
  exchange.resolveModel(req.model)
  const inputs = inputsOf(req)
  const bytes = inputs.reduce((n, s) => n + Buffer.byteLength(s), 0)
  return Effect.map(exceedsLimit({ bytes, images: 0, texts: inputs }, Number.MAX_SAFE_INTEGER), ({ tokens }) => {
    exchange.setEstimatedInput(tokens)
    return { _tag: "Byok", request: req, reference, inputs } as const
  })
}

/**
 * Reads and checks an embeddings request (after authentication and the account gates), noting on the exchange
 * what its row records: `model_not_found`, `model_not_embedding`, `input_too_long`.
 */
export const prepareEmbeddings = (
  request: HttpServerRequest.HttpServerRequest,
  exchange: Exchange,
  limits: LimitsConfig,
  /** The catalog model a client's `model` names (aliases resolved). */
  lookup: (id: string) => ModelConfig | undefined
): Effect.Effect<PreparedEmbeddings, GatewayError> =>
  Effect.flatMap(readJsonWith(request, limits), (body): Effect.Effect<PreparedEmbeddings, GatewayError> => {
      exchange.requestedModel(modelIdOfBody(body))
      const decoded = decodeEmbeddingsRequest(body, limits)
      if (Result.isFailure(decoded)) return Effect.fail(decoded.failure)
      const req = decoded.success
      return isByokModel(req.model) ? byokEmbeddings(exchange, req) : embeddingsForModel(exchange, req, lookup(req.model))
    })

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
