/**
 * The steps that take a decoded request (the internal chat form, whatever wire it came in on) to what is sent
 * upstream, each returning its result for the pipeline to record: the description (`describeChat`), the model and
 * its gates (`checkModel`: tools, reasoning effort), then the size (`chatOnModel`: images, the input against the
 * model's limit, `max_tokens` clamped; `chatThroughCredential` for a BYOK request).
 */
import { Effect, Result } from "effect"
import { type ModelConfig, primaryDeployment } from "../config/GatewayConfig.js"
import { fail, type GatewayError, InferenceMessages } from "../errors/Catalog.js"
import type { ByokReference } from "../byok/Reference.js"
import type { UpstreamRequest } from "../upstream/Upstream.js"
import type { ReasoningEffort } from "../wire/ChatSchemas.js"
import type { ChatRequest } from "./ChatRequest.js"
import { exceedsLimit, measure } from "./Tokens.js"

/** A request for a catalog model, ready for admission and dispatch. */
export interface PoolChat {
  readonly _tag: "Pool"
  readonly model: ModelConfig
  /** The input estimate (the row's, and what admission reserves). */
  readonly estimatedInput: number
  readonly upstream: UpstreamRequest
}

/** A request through the caller's own credential (`@provider[:label]/model`): the provider decides the rest. */
export interface ByokChat {
  readonly _tag: "Byok"
  readonly reference: ByokReference
  /** The input estimate (the row's; BYOK admission reserves nothing). */
  readonly estimatedInput: number
  readonly upstream: UpstreamRequest
}

/** What a chat request's row describes of it (recorded before any gate, so every row has it). */
export interface ChatDescription {
  readonly stream: boolean
  readonly hadTools: boolean
  readonly toolChoice: string | null
}


/** The row's `tool_choice`: the mode, or `function:<name>` (bounded). */
export const toolChoiceLabel = (choice: ChatRequest["tool_choice"]): string | null =>
  choice === undefined ? null : typeof choice === "string" ? choice : `function:${choice.function.name}`.slice(0, 80)

export const describeChat = (req: ChatRequest): ChatDescription => ({
  stream: req.stream === true,
  hadTools: (req.tools?.length ?? 0) > 0,
  toolChoice: toolChoiceLabel(req.tool_choice)
})

/**
 * The catalog model a request may use, with its reasoning effort as the model allows it, or the gate it fails:
 * `model_not_found` (unknown or disabled), `model_not_chat`, `tools_not_supported`,
 * `invalid_reasoning_effort` (listing the allowed values).
 */
export const checkModel = (
  req: ChatRequest,
  model: ModelConfig | undefined
): Result.Result<{ readonly model: ModelConfig; readonly effort: ReasoningEffort | undefined }, GatewayError> => {
  if (model === undefined || model.disabled) return Result.fail(fail("model_not_found"))
  if (!model.supports_chat) return Result.fail(fail("model_not_chat"))
  if (req.tools !== undefined && req.tools.length > 0 && !model.supports_tools) {
    return Result.fail(fail("tools_not_supported"))
  }
  let effort: ReasoningEffort | undefined
  if (req.reasoning_effort !== undefined) {
    const allowed = model.supports_reasoning ? model.reasoning_efforts : []
    effort = allowed.find((e) => e === req.reasoning_effort)
    if (effort === undefined) {
      return Result.fail(fail("invalid_reasoning_effort", { message: InferenceMessages.reasoningEffortNotAllowed(allowed) }))
    }
  }
  return Result.succeed({ model, effort })
}

/**
 * What the adapter receives: contract fields only, `model` as the upstream knows it, `max_tokens` when given (a
 * catalog model's is always clamped and set; a BYOK request passes only the client's).
 */
const toUpstream = (
  req: ChatRequest,
  model: string,
  effort: ReasoningEffort | undefined,
  maxTokens: number | undefined
): UpstreamRequest => {
  const out: { -readonly [K in keyof UpstreamRequest]: UpstreamRequest[K] } = {
    model,
    messages: req.messages,
    stream: req.stream === true
  }
  if (maxTokens !== undefined) out.max_tokens = maxTokens
  if (req.temperature !== undefined) out.temperature = req.temperature
  if (req.top_p !== undefined) out.top_p = req.top_p
  if (req.stop !== undefined) out.stop = req.stop
  if (effort !== undefined) out.reasoning_effort = effort
  // The tool options only go with tools: OpenAI-compatible upstreams reject them alone.
  if (req.tools !== undefined && req.tools.length > 0) {
    out.tools = req.tools
    if (req.tool_choice !== undefined) out.tool_choice = req.tool_choice
    if (req.parallel_tool_calls !== undefined) out.parallel_tool_calls = req.parallel_tool_calls
  }
  return out
}

/** A catalog model's request: `model` mapped to the upstream id, `max_tokens` clamped. */
export const upstreamRequest = (
  req: ChatRequest,
  model: ModelConfig,
  effort: ReasoningEffort | undefined,
  maxTokens: number
): UpstreamRequest => toUpstream(req, primaryDeployment(model).model, effort, maxTokens)

/**
 * What is sent through a credential: the provider's model id verbatim, `max_tokens` only when the client set one
 * (the provider knows its model's limits; the gateway's catalog does not).
 */
export const byokUpstreamRequest = (
  req: ChatRequest,
  reference: ByokReference,
  effort: ReasoningEffort | undefined
): UpstreamRequest => toUpstream(req, reference.model, effort, req.max_tokens)

/** The contract's efforts, all of them allowed through a credential (the provider refuses what its model lacks). */
const BYOK_EFFORTS: ReadonlyArray<ReasoningEffort> = ["none", "low", "high", "max"]

/** A `@provider[:label]/model` that does not parse: `model_not_found`. */
export const badReference = (): GatewayError => fail("model_not_found", { message: InferenceMessages.byokBadReference })

/**
 * The size step of a BYOK request (after its reference parsed): the effort checked against the contract's, the
 * input measured for the row (no catalog limits apply).
 */
export const chatThroughCredential = (req: ChatRequest, reference: ByokReference): Effect.Effect<ByokChat, GatewayError> => {
  const effort = req.reasoning_effort === undefined ? undefined : BYOK_EFFORTS.find((e) => e === req.reasoning_effort)
  if (req.reasoning_effort !== undefined && effort === undefined) {
    return Effect.fail(fail("invalid_reasoning_effort", { message: InferenceMessages.reasoningEffortNotAllowed(BYOK_EFFORTS) }))
  }
  return Effect.map(exceedsLimit(measure(req.messages, req.tools), Number.MAX_SAFE_INTEGER), ({ tokens }) => ({
    _tag: "Byok",
    reference,
    estimatedInput: tokens,
    upstream: byokUpstreamRequest(req, reference, effort)
  }) as const)
}

/**
 * The size step on a catalog model that passed `checkModel`: the images gate, `input_too_long`, `max_tokens`
 * clamped.
 */
export const chatOnModel = (
  req: ChatRequest,
  checked: { readonly model: ModelConfig; readonly effort: ReasoningEffort | undefined }
): Effect.Effect<PoolChat, GatewayError> => {
  const m = checked.model
  const size = measure(req.messages, req.tools)
  if (size.images > 0 && !m.supports_images) return Effect.fail(fail("images_not_supported"))
  return Effect.flatMap(exceedsLimit(size, m.max_input_tokens), ({ exceeds, tokens }) => {
    if (exceeds) {
      return Effect.fail(fail("input_too_long", { message: InferenceMessages.inputTooLong(m.max_input_tokens, tokens) }))
    }
    const maxTokens = Math.min(req.max_tokens ?? m.max_output_tokens, m.max_output_tokens)
    return Effect.succeed({
      _tag: "Pool",
      model: m,
      estimatedInput: tokens,
      upstream: upstreamRequest(req, m, checked.effort, maxTokens)
    } as const)
  })
}

/** A decoded request on a catalog model, every gate and the size at once: a BYOK request's fallback. */
export const chatForModel = (req: ChatRequest, model: ModelConfig | undefined): Effect.Effect<PoolChat, GatewayError> => {
  const checked = checkModel(req, model)
  return Result.isFailure(checked) ? Effect.fail(checked.failure) : chatOnModel(req, checked.success)
}
