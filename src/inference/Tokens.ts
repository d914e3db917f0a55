import { Effect } from "effect"
import type { Message } from "../upstream/Upstream.js"

/** Tokens charged per image part in the estimate (a high-detail tile set). */
export const IMAGE_TOKENS = 765
/** Per-message framing overhead of chat formats. */
const MESSAGE_OVERHEAD = 4
/**
 * Input longer than this many UTF-8 bytes per allowed token is over the limit without tokenizing. Real text
 * runs 1 to 6 bytes per token; only long runs of one repeated character come near this.
 */
export const MAX_BYTES_PER_TOKEN = 32

export interface InputSize {
  /** UTF-8 bytes of all text, an upper bound of its token count. */
  readonly bytes: number
  readonly images: number
  readonly texts: ReadonlyArray<string>
}

/**
 * Sizes a decoded request. Its parts are already bounded by the request schema and limits (tools included,
 * so serializing them here is bounded too).
 */
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

interface Tokenizer {
  readonly countTokens: (text: string, options: { readonly disallowedSpecial: ReadonlySet<string> }) => number
  readonly setMergeCacheSize: (size: number) => void
}
let tokenizer: Promise<Tokenizer> | null = null
const loadTokenizer = (): Promise<Tokenizer> =>
  (tokenizer ??= import("gpt-tokenizer/encoding/o200k_base").then((m) => {
    // The default LRU of 100,000 merged pieces evicts by scanning past deleted map entries, which made
    // counting up to 80 times slower once varied text had filled it; a small cache keeps hits without that.
    m.setMergeCacheSize(4096)
    return m as unknown as Tokenizer
  }))

/** Special-token text (`<|endoftext|>`) is counted as plain text instead of throwing. */
const PLAIN_TEXT = { disallowedSpecial: new Set<string>() }

/** Most UTF-16 units handed to the tokenizer at once. */
const CHUNK_CHARS = 1024
/**
 * Longest run without a word boundary handed to the tokenizer: BPE merging is quadratic in the length of one
 * pre-tokenized piece (64 KB of one letter took 2 s), so runs are cut here; a cut adds at most a token.
 */
const RUN_CHARS = 256
/** Tokenizing yields to the event loop after this much work. */
const SLICE_MS = 5

const isSpace = (c: number) => c === 32 || c === 10 || c === 9 || c === 13

/** End of the next chunk of `text` from `start`: before a word's leading space where possible. */
const chunkEnd = (text: string, start: number): number => {
  const limit = Math.min(text.length, start + CHUNK_CHARS)
  if (limit === text.length && limit - start <= RUN_CHARS) return limit
  let boundary = -1
  let runStart = start
  for (let i = start + 1; i < limit; i++) {
    const space = isSpace(text.charCodeAt(i))
    if (space !== isSpace(text.charCodeAt(i - 1))) {
      runStart = i
      if (space) boundary = i
    } else if (i - runStart >= RUN_CHARS) {
      return avoidSplittingPair(text, i)
    }
  }
  if (limit === text.length) return limit
  return boundary > start ? boundary : avoidSplittingPair(text, limit)
}

const avoidSplittingPair = (text: string, end: number): number => {
  const c = text.charCodeAt(end - 1)
  return c >= 0xd800 && c <= 0xdbff ? end - 1 : end
}

/** A later event-loop iteration, after its timers and I/O (two hops: one from an I/O callback stays in it). */
const nextTurn = () => new Promise<void>((resolve) => setImmediate(() => setImmediate(resolve)))

/**
 * Counts tokens of `texts` plus `base`, stopping once the count passes `limit`. Works in chunks and yields
 * to the event loop every few milliseconds, so no request holds the loop for long; stops when `signal` aborts.
 */
const countUpTo = async (texts: ReadonlyArray<string>, base: number, limit: number, signal: AbortSignal) => {
  const { countTokens } = await loadTokenizer()
  let tokens = base
  let sliceStart = performance.now()
  for (const text of texts) {
    tokens += MESSAGE_OVERHEAD
    let start = 0
    while (start < text.length) {
      const end = chunkEnd(text, start)
      const chunk = text.slice(start, end)
      try {
        tokens += countTokens(chunk, PLAIN_TEXT)
      } catch {
        // Never expected; a token is at least a byte, so this over-counts rather than fails the request.
        tokens += Buffer.byteLength(chunk, "utf8")
      }
      if (tokens > limit) return tokens
      start = end
      if (performance.now() - sliceStart >= SLICE_MS) {
        await nextTurn()
        if (signal.aborted) return tokens
        sliceStart = performance.now()
      }
    }
  }
  return tokens
}

/**
 * Token count for the `input_too_long` gate. A token is at least one byte, so when the byte count fits the
 * limit no tokenizer runs (the common case); past `MAX_BYTES_PER_TOKEN` bytes per allowed token the input is
 * over without tokenizing; in between the o200k tokenizer (loaded on first need) counts, cooperatively and
 * only until the limit is passed.
 */
export const exceedsLimit = (
  size: InputSize,
  limit: number
): Effect.Effect<{ readonly exceeds: boolean; readonly tokens: number }> => {
  const imageTokens = size.images * IMAGE_TOKENS
  if (size.bytes + imageTokens <= limit) {
    return Effect.succeed({ exceeds: false, tokens: roughTokens(size) })
  }
  const textLimit = limit - imageTokens
  if (textLimit <= 0 || size.bytes > textLimit * MAX_BYTES_PER_TOKEN) {
    return Effect.succeed({ exceeds: true, tokens: Math.ceil(size.bytes / MAX_BYTES_PER_TOKEN) + imageTokens })
  }
  return Effect.promise((signal) => countUpTo(size.texts, imageTokens, limit, signal)).pipe(
    Effect.map((tokens) => ({ exceeds: tokens > limit, tokens }))
  )
}

/**
 * The o200k token count of an input (images at `IMAGE_TOKENS` each), counted only up to `limit`: past it the
 * count stops and `exceeds` is true (so a client cannot make the gateway tokenize more than a model takes).
 */
export const countInput = (
  size: InputSize,
  limit: number
): Effect.Effect<{ readonly exceeds: boolean; readonly tokens: number }> => {
  const imageTokens = size.images * IMAGE_TOKENS
  const textLimit = limit - imageTokens
  if (textLimit <= 0 || size.bytes > textLimit * MAX_BYTES_PER_TOKEN) {
    return Effect.succeed({ exceeds: true, tokens: Math.ceil(size.bytes / MAX_BYTES_PER_TOKEN) + imageTokens })
  }
  return Effect.promise((signal) => countUpTo(size.texts, imageTokens, limit, signal)).pipe(
    Effect.map((tokens) => ({ exceeds: tokens > limit, tokens }))
  )
}
