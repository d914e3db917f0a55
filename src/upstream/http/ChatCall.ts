/**
 * One streamed chat call over HTTP: the undici dispatch handler, the answer read incrementally (SSE
 * through `SseParser`, or one buffered JSON body, or a bounded error body) into the codec's decoder,
 * and the watchdog; the consumer side is the shared `PushCall`. `openChat(transport, codec)` is an
 * adapter's `open`.
 *
 * Timeouts follow the opening fiber's `Clock`, so `TestClock` drives them: `first_token_ms` from the
 * request until the first event (until the response headers for a non-streamed answer), `idle_ms`
 * between response chunks (not counted while the socket is paused for a consumer that is held),
 * `total_ms` for the whole answer. One watchdog per request re-arms itself at the nearest deadline;
 * chunks only record their arrival time. The watchdog is a `startTimer` (`src/runtime/Timers.ts`): a
 * plain timer on the live clock, a fiber sleeping on any other clock.
 */
import { StringDecoder } from "node:string_decoder"
import { Clock, Effect, type Fiber } from "effect"
import type { Dispatcher } from "undici"
import { startTimer, stopTimer, type Timer } from "../../runtime/Timers.js"
import { clip, noRedaction } from "../../telemetry/LogText.js"
import { NO_EVENTS, PushCall } from "../PushCall.js"
import {
  type UpstreamAdapter,
  UpstreamError,
  type UpstreamEvent,
  type UpstreamSink
} from "../Upstream.js"
import type { ChatCodec, ChatDecoder, HttpRequest } from "./Codec.js"
import { SseParser } from "./Sse.js"
import { retryAfterMs } from "../Failure.js"
import { ABORTED, headerText, type HttpTransport, MAX_ERROR_BODY, MAX_JSON_BODY, transportError } from "./Transport.js"

/** Most characters of upstream text quoted in a failure or a warning. */
const QUOTED_CHARS = 200

/** How the response body is read: not yet known, SSE, one JSON body, or an error body. */
const HEADERS = 0
const SSE = 1
const JSON_BODY = 2
const FAILED = 3

const skippedWarning = (skipped: number, sample: string): Effect.Effect<void> =>
  Effect.logWarning("skipped undecodable upstream SSE frame").pipe(Effect.annotateLogs({ skipped, sample }))

export class HttpChatCall extends PushCall implements Dispatcher.DispatchHandler {
  private controller: Dispatcher.DispatchController | undefined = undefined
  /** The HTTP response has fully arrived (or failed). */
  private ended = false
  private mode = HEADERS
  private status = 0
  /** A non-2xx answer's `Retry-After`, in milliseconds. */
  private retryAfterMs: number | undefined = undefined
  private body: Array<Buffer> | undefined = undefined
  private bodySize = 0
  private text: StringDecoder | undefined = undefined
  private parser: SseParser | undefined = undefined
  /** The socket read is paused (`controller.pause()`) for a consumer that is held. */
  private paused = false
  private resumeQueued = false
  /** A `signal()` is queued for the end of this read (`signalAfterRead`). */
  private signalQueued = false
  private sawFirst = false
  private loggedSkips = 0
  private readonly clock: Clock.Clock
  private startedAt = 0
  private lastActivity = 0
  private timer: Timer | undefined = undefined

  constructor(
    opener: Fiber.Fiber<unknown, unknown>,
    sink: UpstreamSink,
    private readonly transport: HttpTransport,
    private readonly codec: ChatCodec,
    private readonly request: HttpRequest,
    private readonly decoder: ChatDecoder
  ) {
    super(opener, sink)
    this.clock = opener.getRef(Clock.Clock)
  }

  protected start(): void {
    this.startedAt = this.lastActivity = this.clock.currentTimeMillisUnsafe()
    this.transport.dispatch(this.request, this)
    if (!this.done) this.armWatchdog()
  }

  protected take(): ReadonlyArray<UpstreamEvent> {
    const decoder = this.decoder
    const events = decoder.events
    if (events.length === 0) return NO_EVENTS
    decoder.events = []
    return events
  }

  protected override throttle(): void {
    if (!this.paused && !this.done) this.pauseSocket()
  }

  protected override unthrottle(): void {
    if (!this.paused || this.resumeQueued) return
    // undici's parser may deliver buffered data synchronously from `resume()`, and must not be resumed
    // from inside another connection's parser callback (where `resume()` may be called): defer it.
    this.resumeQueued = true
    queueMicrotask(() => {
      this.resumeQueued = false
      if (!this.finished && !this.held && this.paused) this.resumeSocket()
    })
  }

  /** The consumer is gone: an unfinished upstream request is aborted, which closes its socket. */
  protected release(): void {
    this.stopWatchdog()
    if (!this.ended && (!this.done || this.failure !== undefined)) this.controller?.abort(ABORTED)
  }

  /** Skipped frames since the last log, as a warning. */
  protected override pendingLog(): Effect.Effect<void> | undefined {
    const decoder = this.decoder
    const skipped = decoder.skipped
    if (skipped === undefined || skipped === this.loggedSkips) return undefined
    const count = skipped - this.loggedSkips
    this.loggedSkips = skipped
    return skippedWarning(count, clip((this.codec.redact ?? noRedaction)(decoder.lastSkipped ?? ""), QUOTED_CHARS))
  }

  // --- undici handler -------------------------------------------------------------------------

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.controller = controller
    if (this.finished || this.done) controller.abort(ABORTED)
  }

  onResponseStart(
    _controller: Dispatcher.DispatchController,
    status: number,
    headers: Record<string, string | Array<string> | undefined>
  ): void {
    if (this.finished || status < 200) return
    this.status = status
    this.lastActivity = this.clock.currentTimeMillisUnsafe()
    if (status >= 300) {
      this.mode = FAILED
      this.body = []
      this.retryAfterMs = retryAfterMs(headerText(headers["retry-after"]), this.clock.currentTimeMillisUnsafe())
    } else if (headerText(headers["content-type"]).includes("text/event-stream")) {
      this.mode = SSE
      this.text = new StringDecoder("utf8")
      const decoder = this.decoder
      this.parser = new SseParser((data) => decoder.onData(data))
    } else {
      this.mode = JSON_BODY
      this.body = []
      this.sawFirst = true
    }
  }

  onResponseData(_controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (this.finished || this.done) return
    this.lastActivity = this.clock.currentTimeMillisUnsafe()
    if (this.mode !== SSE) {
      this.bodySize += chunk.length
      if (this.bodySize <= (this.mode === JSON_BODY ? MAX_JSON_BODY : MAX_ERROR_BODY)) this.body!.push(chunk)
      else if (this.mode === JSON_BODY) this.fail(new UpstreamError({ kind: "protocol", detail: "answer too large" }))
      // An error body past its bound: what was read makes the message; the rest (maybe endless) is not waited for.
      else this.fail(this.statusError(Buffer.concat(this.body!).toString("utf8")))
      return
    }
    try {
      this.parser!.push(this.text!.write(chunk))
    } catch (error) {
      return this.fail(new UpstreamError({ kind: "protocol", detail: (error as Error).message }))
    }
    const decoder = this.decoder
    if (decoder.error !== undefined) return this.fail(decoder.error)
    if (decoder.sawDone) return this.finish()
    if (decoder.events.length > 0) {
      this.sawFirst = true
      this.signalAfterRead()
    }
  }

  /**
   * One socket read holds many HTTP chunks (an upstream writes a chunk per event), and undici's parser hands them
   * over one call each, in a row: the consumer gets their events together once the parser is through the read
   * (a microtask), one delivery and one client write per read instead of one per chunk. The end and failures
   * still signal at once, delivering whatever is pending first.
   */
  private signalAfterRead(): void {
    if (this.signalQueued) return
    this.signalQueued = true
    queueMicrotask(this.signalQueuedEvents)
  }

  private readonly signalQueuedEvents = (): void => {
    this.signalQueued = false
    this.signal()
  }

  onResponseEnd(): void {
    this.ended = true
    if (this.finished || this.done) return
    if (this.mode === SSE) {
      try {
        this.parser!.push(this.text!.end())
        this.parser!.end()
      } catch (error) {
        return this.fail(new UpstreamError({ kind: "protocol", detail: (error as Error).message }))
      }
      return this.finish()
    }
    const body = this.body!
    const text = body.length === 1 ? body[0]!.toString("utf8") : Buffer.concat(body).toString("utf8")
    this.body = undefined
    if (this.mode === FAILED) return this.fail(this.statusError(text))
    let json: unknown
    try {
      json = JSON.parse(text)
    } catch {
      const quoted = clip((this.codec.redact ?? noRedaction)(text), QUOTED_CHARS)
      return this.fail(new UpstreamError({ kind: "protocol", detail: `answer is not JSON: ${quoted}` }))
    }
    const problem = this.decoder.onJson(json)
    if (problem !== undefined) return this.fail(problem)
    this.done = true
    this.stopWatchdog()
    this.signal()
  }

  onResponseError(_controller: Dispatcher.DispatchController, error: Error): void {
    this.ended = true
    if (this.finished || this.done) return
    this.fail(transportError(error, this.status !== 0, this.transport.timeouts.connect_ms))
  }

  // --- the answer's state ---------------------------------------------------------------------

  /** The answer is complete (`sawDone` or end of body): `Finish`/`Usage`, or the reason it is not. */
  /** The codec's error for this non-2xx answer, with its `Retry-After`. */
  private statusError(text: string): UpstreamError {
    const error = this.codec.statusError(this.status, text)
    if (this.retryAfterMs === undefined) return error
    return new UpstreamError({
      kind: error.kind,
      detail: error.detail,
      retryAfterMs: this.retryAfterMs,
      ...(error.status === undefined ? {} : { status: error.status })
    })
  }

  private finish(): void {
    const decoder = this.decoder
    const problem = decoder.error ?? decoder.end()
    if (problem !== undefined) return this.fail(problem)
    this.done = true
    this.stopWatchdog()
    // Let the rest of the response (its terminator) be read so that the connection is reused. Only
    // ever called from inside this call's own parser callbacks, where resuming just clears the flag.
    if (this.paused) this.resumeSocket()
    this.signal()
  }

  private fail(error: UpstreamError): void {
    if (this.done) return
    this.done = true
    const usage = this.decoder.usage
    // Usage reported before the failure is still the truth for charging what was delivered.
    this.failure = usage === undefined || error.usage !== undefined ? error : new UpstreamError({ ...error, usage })
    this.body = undefined
    this.stopWatchdog()
    if (!this.ended) this.controller?.abort(ABORTED)
    this.signal()
  }

  private pauseSocket(): void {
    this.paused = true
    this.controller?.pause()
  }

  /** Resumes a paused socket (from this call's own callbacks, or deferred: see `unthrottle`). */
  private resumeSocket(): void {
    this.paused = false
    this.lastActivity = this.clock.currentTimeMillisUnsafe()
    this.controller?.resume()
  }

  // --- timeouts -------------------------------------------------------------------------------

  private stopWatchdog(): void {
    stopTimer(this.timer)
    this.timer = undefined
  }

  /**
   * Checks the deadlines: fails the call if the nearest one passed without progress, else returns
   * how long to wait before checking again (undefined: nothing left to watch).
   */
  private check(): number | undefined {
    if (this.done || this.finished) return undefined
    const t = this.transport.timeouts
    const now = this.clock.currentTimeMillisUnsafe()
    let at: number
    let detail: string
    if (!this.sawFirst) {
      at = this.startedAt + t.first_token_ms
      detail = `no first token within ${t.first_token_ms} ms`
    } else {
      at = this.paused ? now + t.idle_ms : this.lastActivity + t.idle_ms
      detail = `upstream idle for ${t.idle_ms} ms`
    }
    const totalAt = this.startedAt + t.total_ms
    if (totalAt <= at) {
      at = totalAt
      detail = `answer took longer than ${t.total_ms} ms`
    }
    if (now >= at) {
      this.fail(new UpstreamError({ kind: "timeout", detail }))
      return undefined
    }
    // Before the first event, wake at least every idle_ms: the idle deadline may come sooner.
    return this.sawFirst ? at - now : Math.min(at - now, t.idle_ms)
  }

  private armWatchdog(): void {
    const wait = this.check()
    if (wait !== undefined) this.timer = startTimer(this.clock, wait, this.onTimer)
  }

  private readonly onTimer = (): void => {
    this.timer = undefined
    this.armWatchdog()
  }
}

/** `UpstreamAdapter.open` of an HTTP chat upstream: `codec` over `transport`. */
export const openChat = (transport: HttpTransport, codec: ChatCodec): UpstreamAdapter["open"] => (request, sink) =>
  Effect.withFiber((fiber) => {
    const encoded = codec.encode(request)
    if (encoded instanceof UpstreamError) return Effect.fail(encoded)
    return new HttpChatCall(fiber, sink, transport, codec, encoded, codec.decoder(request)).run
  })
