/**
 * Turns OpenAI-wire chat answers (SSE chunks or one JSON body) into normalized `UpstreamEvent`s:
 * `reasoning_content` / `reasoning` become `Reasoning`, tool call ids become `call_` + 32 hex,
 * tool call deltas become one `ToolCallStart` (once id and name are known) and `ToolCallArgs`
 * fragments, and `Finish` then `Usage` close the answer.
 */
import { createHash, randomBytes } from "node:crypto"
import type { FinishReason, UpstreamEvent, Usage } from "../Upstream.js"

const CALL_ID = /^call_[0-9a-f]{32}$/

/** Keeps ids already in the `call_` + 32 hex form; derives the others from a hash of the upstream id. */
export const normalizeToolCallId = (id: string | undefined): string =>
  id !== undefined && id.length > 0
    ? CALL_ID.test(id) ? id : "call_" + createHash("sha256").update(id).digest("hex").slice(0, 32)
    : "call_" + randomBytes(16).toString("hex")

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

const errorText = (error: unknown): string =>
  typeof error === "string"
    ? error
    : typeof error === "object" && error !== null && typeof (error as Json).message === "string"
    ? (error as Json).message
    : JSON.stringify(error)

interface ToolState {
  readonly index: number
  id: string | undefined
  name: string
  started: boolean
  pending: string
}

export class ChatNormalizer {
  /** Events produced since the owner last took them. */
  events: Array<UpstreamEvent> = []
  /** Set when the upstream reported an error inside a 2xx answer. */
  error: string | undefined = undefined
  sawDone = false
  /** Undecodable SSE frames skipped so far, and the last one (truncated) for the log. */
  skipped = 0
  lastSkipped = ""
  private answering = false
  private finish: FinishReason | undefined = undefined
  private usage: Usage | undefined = undefined
  private tools: Map<number, ToolState> | undefined = undefined
  private toolCount = 0
  private lastTool: ToolState | undefined = undefined

  /** One SSE `data` payload. */
  onData(data: string): void {
    if (data === "[DONE]") {
      this.sawDone = true
      return
    }
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
    this.lastSkipped = data.length > 200 ? data.slice(0, 200) + "..." : data
  }

  onChunk(chunk: Json): void {
    if (chunk.error !== undefined && chunk.error !== null) {
      this.error = errorText(chunk.error)
      return
    }
    if (chunk.usage) this.usage = usageFrom(chunk.usage)
    const choices = chunk.choices
    if (!Array.isArray(choices) || choices.length === 0) return
    const choice = choices[0]
    const delta = choice.delta
    if (delta) {
      const reasoning = delta.reasoning_content ?? delta.reasoning
      if (typeof reasoning === "string" && reasoning.length > 0 && !this.answering) {
        this.events.push({ _tag: "Reasoning", text: reasoning })
      }
      const content = delta.content
      if (typeof content === "string" && content.length > 0) {
        this.answering = true
        this.events.push({ _tag: "Content", text: content })
      }
      const calls = delta.tool_calls
      if (Array.isArray(calls)) for (let i = 0; i < calls.length; i++) this.toolDelta(calls[i])
    }
    if (choice.finish_reason !== undefined && choice.finish_reason !== null) {
      this.finish = mapFinishReason(choice.finish_reason)
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

  /** A whole non-streaming `chat.completion` body; returns an error detail when it is not one. */
  onJson(body: unknown): string | undefined {
    if (typeof body !== "object" || body === null) return "answer is not a JSON object"
    const b = body as Json
    if (b.error !== undefined && b.error !== null) return `upstream error: ${errorText(b.error)}`
    const choice = Array.isArray(b.choices) ? b.choices[0] : undefined
    const message = choice?.message
    if (typeof message !== "object" || message === null) return "answer has no choices[0].message"
    const reasoning = message.reasoning_content ?? message.reasoning
    if (typeof reasoning === "string" && reasoning.length > 0) this.events.push({ _tag: "Reasoning", text: reasoning })
    if (typeof message.content === "string" && message.content.length > 0) {
      this.events.push({ _tag: "Content", text: message.content })
    }
    if (Array.isArray(message.tool_calls)) {
      for (const call of message.tool_calls) {
        this.toolDelta({ index: this.toolCount, id: call?.id ?? `${this.toolCount}`, function: call?.function })
      }
    }
    if (b.usage) this.usage = usageFrom(b.usage)
    this.finish = mapFinishReason(choice.finish_reason)
    this.sawDone = true
    return this.end()
  }

  /**
   * The answer is over: flushes tool calls still missing an id, then `Finish` and `Usage`.
   * Returns an error detail when the upstream stopped before saying it was done.
   */
  end(): string | undefined {
    if (this.error !== undefined) return `upstream error: ${this.error}`
    if (this.finish === undefined && !this.sawDone) return "upstream ended the stream before finishing"
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
