import { Effect, Result } from "effect"
import { fail, type GatewayError, InferenceMessages } from "../errors/Catalog.js"

const QUOTE = 34 // "
const BACKSLASH = 92 // \
const OPEN_OBJECT = 123 // {
const OPEN_ARRAY = 91 // [
const CLOSE_OBJECT = 125 // }
const CLOSE_ARRAY = 93 // ]

/**
 * Whether JSON text nests objects and arrays deeper than `max`. One pass over the text, skipping string
 * contents (escapes included), without allocating; stops at the first level past `max`. Text that is not
 * JSON is scanned all the same (JSON.parse rejects it afterwards).
 */
export const exceedsJsonDepth = (text: string, max: number): boolean => {
  let depth = 0
  const length = text.length
  for (let i = 0; i < length; i++) {
    const c = text.charCodeAt(i)
    if (c === QUOTE) {
      // Jump to the closing quote: the next quote preceded by an even run of backslashes.
      let end = text.indexOf("\"", i + 1)
      for (;;) {
        if (end === -1) return false
        let slashes = 0
        while (text.charCodeAt(end - 1 - slashes) === BACKSLASH) slashes++
        if (slashes % 2 === 0) break
        end = text.indexOf("\"", end + 1)
      }
      i = end
    } else if (c === OPEN_OBJECT || c === OPEN_ARRAY) {
      if (++depth > max) return true
    } else if (c === CLOSE_OBJECT || c === CLOSE_ARRAY) {
      depth--
    }
  }
  return false
}

/**
 * Parses a request body: 400 `invalid_request` when it nests deeper than `maxDepth` (checked before parsing,
 * so nothing downstream recurses over hostile depth), 400 `invalid_json` when it is not JSON.
 */
export const parseJsonBody = (text: string, maxDepth: number): Result.Result<unknown, GatewayError> => {
  if (exceedsJsonDepth(text, maxDepth)) {
    return Result.fail(fail("invalid_request", { message: InferenceMessages.jsonTooDeep(maxDepth) }))
  }
  try {
    return Result.succeed(JSON.parse(text))
  } catch {
    return Result.fail(fail("invalid_json"))
  }
}

/**
 * Resolves on a later iteration of the event loop, after its timers and I/O poll (unlike `Effect.yieldNow`'s
 * microtasks). Two `setImmediate` hops: called from an I/O callback, one hop would run in the same
 * iteration's check phase, before any other I/O.
 */
export const nextTurn: Effect.Effect<void> = Effect.callback<void>((resume) => {
  let handle = setImmediate(() => {
    handle = setImmediate(() => resume(Effect.void))
  })
  return Effect.sync(() => clearImmediate(handle))
})

/** Bodies longer than this (UTF-16 units) are parsed on a turn of their own. */
const LARGE_BODY_CHARS = 64 * 1024

/**
 * `parseJsonBody` for a request handler: a large body is scanned and parsed on a turn of its own (the loop
 * runs other requests before and after), so reading, parsing and validating it never add up to one long turn.
 */
export const readJsonBody = (text: string, maxDepth: number): Effect.Effect<unknown, GatewayError> =>
  text.length <= LARGE_BODY_CHARS
    ? Effect.fromResult(parseJsonBody(text, maxDepth))
    : nextTurn.pipe(
      Effect.andThen(Effect.suspend(() => Effect.fromResult(parseJsonBody(text, maxDepth)))),
      Effect.tap(() => nextTurn)
    )

/** What a request row records as `model_id` when the body names no usable model. */
export const UNKNOWN_MODEL_ID = "(unknown)"
/** Longest `model_id` a request row records. */
export const MODEL_ID_CHARS = 128

/**
 * A client's `model` value made safe for the request row: control characters and lone surrogates dropped,
 * at most 128 UTF-16 units (never splitting a pair); `(unknown)` when it is not a string or nothing remains.
 */
export const modelIdForRow = (model: unknown): string => {
  if (typeof model !== "string") return UNKNOWN_MODEL_ID
  let out = ""
  for (let i = 0; i < model.length && out.length < MODEL_ID_CHARS; i++) {
    const c = model.charCodeAt(i)
    if (c < 0x20 || (c >= 0x7f && c <= 0x9f)) continue
    if (c >= 0xd800 && c <= 0xdbff) {
      const next = model.charCodeAt(i + 1)
      if (next >= 0xdc00 && next <= 0xdfff) {
        if (out.length + 2 > MODEL_ID_CHARS) break
        out += model[i]! + model[i + 1]!
        i++
      }
      continue
    }
    if (c >= 0xdc00 && c <= 0xdfff) continue
    out += model[i]!
  }
  return out.length > 0 ? out : UNKNOWN_MODEL_ID
}

/** `model_id` for the row of a parsed body: its `model` when it is an object with one. */
export const modelIdOfBody = (body: unknown): string =>
  typeof body === "object" && body !== null && !Array.isArray(body)
    ? modelIdForRow((body as { readonly model?: unknown }).model)
    : UNKNOWN_MODEL_ID

/** A path for a user message, like `messages[2].content[0].text`, cut to about 100 characters. */
export const formatPath = (path: ReadonlyArray<PropertyKey>): string => {
  let out = ""
  for (const key of path) {
    out += typeof key === "number" ? `[${key}]` : out.length === 0 ? String(key) : `.${String(key)}`
    if (out.length > 100) return out.slice(0, 100) + "…"
  }
  return out
}

export type JsonBound = "depth" | "size" | null

/**
 * Whether a parsed JSON value nests deeper than `maxDepth` (objects and arrays; `{}` is depth 1) or is
 * larger than `maxBytes` serialized (UTF-8, escapes not counted). Iterative, stops at the first bound hit.
 */
export const exceedsJsonBounds = (value: unknown, maxDepth: number, maxBytes: number): JsonBound => {
  let bytes = 0
  const stack: Array<unknown> = [value]
  const depths: Array<number> = [0]
  while (stack.length > 0) {
    const node = stack.pop()
    const depth = depths.pop()!
    if (typeof node === "string") bytes += Buffer.byteLength(node, "utf8") + 2
    else if (typeof node === "number") bytes += Number.isFinite(node) ? String(node).length : 4
    else if (typeof node === "boolean") bytes += node ? 4 : 5
    else if (node === null || node === undefined) bytes += 4
    else if (typeof node === "object") {
      if (depth + 1 > maxDepth) return "depth"
      if (Array.isArray(node)) {
        bytes += 2 + Math.max(0, node.length - 1)
        for (const item of node) {
          stack.push(item)
          depths.push(depth + 1)
        }
      } else {
        const keys = Object.keys(node)
        bytes += 2 + Math.max(0, keys.length - 1)
        for (const key of keys) {
          bytes += Buffer.byteLength(key, "utf8") + 3
          stack.push((node as Record<string, unknown>)[key])
          depths.push(depth + 1)
        }
      }
    }
    if (bytes > maxBytes) return "size"
  }
  return null
}
