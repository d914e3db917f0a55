/**
 * Lean decoding of the common OpenAI chunk frames, for `ChatNormalizer`.
 *
 * Most frames of a stream differ in one string only: `{"id":"chatcmpl-1","object":"chat.completion.
 * chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"..."},"finish_reason":
 * null}]}`. JSON.parse builds every object and string of each; instead, a frame that `LeanScanner`
 * finds to be a plain content (or reasoning) delta becomes a template: the text before and after that
 * string token. A later frame made of the same prefix, one complete JSON string token and the same
 * suffix has the same tokens but that one string, so it is the same delta with a new text: only that
 * token is scanned. Anything else (role, finish, usage, tool calls, errors, odd shapes) goes through
 * the scanner or JSON.parse, and the scanner accepts only what JSON.parse accepts, with the same values.
 */

const isHex = (c: number): boolean => (c >= 48 && c <= 57) || (c >= 97 && c <= 102) || (c >= 65 && c <= 70)

/** Which delta field a template's string is. */
export const SLOT_CONTENT = 1
export const SLOT_REASONING = 2

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
export const scanner = new LeanScanner()

/** A frame shape with one variable string token (see above). */
export interface Template {
  readonly prefix: string
  readonly suffix: string
}

/** Whether `data` is `template` with another string token; its value is then `scanner.content`. */
export const matches = (data: string, t: Template): boolean => {
  const end = data.length - t.suffix.length
  // (Comparing slices is several times faster than startsWith / endsWith on sliced strings.)
  return end > t.prefix.length && data.slice(0, t.prefix.length) === t.prefix && data.slice(end) === t.suffix &&
    scanner.scanToken(data, t.prefix.length, end)
}
