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
export const parseJsonText = (text: string, maxDepth: number): Effect.Effect<unknown, GatewayError> =>
  text.length <= LARGE_BODY_CHARS
    ? Effect.fromResult(parseJsonBody(text, maxDepth))
    : nextTurn.pipe(
      Effect.andThen(Effect.suspend(() => Effect.fromResult(parseJsonBody(text, maxDepth)))),
      Effect.tap(() => nextTurn)
    )

