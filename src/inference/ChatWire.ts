/**
 * How a chat answer is written: the non-stream `chat.completion` body, the SSE frames of a stream, and the
 * receipt (`wellspring`) and quota headers both carry. The exchange is read through its view; output counted here
 * goes to its meter (`addDelivered`, `setUsage`), which charges it.
 */
import { HttpServerResponse } from "effect/http"
import type { PlanConfig } from "../config/GatewayConfig.js"
import type { FinishReason, UpstreamEvent, Usage } from "../upstream/Upstream.js"
import type { Delivery, Receipt, StreamFraming } from "./Codec.js"
import type { AnswerMeter, ExchangeView, Settled } from "./Exchange.js"
import { quotaHeaders, receipt } from "./Receipt.js"

const outputUsage = (usage: Usage) => ({
  prompt_tokens: usage.prompt_tokens,
  completion_tokens: usage.completion_tokens,
  total_tokens: usage.prompt_tokens + usage.completion_tokens
})

/** Receipt of a settled request; omitted (null) rather than failing the request. */
export const safeReceipt = (exchange: ExchangeView, plan: PlanConfig, settled: Settled): Receipt | null => {
  try {
    const ticket = exchange.ticket
    if (!settled || !ticket) return null
    return receipt(String(exchange.rowId), settled.standing, ticket.rpm, plan, settled.weighted)
  } catch {
    return null
  }
}

const completionId = (exchange: ExchangeView) => `chatcmpl-${exchange.requestId}`
const createdSeconds = (exchange: ExchangeView) => Math.floor(exchange.createdAt.getTime() / 1000)

/** A non-stream answer, accumulated from the upstream's events. */
export interface Answer {
  content: string
  reasoning: string
  tools: Array<{ id: string; name: string; args: string }>
  finish: FinishReason
}

export const emptyAnswer = (): Answer => ({ content: "", reasoning: "", tools: [], finish: "stop" })

/** Folds events into `acc` without counting anything (a stream's copy for the completion hook). */
export const foldEvents = (acc: Answer, events: ReadonlyArray<UpstreamEvent>): void => {
  for (const event of events) {
    switch (event._tag) {
      case "Content":
        acc.content += event.text
        break
      case "Reasoning":
        acc.reasoning += event.text
        break
      case "ToolCallStart":
        acc.tools[event.index] = { id: event.id, name: event.name, args: "" }
        break
      case "ToolCallArgs": {
        const call = acc.tools[event.index]
        if (call) call.args += event.fragment
        break
      }
      case "Finish":
        acc.finish = event.reason
        break
      case "Usage":
        break
    }
  }
}

/** Folds the upstream's events into one answer, counting the delivered output and the usage on `meter`. */
export const accumulate = (events: ReadonlyArray<UpstreamEvent>, meter: AnswerMeter): Answer => {
  const acc = emptyAnswer()
  for (const event of events) {
    switch (event._tag) {
      case "Content":
        acc.content += event.text
        meter.addDelivered(event.text.length)
        break
      case "Reasoning":
        acc.reasoning += event.text
        meter.addDelivered(event.text.length)
        break
      case "ToolCallStart":
        acc.tools[event.index] = { id: event.id, name: event.name, args: "" }
        break
      case "ToolCallArgs": {
        const call = acc.tools[event.index]
        if (call) call.args += event.fragment
        meter.addDelivered(event.fragment.length)
        break
      }
      case "Finish":
        acc.finish = event.reason
        break
      case "Usage":
        meter.setUsage(event.usage)
        break
    }
  }
  return acc
}

/** The quota headers of a settled request (its request id alone when the settlement is unknown). */
export const settledHeaders = (exchange: ExchangeView, settled: Settled): Record<string, string> => {
  const ticket = exchange.ticket
  return settled && ticket
    ? quotaHeaders(settled.standing, ticket.rpm, exchange.rowId)
    : { "x-request-id": String(exchange.rowId) }
}

/** The `chat.completion` response of a completed exchange, with its receipt and quota headers. */
export const completionResponse = (exchange: ExchangeView, answer: Answer, delivery: Delivery) => {
  const tools = answer.tools.filter(Boolean)
  const wellspring = delivery.receipt
  const body = {
    id: completionId(exchange),
    object: "chat.completion",
    created: createdSeconds(exchange),
    model: exchange.modelId,
    choices: [{
      index: 0,
      message: {
        role: "assistant",
        content: answer.content.length > 0 || tools.length === 0 ? answer.content : null,
        ...(answer.reasoning.length > 0 ? { reasoning: answer.reasoning } : {}),
        ...(tools.length > 0
          ? {
            tool_calls: tools.map((t) => ({ id: t.id, type: "function", function: { name: t.name, arguments: t.args } }))
          }
          : {})
      },
      finish_reason: answer.finish
    }],
    usage: outputUsage(exchange.chargeable()),
    ...(wellspring ? { wellspring } : {})
  }
  return HttpServerResponse.jsonUnsafe(body, { headers: delivery.headers })
}

/** Headers of a stream's 200 response (the standing right after the reservation). */
export const streamHeaders = (exchange: ExchangeView): Record<string, string> => {
  const ticket = exchange.ticket
  return {
    ...(ticket ? quotaHeaders(ticket.reserved, ticket.rpm, exchange.rowId) : { "x-request-id": String(exchange.rowId) }),
    "cache-control": "no-cache",
    "x-accel-buffering": "no"
  }
}

/**
 * SSE framing of one answer: `head` (the role frame), the frames of each batch of events, and `last`, the final
 * data frame (usage, receipt, finish_reason) then `[DONE]`, once the exchange has completed.
 */
export const sseFraming = (exchange: ExchangeView, meter: AnswerMeter): StreamFraming => {
  const created = createdSeconds(exchange)
  const id = completionId(exchange)
  const prefix = `data: {"id":"${id}","object":"chat.completion.chunk","created":${created},"model":${
    JSON.stringify(exchange.modelId)
  },"choices":[{"index":0,"delta":`
  const frame = (delta: string) => `${prefix}${delta},"finish_reason":null}]}\n\n`
  let finish: FinishReason = "stop"

  const toFrame = (event: UpstreamEvent): string => {
    switch (event._tag) {
      case "Content":
        meter.addDelivered(event.text.length)
        return frame(`{"content":${JSON.stringify(event.text)}}`)
      case "Reasoning":
        meter.addDelivered(event.text.length)
        return frame(`{"reasoning":${JSON.stringify(event.text)}}`)
      case "ToolCallStart":
        return frame(`{"tool_calls":[{"index":${event.index},"id":${JSON.stringify(event.id)},"type":"function","function":{"name":${
          JSON.stringify(event.name)
        },"arguments":""}}]}`)
      case "ToolCallArgs":
        meter.addDelivered(event.fragment.length)
        return frame(`{"tool_calls":[{"index":${event.index},"function":{"arguments":${JSON.stringify(event.fragment)}}}]}`)
      case "Finish":
        finish = event.reason
        return ""
      case "Usage":
        meter.setUsage(event.usage)
        return ""
    }
  }

  return {
    head: frame(`{"role":"assistant","content":""}`),
    frames: (events: ReadonlyArray<UpstreamEvent>) => {
      let out = ""
      for (const event of events) out += toFrame(event)
      return out
    },
    last: (wellspring) => {
      const final = {
        id,
        object: "chat.completion.chunk",
        created,
        model: exchange.modelId,
        choices: [{ index: 0, delta: {}, finish_reason: finish }],
        usage: outputUsage(exchange.chargeable()),
        ...(wellspring ? { wellspring } : {})
      }
      return `data: ${JSON.stringify(final)}\n\ndata: [DONE]\n\n`
    },
    // The stream ends without `[DONE]`: that is how a chat client learns of the failure.
    failed: () => ""
  }
}
