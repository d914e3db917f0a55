/**
 * Turns OpenAI-wire chat answers (SSE chunks or one JSON body) into normalized `UpstreamEvent`s:
 * `reasoning_content` / `reasoning` become `Reasoning`, tool call ids become `call_` + 32 hex,
 * tool call deltas become one `ToolCallStart` (once id and name are known) and `ToolCallArgs`
 * fragments, and `Finish` then `Usage` close the answer.
 */
import { randomBytes } from "node:crypto"
import type { FinishReason, UpstreamEvent, Usage } from "../Upstream.js"

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

const errorText = (error: unknown): string =>
  typeof error === "string"
    ? error
    : typeof error === "object" && error !== null && typeof (error as Json).message === "string"
    ? (error as Json).message
    : JSON.stringify(error)

// ---------------------------------------------------------------------------------------------
// Lean decoding of the common frames
//
// Most frames of a stream differ in one string only: `{"id":"chatcmpl-1","object":"chat.completion.
// chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"..."},"finish_reason":
// null}]}`. JSON.parse builds every object and string of each; instead, a frame that `LeanScanner`
// finds to be a plain content (or reasoning) delta becomes a template: the text before and after that
// string token. A later frame made of the same prefix, one complete JSON string token and the same
// suffix has the same tokens but that one string, so it is the same delta with a new text: only that
// token is scanned. Anything else (role, finish, usage, tool calls, errors, odd shapes) goes through
// the scanner or JSON.parse, and the scanner accepts only what JSON.parse accepts, with the same values.

const isHex = (c: number): boolean => (c >= 48 && c <= 57) || (c >= 97 && c <= 102) || (c >= 65 && c <= 70)

/** Which delta field a template's string is. */
const SLOT_CONTENT = 1
const SLOT_REASONING = 2

const MAX_DEPTH = 64

/**
 * A validating JSON scanner for chunk frames, allocating nothing but the strings it extracts. `scan`
 * returns false when the frame is not lean (or not JSON); the caller then uses JSON.parse.
 */
class LeanScanner {
  private text = ""
  private at = 0
  /** The last scanned string token: its contents (between the quotes), whether it holds escapes. */
  private strStart = 0
  private strEnd = 0
  private strEscaped = false
  // What the frame holds (undefined: absent; null: JSON null).
  content: string | null | undefined = undefined
  reasoningContent: string | null | undefined = undefined
  reasoning: string | null | undefined = undefined
  finish: string | null | undefined = undefined
  /** choices[0] exists (an object); its delta is an object. */
  choice = false
  delta = false
  /** The string token of the last text field read (from its opening quote to after its closing one). */
  slot = 0
  slotStart = 0
  slotEnd = 0
  private sawChoices = false
  private sawDelta = false
  private sawToolCalls = false

  scan(data: string): boolean {
    this.text = data
    this.at = 0
    this.content = this.reasoningContent = this.reasoning = this.finish = undefined
    this.choice = this.delta = this.sawChoices = this.sawDelta = this.sawToolCalls = false
    this.slot = 0
    let ok = this.ws() === 123 && this.members(0)
    if (ok) {
      this.ws()
      ok = this.at === data.length
    }
    this.text = ""
    return ok
  }

  /** Whether `data` between `start` and `end` is exactly one JSON string token; its value in `content`. */
  scanToken(data: string, start: number, end: number): boolean {
    if (data.charCodeAt(start) !== 34) return false
    this.text = data
    this.at = start
    const ok = this.string() && this.at === end
    this.content = ok ? this.stringValue() : undefined
    this.text = ""
    return ok
  }

  /** Skips whitespace; returns the code at the new position (NaN at the end). */
  private ws(): number {
    const text = this.text
    let at = this.at
    let c = text.charCodeAt(at)
    while (c === 32 || c === 10 || c === 13 || c === 9) c = text.charCodeAt(++at)
    this.at = at
    return c
  }

  /** A string token at `at` (on its opening quote). */
  private string(): boolean {
    const text = this.text
    const n = text.length
    let i = this.at + 1
    let escaped = false
    for (;;) {
      if (i >= n) return false
      const c = text.charCodeAt(i)
      if (c === 34) break
      if (c === 92) {
        escaped = true
        const e = text.charCodeAt(i + 1)
        if (e === 117) {
          if (
            !isHex(text.charCodeAt(i + 2)) || !isHex(text.charCodeAt(i + 3)) || !isHex(text.charCodeAt(i + 4)) ||
            !isHex(text.charCodeAt(i + 5))
          ) return false
          i += 6
        } else if (e === 34 || e === 92 || e === 47 || e === 98 || e === 102 || e === 110 || e === 114 || e === 116) {
          i += 2
        } else {
          return false
        }
      } else if (c < 32) {
        return false
      } else {
        i++
      }
    }
    this.strStart = this.at + 1
    this.strEnd = i
    this.strEscaped = escaped
    this.at = i + 1
    return true
  }

  /** The value of the string token just scanned. */
  private stringValue(): string {
    return this.strEscaped
      ? JSON.parse(this.text.slice(this.strStart - 1, this.strEnd + 1))
      : this.text.slice(this.strStart, this.strEnd)
  }

  private keyIs(key: string): boolean {
    return this.strEnd - this.strStart === key.length && this.text.startsWith(key, this.strStart)
  }

  private digits(): boolean {
    const text = this.text
    const from = this.at
    let at = from
    let c = text.charCodeAt(at)
    while (c >= 48 && c <= 57) c = text.charCodeAt(++at)
    this.at = at
    return at > from
  }

  /** -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
  private number(): boolean {
    const text = this.text
    if (text.charCodeAt(this.at) === 45) this.at++
    const c = text.charCodeAt(this.at)
    if (c === 48) this.at++
    else if (c >= 49 && c <= 57) this.digits()
    else return false
    if (text.charCodeAt(this.at) === 46) {
      this.at++
      if (!this.digits()) return false
    }
    const e = text.charCodeAt(this.at)
    if (e === 101 || e === 69) {
      this.at++
      const sign = text.charCodeAt(this.at)
      if (sign === 43 || sign === 45) this.at++
      if (!this.digits()) return false
    }
    return true
  }

  private literal(literal: string): boolean {
    if (!this.text.startsWith(literal, this.at)) return false
    this.at += literal.length
    return true
  }

  /** Any JSON value starting with code `c` at `at`, skipped. */
  private skip(c: number, depth: number): boolean {
    switch (c) {
      case 34:
        return this.string()
      case 123:
        return this.container(125, depth)
      case 91:
        return this.container(93, depth)
      case 116:
        return this.literal("true")
      case 102:
        return this.literal("false")
      case 110:
        return this.literal("null")
      default:
        return this.number()
    }
  }

  /** An object (`close` = `}`) or array (`]`) at `at`, skipped. */
  private container(close: number, depth: number): boolean {
    if (depth >= MAX_DEPTH) return false
    this.at++
    let c = this.ws()
    if (c === close) {
      this.at++
      return true
    }
    for (;;) {
      if (close === 125) {
        if (c !== 34 || !this.string() || this.ws() !== 58) return false
        this.at++
        c = this.ws()
      }
      if (!this.skip(c, depth + 1)) return false
      c = this.ws()
      if (c === 44) {
        this.at++
        c = this.ws()
      } else if (c === close) {
        this.at++
        return true
      } else {
        return false
      }
    }
  }

  /** The members of the object at `at`, at `level` 0 (chunk), 1 (choice) or 2 (delta). */
  private members(level: number): boolean {
    this.at++
    let c = this.ws()
    if (c === 125) {
      this.at++
      return true
    }
    for (;;) {
      // An escaped key could spell a field that is read: not lean.
      if (c !== 34 || !this.string() || this.strEscaped || this.ws() !== 58) return false
      this.at++
      c = this.ws()
      if (!(level === 0 ? this.chunkMember(c) : level === 1 ? this.choiceMember(c) : this.deltaMember(c))) return false
      c = this.ws()
      if (c === 44) {
        this.at++
        c = this.ws()
      } else if (c === 125) {
        this.at++
        return true
      } else {
        return false
      }
    }
  }

  private chunkMember(c: number): boolean {
    if (this.keyIs("choices")) {
      if (this.sawChoices || c !== 91) return false
      this.sawChoices = true
      this.at++
      c = this.ws()
      if (c === 93) {
        this.at++
        return true
      }
      // choices[0] must be an object; the others are only validated.
      if (c !== 123 || !this.members(1)) return false
      this.choice = true
      for (;;) {
        c = this.ws()
        if (c === 93) {
          this.at++
          return true
        }
        if (c !== 44) return false
        this.at++
        if (!this.skip(this.ws(), 2)) return false
      }
    }
    // `usage` and `error` are lean only when null.
    if (this.keyIs("usage") || this.keyIs("error")) return c === 110 && this.literal("null")
    return this.skip(c, 1)
  }

  private choiceMember(c: number): boolean {
    if (this.keyIs("delta")) {
      if (this.sawDelta) return false
      this.sawDelta = true
      if (c === 123) {
        this.delta = true
        return this.members(2)
      }
      return c === 110 && this.literal("null")
    }
    if (this.keyIs("finish_reason")) {
      if (this.finish !== undefined) return false
      return (this.finish = this.stringOrNull(c, 0)) !== undefined
    }
    return this.skip(c, 2)
  }

  private deltaMember(c: number): boolean {
    if (this.keyIs("content")) {
      if (this.content !== undefined) return false
      return (this.content = this.stringOrNull(c, SLOT_CONTENT)) !== undefined
    }
    if (this.keyIs("reasoning_content")) {
      if (this.reasoningContent !== undefined) return false
      return (this.reasoningContent = this.stringOrNull(c, SLOT_REASONING)) !== undefined
    }
    if (this.keyIs("reasoning")) {
      if (this.reasoning !== undefined) return false
      return (this.reasoning = this.stringOrNull(c, SLOT_REASONING)) !== undefined
    }
    if (this.keyIs("tool_calls")) {
      // Lean only when null (and not repeated).
      if (this.sawToolCalls || c !== 110) return false
      this.sawToolCalls = true
      return this.literal("null")
    }
    return this.skip(c, 3)
  }

  /** A string (recorded as the slot `slot` when not 0) or null; undefined when neither. */
  private stringOrNull(c: number, slot: number): string | null | undefined {
    if (c === 110) return this.literal("null") ? null : undefined
    if (c !== 34) return undefined
    const start = this.at
    if (!this.string()) return undefined
    if (slot !== 0) {
      this.slot = slot
      this.slotStart = start
      this.slotEnd = this.at
    }
    return this.stringValue()
  }
}

/** One scanner for all normalizers: used synchronously, never re-entered. */
const scanner = new LeanScanner()

/** A frame shape with one variable string token (see above). */
interface Template {
  readonly prefix: string
  readonly suffix: string
}

/** Whether `data` is `template` with another string token; its value is then `scanner.content`. */
const matches = (data: string, t: Template): boolean => {
  const end = data.length - t.suffix.length
  // (Comparing slices is several times faster than startsWith / endsWith on sliced strings.)
  return end > t.prefix.length && data.slice(0, t.prefix.length) === t.prefix && data.slice(end) === t.suffix &&
    scanner.scanToken(data, t.prefix.length, end)
}

// ---------------------------------------------------------------------------------------------

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
