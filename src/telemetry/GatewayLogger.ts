/**
 * The gateway's one logger (installed by `appLayer` in place of Effect's default): one line per log call, in the
 * logfmt shape of Effect's `Logger.formatLogFmt` (`timestamp=... level=INFO fiber=#12 message="..." key=value`),
 * with every message part, annotation value and cause clipped and its control characters escaped
 * (`LogText.ts`). Whatever a log call is given (upstream text, a user's input), the line cannot be split,
 * forged or used to drive the operator's terminal, and stays bounded.
 *
 * Secrets are not this logger's business: it cannot know them. Text that may carry one (a BYOK provider's answer)
 * is redacted where it is produced (`byok/Dispatch.ts`, the codecs).
 */
import { Cause, Formatter, Layer, Logger, References } from "effect"
import { clip, escapeControl } from "./LogText.js"

/** Longest message part or annotation value kept, in characters (before escaping). */
export const MAX_FIELD_CHARS = 2_000
/** Longest cause (a pretty-printed failure with its stack) kept. */
export const MAX_CAUSE_CHARS = 8_000
/** Annotations kept per line. */
const MAX_ANNOTATIONS = 32

/** Writes one line (without its newline). */
export type LineSink = (line: string) => void

export const stdoutSink: LineSink = (line) => {
  process.stdout.write(line + "\n")
}

const BARE = /^[^\s="\\]+$/

const text = (value: unknown): string => {
  if (typeof value === "string") return value
  try {
    return Formatter.format(value)
  } catch {
    return "[unformattable]"
  }
}

/** A logfmt value: clipped, escaped, quoted unless bare. */
const field = (value: string, max: number): string => {
  const safe = escapeControl(clip(value, max))
  return BARE.test(safe) ? safe : `"${safe.replace(/"/g, '\\"')}"`
}

/** A logfmt label: escaped, no spaces, `=` or quotes, bounded. */
const label = (name: string): string => escapeControl(clip(name, 64)).replace(/[\s="\\]/g, "_") || "_"

/** The line for one log call. */
export const formatLine = (options: Logger.Options<unknown>): string => {
  const { cause, date, fiber, logLevel, message } = options
  let out = `timestamp=${date.toISOString()} level=${logLevel.toUpperCase()} fiber=#${fiber.id}`
  const parts = Array.isArray(message) ? message : [message]
  for (const part of parts) out += ` message=${field(text(part), MAX_FIELD_CHARS)}`
  if (cause.reasons.length > 0) out += ` cause=${field(Cause.pretty(cause), MAX_CAUSE_CHARS)}`
  const now = date.getTime()
  for (const [name, started] of fiber.getRef(References.CurrentLogSpans)) {
    out += ` ${label(name)}=${now - started}ms`
  }
  let count = 0
  for (const [name, value] of Object.entries(fiber.getRef(References.CurrentLogAnnotations))) {
    if (++count > MAX_ANNOTATIONS) break
    out += ` ${label(name)}=${field(text(value), MAX_FIELD_CHARS)}`
  }
  return out
}

/** The logger writing each line to `sink`. */
export const gatewayLogger = (sink: LineSink = stdoutSink): Logger.Logger<unknown, void> =>
  Logger.make((options) => sink(formatLine(options)))

/** Replaces every logger (Effect's default included) with the gateway's. */
export const layer = (sink: LineSink = stdoutSink): Layer.Layer<never> => Logger.layer([gatewayLogger(sink)])
