import { Effect, Result, Schema } from "effect"
import { HttpRouter, HttpServerRequest } from "effect/http"
import { Auth } from "../auth/Auth.js"
import { LiveCatalog, Settings } from "../config/Live.js"
import type { LimitsConfig } from "../config/GatewayConfig.js"
import { fail, type GatewayError } from "../errors/Catalog.js"
import { renderInference } from "../errors/Render.js"
import { currentRequestId, handle, headersOf, json } from "../http/Respond.js"
import { readText } from "../http/Body.js"
import { guard as guardFailures } from "../http/FailedRequests.js"
import { Admission } from "../quota/Admission.js"
import { RequestLog } from "../telemetry/RequestLog.js"
import { Upstreams } from "../upstream/Upstream.js"
import { Exchange, finishing } from "./Chat.js"
import { Bounded, describeDecodeFailure, MODEL_CHARS, NOT_AN_OBJECT, tooLong } from "./ChatRequest.js"
import { modelIdOfBody, readJsonBody } from "./JsonGuard.js"
import { upstreamFailure } from "./UpstreamErrors.js"
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
      return Result.fail(fail("invalid_request", {
        message: "토큰 배열 입력은 지원하지 않습니다. input 은 문자열 또는 문자열 배열이어야 합니다."
      }))
    }
    if (input.length > limits.embedding_inputs) {
      return Result.fail(fail("invalid_request", { message: `input 은 최대 ${limits.embedding_inputs}개까지 허용됩니다.` }))
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

/** `encoding_format: "base64"`: the vector as little-endian float32, base64-encoded (what the openai SDK decodes). */
export const toBase64Float32 = (vector: ReadonlyArray<number>): string => {
  const bytes = Buffer.allocUnsafe(vector.length * 4)
  for (let i = 0; i < vector.length; i++) bytes.writeFloatLE(vector[i]!, i * 4)
  return bytes.toString("base64")
}

/** Pads or truncates to exactly 1024 dimensions, then re-normalizes. */
const fit = (vector: ReadonlyArray<number>): Array<number> => {
  const out = vector.slice(0, EMBEDDING_DIMENSIONS)
  while (out.length < EMBEDDING_DIMENSIONS) out.push(0)
  const norm = Math.sqrt(out.reduce((s, v) => s + v * v, 0)) || 1
  return out.map((v) => v / norm)
}

export const embeddings = HttpRouter.add(
  "POST",
  "/v1/embeddings",
  Effect.gen(function*() {
    const request = yield* HttpServerRequest.HttpServerRequest
    const auth = yield* Auth
    const catalog = yield* LiveCatalog
    const settings = yield* Settings
    const admission = yield* Admission
    const upstreams = yield* Upstreams
    const log = yield* RequestLog
    return yield* handle(
      renderInference,
      Effect.gen(function*() {
        const caller = yield* auth.authenticateKey(request.headers.authorization)
        yield* guardFailures(caller)
        const exchange = new Exchange(caller, yield* log.nextId, yield* currentRequestId, log)
        const run = Effect.gen(function*() {
          yield* auth.gate(caller, headersOf(request))
          const limits = settings.config.limits
          const body = yield* readJsonBody(yield* readText(request), limits.json_depth)
          exchange.modelId = modelIdOfBody(body)
          const req = yield* Effect.fromResult(decodeEmbeddingsRequest(body, limits))
          const model = catalog.current().byId.get(req.model)
          if (!model || model.disabled) return yield* Effect.fail(fail("model_not_found"))
          if (!model.supports_embeddings) return yield* Effect.fail(fail("model_not_embedding"))
          exchange.modelId = model.id
          const inputs = typeof req.input === "string" ? [req.input] : req.input
          const bytes = inputs.reduce((n, s) => n + Buffer.byteLength(s), 0)
          const { exceeds, tokens } = yield* exceedsLimit({ bytes, images: 0, texts: inputs }, model.max_input_tokens)
          if (exceeds) return yield* Effect.fail(fail("input_too_long"))
          exchange.estimatedInput = tokens
          exchange.provider = model.route.provider
          yield* exchange.admit(admission, {
            accountId: caller.account.id,
            plan: settings.planFor(caller.account.plan),
            model,
            estimatedInputTokens: tokens,
            byok: false
          })
          const adapter = yield* upstreams.get(model.route.provider).pipe(Effect.mapError(upstreamFailure))
          const result = yield* adapter.embed(model.route.model, inputs).pipe(Effect.mapError(upstreamFailure))
          exchange.usage = { prompt_tokens: result.prompt_tokens, completion_tokens: 0, reasoning_tokens: 0, cached_tokens: 0 }
          exchange.markFirstByte()
          yield* exchange.finish({ status: "success" })
          return json({
            object: "list",
            data: result.vectors.map((v, index) => ({
              object: "embedding",
              index,
              embedding: req.encoding_format === "base64" ? toBase64Float32(fit(v)) : fit(v)
            })),
            model: req.model,
            usage: { prompt_tokens: result.prompt_tokens, total_tokens: result.prompt_tokens }
          }, 200, { "x-request-id": String(exchange.rowId) })
        })
        return yield* finishing(exchange, run)
      })
    )
  })
)
