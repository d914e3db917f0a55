/**
 * Turns OpenAI-wire chat answers (SSE chunks or one JSON body) into normalized `UpstreamEvent`s:
 * `reasoning_content` / `reasoning` become `Reasoning`, tool call ids become `call_` + 32 hex,
 * tool call deltas become one `ToolCallStart` (once id and name are known) and `ToolCallArgs`
 * fragments, and `Finish` then `Usage` close the answer. The OpenAI-compatible codec's `ChatDecoder`;
 * common content frames are decoded without JSON.parse (`LeanScanner.ts`).
 */
import { randomBytes } from "node:crypto"
import type { ChatDecoder } from "../http/Codec.js"
import { type FinishReason, UpstreamError, type UpstreamEvent, type Usage } from "../Upstream.js"
import { matches, scanner, SLOT_CONTENT, type Template } from "./LeanScanner.js"

const CALL_ID = /^call_[0-9a-f]{32}$/

/**
 * Keeps an id already in the `call_` + 32 hex form; any other (or none) becomes a fresh random one. Never
 * derived from the upstream id: upstreams that number their calls (`0`, `call_1`) would give every request
 * the same id. Called once per call, so every frame of a stream refers to the call by its index.
 */
export const normalizeToolCallId = (id: string | undefined): string =>
  id !== undefined && CALL_ID.test(id) ? id : "call_" + randomBytes(16).toString("hex")

/** `stop`, `length` and `tool_calls` pass; `function_call` is `tool_calls`; anything else is `stop`. */
export const mapFinishReason = (reason: unknown): FinishReason =>
  reason === "length" ? "length" : reason === "tool_calls" || reason === "function_call" ? "tool_calls" : "stop"

type Json = Record<string, any>

const num = (u: unknown): number => (typeof u === "number" && Number.isFinite(u) ? u : 0)

export const usageFrom = (u: Json): Usage => ({
  prompt_tokens: num(u.prompt_tokens),
  completion_tokens: num(u.completion_tokens),
  reasoning_tokens: num(u.completion_tokens_details?.reasoning_tokens),
  cached_tokens: num(u.prompt_tokens_details?.cached_tokens ?? u.prompt_cache_hit_tokens)
})

const protocolError = (detail: string): UpstreamError => new UpstreamError({ kind: "protocol", detail })

const errorText = (error: unknown): string =>
  typeof error === "string"
    ? error
    : typeof error === "object" && error !== null && typeof (error as Json).message === "string"
    ? (error as Json).message
    : JSON.stringify(error)

// ---------------------------------------------------------------------------------------------

interface ToolState {
  readonly index: number
  id: string | undefined
  name: string
  started: boolean
  pending: string
}

export class ChatNormalizer implements ChatDecoder {
  /** Events produced since the owner last took them. */
  events: Array<UpstreamEvent> = []
  /** Set when the upstream reported an error inside a 2xx answer. */
  error: UpstreamError | undefined = undefined
  sawDone = false
  /** Undecodable SSE frames skipped so far, and the last one (whole; bounded when logged) for the log. */
  skipped = 0
  lastSkipped = ""
  private answering = false
  private finish: FinishReason | undefined = undefined
  /** The upstream's usage figures, once reported. */
  usage: Usage | undefined = undefined
  private tools: Map<number, ToolState> | undefined = undefined
  private toolCount = 0
  private lastTool: ToolState | undefined = undefined

  /** Templates of lean content and reasoning frames (see `LeanScanner`). */
  private contentTemplate: Template | undefined = undefined
  private reasoningTemplate: Template | undefined = undefined

  /** `lean: false` decodes every frame with JSON.parse (the reference for the lean decoding). */
  constructor(private readonly lean = true) {}

  /** One SSE `data` payload. */
  onData(data: string): void {
    if (data === "[DONE]") {
      this.sawDone = true
      return
    }
    if (this.lean && this.leanFrame(data)) return
    let chunk: unknown
    try {
      chunk = JSON.parse(data)
    } catch {
      this.skip(data)
      return
    }
    if (typeof chunk !== "object" || chunk === null) return this.skip(data)
    this.onChunk(chunk as Json)
  }

  private skip(data: string): void {
    this.skipped++
    this.lastSkipped = data
  }

  onChunk(chunk: Json): void {
    if (chunk.error !== undefined && chunk.error !== null) {
      this.error = protocolError(`upstream error: ${errorText(chunk.error)}`)
      return
    }
    if (chunk.usage) this.usage = usageFrom(chunk.usage)
    const choices = chunk.choices
    if (!Array.isArray(choices) || choices.length === 0) return
    const choice = choices[0]
    const delta = choice.delta
    if (delta) {
      this.delta(delta.reasoning_content ?? delta.reasoning, delta.content)
      const calls = delta.tool_calls
      if (Array.isArray(calls)) for (let i = 0; i < calls.length; i++) this.toolDelta(calls[i])
    }
    if (choice.finish_reason !== undefined && choice.finish_reason !== null) {
      this.finish = mapFinishReason(choice.finish_reason)
    }
  }

  /** Handles `data` when it is a lean frame (true), else leaves it to JSON.parse (false). */
  private leanFrame(data: string): boolean {
    let t = this.contentTemplate
    if (t !== undefined && matches(data, t)) {
      this.delta(undefined, scanner.content)
      return true
    }
    t = this.reasoningTemplate
    if (t !== undefined && matches(data, t)) {
      this.delta(scanner.content, undefined)
      return true
    }
    // Tool call deltas are never lean: spare them the scan.
    if (data.indexOf("\"tool_calls\":[") >= 0 || !scanner.scan(data)) return false
    if (!scanner.choice) return true
    if (scanner.delta) {
      this.delta(scanner.reasoningContent ?? scanner.reasoning, scanner.content)
      // A delta with exactly one text field and nothing else read: later frames like it are lean.
      if (scanner.slot !== 0 && (scanner.finish === undefined || scanner.finish === null)) {
        const texts = (scanner.content != null ? 1 : 0) + (scanner.reasoningContent != null ? 1 : 0) +
          (scanner.reasoning != null ? 1 : 0)
        if (texts === 1) {
          const template = { prefix: data.slice(0, scanner.slotStart), suffix: data.slice(scanner.slotEnd) }
          if (scanner.slot === SLOT_CONTENT) this.contentTemplate = template
          else this.reasoningTemplate = template
        }
      }
    }
    if (scanner.finish !== undefined && scanner.finish !== null) this.finish = mapFinishReason(scanner.finish)
    return true
  }

  private delta(reasoning: unknown, content: unknown): void {
    if (typeof reasoning === "string" && reasoning.length > 0 && !this.answering) {
      this.events.push({ _tag: "Reasoning", text: reasoning })
    }
    if (typeof content === "string" && content.length > 0) {
      this.answering = true
      this.events.push({ _tag: "Content", text: content })
    }
  }

  private toolDelta(call: Json): void {
    const tools = this.tools ?? (this.tools = new Map())
    const id = typeof call.id === "string" && call.id.length > 0 ? call.id : undefined
    let state: ToolState | undefined
    if (typeof call.index === "number") state = tools.get(call.index)
    else if (id === undefined) state = this.lastTool
    else for (const s of tools.values()) if (s.id === id) state = s
    if (state === undefined) {
      state = { index: this.toolCount++, id: undefined, name: "", started: false, pending: "" }
      // Deltas without an index are keyed below 0 so they never meet an upstream index.
      tools.set(typeof call.index === "number" ? call.index : -1 - state.index, state)
    }
    this.lastTool = state
    if (id !== undefined && state.id === undefined) state.id = id
    const fn = call.function
    if (fn) {
      if (!state.started && typeof fn.name === "string" && fn.name.length > 0) state.name = fn.name
      const args = fn.arguments
      const fragment = typeof args === "string" ? args : args !== undefined && args !== null ? JSON.stringify(args) : ""
      if (fragment.length > 0) {
        if (state.started) this.events.push({ _tag: "ToolCallArgs", index: state.index, fragment })
        else state.pending += fragment
      }
    }
    if (!state.started && state.id !== undefined && state.name !== "") this.start(state)
  }

  private start(state: ToolState): void {
    state.started = true
    this.answering = true
    this.events.push({ _tag: "ToolCallStart", index: state.index, id: normalizeToolCallId(state.id), name: state.name })
    if (state.pending.length > 0) {
      this.events.push({ _tag: "ToolCallArgs", index: state.index, fragment: state.pending })
      state.pending = ""
    }
  }

  /** A whole non-streaming `chat.completion` body; returns the error when it is not one. */
  onJson(body: unknown): UpstreamError | undefined {
    if (typeof body !== "object" || body === null) return protocolError("answer is not a JSON object")
    const b = body as Json
    if (b.error !== undefined && b.error !== null) return protocolError(`upstream error: ${errorText(b.error)}`)
    const choice = Array.isArray(b.choices) ? b.choices[0] : undefined
    const message = choice?.message
    if (typeof message !== "object" || message === null) return protocolError("answer has no choices[0].message")
    const reasoning = message.reasoning_content ?? message.reasoning
    if (typeof reasoning === "string" && reasoning.length > 0) this.events.push({ _tag: "Reasoning", text: reasoning })
    if (typeof message.content === "string" && message.content.length > 0) {
      this.events.push({ _tag: "Content", text: message.content })
    }
    if (Array.isArray(message.tool_calls)) {
      for (const call of message.tool_calls) {
        // A call without an upstream id still starts here, in order, with a random id of its own.
        const id = typeof call?.id === "string" && call.id.length > 0 ? call.id : "missing"
        this.toolDelta({ index: this.toolCount, id, function: call?.function })
      }
    }
    if (b.usage) this.usage = usageFrom(b.usage)
    this.finish = mapFinishReason(choice.finish_reason)
    this.sawDone = true
    return this.end()
  }

  /**
   * The answer is over: flushes tool calls still missing an id, then `Finish` and `Usage`.
   * Returns the error when the upstream stopped before saying it was done (or reported an error).
   */
  end(): UpstreamError | undefined {
    if (this.error !== undefined) return this.error
    if (this.finish === undefined && !this.sawDone) return protocolError("upstream ended the stream before finishing")
    let calls = false
    if (this.tools) {
      for (const state of this.tools.values()) {
        if (!state.started && state.name !== "") this.start(state)
        if (state.started) calls = true
      }
    }
    const finish = this.finish ?? (calls ? "tool_calls" : "stop")
    // Some upstreams answer a forced tool call with `stop`.
    this.events.push({ _tag: "Finish", reason: calls && finish === "stop" ? "tool_calls" : finish })
    if (this.usage) this.events.push({ _tag: "Usage", usage: this.usage })
    return undefined
  }
}
