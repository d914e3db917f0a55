/**
 * How a Responses answer is written: the `response` object (non-stream, `GET`, and inside the lifecycle
 * events) and the SSE events of a stream, from the internal `Answer` and `UpstreamEvent`s. Output counted here
 * goes to the exchange's meter (`addDelivered`, `setUsage`), which charges it.
 *
 * Output items: `reasoning` (its text as one `reasoning_text` content part), `message` (one `output_text`
 * part) and `function_call` (`call_id` is the upstream tool call id, unchanged; the item's own id is `fc_…`).
 */
import * as Crypto from "node:crypto"
import type { Receipt } from "../../inference/Codec.js"
import type { Answer } from "../../inference/ChatWire.js"
import type { AnswerMeter } from "../../inference/Exchange.js"
import { Catalog, type GatewayError } from "../../errors/Catalog.js"
import type { FinishReason, Message, ToolCall, UpstreamEvent, Usage } from "../../upstream/Upstream.js"
import type { ResponsesCall } from "./Request.js"

/** `prefix` and 48 random hex digits (192 bits): unguessable ids. */
export const newId = (prefix: "resp" | "msg" | "rs" | "fc"): string => `${prefix}_${Crypto.randomBytes(24).toString("hex")}`

export interface OutputText {
  readonly type: "output_text"
  readonly text: string
  readonly annotations: ReadonlyArray<never>
  readonly logprobs: ReadonlyArray<never>
}
export type OutputItem =
  | {
    readonly id: string
    readonly type: "reasoning"
    readonly summary: ReadonlyArray<never>
    readonly content: ReadonlyArray<{ readonly type: "reasoning_text"; readonly text: string }>
    readonly status: "completed" | "incomplete"
  }
  | {
    readonly id: string
    readonly type: "message"
    readonly role: "assistant"
    readonly status: "completed" | "incomplete"
    readonly content: ReadonlyArray<OutputText>
  }
  | {
    readonly id: string
    readonly type: "function_call"
    readonly call_id: string
    readonly name: string
    readonly arguments: string
    readonly status: "completed" | "incomplete"
  }

export type ResponseStatus = "in_progress" | "completed" | "incomplete" | "failed"

/** What every response object of one request repeats. */
export interface ResponseMeta {
  readonly id: string
  /** Epoch seconds. */
  readonly createdAt: number
  readonly model: string
  readonly call: ResponsesCall
}

export const responsesUsage = (u: Usage) => ({
  input_tokens: u.prompt_tokens,
  input_tokens_details: { cached_tokens: u.cached_tokens },
  output_tokens: u.completion_tokens,
  output_tokens_details: { reasoning_tokens: u.reasoning_tokens },
  total_tokens: u.prompt_tokens + u.completion_tokens
})

const outputText = (text: string): OutputText => ({ type: "output_text", text, annotations: [], logprobs: [] })

/** The status an answer ends with: `incomplete` when the output cap cut it. */
export const statusOf = (finish: FinishReason): "completed" | "incomplete" => finish === "length" ? "incomplete" : "completed"

/**
 * The response object. `usage` null while in progress; `receipt` is the `wellspring` block (an extra field the
 * SDKs keep).
 */
export const responseObject = (
  meta: ResponseMeta,
  state: {
    readonly status: ResponseStatus
    readonly output: ReadonlyArray<OutputItem>
    readonly usage: Usage | null
    readonly error?: GatewayError
    readonly receipt?: Receipt | null
  }
) => {
  const call = meta.call
  return {
    id: meta.id,
    object: "response",
    created_at: meta.createdAt,
    status: state.status,
    background: false,
    error: state.error === undefined
      ? null
      : { code: Catalog[state.error.code].wire ?? state.error.code, message: state.error.userMessage },
    incomplete_details: state.status === "incomplete" ? { reason: "max_output_tokens" } : null,
    instructions: call.instructions,
    max_output_tokens: call.maxOutputTokens,
    metadata: call.metadata,
    model: meta.model,
    output: state.output,
    parallel_tool_calls: call.parallelToolCalls ?? true,
    previous_response_id: call.previousResponseId,
    reasoning: { effort: call.effort, summary: null },
    store: call.store,
    temperature: call.temperature ?? 1,
    text: { format: { type: "text" } },
    tool_choice: call.toolChoice ?? "auto",
    tools: call.tools.map((t) => ({
      type: "function",
      name: t.name,
      description: t.description ?? null,
      parameters: t.parameters ?? null,
      strict: t.strict ?? null
    })),
    top_p: call.topP ?? 1,
    truncation: "disabled",
    usage: state.usage === null ? null : responsesUsage(state.usage),
    ...(state.receipt ? { wellspring: state.receipt } : {})
  }
}

/** The output items of a whole answer: reasoning, then the message, then the function calls. */
export const outputOf = (answer: Answer): Array<OutputItem> => {
  const items: Array<OutputItem> = []
  if (answer.reasoning.length > 0) {
    items.push({
      id: newId("rs"),
      type: "reasoning",
      summary: [],
      content: [{ type: "reasoning_text", text: answer.reasoning }],
      status: "completed"
    })
  }
  if (answer.content.length > 0) {
    items.push({
      id: newId("msg"),
      type: "message",
      role: "assistant",
      status: statusOf(answer.finish) === "incomplete" ? "incomplete" : "completed",
      content: [outputText(answer.content)]
    })
  }
  for (const call of answer.tools) {
    if (!call) continue
    items.push({
      id: newId("fc"),
      type: "function_call",
      call_id: call.id,
      name: call.name,
      arguments: call.args,
      status: "completed"
    })
  }
  return items
}

/**
 * The assistant turn of an answer as one chat message (what a continuation replays): reasoning on its own
 * field, tool calls with their ids unchanged.
 */
export const assistantMessage = (output: ReadonlyArray<OutputItem>): Message | null => {
  let content = ""
  let reasoning = ""
  const calls: Array<ToolCall> = []
  for (const item of output) {
    if (item.type === "reasoning") reasoning += item.content.map((c) => c.text).join("")
    else if (item.type === "message") content += item.content.map((c) => c.text).join("")
    else calls.push({ id: item.call_id, type: "function", function: { name: item.name, arguments: item.arguments } })
  }
  if (content.length === 0 && calls.length === 0) return null
  return {
    role: "assistant",
    content: content.length > 0 ? content : null,
    ...(calls.length > 0 ? { tool_calls: calls } : {}),
    ...(reasoning.length > 0 ? { reasoning } : {})
  }
}

// ----- streaming

const frame = (type: string, sequence: number, fields: Record<string, unknown>): string =>
  `event: ${type}\ndata: ${JSON.stringify({ type, sequence_number: sequence, ...fields })}\n\n`

interface OpenText {
  readonly kind: "reasoning" | "message"
  readonly id: string
  readonly index: number
  text: string
}

interface OpenCall {
  readonly id: string
  readonly index: number
  readonly callId: string
  readonly name: string
  args: string
}

/**
 * The SSE events of one streamed response, in the API's order: `response.created`, `response.in_progress`, then
 * per output item `response.output_item.added`, its content part and deltas (`response.reasoning_text.delta`,
 * `response.output_text.delta`, `response.function_call_arguments.delta`), their `.done` events and
 * `response.output_item.done`, then `response.completed` (or `response.incomplete`, `response.failed`).
 * Every event carries `sequence_number`, from 0 up by one. A text item is closed when the next item opens;
 * function calls are closed at the end (so a late argument fragment still lands in its own call).
 */
export class StreamEncoder {
  #sequence = 0
  /** Items by output index: the finished ones, and placeholders for the open ones. */
  readonly #output: Array<OutputItem | null> = []
  #text: OpenText | null = null
  readonly #calls = new Map<number, OpenCall>()
  #finish: FinishReason = "stop"
  #closing = ""
  #closed = false

  constructor(private readonly meta: ResponseMeta, private readonly meter: AnswerMeter) {}

  #emit(type: string, fields: Record<string, unknown>): string {
    return frame(type, this.#sequence++, fields)
  }

  /** `response.created` and `response.in_progress`. */
  head(): string {
    const response = responseObject(this.meta, { status: "in_progress", output: [], usage: null })
    return this.#emit("response.created", { response }) + this.#emit("response.in_progress", { response })
  }

  #closeText(): string {
    const open = this.#text
    if (open === null) return ""
    this.#text = null
    let out: string
    let item: OutputItem
    if (open.kind === "reasoning") {
      const part = { type: "reasoning_text", text: open.text } as const
      item = { id: open.id, type: "reasoning", summary: [], content: [part], status: "completed" }
      out = this.#emit("response.reasoning_text.done", {
        item_id: open.id,
        output_index: open.index,
        content_index: 0,
        text: open.text
      }) +
        this.#emit("response.content_part.done", { item_id: open.id, output_index: open.index, content_index: 0, part })
    } else {
      const part = outputText(open.text)
      item = { id: open.id, type: "message", role: "assistant", status: "completed", content: [part] }
      out = this.#emit("response.output_text.done", {
        item_id: open.id,
        output_index: open.index,
        content_index: 0,
        text: open.text,
        logprobs: []
      }) +
        this.#emit("response.content_part.done", { item_id: open.id, output_index: open.index, content_index: 0, part })
    }
    this.#output[open.index] = item
    return out + this.#emit("response.output_item.done", { output_index: open.index, item })
  }

  #openText(kind: "reasoning" | "message"): string {
    if (this.#text?.kind === kind) return ""
    let out = this.#closeText()
    const index = this.#output.length
    this.#output.push(null)
    const id = newId(kind === "reasoning" ? "rs" : "msg")
    this.#text = { kind, id, index, text: "" }
    if (kind === "reasoning") {
      out += this.#emit("response.output_item.added", {
        output_index: index,
        item: { id, type: "reasoning", summary: [], content: [], status: "in_progress" }
      }) +
        this.#emit("response.content_part.added", {
          item_id: id,
          output_index: index,
          content_index: 0,
          part: { type: "reasoning_text", text: "" }
        })
    } else {
      out += this.#emit("response.output_item.added", {
        output_index: index,
        item: { id, type: "message", role: "assistant", status: "in_progress", content: [] }
      }) +
        this.#emit("response.content_part.added", {
          item_id: id,
          output_index: index,
          content_index: 0,
          part: outputText("")
        })
    }
    return out
  }

  #event(event: UpstreamEvent): string {
    switch (event._tag) {
      case "Reasoning": {
        if (event.text.length === 0) return ""
        this.meter.addDelivered(event.text.length)
        const out = this.#openText("reasoning")
        const open = this.#text!
        open.text += event.text
        return out + this.#emit("response.reasoning_text.delta", {
          item_id: open.id,
          output_index: open.index,
          content_index: 0,
          delta: event.text
        })
      }
      case "Content": {
        if (event.text.length === 0) return ""
        this.meter.addDelivered(event.text.length)
        const out = this.#openText("message")
        const open = this.#text!
        open.text += event.text
        return out + this.#emit("response.output_text.delta", {
          item_id: open.id,
          output_index: open.index,
          content_index: 0,
          delta: event.text,
          logprobs: []
        })
      }
      case "ToolCallStart": {
        if (this.#calls.has(event.index)) return ""
        const out = this.#closeText()
        const index = this.#output.length
        this.#output.push(null)
        const call: OpenCall = { id: newId("fc"), index, callId: event.id, name: event.name, args: "" }
        this.#calls.set(event.index, call)
        return out + this.#emit("response.output_item.added", {
          output_index: index,
          item: {
            id: call.id,
            type: "function_call",
            call_id: call.callId,
            name: call.name,
            arguments: "",
            status: "in_progress"
          }
        })
      }
      case "ToolCallArgs": {
        const call = this.#calls.get(event.index)
        if (call === undefined || event.fragment.length === 0) return ""
        this.meter.addDelivered(event.fragment.length)
        call.args += event.fragment
        return this.#emit("response.function_call_arguments.delta", {
          item_id: call.id,
          output_index: call.index,
          delta: event.fragment
        })
      }
      case "Finish":
        this.#finish = event.reason
        return ""
      case "Usage":
        this.meter.setUsage(event.usage)
        return ""
    }
  }

  /** The events of one batch of upstream events. */
  frames(events: ReadonlyArray<UpstreamEvent>): string {
    let out = ""
    for (const event of events) out += this.#event(event)
    return out
  }

  /**
   * Closes every open item (idempotent); their `.done` events are written by `last`. Called when the answer is
   * complete, before it is stored.
   */
  finish(): void {
    if (this.#closed) return
    this.#closed = true
    let out = this.#closeText()
    for (const call of this.#calls.values()) {
      const item: OutputItem = {
        id: call.id,
        type: "function_call",
        call_id: call.callId,
        name: call.name,
        arguments: call.args,
        status: "completed"
      }
      this.#output[call.index] = item
      out += this.#emit("response.function_call_arguments.done", {
        item_id: call.id,
        output_index: call.index,
        name: call.name,
        arguments: call.args
      }) +
        this.#emit("response.output_item.done", { output_index: call.index, item })
    }
    this.#closing = out
  }

  get finishReason(): FinishReason {
    return this.#finish
  }

  /** The finished output items (after `finish`). */
  output(): Array<OutputItem> {
    return this.#output.filter((item): item is OutputItem => item !== null)
  }

  /** The closing events and `response.completed` (or `response.incomplete`), with the usage and the receipt. */
  last(usage: Usage, receipt: Receipt | null): string {
    this.finish()
    const status = statusOf(this.#finish)
    const response = responseObject(this.meta, { status, output: this.output(), usage, receipt })
    return this.#closing + this.#emit(status === "completed" ? "response.completed" : "response.incomplete", { response })
  }

  /**
   * `response.failed` after a mid-stream failure: the output so far (open items marked `incomplete`) and the
   * error in the API's `{code, message}` form.
   */
  failed(error: GatewayError, usage: Usage): string {
    const output: Array<OutputItem> = []
    for (let i = 0; i < this.#output.length; i++) {
      const done = this.#output[i]
      if (done) {
        output.push(done)
        continue
      }
      const text = this.#text
      if (text !== null && text.index === i) {
        output.push(
          text.kind === "reasoning"
            ? {
              id: text.id,
              type: "reasoning",
              summary: [],
              content: [{ type: "reasoning_text", text: text.text }],
              status: "incomplete"
            }
            : { id: text.id, type: "message", role: "assistant", status: "incomplete", content: [outputText(text.text)] }
        )
        continue
      }
      for (const call of this.#calls.values()) {
        if (call.index !== i) continue
        output.push({
          id: call.id,
          type: "function_call",
          call_id: call.callId,
          name: call.name,
          arguments: call.args,
          status: "incomplete"
        })
      }
    }
    const response = responseObject(this.meta, { status: "failed", output, usage, error })
    return this.#emit("response.failed", { response })
  }
}
