/**
 * JSON text from a client: its nesting depth checked before parsing (so nothing recurses over hostile depth), then
 * parsed; large texts on a turn of their own.
 */
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
 * `exceedsJsonDepth` over text that arrives in pieces: `feed` each piece in order; it answers true as soon as
 * the nesting so far passes `max`, so a reader can stop before the rest of a hostile body arrives. String
 * contents (and escapes split across pieces) are skipped as in `exceedsJsonDepth`.
 */
export const makeDepthScanner = (max: number) => {
  let depth = 0
  let inString = false
  /** Backslashes at the end of what was fed, inside a string (an odd count escapes the next character). */
  let slashes = 0
  return (text: string): boolean => {
    const n = text.length
    let i = 0
    while (i < n) {
      if (inString) {
        const q = text.indexOf("\"", i)
        if (q === -1) {
          let k = 0
          while (k < n - i && text.charCodeAt(n - 1 - k) === BACKSLASH) k++
          slashes = k === n - i ? slashes + k : k
          return false
        }
        let k = 0
        while (q - 1 - k >= i && text.charCodeAt(q - 1 - k) === BACKSLASH) k++
        if (k === q - i) k += slashes
        slashes = 0
        i = q + 1
        if (k % 2 === 0) inString = false
        continue
      }
      const c = text.charCodeAt(i++)
      if (c === QUOTE) {
        inString = true
        slashes = 0
      } else if (c === OPEN_OBJECT || c === OPEN_ARRAY) {
        if (++depth > max) return true
      } else if (c === CLOSE_OBJECT || c === CLOSE_ARRAY) {
        depth--
      }
    }
    return false
  }
}

/** The 400 for a body nested deeper than `maxDepth`. */
export const tooDeep = (maxDepth: number): GatewayError =>
  fail("invalid_request", { message: InferenceMessages.jsonTooDeep(maxDepth) })

/**
 * Parses a request body: 400 `invalid_request` when it nests deeper than `maxDepth` (checked before parsing,
 * so nothing downstream recurses over hostile depth), 400 `invalid_json` when it is not JSON.
 */
export const parseJsonBody = (text: string, maxDepth: number): Result.Result<unknown, GatewayError> => {
  if (exceedsJsonDepth(text, maxDepth)) return Result.fail(tooDeep(maxDepth))
  return parseUnchecked(text)
}

const parseUnchecked = (text: string): Result.Result<unknown, GatewayError> => {
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
export const parseJsonText = (text: string, maxDepth: number): Effect.Effect<unknown, GatewayError> =>
  text.length <= LARGE_BODY_CHARS
    ? Effect.fromResult(parseJsonBody(text, maxDepth))
    : nextTurn.pipe(
      Effect.andThen(Effect.suspend(() => Effect.fromResult(parseJsonBody(text, maxDepth)))),
      Effect.tap(() => nextTurn)
    )

/** `parseJsonText` for text whose depth was already checked while it was read (`makeDepthScanner`). */
export const parseScannedJson = (text: string): Effect.Effect<unknown, GatewayError> =>
  text.length <= LARGE_BODY_CHARS
    ? Effect.fromResult(parseUnchecked(text))
    : nextTurn.pipe(
      Effect.andThen(Effect.suspend(() => Effect.fromResult(parseUnchecked(text)))),
      Effect.tap(() => nextTurn)
    )

