/**
 * A deterministic simulated model. The same request always yields the same events, so tests and
 * benchmarks can assert exact output. `planChat` is pure and synchronous (the HTTP sim server uses it
 * directly); `simulateOpen` is the in-process adapter's `open`, paced on the Effect clock so that
 * `TestClock` drives the latency.
 */
import { createHash } from "node:crypto"
import { Clock, Effect, type Fiber } from "effect"
import type { SimulatedProvider } from "../../config/GatewayConfig.js"
import { startTimer, stopTimer, type Timer } from "../../runtime/Timers.js"
import { NO_EVENTS, PushCall } from "../PushCall.js"
import type {
  ContentPart,
  FinishReason,
  Message,
  ToolDefinition,
  UpstreamAdapter,
  UpstreamCall,
  UpstreamError,
  UpstreamEvent,
  UpstreamRequest,
  UpstreamSink,
  Usage
} from "../Upstream.js"

export type SimulatedProviderConfig = typeof SimulatedProvider.Type

export interface SimulatedTiming {
  /** Delay before the first event. */
  readonly first_token_ms: number
  /** Output pacing; 0 emits everything at once. */
  readonly tokens_per_second: number
}

// ---------------------------------------------------------------------------------------------
// Tokens and hashing

/** One token per started 4-character piece of each whitespace-separated word. */
export const countTokens = (text: string): number => {
  let tokens = 0
  let run = 0
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i)
    if (c === 32 || c === 10 || c === 9 || c === 13) {
      if (run > 0) {
        tokens += (run + 3) >> 2
        run = 0
      }
    } else {
      run++
    }
  }
  return run > 0 ? tokens + ((run + 3) >> 2) : tokens
}

/** FNV-1a, 32 bits. */
export const hash32 = (text: string): number => {
  let h = 0x811c9dc5
  for (let i = 0; i < text.length; i++) {
    h ^= text.charCodeAt(i)
    h = Math.imul(h, 0x01000193)
  }
  return h >>> 0
}

/** mulberry32: a small seeded PRNG in [0, 1). */
const prng = (seed: number) => {
  let a = seed >>> 0
  return (): number => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
}

/** `call_` + 32 lowercase hex characters derived from `seed`. */
export const toolCallId = (seed: string): string =>
  "call_" + createHash("sha256").update(seed).digest("hex").slice(0, 32)

// ---------------------------------------------------------------------------------------------
// Prompt estimate

const IMAGE_TOKENS = 85

export const contentText = (content: string | ReadonlyArray<ContentPart> | null): string => {
  if (content === null) return ""
  if (typeof content === "string") return content
  let text = ""
  for (const part of content) if (part.type === "text") text = text === "" ? part.text : text + " " + part.text
  return text
}

const imageCount = (content: string | ReadonlyArray<ContentPart> | null): number => {
  if (content === null || typeof content === "string") return 0
  let n = 0
  for (const part of content) if (part.type === "image_url") n++
  return n
}

/** Deterministic input size: 3 + per message (4 + text tokens + 85 per image) + tool definitions. */
export const estimatePromptTokens = (request: Pick<UpstreamRequest, "messages" | "tools">): number => {
  let tokens = 3
  for (const message of request.messages) {
    tokens += 4 + countTokens(contentText(message.content)) + IMAGE_TOKENS * imageCount(message.content)
    if (message.role === "assistant" && message.tool_calls) {
      for (const call of message.tool_calls) {
        tokens += countTokens(call.function.name) + countTokens(call.function.arguments)
      }
    }
  }
  if (request.tools) {
    for (const tool of request.tools) {
      tokens += 8 + countTokens(tool.function.name) + countTokens(tool.function.description ?? "") +
        countTokens(JSON.stringify(tool.function.parameters ?? {}))
    }
  }
  return tokens
}

// ---------------------------------------------------------------------------------------------
// Text generation

const VOCABULARY = [
  "river", "stone", "light", "water", "gentle", "north", "signal", "garden", "quiet", "bright",
  "window", "market", "harbor", "silver", "morning", "forest", "bridge", "paper", "simple", "steady",
  "valley", "spring", "clear", "answer", "method", "detail", "pattern", "common", "useful", "careful",
  "layer", "stream", "token", "record", "summary", "example", "reason", "result", "number", "letter",
  "field", "order", "table", "circle", "square", "small", "large", "early", "later", "often",
  "always", "rarely", "still", "again", "around", "inside", "outside", "between", "across", "beyond",
  "within", "along", "toward", "under"
] as const

const filler = (seed: number, count: number): string => {
  const next = prng(seed)
  const words: Array<string> = []
  for (let i = 0; i < count; i++) words.push(VOCABULARY[Math.floor(next() * VOCABULARY.length)]!)
  return words.join(" ")
}

const firstWords = (text: string, max: number): string => {
  const words = text.split(/\s+/).filter((w) => w.length > 0)
  return words.slice(0, max).join(" ")
}

/** `words` closed with a period unless it already ends a sentence. */
const sentence = (words: string): string => /[.!?]$/.test(words) ? words : words + "."

/** Word pieces: each is a word plus the whitespace after it, so pieces concatenate to the text. */
const pieces = (text: string): Array<string> => text.match(/\S+\s*|\s+/g) ?? []

const REASONING_WORDS = { low: 12, high: 40, max: 100 } as const

// ---------------------------------------------------------------------------------------------
// Tool arguments from a JSON schema

const isRecord = (u: unknown): u is Record<string, unknown> => typeof u === "object" && u !== null && !Array.isArray(u)

const sampleValue = (schema: unknown, word: string, depth: number): unknown => {
  if (!isRecord(schema) || depth > 8) return word
  if ("const" in schema) return schema.const
  if (Array.isArray(schema.enum) && schema.enum.length > 0) return schema.enum[0]
  if ("default" in schema) return schema.default
  for (const key of ["anyOf", "oneOf", "allOf"] as const) {
    const options = schema[key]
    if (Array.isArray(options) && options.length > 0) {
      const first = options.find((o) => !(isRecord(o) && o.type === "null")) ?? options[0]
      return sampleValue(first, word, depth + 1)
    }
  }
  let type = schema.type
  if (Array.isArray(type)) type = type.find((t) => t !== "null") ?? "null"
  if (type === undefined) type = isRecord(schema.properties) ? "object" : "items" in schema ? "array" : "string"
  switch (type) {
    case "string": {
      switch (schema.format) {
        case "date":
          return "2026-01-01"
        case "date-time":
          return "2026-01-01T00:00:00Z"
        case "email":
          return "user@example.com"
        case "uri":
        case "url":
          return "https://example.com"
      }
      let value = word
      const min = typeof schema.minLength === "number" ? schema.minLength : 0
      while (value.length < min) value += "x"
      if (typeof schema.maxLength === "number" && value.length > schema.maxLength) {
        value = value.slice(0, Math.max(schema.maxLength, min))
      }
      return value
    }
    case "integer":
    case "number": {
      let value = 1
      if (typeof schema.minimum === "number" && value < schema.minimum) value = schema.minimum
      if (typeof schema.exclusiveMinimum === "number" && value <= schema.exclusiveMinimum) {
        value = schema.exclusiveMinimum + 1
      }
      if (typeof schema.maximum === "number" && value > schema.maximum) value = schema.maximum
      if (typeof schema.exclusiveMaximum === "number" && value >= schema.exclusiveMaximum) {
        value = schema.exclusiveMaximum - 1
      }
      return type === "integer" ? Math.ceil(value) : value
    }
    case "boolean":
      return true
    case "null":
      return null
    case "array": {
      const min = typeof schema.minItems === "number" ? schema.minItems : 1
      const max = typeof schema.maxItems === "number" ? schema.maxItems : min
      const items: Array<unknown> = []
      for (let i = 0; i < Math.min(min, max); i++) items.push(sampleValue(schema.items, word, depth + 1))
      return items
    }
    default: {
      const properties = isRecord(schema.properties) ? schema.properties : {}
      const required = Array.isArray(schema.required)
        ? schema.required.filter((k): k is string => typeof k === "string")
        : []
      const keys = required.length > 0 ? required : Object.keys(properties)
      const out: Record<string, unknown> = {}
      for (const key of keys) out[key] = sampleValue(properties[key], word, depth + 1)
      return out
    }
  }
}

/** A JSON object (as text) valid for the tool's `parameters` schema, strings filled with `word`. */
export const sampleArguments = (tool: ToolDefinition, word: string): string => {
  const value = sampleValue(tool.function.parameters ?? { type: "object" }, word, 0)
  return JSON.stringify(isRecord(value) ? value : {})
}

const ARGUMENT_FRAGMENT = 8

// ---------------------------------------------------------------------------------------------
// The plan

export interface SimulatedToolCall {
  readonly id: string
  readonly name: string
  readonly arguments: string
}

export interface ChatPlan {
  /** All events in order, `Finish` and `Usage` last. */
  readonly events: ReadonlyArray<UpstreamEvent>
  /** Output tokens of each event (0 for Finish/Usage), used for pacing. */
  readonly costs: ReadonlyArray<number>
  readonly reasoning: string
  readonly content: string
  readonly toolCalls: ReadonlyArray<SimulatedToolCall>
  readonly finish: FinishReason
  readonly usage: Usage
}

const lastOf = <A>(items: ReadonlyArray<A>, predicate: (a: A) => boolean): A | undefined => {
  for (let i = items.length - 1; i >= 0; i--) if (predicate(items[i]!)) return items[i]
  return undefined
}

const lastUserText = (messages: ReadonlyArray<Message>): string => {
  const user = lastOf(messages, (m) => m.role === "user")
  return user ? contentText(user.content) : ""
}

/** The tool name that produced a tool result, looked up in the assistant turn that called it. */
const toolNameFor = (messages: ReadonlyArray<Message>, toolCallId: string): string => {
  for (let i = messages.length - 1; i >= 0; i--) {
    const m = messages[i]!
    if (m.role === "assistant" && m.tool_calls) {
      const call = m.tool_calls.find((c) => c.id === toolCallId)
      if (call) return call.function.name
    }
  }
  return "tool"
}

const chooseTools = (request: UpstreamRequest, seed: number): ReadonlyArray<ToolDefinition> => {
  const tools = request.tools ?? []
  const choice = request.tool_choice
  if (typeof choice === "object") {
    const named = tools.find((t) => t.function.name === choice.function.name)
    return named ? [named] : []
  }
  const first = tools[seed % tools.length]!
  if (request.parallel_tool_calls === true && tools.length >= 2) {
    return [first, tools[(seed + 1) % tools.length]!]
  }
  return [first]
}

const cutAtStop = (text: string, stop: UpstreamRequest["stop"]): { text: string; stopped: boolean } => {
  if (stop === undefined) return { text, stopped: false }
  let cut = -1
  for (const s of typeof stop === "string" ? [stop] : stop) {
    if (s.length === 0) continue
    const at = text.indexOf(s)
    if (at >= 0 && (cut < 0 || at < cut)) cut = at
  }
  return cut < 0 ? { text, stopped: false } : { text: text.slice(0, cut), stopped: true }
}

/**
 * What the simulated model answers:
 * - reasoning first when `reasoning_effort` is set and not "none" (12/40/100 words for low/high/max);
 * - a tool call (two with `parallel_tool_calls: true`) when tools are offered, `tool_choice` is not
 *   "none" and the last message is the user's;
 * - otherwise text that echoes the first words of the last user message (or the tool result after a
 *   tool message), then seeded filler words.
 * `max_tokens` bounds reasoning plus output (finish `length`); a `stop` string cuts the text.
 */
export const planChat = (request: UpstreamRequest): ChatPlan => {
  const events: Array<UpstreamEvent> = []
  const costs: Array<number> = []
  const messages = request.messages
  const last = messages[messages.length - 1]
  const userText = lastUserText(messages)
  const seed = hash32(userText)
  let budget = Math.max(0, request.max_tokens ?? Number.MAX_SAFE_INTEGER)
  let truncated = false
  let reasoning = ""
  let content = ""
  let reasoningTokens = 0
  let outputTokens = 0

  const emitText = (tag: "Reasoning" | "Content", text: string): string => {
    let emitted = ""
    for (const piece of pieces(text)) {
      let cost = countTokens(piece)
      let out = piece
      if (cost > budget) {
        out = piece.trimEnd().slice(0, budget * 4)
        cost = countTokens(out)
        truncated = true
      }
      if (out.length > 0) {
        events.push({ _tag: tag, text: out })
        costs.push(cost)
        budget -= cost
        emitted += out
        if (tag === "Reasoning") reasoningTokens += cost
        else outputTokens += cost
      }
      if (truncated) break
    }
    return emitted
  }

  const effort = request.reasoning_effort
  if (effort !== undefined && effort !== "none") {
    const topic = firstWords(userText, 8)
    const text = `Considering the request${topic ? ` about ${sentence(topic)}` : "."} ` +
      filler(seed ^ 0x9e3779b9, REASONING_WORDS[effort])
    reasoning = emitText("Reasoning", text)
  }

  const toolCalls: Array<SimulatedToolCall> = []
  const wantsTools = request.tools !== undefined && request.tools.length > 0 && request.tool_choice !== "none" &&
    last !== undefined && last.role === "user"
  const chosen = wantsTools && !truncated ? chooseTools(request, seed) : []
  let stopped = false

  if (chosen.length > 0) {
    const word = lastOf(userText.split(/[^A-Za-z0-9]+/), (w) => w.length > 0) ?? "sample"
    chosen.forEach((tool, index) => {
      if (truncated) return
      const name = tool.function.name
      const id = toolCallId(`${userText}\u0000${name}\u0000${index}`)
      const args = sampleArguments(tool, word)
      events.push({ _tag: "ToolCallStart", index, id, name })
      const nameCost = countTokens(name)
      costs.push(nameCost)
      outputTokens += nameCost
      budget = Math.max(0, budget - nameCost)
      let sent = ""
      for (let at = 0; at < args.length; at += ARGUMENT_FRAGMENT) {
        const fragment = args.slice(at, at + ARGUMENT_FRAGMENT)
        const cost = countTokens(fragment)
        if (cost > budget) {
          truncated = true
          break
        }
        events.push({ _tag: "ToolCallArgs", index, fragment })
        costs.push(cost)
        budget -= cost
        outputTokens += cost
        sent += fragment
      }
      toolCalls.push({ id, name, arguments: sent })
    })
  } else if (!truncated) {
    let text: string
    if (last !== undefined && last.role === "tool") {
      const name = toolNameFor(messages, last.tool_call_id)
      text = `The ${name} tool returned: ${sentence(firstWords(last.content, 40))} ` +
        filler(hash32(last.content), 8 + (hash32(last.content) % 16))
    } else {
      text = `Echo: ${sentence(firstWords(userText, 16))} ${filler(seed, 8 + (seed % 24))}`
    }
    const cut = cutAtStop(text, request.stop)
    stopped = cut.stopped
    content = emitText("Content", cut.text)
  }

  const finish: FinishReason = truncated
    ? "length"
    : toolCalls.length > 0 && !stopped
    ? "tool_calls"
    : "stop"
  const usage: Usage = {
    prompt_tokens: estimatePromptTokens(request),
    completion_tokens: reasoningTokens + outputTokens,
    reasoning_tokens: reasoningTokens,
    cached_tokens: 0
  }
  events.push({ _tag: "Finish", reason: finish })
  costs.push(0)
  events.push({ _tag: "Usage", usage })
  costs.push(0)
  return { events, costs, reasoning, content, toolCalls, finish, usage }
}

/**
 * When each event is due, in ms after the request started: the first after `first_token_ms`,
 * each later one after its own tokens at `tokens_per_second` (0 = no pacing).
 */
export const schedule = (plan: Pick<ChatPlan, "costs">, timing: SimulatedTiming): Float64Array => {
  const due = new Float64Array(plan.costs.length)
  const perToken = timing.tokens_per_second > 0 ? 1000 / timing.tokens_per_second : 0
  let at = Math.max(0, timing.first_token_ms)
  for (let i = 0; i < due.length; i++) {
    if (i > 0) at += plan.costs[i]! * perToken
    due[i] = at
  }
  return due
}

/**
 * A push-based simulated call (`UpstreamAdapter.open`) on the shared `PushCall`: `open` resolves when
 * the first event is due, later events are delivered in batches of what is due, then `onEnd`.
 * Pacing uses `startTimer` on the opening fiber's clock (a plain timer live, a fiber on a TestClock).
 */
class SimulatedCall extends PushCall {
  private next = 0
  private timer: Timer | undefined = undefined
  private readonly clock: Clock.Clock

  constructor(
    opener: Fiber.Fiber<unknown, unknown>,
    sink: UpstreamSink,
    private readonly events: ReadonlyArray<UpstreamEvent>,
    /** When each event is due (ms after the call starts); undefined when unpaced (all at once). */
    private readonly due: Float64Array | undefined
  ) {
    super(opener, sink)
    this.clock = opener.getRef(Clock.Clock)
  }

  protected start(): void {
    const due = this.due
    if (due !== undefined) {
      const start = this.clock.currentTimeMillisUnsafe()
      for (let i = 0; i < due.length; i++) due[i] = due[i]! + start
    }
    this.signal()
  }

  protected take(): ReadonlyArray<UpstreamEvent> {
    const events = this.events
    const from = this.next
    if (from >= events.length) return NO_EVENTS
    let to = events.length
    const due = this.due
    if (due !== undefined) {
      const now = this.clock.currentTimeMillisUnsafe()
      to = from
      while (to < events.length && due[to]! <= now) to++
      if (to === from) return NO_EVENTS
    }
    this.next = to
    if (to === events.length) this.done = true
    return from === 0 && to === events.length ? events : events.slice(from, to)
  }

  /** Wakes when the next event is due (a timer may fire a little early: it then re-arms). */
  protected override waiting(): void {
    if (this.timer !== undefined || this.done || this.due === undefined) return
    const wait = this.due[this.next]! - this.clock.currentTimeMillisUnsafe()
    this.timer = startTimer(this.clock, Math.max(wait, 0), this.tick)
  }

  private readonly tick = (): void => {
    this.timer = undefined
    this.signal()
  }

  protected release(): void {
    stopTimer(this.timer)
    this.timer = undefined
  }
}

/** `open` for the simulated model: resolves after `first_token_ms` with what is due by then. */
export const simulateOpen = (
  request: UpstreamRequest,
  timing: SimulatedTiming,
  sink: UpstreamSink
): Effect.Effect<UpstreamCall, UpstreamError> =>
  Effect.withFiber((fiber) => {
    const plan = planChat(request)
    const paced = timing.first_token_ms > 0 || timing.tokens_per_second > 0
    return new SimulatedCall(fiber, sink, plan.events, paced ? schedule(plan, timing) : undefined).run
  })

// ---------------------------------------------------------------------------------------------
// Embeddings

export const EMBEDDING_DIMENSIONS = 1024

/** A deterministic unit vector of 1024 dimensions seeded by the text. */
export const embedText = (text: string): Array<number> => {
  const next = prng(hash32(text) ^ 0x5bd1e995)
  const vector = new Array<number>(EMBEDDING_DIMENSIONS)
  let norm = 0
  for (let i = 0; i < EMBEDDING_DIMENSIONS; i++) {
    const v = next() * 2 - 1
    vector[i] = v
    norm += v * v
  }
  const scale = 1 / Math.sqrt(norm)
  for (let i = 0; i < EMBEDDING_DIMENSIONS; i++) vector[i] = vector[i]! * scale
  return vector
}

// ---------------------------------------------------------------------------------------------
// In-process adapter

export const makeSimulatedAdapter = (provider: SimulatedProviderConfig): UpstreamAdapter => {
  const timing: SimulatedTiming = {
    first_token_ms: provider.first_token_ms,
    tokens_per_second: provider.tokens_per_second
  }
  return {
    open: (request, sink) => simulateOpen(request, timing, sink),
    embed: (_model, input) =>
      Effect.sync(() => {
        let promptTokens = 0
        const vectors = input.map((text) => {
          promptTokens += countTokens(text)
          return embedText(text)
        })
        return { vectors, prompt_tokens: promptTokens }
      })
  }
}
