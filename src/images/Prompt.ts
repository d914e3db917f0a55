/**
 * Prompt conversion: the external protocol's (NovelAI) emphasis syntax to the worker's `(text:1.05)` syntax.
 *
 * NAI syntax, as read here:
 * - `{x}` multiplies the weight of `x` by 1.05 per brace, `[x]` divides it by 1.05 per bracket; nesting multiplies.
 *   Braces and brackets pair among themselves (a `}` closes the latest open `{`); one that never pairs is literal text.
 * - `1.3::text::` gives `text` the weight 1.3 (negative weights too: `-1::text::`); the number must start the
 *   input or follow whitespace, a comma, a bracket or a colon. A new `w::` replaces the section's weight; a `::`
 *   that starts no section ends it (back to 1). Braces inside a section multiply with it.
 * - `\{ \} \[ \] \( \)` are the literal characters. Parentheses are always literal in NAI.
 *
 * The output is flat: runs of equal weight, weight 1 as plain text, any other as `(text:w)` with `w` rounded to 4
 * decimals and clamped to ±`MAX_WEIGHT`; literal parentheses are escaped (`\(`, `\)`), as the worker's parser wants.
 * Both passes are linear in the input; nothing here throws.
 */

/** The NAI emphasis factor of one brace (or, divided, one bracket). */
export const EMPHASIS = 1.05
/** Weights beyond this (in either sign) are clamped: 60 braces are already 18.7. */
export const MAX_WEIGHT = 10

/** A run of literal text and its weight. */
export interface Segment {
  readonly text: string
  readonly weight: number
}

const LITERAL = 0
const OPEN_CURLY = 1
const CLOSE_CURLY = 2
const OPEN_SQUARE = 3
const CLOSE_SQUARE = 4
/** A backslash that escapes the next character. */
const ESCAPE = 5

const ESCAPABLE = new Set(["{", "}", "[", "]", "(", ")"])
/** Characters after which a `w::` starts a section. */
const SECTION_BOUNDARY = /[\s,{}[\]()|:]/

const isDigit = (c: string | undefined) => c !== undefined && c >= "0" && c <= "9"

/** The role of each position: escapes, and the braces and brackets that pair (unpaired ones stay literal). */
const classify = (input: string): Uint8Array => {
  const kinds = new Uint8Array(input.length)
  const curly: Array<number> = []
  const square: Array<number> = []
  for (let i = 0; i < input.length; i++) {
    const c = input[i]!
    if (c === "\\" && i + 1 < input.length && ESCAPABLE.has(input[i + 1]!)) {
      kinds[i] = ESCAPE
      i++
    } else if (c === "{") curly.push(i)
    else if (c === "[") square.push(i)
    else if (c === "}" && curly.length > 0) {
      kinds[curly.pop()!] = OPEN_CURLY
      kinds[i] = CLOSE_CURLY
    } else if (c === "]" && square.length > 0) {
      kinds[square.pop()!] = OPEN_SQUARE
      kinds[i] = CLOSE_SQUARE
    }
  }
  return kinds
}

/**
 * A section start `w::` at `i` (already known to be at a boundary): the index after the `::` and the weight, or
 * null. Scans one run of digits at most, so the whole parse stays linear.
 */
const sectionAt = (input: string, i: number): { readonly end: number; readonly weight: number } | null => {
  let j = i
  if (input[j] === "-") j++
  const digitsFrom = j
  while (isDigit(input[j])) j++
  let digits = j - digitsFrom
  if (input[j] === ".") {
    j++
    const fractionFrom = j
    while (isDigit(input[j])) j++
    digits += j - fractionFrom
  }
  if (digits === 0 || input[j] !== ":" || input[j + 1] !== ":") return null
  const weight = Number(input.slice(i, j))
  return Number.isFinite(weight) ? { end: j + 2, weight } : { end: j + 2, weight: weight > 0 ? MAX_WEIGHT : -MAX_WEIGHT }
}

const clampWeight = (w: number): number =>
  Number.isNaN(w) ? 1 : Math.max(-MAX_WEIGHT, Math.min(MAX_WEIGHT, w))

/** A weight as written in the output: at most 4 decimals, no exponent, no `-0`. */
export const formatWeight = (weight: number): string => {
  const rounded = Number(clampWeight(weight).toFixed(4))
  return rounded === 0 ? "0" : String(rounded)
}

/** NAI syntax to runs of literal text with their weights (adjacent runs of equal rounded weight merged). */
export const parseNai = (input: string): Array<Segment> => {
  const kinds = classify(input)
  const segments: Array<Segment> = []
  let curly = 0
  let square = 0
  let section = 1
  let weight = 1
  let text = ""
  const flush = () => {
    if (text.length === 0) return
    const last = segments[segments.length - 1]
    if (last !== undefined && formatWeight(last.weight) === formatWeight(weight)) {
      segments[segments.length - 1] = { text: last.text + text, weight: last.weight }
    } else segments.push({ text, weight })
    text = ""
  }
  const reweigh = () => {
    const next = clampWeight(section * Math.pow(EMPHASIS, curly - square))
    if (next !== weight) {
      flush()
      weight = next
    }
  }
  let i = 0
  while (i < input.length) {
    const kind = kinds[i]!
    if (kind === ESCAPE) {
      text += input[i + 1]!
      i += 2
      continue
    }
    if (kind !== LITERAL) {
      if (kind === OPEN_CURLY) curly++
      else if (kind === CLOSE_CURLY) curly--
      else if (kind === OPEN_SQUARE) square++
      else square--
      reweigh()
      i++
      continue
    }
    const c = input[i]!
    if ((c === "-" || c === "." || isDigit(c)) && (i === 0 || SECTION_BOUNDARY.test(input[i - 1]!))) {
      const start = sectionAt(input, i)
      if (start !== null) {
        section = start.weight
        reweigh()
        i = start.end
        continue
      }
    }
    if (c === ":" && input[i + 1] === ":") {
      section = 1
      reweigh()
      i += 2
      continue
    }
    text += c
    i++
  }
  flush()
  return segments
}

/** Literal text for the worker: parentheses escaped. */
const escapeText = (text: string): string => text.replace(/[()]/g, (c) => "\\" + c)

/** NAI syntax to the worker's `(text:1.05)` syntax (see the module comment). */
export const toWorkerSyntax = (input: string): string => {
  const pieces = parseNai(input).map((segment) => {
    const w = formatWeight(segment.weight)
    const text = escapeText(segment.text)
    return w === "1" || text.trim() === "" ? text : `(${text}:${w})`
  })
  // A plain run ending in a backslash would escape the `(` of the group after it: a space keeps them apart.
  for (let i = 0; i + 1 < pieces.length; i++) {
    if (pieces[i]!.endsWith("\\") && pieces[i + 1]!.startsWith("(")) pieces[i] += " "
  }
  return pieces.join("")
}

/** Parts joined as one prompt (`, ` between non-empty parts). */
export const joinPrompts = (...parts: ReadonlyArray<string>): string =>
  parts.map((p) => p.trim()).filter((p) => p.length > 0).join(", ")
