/**
 * An incremental Server-Sent Events parser for upstream responses: text may be split anywhere,
 * lines end with `\n`, `\r\n` or `\r`, `:` lines are comments, and only `data` fields matter
 * (multi-line data is joined with `\n`). Each completed event's data is handed to `onData`.
 * Shared by every HTTP upstream (the wire formats carry the event type inside the data: OpenAI's
 * chunks, Anthropic's `{"type": ...}` events), so the `event` field is not kept.
 */
export class SseParser {
  private buffer = ""
  private data: string | undefined = undefined
  /** The previous text ended with `\r`: a `\n` opening the next text belongs to it. */
  private pendingCR = false

  constructor(
    private readonly onData: (data: string) => void,
    /** A line longer than this without a terminator is an error (a runaway upstream). */
    private readonly maxLine = 16 * 1024 * 1024
  ) {}

  push(text: string): void {
    if (text.length === 0) return
    if (this.pendingCR) {
      this.pendingCR = false
      if (text.charCodeAt(0) === 10) text = text.slice(1)
    }
    let buf = this.buffer === "" ? text : this.buffer + text
    if (buf.indexOf("\r") >= 0) {
      this.pendingCR = buf.charCodeAt(buf.length - 1) === 13
      buf = buf.replace(/\r\n?/g, "\n")
    }
    let start = 0
    let nl: number
    while ((nl = buf.indexOf("\n", start)) >= 0) {
      this.line(buf, start, nl)
      start = nl + 1
    }
    this.buffer = start === 0 ? buf : start === buf.length ? "" : buf.slice(start)
    if (this.buffer.length > this.maxLine) {
      this.buffer = ""
      throw new Error(`SSE line longer than ${this.maxLine} characters`)
    }
  }

  /** End of input: a last event without its blank line is still delivered. */
  end(): void {
    if (this.buffer !== "") {
      const buf = this.buffer
      this.buffer = ""
      this.line(buf, 0, buf.length)
    }
    this.dispatch()
  }

  private line(buf: string, start: number, end: number): void {
    if (start === end) return this.dispatch()
    const first = buf.charCodeAt(start)
    if (first === 58) return // ":" comment
    if (first === 100 && buf.startsWith("data", start)) {
      let at = start + 4
      if (at === end) return this.append("")
      if (buf.charCodeAt(at) !== 58) return // a field named e.g. "database"
      at++
      if (buf.charCodeAt(at) === 32) at++
      return this.append(buf.slice(at, end))
    }
    // `event`, `id`, `retry` and unknown fields carry nothing we use.
  }

  private append(value: string): void {
    this.data = this.data === undefined ? value : this.data + "\n" + value
  }

  private dispatch(): void {
    if (this.data !== undefined) {
      const data = this.data
      this.data = undefined
      this.onData(data)
    }
  }
}
