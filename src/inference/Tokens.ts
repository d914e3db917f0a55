import { Effect } from "effect"
import type { Message } from "../upstream/Upstream.js"

/** Tokens charged per image part in the estimate (a high-detail tile set). */
export const IMAGE_TOKENS = 765
/** Per-message framing overhead of chat formats. */
const MESSAGE_OVERHEAD = 4

export interface InputSize {
  /** UTF-8 bytes of all text, an upper bound of its token count. */
  readonly bytes: number
  readonly images: number
  readonly texts: ReadonlyArray<string>
}

export const measure = (messages: ReadonlyArray<Message>, tools?: ReadonlyArray<unknown>): InputSize => {
  let bytes = 0
  let images = 0
  const texts: Array<string> = []
  const add = (text: string) => {
    texts.push(text)
    bytes += Buffer.byteLength(text, "utf8")
  }
  for (const message of messages) {
    bytes += MESSAGE_OVERHEAD
    const content = message.content
    if (typeof content === "string") add(content)
    else if (content !== null) {
      for (const part of content) {
        if (part.type === "text") add(part.text)
        else images++
      }
    }
    if (message.role === "assistant") {
      if (message.reasoning) add(message.reasoning)
      for (const call of message.tool_calls ?? []) add(call.function.name + call.function.arguments)
    }
  }
  if (tools && tools.length > 0) add(JSON.stringify(tools))
  return { bytes, images, texts }
}

/** Cheap estimate for reservations: about 4 bytes per token. Upstream usage is the truth for charging. */
export const roughTokens = (size: InputSize): number => Math.ceil(size.bytes / 4) + size.images * IMAGE_TOKENS

type Counter = (text: string) => number
let counter: Promise<Counter> | null = null
const loadCounter = (): Promise<Counter> =>
  (counter ??= import("gpt-tokenizer/encoding/o200k_base").then((m) => m.countTokens as Counter))

/**
 * Token count for the `input_too_long` gate. A token is at least one byte, so when the byte count fits
 * the limit no tokenizer runs (the common case); otherwise the o200k tokenizer (loaded on first need) counts.
 */
export const exceedsLimit = (size: InputSize, limit: number): Effect.Effect<{ readonly exceeds: boolean; readonly tokens: number }> => {
  if (size.bytes + size.images * IMAGE_TOKENS <= limit) {
    return Effect.succeed({ exceeds: false, tokens: roughTokens(size) })
  }
  return Effect.promise(loadCounter).pipe(Effect.map((count) => {
    let tokens = size.images * IMAGE_TOKENS
    for (const text of size.texts) {
      tokens += count(text) + MESSAGE_OVERHEAD
      if (tokens > limit) return { exceeds: true, tokens }
    }
    return { exceeds: tokens > limit, tokens }
  }))
}
