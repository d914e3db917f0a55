/**
 * How an answer is written on the Anthropic Messages wire: the error envelope, the `message` object, and the SSE
 * events of a stream (message_start, content blocks with text/thinking/input_json deltas, message_delta,
 * message_stop, ping, error). The exchange is read through its view; delivered output and usage are counted on
 * its meter as they go (as the chat wire does).
 */
import { HttpServerResponse } from "effect/http"
import type { GatewayError } from "../../errors/Catalog.js"
import { retryHeaders } from "../../errors/Render.js"
import type { Answer } from "../../inference/ChatWire.js"
import type { Delivery, Receipt, StreamFraming } from "../../inference/Codec.js"
import type { AnswerMeter, ExchangeView } from "../../inference/Exchange.js"
import type { FinishReason, UpstreamEvent, Usage } from "../../upstream/Upstream.js"
import { toAnthropicId } from "./Request.js"

// ----- errors

/** Anthropic's error type for a gateway error's status. */
export const errorType = (status: number): string => {
  if (status === 529) return "overloaded_error"
  if (status === 429) return "rate_limit_error"
  if (status === 401) return "authentication_error"
  if (status === 403) return "permission_error"
  if (status === 404) return "not_found_error"
  if (status === 413) return "request_too_large"
  if (status === 504) return "timeout_error"
  if (status >= 500) return "api_error"
  return "invalid_request_error"
}

export const errorBody = (error: GatewayError) => ({
  type: "error" as const,
  error: { type: errorType(error.status), message: error.userMessage }
})

/** `{type: "error", error: {type, message}}` with the gateway's status and retry headers. */
export const renderAnthropic = (error: GatewayError): HttpServerResponse.HttpServerResponse =>
  HttpServerResponse.jsonUnsafe(errorBody(error), { status: error.status, headers: retryHeaders(error) })

// ----- the message

export const messageId = (exchange: ExchangeView) => `msg_${exchange.requestId.replace(/[^A-Za-z0-9]/g, "")}`

export type StopReason = "end_turn" | "max_tokens" | "tool_use"

export const stopReason = (finish: FinishReason): StopReason =>
  finish === "length" ? "max_tokens" : finish === "tool_calls" ? "tool_use" : "end_turn"

/**
 * Anthropic's usage: `input_tokens` excludes what was read from the cache (OpenAI's `prompt_tokens` includes
 * it), `cache_read_input_tokens` is that part; the gateway never writes a cache.
 */
export const anthropicUsage = (usage: Usage) => ({
  input_tokens: Math.max(0, usage.prompt_tokens - usage.cached_tokens),
  output_tokens: usage.completion_tokens,
  cache_read_input_tokens: usage.cached_tokens,
  cache_creation_input_tokens: 0
})

/** A tool's arguments as the object Anthropic's `input` is; arguments that are not a JSON object give `{}`. */
const toolInput = (args: string): unknown => {
  try {
    const value: unknown = JSON.parse(args)
    return typeof value === "object" && value !== null && !Array.isArray(value) ? value : {}
  } catch {
    return {}
  }
}

export const messageBody = (exchange: ExchangeView, answer: Answer, receipt: Receipt | null) => {
  const content: Array<unknown> = []
  if (answer.reasoning.length > 0) content.push({ type: "thinking", thinking: answer.reasoning, signature: "" })
  if (answer.content.length > 0) content.push({ type: "text", text: answer.content })
  for (const tool of answer.tools) {
    if (tool) content.push({ type: "tool_use", id: toAnthropicId(tool.id), name: tool.name, input: toolInput(tool.args) })
  }
  return {
    id: messageId(exchange),
    type: "message",
    role: "assistant",
    model: exchange.modelId,
    content,
    stop_reason: stopReason(answer.finish),
    stop_sequence: null,
    usage: anthropicUsage(exchange.chargeable()),
    ...(receipt !== null ? { wellspring: receipt } : {})
  }
}

export const messageResponse = (exchange: ExchangeView, answer: Answer, delivery: Delivery) =>
  HttpServerResponse.jsonUnsafe(messageBody(exchange, answer, delivery.receipt), { headers: delivery.headers })

// ----- the stream

const event = (name: string, data: unknown) => `event: ${name}\ndata: ${JSON.stringify(data)}\n\n`

export const PING_EVENT = event("ping", { type: "ping" })

/**
 * The events of one streamed message. Blocks are opened as their kind of output starts (thinking, text, each
 * tool call) and each is stopped before the next opens; a tool call's argument fragments go to its own block.
 */
export const messageFraming = (exchange: ExchangeView, meter: AnswerMeter): StreamFraming => {
  let next = 0
  /** The open block: its index and what it holds ("tool" blocks by the call's index). */
  let open: { readonly index: number; readonly kind: "thinking" | "text" | "tool"; readonly call?: number } | null = null
  const toolBlocks = new Map<number, number>()
  let finish: FinishReason = "stop"

  const start = (kind: "thinking" | "text" | "tool", block: unknown, call?: number): string => {
    const stop = open === null ? "" : event("content_block_stop", { type: "content_block_stop", index: open.index })
    const index = next++
    open = call === undefined ? { index, kind } : { index, kind, call }
    return stop + event("content_block_start", { type: "content_block_start", index, content_block: block })
  }
  const delta = (index: number, value: unknown) =>
    event("content_block_delta", { type: "content_block_delta", index, delta: value })

  const toFrames = (e: UpstreamEvent): string => {
    switch (e._tag) {
      case "Reasoning": {
        meter.addDelivered(e.text.length)
        const head = open?.kind === "thinking" ? "" : start("thinking", { type: "thinking", thinking: "", signature: "" })
        return head + delta(open!.index, { type: "thinking_delta", thinking: e.text })
      }
      case "Content": {
        meter.addDelivered(e.text.length)
        const head = open?.kind === "text" ? "" : start("text", { type: "text", text: "" })
        return head + delta(open!.index, { type: "text_delta", text: e.text })
      }
      case "ToolCallStart": {
        const head = start("tool", { type: "tool_use", id: toAnthropicId(e.id), name: e.name, input: {} }, e.index)
        toolBlocks.set(e.index, open!.index)
        return head
      }
      case "ToolCallArgs": {
        meter.addDelivered(e.fragment.length)
        const index = toolBlocks.get(e.index)
        return index === undefined ? "" : delta(index, { type: "input_json_delta", partial_json: e.fragment })
      }
      case "Finish":
        finish = e.reason
        return ""
      case "Usage":
        meter.setUsage(e.usage)
        return ""
    }
  }

  return {
    head: event("message_start", {
      type: "message_start",
      message: {
        id: messageId(exchange),
        type: "message",
        role: "assistant",
        model: exchange.modelId,
        content: [],
        stop_reason: null,
        stop_sequence: null,
        usage: { input_tokens: exchange.estimatedInput, output_tokens: 0 }
      }
    }),
    frames: (events) => {
      let out = ""
      for (const e of events) out += toFrames(e)
      return out
    },
    last: (receipt) => {
      const stop = open === null ? "" : event("content_block_stop", { type: "content_block_stop", index: open.index })
      open = null
      return stop +
        event("message_delta", {
          type: "message_delta",
          delta: { stop_reason: stopReason(finish), stop_sequence: null },
          usage: anthropicUsage(exchange.chargeable()),
          ...(receipt !== null ? { wellspring: receipt } : {})
        }) +
        event("message_stop", { type: "message_stop" })
    },
    failed: (error) => event("error", errorBody(error))
  }
}
