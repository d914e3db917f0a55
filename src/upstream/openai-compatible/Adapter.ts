/**
 * The adapter for OpenAI-compatible upstreams: one undici `Pool` per provider origin, requests sent
 * with the low-level `dispatch` API (no body Readable, no header objects beyond one parse), the
 * response parsed incrementally into normalized events.
 *
 * One undici handler class (`CallBase`) owns the transport, the parsing and the timeouts; three
 * consumers sit on top of it:
 * - `complete`: one `Effect.callback` that resumes with every event once the answer is complete;
 * - `open`: push-based, an `Effect.callback` that resumes with the first events, then plain sink
 *   callbacks (see `UpstreamSink`), no fiber per request and no Stream;
 * - `chat`: the `Stream`, `fromPull(pull)` + `ensuring(close)`, started on the first pull.
 *
 * Timeouts follow the fiber's `Clock`, so `TestClock` drives them: `first_token_ms` from the request
 * until the first event (until the response headers for a non-streamed answer), `idle_ms` between
 * response chunks (not counted while the socket is paused for a slow consumer), `total_ms` for the
 * whole answer. One watchdog per request re-arms itself at the nearest deadline; chunks only record
 * their arrival time. On the default live clock the watchdog is a plain timer (what `Effect.sleep`
 * does underneath, without a fiber per request); on any other clock it is a forked fiber sleeping on
 * that clock (for `open`, the clock of the fiber that opened the call).
 * `connect_ms` is the socket (and TLS) connect timeout of the pool, real time only.
 */
import { StringDecoder } from "node:string_decoder"
import { type Array as Arr, Cause, Clock, Context, Duration, Effect, type Fiber, Stream } from "effect"
import { type Dispatcher, Pool } from "undici"
import type { OpenAiCompatibleProvider } from "../../config/GatewayConfig.js"
import { DetachedLog } from "../DetachedLog.js"
import {
  type Message,
  type UpstreamAdapter,
  type UpstreamCall,
  UpstreamError,
  type UpstreamEvent,
  type UpstreamRequest,
  type UpstreamSink
} from "../Upstream.js"
import { ChatNormalizer } from "./Normalize.js"
import { SseParser } from "./Sse.js"

export type OpenAiCompatibleProviderConfig = typeof OpenAiCompatibleProvider.Type

export interface OpenAiCompatibleAdapter extends UpstreamAdapter {
  /** Closes the pool: lets in-flight requests finish for up to `grace`, then destroys it. */
  readonly close: (grace?: Duration.Input) => Effect.Effect<void>
}

/** Queued events above which the upstream socket is paused until the Stream consumer pulls. */
const HIGH_WATER = 1024
/** Error bodies are read up to this size for the message. */
const MAX_ERROR_BODY = 64 * 1024
const MAX_JSON_BODY = 64 * 1024 * 1024
const ABORTED = new Error("request interrupted by the gateway")

// ---------------------------------------------------------------------------------------------
// Request encoding

/** Assistant `reasoning` is ours, not the wire format's: strip it before forwarding. */
const upstreamMessages = (messages: ReadonlyArray<Message>): ReadonlyArray<Message> => {
  for (let i = 0; i < messages.length; i++) {
    const m = messages[i]!
    if (m.role === "assistant" && m.reasoning !== undefined) {
      return messages.map((m) => {
        if (m.role !== "assistant" || m.reasoning === undefined) return m
        const { reasoning: _, ...rest } = m
        return rest
      })
    }
  }
  return messages
}

const INCLUDE_USAGE = { include_usage: true } as const

/** Only contract fields are forwarded; the tool options only with a non-empty `tools`. */
export const encodeChatRequest = (r: UpstreamRequest): string => {
  const body: Record<string, unknown> = { model: r.model, messages: upstreamMessages(r.messages), stream: r.stream }
  if (r.stream) body.stream_options = INCLUDE_USAGE
  body.max_tokens = r.max_tokens
  if (r.temperature !== undefined) body.temperature = r.temperature
  if (r.top_p !== undefined) body.top_p = r.top_p
  if (r.stop !== undefined) body.stop = r.stop
  if (r.reasoning_effort !== undefined) body.reasoning_effort = r.reasoning_effort
  // OpenAI-compatible servers reject tool_choice / parallel_tool_calls without tools.
  if (r.tools !== undefined && r.tools.length > 0) {
    body.tools = r.tools
    if (r.tool_choice !== undefined) body.tool_choice = r.tool_choice
    if (r.parallel_tool_calls !== undefined) body.parallel_tool_calls = r.parallel_tool_calls
  }
  return JSON.stringify(body)
}

// ---------------------------------------------------------------------------------------------
// Errors

const codeOf = (error: Error): string | undefined => {
  const code = (error as { code?: unknown }).code ?? (error.cause as { code?: unknown } | undefined)?.code
  return typeof code === "string" ? code : undefined
}

const transportError = (error: Error, gotHeaders: boolean, connectMs: number): UpstreamError => {
  const code = codeOf(error)
  const what = `${code ?? error.name}: ${error.message}`
  if (code === "UND_ERR_CONNECT_TIMEOUT") {
    return new UpstreamError({ kind: "timeout", detail: `connect timed out after ${connectMs} ms (${what})` })
  }
  if (code === "UND_ERR_HEADERS_TIMEOUT" || code === "UND_ERR_BODY_TIMEOUT") {
    return new UpstreamError({ kind: "timeout", detail: what })
  }
  return gotHeaders
    ? new UpstreamError({ kind: "protocol", detail: `connection lost mid-answer (${what})` })
    : new UpstreamError({ kind: "connect", detail: `could not get an answer (${what})` })
}

/** Longest upstream error message kept in `UpstreamError.detail` (which is only ever logged). */
const MAX_ERROR_MESSAGE = 500

/**
 * A non-2xx answer. The detail keeps the upstream's `error.code` / `error.type` (e.g.
 * `context_length_exceeded`, which the gateway maps to `input_too_long`) and its message, bounded.
 */
export const statusError = (status: number, body: string): UpstreamError => {
  let message = body
  let code = ""
  try {
    const parsed = JSON.parse(body)
    const e = parsed?.error
    if (typeof e === "string") message = e
    else if (typeof e?.message === "string") message = e.message
    else if (typeof parsed?.message === "string") message = parsed.message
    const tag = [e?.code, e?.type, parsed?.code, parsed?.type].find((t) => typeof t === "string" && t.length > 0)
    if (tag !== undefined) code = ` (${String(tag).slice(0, 80)})`
  } catch {
    // not JSON: keep the text
  }
  if (message.length > MAX_ERROR_MESSAGE) message = message.slice(0, MAX_ERROR_MESSAGE) + "..."
  return new UpstreamError({
    kind: status === 429 ? "rate_limited" : "status",
    status,
    detail: `upstream answered ${status}${code}${message ? `: ${message}` : ""}`
  })
}

const headerText = (value: string | Array<string> | undefined): string =>
  value === undefined ? "" : typeof value === "string" ? value : value.join(",")

// ---------------------------------------------------------------------------------------------
// One chat call: the undici handler, parsing and timeouts shared by `chat`, `complete` and `open`

type Timeouts = OpenAiCompatibleProviderConfig["timeouts"]

/** The default clock: every fiber without a provided `Clock` (e.g. no `TestClock`) sees this one. */
const liveClock = Context.get(Context.empty(), Clock.Clock)

/** How the response body is read: not yet known, SSE, one JSON body, or an error body. */
type Mode = "headers" | "sse" | "json" | "failed"

const skippedWarning = (skipped: number, sample: string): Effect.Effect<void> =>
  Effect.logWarning("skipped undecodable upstream SSE frame").pipe(Effect.annotateLogs({ skipped, sample }))

abstract class CallBase implements Dispatcher.DispatchHandler {
  private controller: Dispatcher.DispatchController | undefined = undefined
  /** The consumer is finished with this call: late callbacks are ignored. */
  protected closed = false
  /** The HTTP response has fully arrived (or failed). */
  protected ended = false
  /** No more events will come (answer complete or failed). */
  protected done = false
  protected failure: UpstreamError | undefined = undefined
  private mode: Mode = "headers"
  private status = 0
  private body: Array<Buffer> | undefined = undefined
  private bodySize = 0
  private decoder: StringDecoder | undefined = undefined
  private parser: SseParser | undefined = undefined
  protected readonly normalizer = new ChatNormalizer()
  /** The socket read is paused (`controller.pause()`) for a consumer that is behind. */
  protected paused = false
  private sawFirst = false
  protected loggedSkips = 0
  protected clock: Clock.Clock = liveClock
  private startedAt = 0
  protected lastActivity = 0
  private timer: ReturnType<typeof setTimeout> | undefined = undefined
  watchdogFiber: Fiber.Fiber<void> | undefined = undefined

  constructor(
    private readonly pool: Pool,
    private readonly options: Dispatcher.DispatchOptions,
    private readonly timeouts: Timeouts
  ) {}

  /** New events, the end, or a failure: the consumer's turn. */
  protected abstract signal(): void

  /** Starts the clocks; on a clock other than the live one, fork `watchdog` after this. */
  init(clock: Clock.Clock): void {
    this.clock = clock
    this.startedAt = this.lastActivity = clock.currentTimeMillisUnsafe()
  }

  /** Sends the request (after `init`); arms the watchdog timer on the live clock. */
  protected send(): void {
    this.pool.dispatch(this.options, this)
    if (this.clock === liveClock && !this.done) this.armTimer()
  }

  // --- undici handler -------------------------------------------------------------------------

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.controller = controller
    if (this.closed || this.done) controller.abort(ABORTED)
  }

  onResponseStart(
    _controller: Dispatcher.DispatchController,
    status: number,
    headers: Record<string, string | Array<string> | undefined>
  ): void {
    if (this.closed || status < 200) return
    this.status = status
    this.lastActivity = this.clock.currentTimeMillisUnsafe()
    if (status >= 300) {
      this.mode = "failed"
      this.body = []
    } else if (headerText(headers["content-type"]).includes("text/event-stream")) {
      this.mode = "sse"
      this.decoder = new StringDecoder("utf8")
      const normalizer = this.normalizer
      this.parser = new SseParser((data) => normalizer.onData(data))
    } else {
      this.mode = "json"
      this.body = []
      this.sawFirst = true
    }
  }

  onResponseData(_controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (this.closed || this.done) return
    this.lastActivity = this.clock.currentTimeMillisUnsafe()
    if (this.mode !== "sse") {
      this.bodySize += chunk.length
      if (this.bodySize <= (this.mode === "json" ? MAX_JSON_BODY : MAX_ERROR_BODY)) this.body!.push(chunk)
      else if (this.mode === "json") this.fail(new UpstreamError({ kind: "protocol", detail: "answer too large" }))
      return
    }
    try {
      this.parser!.push(this.decoder!.write(chunk))
    } catch (error) {
      return this.fail(new UpstreamError({ kind: "protocol", detail: (error as Error).message }))
    }
    const normalizer = this.normalizer
    if (normalizer.error !== undefined) {
      return this.fail(new UpstreamError({ kind: "protocol", detail: `upstream error: ${normalizer.error}` }))
    }
    if (normalizer.sawDone) return this.finish()
    if (normalizer.events.length > 0) {
      this.sawFirst = true
      this.signal()
    }
  }

  onResponseEnd(): void {
    this.ended = true
    if (this.closed || this.done) return
    if (this.mode === "sse") {
      try {
        this.parser!.push(this.decoder!.end())
        this.parser!.end()
      } catch (error) {
        return this.fail(new UpstreamError({ kind: "protocol", detail: (error as Error).message }))
      }
      return this.finish()
    }
    const body = this.body!
    const text = body.length === 1 ? body[0]!.toString("utf8") : Buffer.concat(body).toString("utf8")
    this.body = undefined
    if (this.mode === "failed") return this.fail(statusError(this.status, text))
    let json: unknown
    try {
      json = JSON.parse(text)
    } catch {
      return this.fail(new UpstreamError({ kind: "protocol", detail: `answer is not JSON: ${text.slice(0, 200)}` }))
    }
    const problem = this.normalizer.onJson(json)
    if (problem !== undefined) return this.fail(new UpstreamError({ kind: "protocol", detail: problem }))
    this.done = true
    this.stopWatchdog()
    this.signal()
  }

  onResponseError(_controller: Dispatcher.DispatchController, error: Error): void {
    this.ended = true
    if (this.closed || this.done) return
    this.fail(transportError(error, this.status !== 0, this.timeouts.connect_ms))
  }

  // --- state ----------------------------------------------------------------------------------

  /** The answer is complete (`[DONE]` or end of body): emit `Finish`/`Usage` or the reason it is not. */
  private finish(): void {
    const problem = this.normalizer.end()
    if (problem !== undefined) return this.fail(new UpstreamError({ kind: "protocol", detail: problem }))
    this.done = true
    this.stopWatchdog()
    // Let the rest of the response (its terminator) be read so that the connection is reused. Only
    // ever called from inside this call's own parser callbacks, where resuming just clears the flag.
    if (this.paused) this.resumeSocket()
    this.signal()
  }

  protected fail(error: UpstreamError): void {
    if (this.done) return
    this.done = true
    const usage = this.normalizer.usage
    // Usage reported before the failure is still the truth for charging what was delivered.
    this.failure = usage === undefined || error.usage !== undefined
      ? error
      : new UpstreamError({ ...error, usage })
    this.body = undefined
    this.stopWatchdog()
    if (!this.ended) this.controller?.abort(ABORTED)
    this.signal()
  }

  protected pauseSocket(): void {
    this.paused = true
    this.controller?.pause()
  }

  /**
   * Resumes a paused socket. undici's parser may deliver buffered data synchronously from here, and
   * must not be resumed from inside another connection's parser callback: callers outside this
   * call's own callbacks defer it to a microtask (`resumeSocketLater`).
   */
  protected resumeSocket(): void {
    this.paused = false
    this.lastActivity = this.clock.currentTimeMillisUnsafe()
    this.controller?.resume()
  }

  private stopWatchdog(): void {
    clearTimeout(this.timer)
    const fiber = this.watchdogFiber
    if (fiber !== undefined) {
      this.watchdogFiber = undefined
      fiber.interruptUnsafe()
    }
  }

  /** The consumer is gone: an unfinished upstream request is aborted, which closes its socket. */
  protected closeCall(): void {
    this.closed = true
    this.stopWatchdog()
    if (!this.ended && (!this.done || this.failure !== undefined)) this.controller?.abort(ABORTED)
  }

  /** Logs SSE frames skipped since the last call, or returns undefined when there are none. */
  protected skippedLog(): Effect.Effect<void> | undefined {
    const normalizer = this.normalizer
    if (normalizer.skipped === this.loggedSkips) return undefined
    const skipped = normalizer.skipped - this.loggedSkips
    this.loggedSkips = normalizer.skipped
    return skippedWarning(skipped, normalizer.lastSkipped)
  }

  // --- timeouts -------------------------------------------------------------------------------

  /**
   * Checks the deadlines: fails the call if the nearest one passed without progress, else returns
   * how long to wait before checking again (undefined: nothing left to watch).
   */
  private check(): number | undefined {
    if (this.done || this.closed) return undefined
    const t = this.timeouts
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

  /** The watchdog on the live clock. */
  private armTimer(): void {
    const wait = this.check()
    if (wait !== undefined) this.timer = setTimeout(this.onTimer, wait)
  }

  private readonly onTimer = () => this.armTimer()

  /** The watchdog on any other clock (e.g. `TestClock`), as a forked fiber. */
  readonly watchdog: Effect.Effect<void> = Effect.suspend(() => {
    const wait = this.check()
    return wait === undefined ? Effect.void : Effect.andThen(Effect.sleep(wait), this.watchdog)
  })
}

/** Runs `run` with the watchdog of `call` on `clock`: a timer on the live clock, else a fiber. */
const watched = <A, E>(call: CallBase, clock: Clock.Clock, run: Effect.Effect<A, E>): Effect.Effect<A, E> => {
  call.init(clock)
  if (clock === liveClock) return run
  return Effect.flatMap(Effect.forkDetach(call.watchdog), (fiber) => {
    call.watchdogFiber = fiber
    return run
  })
}

const clockOf = (fiber: Fiber.Fiber<unknown, unknown>): Clock.Clock => fiber.getRef(Clock.Clock)

// ---------------------------------------------------------------------------------------------
// `chat`: a Stream pulling from the call

/** One pull of the stream: a non-empty batch, the end (`Cause.Done`) or the failure. */
type Pull = Effect.Effect<Arr.NonEmptyReadonlyArray<UpstreamEvent>, UpstreamError | Cause.Done>

const END: Pull = Cause.done()

class PullCall extends CallBase {
  private started = false
  private waiter: ((pull: Pull) => void) | undefined = undefined

  /** Sends the request on the first pull, on the clock of the pulling fiber. */
  private readonly start: Pull = Effect.clockWith((clock) => {
    this.started = true
    return watched(this, clock, Effect.suspend(() => {
      this.send()
      return this.next()
    }))
  })

  protected signal(): void {
    if (this.normalizer.events.length > HIGH_WATER && !this.paused && !this.done) this.pauseSocket()
    const waiter = this.waiter
    if (waiter !== undefined) {
      this.waiter = undefined
      waiter(this.next())
    }
  }

  /** Stream finalizer. */
  readonly close: Effect.Effect<void> = Effect.sync(() => this.closeCall())

  private next(): Pull {
    const log = this.skippedLog()
    if (log !== undefined) return Effect.andThen(log, Effect.suspend(() => this.next()))
    const normalizer = this.normalizer
    const events = normalizer.events
    if (events.length > 0) {
      normalizer.events = []
      // `signal` calls `next` from inside this call's own callback, and the pulling fiber, resumed
      // there, runs on synchronously (Effect 4) and may pull again: inside this call's own callback
      // resuming only clears the pause flag. Otherwise pulls run in a fiber outside any callback.
      if (this.paused) this.resumeSocket()
      return Effect.succeed(events as unknown as Arr.NonEmptyReadonlyArray<UpstreamEvent>)
    }
    if (this.failure !== undefined) return Effect.fail(this.failure)
    if (this.done) return END
    return this.wait
  }

  readonly pull: Pull = Effect.suspend(() => (this.started ? this.next() : this.start))

  private readonly wait: Pull = Effect.callback<Arr.NonEmptyReadonlyArray<UpstreamEvent>, UpstreamError | Cause.Done>((
    resume
  ) => {
    // Progress may have been made since `next()` chose to wait (the fiber can yield in between).
    const now = this.next()
    if (now !== this.wait) return resume(now)
    this.waiter = resume
    return Effect.sync(() => {
      this.waiter = undefined
    })
  })
}

// ---------------------------------------------------------------------------------------------
// `complete`: one Effect.callback resumed with the whole answer

type Resume<A> = (effect: Effect.Effect<A, UpstreamError>) => void

class CompleteCall extends CallBase {
  private resolve: Resume<ReadonlyArray<UpstreamEvent>> | undefined = undefined

  readonly run: Effect.Effect<ReadonlyArray<UpstreamEvent>, UpstreamError> = Effect.callback((resume) => {
    this.resolve = resume
    this.send()
    return Effect.sync(() => {
      this.resolve = undefined
      this.closeCall()
    })
  })

  protected signal(): void {
    if (!this.done) return
    const resolve = this.resolve
    if (resolve === undefined) return
    this.resolve = undefined
    this.closed = true
    if (this.failure !== undefined) return resolve(Effect.fail(this.failure))
    const events = this.normalizer.events
    this.normalizer.events = []
    const log = this.skippedLog()
    resolve(log === undefined ? Effect.succeed(events) : Effect.as(log, events))
  }
}

// ---------------------------------------------------------------------------------------------
// `open`: push-based

const PENDING = 0
const OPEN = 1
const FINISHED = 2

const NO_EVENTS: ReadonlyArray<UpstreamEvent> = []

class PushCall extends CallBase implements UpstreamCall {
  first: ReadonlyArray<UpstreamEvent> = NO_EVENTS
  /** PENDING until `open` resolves, OPEN until the terminal callback or abort, then FINISHED. */
  private phase = PENDING
  /** The consumer is paused: after resolution until `resume()`, after `onEvents` returned false. */
  private held = true
  private delivering = false
  /** `resume()` was called from inside `onEvents`: its false return does not hold the call. */
  private resumedInside = false
  private resumeQueued = false
  private resolve: Resume<UpstreamCall> | undefined = undefined

  constructor(
    pool: Pool,
    options: Dispatcher.DispatchOptions,
    timeouts: Timeouts,
    private readonly sink: UpstreamSink,
    private readonly log: DetachedLog
  ) {
    super(pool, options, timeouts)
  }

  readonly run: Effect.Effect<UpstreamCall, UpstreamError> = Effect.callback((resume) => {
    this.resolve = resume
    this.send()
    return Effect.sync(this.abort)
  })

  protected signal(): void {
    if (this.phase === OPEN) {
      if (!this.held) this.deliver()
      else if (!this.paused && !this.done && this.normalizer.events.length > 0) this.pauseSocket()
      return
    }
    if (this.phase !== PENDING) return
    const resolve = this.resolve!
    const events = this.normalizer.events
    if (events.length > 0 || this.failure === undefined) {
      // Events (a failure or the end in the same read stays held for the sink), or the end.
      this.normalizer.events = []
      this.first = events
      this.phase = OPEN
      this.resolve = undefined
      const log = this.skippedLog()
      resolve(log === undefined ? Effect.succeed(this) : Effect.as(log, this))
    } else {
      this.phase = FINISHED
      this.closed = true
      this.resolve = undefined
      resolve(Effect.fail(this.failure))
    }
  }

  private deliver(): void {
    if (this.delivering) return
    this.delivering = true
    const sink = this.sink
    const normalizer = this.normalizer
    try {
      while (this.phase === OPEN && !this.held) {
        if (normalizer.skipped !== this.loggedSkips) this.log.run(this.skippedLog()!)
        const events = normalizer.events
        if (events.length > 0) {
          normalizer.events = []
          this.resumedInside = false
          if (!sink.onEvents(events) && !this.resumedInside) {
            this.held = true
            if (!this.paused && !this.done) this.pauseSocket()
          }
        } else {
          if (this.failure !== undefined) {
            this.phase = FINISHED
            this.closed = true
            sink.onError(this.failure)
          } else if (this.done) {
            this.phase = FINISHED
            this.closed = true
            sink.onEnd()
          }
          break
        }
      }
    } catch (defect) {
      this.abort()
      this.log.run(Effect.logError("upstream sink callback threw; call aborted", Cause.die(defect)))
    } finally {
      this.delivering = false
    }
  }

  readonly resume = (): void => {
    if (this.phase !== OPEN) return
    if (!this.held) {
      if (this.delivering) this.resumedInside = true
      return
    }
    this.held = false
    this.deliver()
    if (this.phase === OPEN && !this.held && this.paused && !this.resumeQueued) {
      this.resumeQueued = true
      queueMicrotask(() => {
        this.resumeQueued = false
        if (this.phase === OPEN && !this.held && this.paused) this.resumeSocket()
      })
    }
  }

  readonly abort = (): void => {
    // `closed` is also set when the terminal callback is made: then there is nothing to release.
    if (this.closed) return
    this.phase = FINISHED
    this.resolve = undefined
    this.closeCall()
  }
}

// ---------------------------------------------------------------------------------------------
// A buffered call (embeddings)

class BufferCall implements Dispatcher.DispatchHandler {
  private controller: Dispatcher.DispatchController | undefined = undefined
  private closed = false
  private ended = false
  private status = 0
  private body: Array<Buffer> = []
  private size = 0

  constructor(
    private readonly connectMs: number,
    private readonly callback: (result: { status: number; text: string } | UpstreamError) => void
  ) {}

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.controller = controller
    if (this.closed) controller.abort(ABORTED)
  }

  onResponseStart(_controller: Dispatcher.DispatchController, status: number): void {
    if (status >= 200) this.status = status
  }

  onResponseData(_controller: Dispatcher.DispatchController, chunk: Buffer): void {
    this.size += chunk.length
    if (this.size <= MAX_JSON_BODY) this.body.push(chunk)
  }

  onResponseEnd(): void {
    this.ended = true
    if (this.closed) return
    if (this.size > MAX_JSON_BODY) {
      return this.callback(new UpstreamError({ kind: "protocol", detail: "answer too large" }))
    }
    this.callback({ status: this.status, text: Buffer.concat(this.body).toString("utf8") })
  }

  onResponseError(_controller: Dispatcher.DispatchController, error: Error): void {
    this.ended = true
    if (this.closed) return
    this.callback(transportError(error, this.status !== 0, this.connectMs))
  }

  abort(): void {
    this.closed = true
    if (!this.ended) this.controller?.abort(ABORTED)
  }
}

const decodeEmbeddings = (
  text: string,
  count: number
): { vectors: Array<ReadonlyArray<number>>; prompt_tokens: number } | UpstreamError => {
  let body: any
  try {
    body = JSON.parse(text)
  } catch {
    return new UpstreamError({ kind: "protocol", detail: `embeddings answer is not JSON: ${text.slice(0, 200)}` })
  }
  if (!Array.isArray(body?.data) || body.data.length !== count) {
    return new UpstreamError({ kind: "protocol", detail: `embeddings answer does not hold ${count} vectors` })
  }
  const vectors = new Array<ReadonlyArray<number>>(count)
  for (let i = 0; i < count; i++) {
    const item = body.data[i]
    const at = typeof item?.index === "number" ? item.index : i
    let vector = item?.embedding
    if (typeof vector === "string") {
      const bytes = Buffer.from(vector, "base64")
      vector = Array.from(new Float32Array(bytes.buffer, bytes.byteOffset, bytes.length >> 2))
    }
    if (!Array.isArray(vector) || at < 0 || at >= count) {
      return new UpstreamError({ kind: "protocol", detail: "embeddings answer holds an invalid vector" })
    }
    vectors[at] = vector
  }
  const usage = body.usage
  return { vectors, prompt_tokens: typeof usage?.prompt_tokens === "number" ? usage.prompt_tokens : 0 }
}

// ---------------------------------------------------------------------------------------------
// The adapter

export const makeOpenAiCompatibleAdapter = (
  provider: OpenAiCompatibleProviderConfig,
  apiKey?: string
): OpenAiCompatibleAdapter => {
  const url = new URL(provider.base_url)
  const basePath = url.pathname.replace(/\/+$/, "")
  const timeouts = provider.timeouts
  const pool = new Pool(url.origin, {
    connections: provider.connections,
    pipelining: 1,
    connect: { timeout: timeouts.connect_ms },
    // The watchdog owns first-token and idle timeouts; these are backstops for abandoned requests.
    headersTimeout: timeouts.total_ms,
    bodyTimeout: timeouts.idle_ms + 1_000,
    keepAliveTimeout: 30_000
  })
  const auth = apiKey !== undefined && apiKey !== "" ? { authorization: `Bearer ${apiKey}` } : {}
  const sseHeaders = { "content-type": "application/json", accept: "text/event-stream", ...auth }
  const jsonHeaders = { "content-type": "application/json", accept: "application/json", ...auth }
  const chatPath = `${basePath}/chat/completions`
  const embeddingsPath = `${basePath}/embeddings`

  const chatOptions = (request: UpstreamRequest): Dispatcher.DispatchOptions => ({
    path: chatPath,
    method: "POST",
    headers: request.stream ? sseHeaders : jsonHeaders,
    body: encodeChatRequest(request)
  })

  const chat = (request: UpstreamRequest): Stream.Stream<UpstreamEvent, UpstreamError> =>
    Stream.suspend(() => {
      const call = new PullCall(pool, chatOptions(request), timeouts)
      return Stream.ensuring(Stream.fromPull(Effect.succeed(call.pull)), call.close)
    })

  const complete = (request: UpstreamRequest): Effect.Effect<ReadonlyArray<UpstreamEvent>, UpstreamError> =>
    Effect.withFiber((fiber) => {
      const call = new CompleteCall(pool, chatOptions(request), timeouts)
      return watched(call, clockOf(fiber), call.run)
    })

  const open = (request: UpstreamRequest, sink: UpstreamSink): Effect.Effect<UpstreamCall, UpstreamError> =>
    Effect.withFiber((fiber) => {
      const call = new PushCall(pool, chatOptions(request), timeouts, sink, new DetachedLog(fiber))
      return watched(call, clockOf(fiber), call.run)
    })

  const embed: UpstreamAdapter["embed"] = (model, input) =>
    Effect.callback<{ status: number; text: string }, UpstreamError>((resume) => {
      const call = new BufferCall(timeouts.connect_ms, (result) =>
        resume(result instanceof UpstreamError ? Effect.fail(result) : Effect.succeed(result)))
      pool.dispatch({
        path: embeddingsPath,
        method: "POST",
        headers: jsonHeaders,
        body: JSON.stringify({ model, input, encoding_format: "float" })
      }, call)
      return Effect.sync(() => call.abort())
    }).pipe(
      Effect.timeoutOrElse({
        duration: Duration.millis(timeouts.total_ms),
        orElse: () =>
          Effect.fail(
            new UpstreamError({ kind: "timeout", detail: `embeddings took longer than ${timeouts.total_ms} ms` })
          )
      }),
      Effect.flatMap(({ status, text }) => {
        if (status < 200 || status >= 300) return Effect.fail(statusError(status, text))
        const decoded = decodeEmbeddings(text, input.length)
        return decoded instanceof UpstreamError ? Effect.fail(decoded) : Effect.succeed(decoded)
      })
    )

  const close = (grace: Duration.Input = "5 seconds") =>
    Effect.promise(() => pool.close()).pipe(
      Effect.timeout(grace),
      Effect.catch(() => Effect.promise(() => pool.destroy())),
      Effect.ignore
    )

  return { chat, complete, open, embed, close }
}

/** The adapter as a scoped resource: its pool closes with the scope. */
export const openAiCompatibleAdapter = (
  provider: OpenAiCompatibleProviderConfig,
  apiKey?: string
) => Effect.acquireRelease(Effect.sync(() => makeOpenAiCompatibleAdapter(provider, apiKey)), (a) => a.close())
