/**
 * A decoded request (the internal chat form, whatever wire it came in on) to what is sent upstream: check the
 * model and its capability gates (tools, reasoning effort, images), measure the input against the model's limit
 * and clamp `max_tokens`. What the request row needs is noted on the exchange as it is learnt.
 */
import { Effect, Result } from "effect"
import { type ModelConfig, primaryDeployment } from "../config/GatewayConfig.js"
import { fail, type GatewayError, InferenceMessages } from "../errors/Catalog.js"
import { type ByokReference, isByokModel, parseReference } from "../byok/Reference.js"
import type { UpstreamRequest } from "../upstream/Upstream.js"
import type { ReasoningEffort } from "../wire/ChatSchemas.js"
import type { ChatRequest } from "./ChatRequest.js"
import type { Exchange } from "./Exchange.js"
import { exceedsLimit, measure } from "./Tokens.js"

/** A request for a catalog model, ready for admission and dispatch. */
export interface PoolChat {
  readonly _tag: "Pool"
  readonly model: ModelConfig
  readonly upstream: UpstreamRequest
}

/** A request through the caller's own credential (`@provider[:label]/model`): the provider decides the rest. */
export interface ByokChat {
  readonly _tag: "Byok"
  readonly reference: ByokReference
  /** The decoded request, kept for a fallback to a pool model. */
  readonly request: ChatRequest
  readonly upstream: UpstreamRequest
}

export type PreparedChat = PoolChat | ByokChat


/** The row's `tool_choice`: the mode, or `function:<name>` (bounded). */
export const toolChoiceLabel = (choice: ChatRequest["tool_choice"]): string | null =>
  choice === undefined ? null : typeof choice === "string" ? choice : `function:${choice.function.name}`.slice(0, 80)

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

/** A BYOK request: the reference parsed, the input measured for the row (no catalog limits apply). */
const prepareByok = (exchange: Exchange, req: ChatRequest): Effect.Effect<ByokChat, GatewayError> => {
  const reference = parseReference(req.model)
  if (reference === null) return Effect.fail(fail("model_not_found", { message: InferenceMessages.byokBadReference }))
  exchange.resolveModel(req.model)
  const effort = req.reasoning_effort === undefined ? undefined : BYOK_EFFORTS.find((e) => e === req.reasoning_effort)
  if (req.reasoning_effort !== undefined && effort === undefined) {
    return Effect.fail(fail("invalid_reasoning_effort", { message: InferenceMessages.reasoningEffortNotAllowed(BYOK_EFFORTS) }))
  }
  return Effect.map(exceedsLimit(measure(req.messages, req.tools), Number.MAX_SAFE_INTEGER), ({ tokens }) => {
    exchange.setEstimatedInput(tokens)
    return { _tag: "Byok", reference, request: req, upstream: byokUpstreamRequest(req, reference, effort) } as const
  })
}

/**
 * A decoded request on a catalog model: the gates, the size check and `max_tokens`. Also a BYOK request's
 * fallback to its pool model.
 */
export const prepareForModel = (
  exchange: Exchange,
  req: ChatRequest,
  model: ModelConfig | undefined
): Effect.Effect<PoolChat, GatewayError> => {
  const checked = checkModel(req, model)
  if (Result.isFailure(checked)) return Effect.fail(checked.failure)
  const m = checked.success.model
  exchange.resolveModel(m.id)
  const size = measure(req.messages, req.tools)
  if (size.images > 0 && !m.supports_images) return Effect.fail(fail("images_not_supported"))
  return Effect.flatMap(exceedsLimit(size, m.max_input_tokens), ({ exceeds, tokens }) => {
    if (exceeds) {
      return Effect.fail(fail("input_too_long", { message: InferenceMessages.inputTooLong(m.max_input_tokens, tokens) }))
    }
    exchange.setEstimatedInput(tokens)
    const maxTokens = Math.min(req.max_tokens ?? m.max_output_tokens, m.max_output_tokens)
    return Effect.succeed({ _tag: "Pool", model: m, upstream: upstreamRequest(req, m, checked.success.effort, maxTokens) } as const)
  })
}

/**
 * Checks a decoded request (after authentication and the account gates), noting on the exchange what its row
 * records. `lookup` finds a live catalog model by the id or alias the client named.
 */
export const prepareRequest = (
  exchange: Exchange,
  req: ChatRequest,
  lookup: (id: string) => ModelConfig | undefined
): Effect.Effect<PreparedChat, GatewayError> => {
  exchange.describe({
    stream: req.stream === true,
    hadTools: (req.tools?.length ?? 0) > 0,
    toolChoice: toolChoiceLabel(req.tool_choice)
  })
  return isByokModel(req.model)
    ? prepareByok(exchange, req) as Effect.Effect<PreparedChat, GatewayError>
    : prepareForModel(exchange, req, lookup(req.model))
}
