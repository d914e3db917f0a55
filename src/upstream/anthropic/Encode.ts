/**
 * `UpstreamRequest` (the chat-completions contract) -> an Anthropic Messages API request (`POST /v1/messages`).
 * Pure: no I/O; the transport sends `{ path, headers, body }` to the provider's origin.
 *
 * Mapping (decisions in the notes, docs/decisions.md "Anthropic Messages codec"):
 * - `system` messages, wherever they stand, become the top-level `system` text: the text parts of one message
 *   joined with "\n", messages joined with "\n\n". Anthropic has no system role and no images there: an image
 *   part in a system message is refused.
 * - `user` content: text parts -> `text` blocks, `image_url` -> `image` blocks (`https:` -> a `url` source,
 *   `data:<type>;base64,` -> a `base64` source for image/jpeg, png, gif, webp; anything else is refused).
 *   `detail` has no Anthropic equivalent and is dropped. Empty text blocks are dropped (Anthropic refuses them).
 * - `assistant`: content -> a `text` block, `tool_calls` -> `tool_use` blocks (arguments parsed; arguments that are
 *   not a JSON object, e.g. cut by `max_tokens`, become `{}`). `reasoning` is dropped: Anthropic only accepts
 *   thinking blocks with the signature it issued, which the contract does not carry.
 * - `tool` messages -> `tool_result` blocks of a user turn. Consecutive messages of the same Anthropic role are
 *   merged into one turn (the API wants alternating turns); in a user turn the tool results come first (the API
 *   wants them at the start of the turn following the tool calls).
 * - Tool call ids that are not `[A-Za-z0-9_-]{1,64}` (Anthropic's pattern) are replaced by a hash of themselves,
 *   the same on the `tool_use` and its `tool_result`, so pairs still match.
 * - A final assistant message is a prefill (Anthropic continues it); its trailing whitespace is trimmed (Anthropic
 *   refuses it).
 * - `tools` -> `{name, description, input_schema}` (`parameters` with `type: "object"` added when missing, or an
 *   empty object schema; `strict` dropped).
 *   Tool calls in the history with no `tools` in the request: Anthropic refuses tool blocks without tool
 *   definitions, so each tool name of the history is declared (empty schema) with `tool_choice: none`.
 * - `tool_choice`: auto -> auto, required -> any, none -> none, function -> tool; `parallel_tool_calls: false` ->
 *   `disable_parallel_tool_use: true`. Both only with tools.
 * - `stop` -> `stop_sequences`; `temperature` clamped to Anthropic's 0..1; `top_p` only without `temperature`
 *   (recent models refuse both); `max_tokens`; `stream`.
 * - `reasoning_effort` -> `thinking: {type: "enabled", budget_tokens}` (see `THINKING_BUDGETS` and `thinkingBudget`).
 *   With thinking on, `temperature` is omitted and `top_p` is sent only when within 0.95..1 (Anthropic's rules).
 */
import { createHash } from "node:crypto"
import type { ContentPart, Message, ToolChoice, UpstreamRequest } from "../Upstream.js"
import { UpstreamError } from "../Upstream.js"

export const MESSAGES_PATH = "/v1/messages"
/**
 * `max_tokens` when the request names none (a BYOK request passes only what the client asked, and the Messages
 * API requires one): 4,096 is accepted by every Claude model.
 */
export const DEFAULT_MAX_TOKENS = 4096
export const ANTHROPIC_VERSION = "2023-06-01"

export interface EncodeOptions {
  /**
   * The credential. Never logged; only placed in the header below. Absent or empty: no credential header at all
   * (a provider without `api_key_env`, e.g. a proxy that adds its own).
   */
  readonly apiKey?: string | undefined
  /** `x-api-key` (Anthropic's own API, the default) or `Authorization: Bearer` (gateways, OAuth tokens). */
  readonly scheme?: "x-api-key" | "bearer"
}

export interface EncodedRequest {
  readonly path: typeof MESSAGES_PATH
  readonly headers: Readonly<Record<string, string>>
  readonly body: string
}

/**
 * Thinking budget (tokens) per `reasoning_effort`; `none` (or no effort) sends no `thinking` at all. 1024 is
 * Anthropic's minimum budget.
 */
export const THINKING_BUDGETS = { low: 1024, high: 8192, max: 24576 } as const
export const MIN_THINKING_BUDGET = 1024

/**
 * The budget actually sent, or 0 for none. `max_tokens` is the contract's cap on reasoning plus answer (the
 * simulated upstream and OpenAI's reasoning models count it so; the gateway already clamps it to the model's
 * `max_output_tokens`), and Anthropic's `max_tokens` counts thinking too and must exceed the budget. So the budget
 * shrinks to `max_tokens - 1` rather than `max_tokens` growing (which could pass the model's limit and the
 * client's cap); below Anthropic's minimum of 1024 thinking is off.
 */
export const thinkingBudget = (effort: UpstreamRequest["reasoning_effort"], maxTokens: number): number => {
  if (effort === undefined || effort === "none") return 0
  const budget = Math.min(THINKING_BUDGETS[effort], maxTokens - 1)
  return budget >= MIN_THINKING_BUDGET ? budget : 0
}

/** Image media types the Messages API accepts (`image/jpg` is read as jpeg). */
const MEDIA_TYPES: ReadonlyMap<string, string> = new Map([
  ["image/jpeg", "image/jpeg"],
  ["image/jpg", "image/jpeg"],
  ["image/png", "image/png"],
  ["image/gif", "image/gif"],
  ["image/webp", "image/webp"]
])

const TOOL_ID = /^[A-Za-z0-9_-]{1,64}$/

/** Anthropic's tool-use id for a client's tool call id (kept when it fits the pattern). */
export const wireToolId = (id: string): string =>
  TOOL_ID.test(id) ? id : "toolu_" + createHash("sha256").update(id).digest("hex").slice(0, 32)

type Block = Record<string, unknown>

interface Turn {
  readonly role: "user" | "assistant"
  /** `tool_result` blocks (user turns only): they go first. */
  readonly results: Array<Block>
  readonly blocks: Array<Block>
}

/** Refused before sending: answered like the upstream's own 400 (`upstream_rejected`). */
const refuse = (detail: string): UpstreamError =>
  new UpstreamError({ kind: "status", status: 400, detail: `refused before sending to Anthropic: ${detail}` })

const imageBlock = (url: string): Block | UpstreamError => {
  if (url.startsWith("https://")) return { type: "image", source: { type: "url", url } }
  if (url.startsWith("data:")) {
    // `data:<type>[;param]*;base64,<data>`; the header is short, so a huge URL without a comma costs nothing.
    const comma = url.slice(0, 206).indexOf(",")
    if (comma < 0) return refuse("image data URI is malformed")
    const params = url.slice(5, comma).split(";")
    const given = params[0]!.trim().toLowerCase()
    const mediaType = MEDIA_TYPES.get(given)
    if (mediaType === undefined) {
      return refuse(`image media type ${JSON.stringify(given.slice(0, 50))} is not supported (jpeg, png, gif, webp)`)
    }
    if (!params.slice(1).some((p) => p.trim().toLowerCase() === "base64")) {
      return refuse("image data URI must be base64-encoded")
    }
    if (comma === url.length - 1) return refuse("image data URI is empty")
    return { type: "image", source: { type: "base64", media_type: mediaType, data: url.slice(comma + 1) } }
  }
  return refuse("image URL must be https or a data: URI")
}

/** Text parts of a system message; an image is refused. */
const systemText = (content: string | ReadonlyArray<ContentPart>): string | UpstreamError => {
  if (typeof content === "string") return content
  const texts: Array<string> = []
  for (const part of content) {
    if (part.type !== "text") return refuse("system messages cannot hold images")
    if (part.text.length > 0) texts.push(part.text)
  }
  return texts.join("\n")
}

const userBlocks = (content: string | ReadonlyArray<ContentPart>, into: Array<Block>): UpstreamError | undefined => {
  if (typeof content === "string") {
    if (content.length > 0) into.push({ type: "text", text: content })
    return undefined
  }
  for (const part of content) {
    if (part.type === "text") {
      if (part.text.length > 0) into.push({ type: "text", text: part.text })
    } else {
      const block = imageBlock(part.image_url.url)
      if (block instanceof UpstreamError) return block
      into.push(block)
    }
  }
  return undefined
}

const EMPTY_OBJECT_SCHEMA = { type: "object", properties: {} } as const

/** Tool call arguments as the `input` object Anthropic requires; anything else (or invalid JSON) is `{}`. */
const toolInput = (args: string): object => {
  if (args.length === 0) return {}
  try {
    const parsed = JSON.parse(args)
    return typeof parsed === "object" && parsed !== null && !Array.isArray(parsed) ? parsed : {}
  } catch {
    return {}
  }
}

const wireToolChoice = (choice: ToolChoice | undefined, parallel: boolean | undefined): Block | undefined => {
  let out: Block | undefined
  if (choice === undefined) out = parallel === false ? { type: "auto" } : undefined
  else if (choice === "auto") out = { type: "auto" }
  else if (choice === "required") out = { type: "any" }
  else if (choice === "none") return { type: "none" }
  else out = { type: "tool", name: choice.function.name }
  if (out !== undefined && parallel === false) out.disable_parallel_tool_use = true
  return out
}

/** Whether the client forces a tool call (Anthropic refuses forced tool use with thinking). */
const forcesTool = (choice: ToolChoice | undefined): boolean =>
  choice !== undefined && choice !== "auto" && choice !== "none"

/** Builds the Anthropic request, or the reason it cannot be sent (an `UpstreamError`, status 400). */
export const encodeRequest = (request: UpstreamRequest, options: EncodeOptions): EncodedRequest | UpstreamError => {
  const system: Array<string> = []
  const turns: Array<Turn> = []
  /** Tool names used in the history (only needed when the request declares no tools). */
  let historyTools: Set<string> | undefined
  const hasTools = request.tools !== undefined && request.tools.length > 0

  const turn = (role: "user" | "assistant"): Turn => {
    const last = turns[turns.length - 1]
    if (last !== undefined && last.role === role) return last
    const created: Turn = { role, results: [], blocks: [] }
    turns.push(created)
    return created
  }

  const messages: ReadonlyArray<Message> = request.messages
  for (let i = 0; i < messages.length; i++) {
    const m = messages[i]!
    switch (m.role) {
      case "system": {
        const text = systemText(m.content)
        if (text instanceof UpstreamError) return text
        if (text.length > 0) system.push(text)
        break
      }
      case "user": {
        const blocks: Array<Block> = []
        const refused = userBlocks(m.content, blocks)
        if (refused !== undefined) return refused
        if (blocks.length > 0) turn("user").blocks.push(...blocks)
        break
      }
      case "tool": {
        const result: Block = { type: "tool_result", tool_use_id: wireToolId(m.tool_call_id) }
        if (m.content.length > 0) result.content = m.content
        turn("user").results.push(result)
        break
      }
      case "assistant": {
        const calls = m.tool_calls ?? []
        const hasText = m.content !== null && m.content.length > 0
        if (!hasText && calls.length === 0) break
        const t = turn("assistant")
        if (hasText) t.blocks.push({ type: "text", text: m.content })
        for (const call of calls) {
          t.blocks.push({
            type: "tool_use",
            id: wireToolId(call.id),
            name: call.function.name,
            input: toolInput(call.function.arguments)
          })
          if (!hasTools) (historyTools ??= new Set()).add(call.function.name)
        }
        // m.reasoning is dropped: see the module comment.
        break
      }
    }
  }

  const last = turns[turns.length - 1]
  // A final assistant turn is a prefill: Anthropic refuses trailing whitespace in it.
  if (last !== undefined && last.role === "assistant") {
    const block = last.blocks[last.blocks.length - 1]!
    if (block.type === "text") {
      const trimmed = (block.text as string).trimEnd()
      if (trimmed.length > 0) block.text = trimmed
      else last.blocks.pop()
      if (last.blocks.length === 0) turns.pop()
    }
  }

  const wireMessages = turns.map((t) => ({
    role: t.role,
    content: t.results.length === 0 ? t.blocks : t.blocks.length === 0 ? t.results : [...t.results, ...t.blocks]
  }))

  const final = turns[turns.length - 1]
  // Thinking is off when Anthropic would refuse it: a forced tool, a prefill, or a tool loop continued without the
  // signed thinking blocks of the assistant turn that called the tools (the contract cannot carry them).
  const maxTokens = request.max_tokens ?? DEFAULT_MAX_TOKENS
  let budget = thinkingBudget(request.reasoning_effort, maxTokens)
  if (
    budget > 0 &&
    ((hasTools && forcesTool(request.tool_choice)) ||
      (final !== undefined && (final.role === "assistant" || final.results.length > 0)))
  ) budget = 0

  const body: Record<string, unknown> = { model: request.model, max_tokens: maxTokens }
  if (system.length > 0) body.system = system.join("\n\n")
  body.messages = wireMessages
  if (request.stop !== undefined) {
    const stops = typeof request.stop === "string" ? [request.stop] : request.stop
    if (stops.length > 0) body.stop_sequences = stops
  }
  if (budget > 0) {
    body.thinking = { type: "enabled", budget_tokens: budget }
    if (request.top_p !== undefined && request.top_p >= 0.95) body.top_p = request.top_p
  } else if (request.temperature !== undefined) {
    // Recent models refuse temperature and top_p together: temperature wins.
    body.temperature = Math.min(1, Math.max(0, request.temperature))
  } else if (request.top_p !== undefined) {
    body.top_p = request.top_p
  }
  if (hasTools) {
    body.tools = request.tools!.map((tool) => {
      const out: Record<string, unknown> = { name: tool.function.name }
      if (tool.function.description !== undefined) out.description = tool.function.description
      const schema = tool.function.parameters
      // Anthropic requires `type: "object"`; OpenAI-style clients sometimes send `{}` or properties alone.
      out.input_schema = schema === undefined
        ? EMPTY_OBJECT_SCHEMA
        : schema.type === undefined
        ? { type: "object", ...schema }
        : schema
      return out
    })
    const choice = wireToolChoice(request.tool_choice, request.parallel_tool_calls)
    if (choice !== undefined) body.tool_choice = choice
  } else if (historyTools !== undefined) {
    body.tools = [...historyTools].map((name) => ({ name, input_schema: EMPTY_OBJECT_SCHEMA }))
    body.tool_choice = { type: "none" }
  }
  body.stream = request.stream

  const headers: Record<string, string> = {
    "content-type": "application/json",
    "anthropic-version": ANTHROPIC_VERSION
  }
  if (options.apiKey) {
    if (options.scheme === "bearer") headers.authorization = `Bearer ${options.apiKey}`
    else headers["x-api-key"] = options.apiKey
  }
  return { path: MESSAGES_PATH, headers, body: JSON.stringify(body) }
}
