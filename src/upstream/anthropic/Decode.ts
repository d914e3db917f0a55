/**
 * Anthropic Messages answers -> normalized `UpstreamEvent`s, for streamed answers (`StreamDecoder`, fed the `data`
 * of each SSE event; `AnthropicSse` wires it to the shared SSE parser) and whole ones (`decodeResponse`).
 *
 * - `thinking` blocks -> `Reasoning`; `text` -> `Content`; `tool_use` -> `ToolCallStart` (at the block's start,
 *   where id and name are known) then `ToolCallArgs` (each `input_json_delta.partial_json`; `{}` when the block
 *   gave none, so that streamed and whole answers agree). `signature_delta`, `redacted_thinking`, citations, `ping`
 *   and unknown events or block types are ignored (forward compatible).
 * - Reasoning before the answer: once text or a tool call was emitted, later thinking is dropped, as the OpenAI
 *   normalizer drops late `reasoning_content` (the contract: reasoning always precedes content). Anthropic sends
 *   thinking first, so this only bites interleaved thinking; the dropped text still counts in the estimate below.
 * - Tool call ids: `call_` + 32 hex derived from Anthropic's `toolu_...` id (sha256), so the same answer decodes to
 *   the same ids streamed or whole. Anthropic's ids are unique per call; an id shorter than 16 characters (a fake
 *   or a proxy numbering its calls) or one repeated within the answer gets a random id instead, so ids never repeat
 *   across requests (docs/decisions.md, "Tool call ids").
 * - `Finish` then `Usage` close the answer. stop_reason: end_turn, stop_sequence, pause_turn, refusal, unknown ->
 *   stop; max_tokens, model_context_window_exceeded -> length; tool_use -> tool_calls (also a `stop` answer that
 *   made tool calls). Usage: prompt = input + cache_creation_input + cache_read_input tokens, cached = cache read,
 *   completion = output tokens (thinking included, as Anthropic bills it), reasoning = an estimate, the thinking
 *   text's UTF-16 length / 4 rounded up, at most the output tokens (Anthropic does not report thinking tokens).
 *   `message_delta` usage is cumulative and overrides `message_start`'s figures field by field.
 * - Bounded: an event over `MAX_EVENT_CHARS`, more than `MAX_TOOL_CALLS` tool blocks or `MAX_BLOCKS` blocks,
 *   undecodable JSON, or a delta for a block that is not open is a `protocol` error; an `error` event is mapped
 *   by `errorFromEvent`. Nothing is decoded after the first failure.
 */
import { createHash } from "node:crypto"
import { normalizeToolCallId } from "../openai-compatible/Normalize.js"
import { SseParser } from "../http/Sse.js"
import type { FinishReason, UpstreamError, UpstreamEvent, Usage } from "../Upstream.js"
import { clip, redactorOf, type Redactor } from "../../telemetry/LogText.js"
import { errorFromEvent, protocolError, type Secrets } from "./Errors.js"

/** Longest SSE event (`data`) accepted. Anthropic's events are deltas of a few dozen characters. */
export const MAX_EVENT_CHARS = 1024 * 1024
/** Tool calls per answer (the contract's bound on tools per request). */
export const MAX_TOOL_CALLS = 128
/** Content blocks per answer. */
export const MAX_BLOCKS = 4096

type Json = Record<string, any>

const CALL_ID = /^call_[0-9a-f]{32}$/
const DERIVABLE = /^[A-Za-z0-9_-]{16,256}$/

/** Our id for an Anthropic tool-use id (see the module comment); `seen` holds the ids given so far. */
const toolCallId = (upstream: unknown, seen: Set<string>): string => {
  let id: string | undefined
  if (typeof upstream === "string") {
    if (CALL_ID.test(upstream)) id = upstream
    else if (DERIVABLE.test(upstream)) {
      id = "call_" + createHash("sha256").update("anthropic:" + upstream).digest("hex").slice(0, 32)
    }
  }
  if (id === undefined || seen.has(id)) id = normalizeToolCallId(undefined)
  seen.add(id)
  return id
}

export const mapStopReason = (reason: unknown): FinishReason =>
  reason === "max_tokens" || reason === "model_context_window_exceeded"
    ? "length"
    : reason === "tool_use"
    ? "tool_calls"
    : "stop"

const count = (u: unknown): number => (typeof u === "number" && Number.isFinite(u) && u > 0 ? Math.floor(u) : 0)

/** Anthropic's token figures, as reported so far. */
class Tokens {
  input = 0
  cacheCreation = 0
  cacheRead = 0
  output = 0
  reported = false

  /** Reads the fields present in an Anthropic `usage` object (absent ones keep their value). */
  read(u: unknown): void {
    if (typeof u !== "object" || u === null) return
    const usage = u as Json
    this.reported = true
    if (usage.input_tokens !== undefined) this.input = count(usage.input_tokens)
    if (usage.cache_creation_input_tokens !== undefined) this.cacheCreation = count(usage.cache_creation_input_tokens)
    if (usage.cache_read_input_tokens !== undefined) this.cacheRead = count(usage.cache_read_input_tokens)
    if (usage.output_tokens !== undefined) this.output = count(usage.output_tokens)
  }

  usage(thinkingChars: number): Usage {
    return {
      prompt_tokens: this.input + this.cacheCreation + this.cacheRead,
      completion_tokens: this.output,
      reasoning_tokens: Math.min(this.output, Math.ceil(thinkingChars / 4)),
      cached_tokens: this.cacheRead
    }
  }
}

const NO_EVENTS: ReadonlyArray<UpstreamEvent> = Object.freeze([])

const TEXT = 0
const THINKING = 1
const TOOL = 2
const OTHER = 3

interface Block {
  readonly kind: typeof TEXT | typeof THINKING | typeof TOOL | typeof OTHER
  /** Tool blocks: the call's index among the answer's tool calls. */
  readonly tool: number
  /** Tool blocks: whether any `ToolCallArgs` was emitted. */
  args: boolean
  /** Tool blocks: the `input` of `content_block_start` (Anthropic sends `{}` and streams the JSON). */
  readonly input: unknown
}

const kindOf = (type: unknown): Block["kind"] =>
  type === "text" ? TEXT : type === "thinking" ? THINKING : type === "tool_use" ? TOOL : OTHER

/** The arguments of a tool block that streamed none: its start `input` when that is a non-empty object. */
const startArgs = (input: unknown): string =>
  typeof input === "object" && input !== null && !Array.isArray(input) && Object.keys(input).length > 0
    ? JSON.stringify(input)
    : "{}"

/**
 * The value of the JSON string token whose contents are `data[start, end)` (the quotes around them are not
 * included), or undefined when those contents are not exactly one valid string token.
 */
const stringBody = (data: string, start: number, end: number): string | undefined => {
  let escaped = false
  for (let i = start; i < end; i++) {
    const c = data.charCodeAt(i)
    if (c === 34 || c < 32) return undefined
    if (c === 92) {
      escaped = true
      // The escaped character is skipped (an escaped quote does not end the token); JSON.parse checks escapes.
      if (++i >= end) return undefined
    }
  }
  if (!escaped) return data.slice(start, end)
  try {
    return JSON.parse(data.slice(start - 1, end + 1))
  } catch {
    return undefined
  }
}

/** The shared state of both decoders: emits events in the contract's order. */
class Emitter {
  /** Events produced since the owner last took them. */
  events: Array<UpstreamEvent> = []
  protected answering = false
  protected thinkingChars = 0
  protected tools = 0
  protected blocks = 0
  protected readonly ids = new Set<string>()
  protected readonly tokens = new Tokens()

  protected text(text: unknown): void {
    if (typeof text === "string" && text.length > 0) {
      this.answering = true
      this.events.push({ _tag: "Content", text })
    }
  }

  protected thinking(text: unknown): void {
    if (typeof text === "string" && text.length > 0) {
      this.thinkingChars += text.length
      if (!this.answering) this.events.push({ _tag: "Reasoning", text })
    }
  }

  /** A new block; a failure detail when over the bounds or a tool block lacks its name. */
  protected open(block: Json): Block | string {
    if (++this.blocks > MAX_BLOCKS) return `more than ${MAX_BLOCKS} content blocks`
    const kind = kindOf(block.type)
    if (kind !== TOOL) return { kind, tool: -1, args: false, input: undefined }
    if (this.tools >= MAX_TOOL_CALLS) return `more than ${MAX_TOOL_CALLS} tool calls`
    const name = block.name
    if (typeof name !== "string" || name.length === 0) return "tool_use block without a name"
    const index = this.tools++
    this.answering = true
    this.events.push({ _tag: "ToolCallStart", index, id: toolCallId(block.id, this.ids), name })
    return { kind, tool: index, args: false, input: block.input }
  }

  protected args(block: Block, fragment: string): void {
    block.args = true
    this.events.push({ _tag: "ToolCallArgs", index: block.tool, fragment })
  }

  protected close(block: Block): void {
    if (block.kind === TOOL && !block.args) this.args(block, startArgs(block.input))
  }

  protected finish(stopReason: unknown): void {
    const finish = mapStopReason(stopReason)
    this.events.push({ _tag: "Finish", reason: this.tools > 0 && finish === "stop" ? "tool_calls" : finish })
    if (this.tokens.reported) this.events.push({ _tag: "Usage", usage: this.tokens.usage(this.thinkingChars) })
  }
}

/**
 * A streamed answer, fed the `data` of each SSE event in order (`onData`), then `end()` at the end of the body.
 * The owner takes `events` as they come (`take()`); `error` is set once the answer failed (an `error` event or a
 * protocol violation), after which nothing more is decoded.
 */
export class StreamDecoder extends Emitter {
  error: UpstreamError | undefined = undefined
  /** `message_stop` arrived: the answer is complete (call `end()`). */
  sawDone = false
  /** The final usage, once `message_delta` reported it (kept on an error that comes after it). */
  usage: Usage | undefined = undefined
  private readonly open_ = new Map<number, Block>()
  private stopReason: unknown = undefined
  private sawDelta = false
  private ended = false
  /** The exact text a delta of the last opened block starts with (see `leanDelta`), and that block. */
  private leanPrefix: string | undefined = undefined
  private leanBlock: Block | undefined = undefined

  /** Keeps the credential sent out of error details. */
  private readonly redact: Redactor

  constructor(
    /** Secrets to keep out of error details (the credential sent). */
    secrets: Secrets = [],
    /** `false` decodes every event with JSON.parse (the reference for the lean decoding). */
    private readonly lean = true
  ) {
    super()
    this.redact = redactorOf(secrets)
  }

  /** The events produced since the last call. */
  take(): ReadonlyArray<UpstreamEvent> {
    const events = this.events
    if (events.length === 0) return NO_EVENTS
    this.events = []
    return events
  }

  /** Fails the answer (first failure wins). */
  fail(error: UpstreamError): void {
    if (this.error === undefined) this.error = error
  }

  /** One SSE event's `data`. */
  onData(data: string): void {
    if (this.error !== undefined || this.sawDone) return
    if (data.length > MAX_EVENT_CHARS) {
      return this.fail(protocolError(`event longer than ${MAX_EVENT_CHARS} characters`))
    }
    if (this.lean && this.leanPrefix !== undefined && this.leanDelta(data, this.leanPrefix)) return
    let event: unknown
    try {
      event = JSON.parse(data)
    } catch {
      return this.fail(protocolError(`undecodable event: ${clip(this.redact(data), 200)}`))
    }
    if (typeof event !== "object" || event === null) return this.fail(protocolError("event is not a JSON object"))
    this.onEvent(event as Json)
  }

  onEvent(event: Json): void {
    if (this.error !== undefined || this.sawDone) return
    switch (event.type) {
      case "content_block_delta": {
        const block = this.block(event.index)
        // Blocks of types we do not decode (redacted thinking, server tools, ...) take any delta.
        if (block === undefined || block.kind === OTHER) return
        const delta = event.delta
        switch (delta?.type) {
          case "text_delta":
            if (block.kind !== TEXT) return this.fail(protocolError("text_delta outside a text block"))
            return this.text(delta.text)
          case "thinking_delta":
            if (block.kind !== THINKING) return this.fail(protocolError("thinking_delta outside a thinking block"))
            return this.thinking(delta.thinking)
          case "input_json_delta": {
            if (block.kind !== TOOL) return this.fail(protocolError("input_json_delta outside a tool_use block"))
            const fragment = delta.partial_json
            if (typeof fragment === "string" && fragment.length > 0) this.args(block, fragment)
            return
          }
          default:
            // signature_delta, citations_delta, ...
            return
        }
      }
      case "content_block_start": {
        const index = event.index
        if (!Number.isInteger(index) || index < 0) return this.fail(protocolError("content block without an index"))
        if (this.open_.has(index)) return this.fail(protocolError(`content block ${index} started twice`))
        const start = event.content_block
        if (typeof start !== "object" || start === null) {
          return this.fail(protocolError("content_block_start without a content_block"))
        }
        const block = this.open(start)
        if (typeof block === "string") return this.fail(protocolError(block))
        this.open_.set(index, block)
        const delta = block.kind === TEXT
          ? "text_delta\",\"text"
          : block.kind === THINKING
          ? "thinking_delta\",\"thinking"
          : block.kind === TOOL
          ? "input_json_delta\",\"partial_json"
          : undefined
        this.leanBlock = delta === undefined ? undefined : block
        this.leanPrefix = delta === undefined
          ? undefined
          : `{"type":"content_block_delta","index":${index},"delta":{"type":"${delta}":"`
        if (block.kind === TEXT) this.text(start.text)
        else if (block.kind === THINKING) this.thinking(start.thinking)
        return
      }
      case "content_block_stop": {
        const block = this.block(event.index)
        if (block === undefined) return
        this.open_.delete(event.index)
        if (this.leanBlock === block) this.leanBlock = this.leanPrefix = undefined
        return this.close(block)
      }
      case "message_start":
        return this.tokens.read(event.message?.usage)
      case "message_delta": {
        this.sawDelta = true
        const reason = event.delta?.stop_reason
        if (reason !== undefined && reason !== null) this.stopReason = reason
        this.tokens.read(event.usage)
        if (this.tokens.reported) this.usage = this.tokens.usage(this.thinkingChars)
        return
      }
      case "message_stop":
        this.sawDone = true
        return
      case "error":
        return this.fail(errorFromEvent(event.error, this.redact))
      default:
        // ping, and event types added later
        return
    }
  }

  /**
   * Lean decoding of the common event. Nearly every event of an answer is a delta of the open block, sent by
   * Anthropic as compact JSON: `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"..."}}`.
   * A `data` that is exactly the open block's prefix, one JSON string token and `}}` has those members and no
   * others, so it is that delta: only the string is read (sliced, or parsed alone when it holds escapes) instead of
   * JSON.parse building the whole object. Anything else goes through JSON.parse. Returns whether it was handled.
   */
  private leanDelta(data: string, prefix: string): boolean {
    const end = data.length - 3
    if (
      end < prefix.length || data.charCodeAt(end) !== 34 || data.charCodeAt(end + 1) !== 125 ||
      data.charCodeAt(end + 2) !== 125 || !data.startsWith(prefix)
    ) return false
    const value = stringBody(data, prefix.length, end)
    if (value === undefined) return false
    const block = this.leanBlock!
    if (block.kind === TEXT) this.text(value)
    else if (block.kind === THINKING) this.thinking(value)
    else if (value.length > 0) this.args(block, value)
    return true
  }

  private block(index: unknown): Block | undefined {
    const block = typeof index === "number" ? this.open_.get(index) : undefined
    if (block === undefined) this.fail(protocolError(`event for content block ${String(index)} that is not open`))
    return block
  }

  /**
   * The body ended: `Finish` and `Usage` (in `events`), or the failure. An answer cut before `message_delta`
   * (which carries the stop reason) is a protocol error; one cut between it and `message_stop` is complete.
   */
  end(): UpstreamError | undefined {
    if (this.error !== undefined) return this.error
    if (this.ended) return undefined
    if (!this.sawDone && !this.sawDelta) {
      this.fail(protocolError("upstream ended the stream before finishing"))
      return this.error
    }
    this.ended = true
    for (const block of this.open_.values()) this.close(block)
    this.open_.clear()
    this.finish(this.stopReason)
    return undefined
  }
}

/** Feeds response text (decoded UTF-8, split anywhere) through the SSE parser into a `StreamDecoder`. */
export class AnthropicSse {
  readonly decoder: StreamDecoder
  private readonly parser: SseParser

  constructor(secrets: Secrets = []) {
    const decoder = (this.decoder = new StreamDecoder(secrets))
    // A line a little over the event bound fails in the parser; shorter ones are checked by the decoder.
    this.parser = new SseParser((data) => decoder.onData(data), MAX_EVENT_CHARS + 16)
  }

  push(text: string): void {
    if (this.decoder.error !== undefined || this.decoder.sawDone) return
    try {
      this.parser.push(text)
    } catch (error) {
      this.decoder.fail(protocolError((error as Error).message))
    }
  }

  /** End of the body: the last event, then `StreamDecoder.end()`. */
  end(): UpstreamError | undefined {
    if (this.decoder.error === undefined && !this.decoder.sawDone) {
      try {
        this.parser.end()
      } catch (error) {
        this.decoder.fail(protocolError((error as Error).message))
      }
    }
    return this.decoder.end()
  }
}

class WholeDecoder extends Emitter {
  decode(body: Json): ReadonlyArray<UpstreamEvent> | UpstreamError {
    const content = body.content
    if (!Array.isArray(content)) return protocolError("answer has no content array")
    for (const item of content) {
      if (typeof item !== "object" || item === null) return protocolError("content block is not an object")
      const block = this.open(item)
      if (typeof block === "string") return protocolError(block)
      if (block.kind === TEXT) this.text(item.text)
      else if (block.kind === THINKING) this.thinking(item.thinking)
      else if (block.kind === TOOL) this.close(block)
    }
    this.tokens.read(body.usage)
    this.finish(body.stop_reason)
    return this.events
  }
}

/** A whole (non-streamed) Messages answer, parsed: the same events a stream of it gives, or the failure. */
export const decodeResponse = (
  body: unknown,
  secrets: Secrets = []
): ReadonlyArray<UpstreamEvent> | UpstreamError => {
  if (typeof body !== "object" || body === null || Array.isArray(body)) {
    return protocolError("answer is not a JSON object")
  }
  const b = body as Json
  if (b.type === "error") return errorFromEvent(b.error, secrets)
  return new WholeDecoder().decode(b)
}
