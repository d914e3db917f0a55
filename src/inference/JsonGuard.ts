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
