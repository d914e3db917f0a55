/**
 * Text from outside the gateway (upstream answers, user-supplied values) on its way to a log line or an error
 * detail: secrets removed, control characters escaped, length bounded.
 *
 * - `secretRedactor(secrets)`: every run of `MIN_SECRET_RUN` (6) or more consecutive characters of a secret is
 *   replaced by `[redacted]`, wherever it appears (the middle, the end, pieces of it side by side). A secret shorter
 *   than that is removed where it appears whole. Apply it to the whole text (at most `MAX_REDACTED_CHARS`), then
 *   clip: a clip first could leave part of a secret that the redactor no longer sees in one piece.
 * - `escapeControl`: C0, DEL, C1, U+2028/2029 and the bidi controls become visible escapes (`\n`, `\x1b`,
 *   `\u202e`), so text can neither start a forged log line nor drive the operator's terminal.
 * - `clip`: at most `max` characters (never half a surrogate pair), with how much was cut.
 */

/** Shortest run of a secret's characters that is removed wherever it appears. */
export const MIN_SECRET_RUN = 6
export const REDACTED = "[redacted]"
/** Most text a redactor reads (the transport reads error bodies up to 64 KiB); the rest is dropped. */
export const MAX_REDACTED_CHARS = 64 * 1024

export type Redactor = (text: string) => string

export const noRedaction: Redactor = (text) => text

/** A redactor as it is, or one for these secrets. */
export const redactorOf = (secrets: ReadonlyArray<string> | Redactor): Redactor =>
  typeof secrets === "function" ? secrets : secretRedactor(secrets)

/** Replaces every run of characters covered by windows of `grams` with one `[redacted]`. */
const redactRuns = (text: string, grams: ReadonlySet<string>): string => {
  const n = MIN_SECRET_RUN
  let out = ""
  let copied = 0
  let start = -1
  let end = -1
  for (let i = 0; i + n <= text.length; i++) {
    if (!grams.has(text.slice(i, i + n))) continue
    if (start >= 0 && i <= end) {
      end = i + n
      continue
    }
    if (start >= 0) {
      out += text.slice(copied, start) + REDACTED
      copied = end
    }
    start = i
    end = i + n
  }
  if (start < 0) return text
  return out + text.slice(copied, start) + REDACTED + text.slice(end)
}

/**
 * A redactor for these secrets (empty ones ignored). Built once per credential: it holds the secrets' 6-grams in
 * a set, so one pass over the text finds every run (O(length of the text)).
 */
export const secretRedactor = (secrets: ReadonlyArray<string>): Redactor => {
  const grams = new Set<string>()
  const short: Array<string> = []
  for (const secret of secrets) {
    if (secret.length === 0) continue
    if (secret.length < MIN_SECRET_RUN) short.push(secret)
    else for (let i = 0; i + MIN_SECRET_RUN <= secret.length; i++) grams.add(secret.slice(i, i + MIN_SECRET_RUN))
  }
  if (grams.size === 0 && short.length === 0) return noRedaction
  return (text) => {
    let out = text.length > MAX_REDACTED_CHARS ? text.slice(0, MAX_REDACTED_CHARS) : text
    if (grams.size > 0) out = redactRuns(out, grams)
    for (const secret of short) if (out.includes(secret)) out = out.split(secret).join(REDACTED)
    return out
  }
}

/** Characters never written raw to a log: C0, DEL, C1, U+2028/2029, and the bidi marks, embeddings and isolates. */
const CONTROL = /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/
const CONTROL_ALL = new RegExp(CONTROL.source, "g")

const NAMED: Readonly<Record<string, string>> = { "\n": "\\n", "\r": "\\r", "\t": "\\t" }

const escapeOne = (c: string): string => {
  const named = NAMED[c]
  if (named !== undefined) return named
  const code = c.charCodeAt(0)
  return code < 0x100 ? `\\x${code.toString(16).padStart(2, "0")}` : `\\u${code.toString(16).padStart(4, "0")}`
}

export const hasControl = (text: string): boolean => CONTROL.test(text)

/** The text with every control character written as a visible escape. */
export const escapeControl = (text: string): string => CONTROL.test(text) ? text.replace(CONTROL_ALL, escapeOne) : text

/** At most `max` characters (a surrogate pair is kept whole or dropped), then how many were cut. */
export const clip = (text: string, max: number): string => {
  if (text.length <= max) return text
  let end = max
  const last = text.charCodeAt(end - 1)
  if (last >= 0xd800 && last <= 0xdbff) end--
  return `${text.slice(0, end)}...(${text.length - end} more)`
}

/** Outside text for a log line: clipped to `max`, then escaped. */
export const logText = (text: string, max: number): string => escapeControl(clip(text, max))
