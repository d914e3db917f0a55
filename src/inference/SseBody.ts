import { NodeHttpServerRequest } from "@effect/platform-node"
import { Cause, Clock, type Context, Duration, Effect, Exit, Scope } from "effect"
import { HttpServerRequest, HttpServerResponse } from "effect/http"
import type * as Http from "node:http"
import { runForkTracked } from "../http/CallbackFibers.js"
import { awaitAtMost, startTimer, stopTimer, type Timer } from "../runtime/Timers.js"
import { holdForTurn } from "../store/TurnWrites.js"
import { currentRequestId, REQUEST_ID_HEADER } from "../http/Respond.js"
import { type UpstreamCall, UpstreamError, type UpstreamEvent, type UpstreamSink } from "../upstream/Upstream.js"

export const PING_INTERVAL = Duration.seconds(8)
export const PING_FRAME = ": ping\n\n"

/**
 * Calls `ping` whenever `touch` has not been called for `idle`, on the Effect clock (TestClock drives it): one
 * re-armed `startTimer` (`runtime/Timers.ts`), stopped when `scope` closes. Costs nothing per chunk but a clock read.
 */
export const idlePinger = Effect.fnUntraced(function*(idle: Duration.Input, ping: () => void, scope: Scope.Scope) {
  const clock = yield* Clock.Clock
  const idleMs = Duration.toMillis(idle)
  let last = clock.currentTimeMillisUnsafe()
  let timer: Timer | undefined
  const arm = (wait: number): void => {
    timer = startTimer(clock, wait, () => {
      const left = last + idleMs - clock.currentTimeMillisUnsafe()
      if (left > 0) return arm(left)
      ping()
      last = clock.currentTimeMillisUnsafe()
      arm(idleMs)
    }, true)
  }
  arm(idleMs)
  yield* Scope.addFinalizer(scope, Effect.sync(() => stopTimer(timer)))
  return { touch: () => void (last = clock.currentTimeMillisUnsafe()) }
})

export interface SseHandlers {
  /** Frames for one batch of upstream events (may be empty). */
  readonly frames: (events: ReadonlyArray<UpstreamEvent>) => string
  /** The closing frames (usage, receipt, `[DONE]`), computed once the answer is complete. */
  readonly end: Effect.Effect<string>
  /**
   * The upstream failed mid-stream; the connection is then cut without the closing frames, after the frame this
   * returns, if any (Anthropic's `event: error`; chat writes none).
   */
  readonly failed: (error: UpstreamError) => Effect.Effect<string | void>
  /** The client went away or the body was dropped before the end. */
  readonly cancelled: Effect.Effect<void>
  /** The first upstream events are being written (time to first token). */
  readonly started?: () => void
  /** The idle keep-alive frame (default `PING_FRAME`, chat's comment line). */
  readonly ping?: string
}

/**
 * Where a stream's text goes: the client's response, written directly (no Readable, no pipeline).
 * `write` returns false when the client is backed up; the output then calls the body's `drained` once it
 * has room again.
 */
export interface SseOutput {
  /** Writes frames; the first write also sends the 200 status line and headers. */
  readonly write: (text: string) => boolean
  /** Writes the closing frames and ends the response. */
  readonly end: (text: string) => void
  /** Ends the connection without the closing frames (a failure mid-stream), after what was written; `closed` follows. */
  readonly cut: () => void
}

/** A stream that has committed (its first events came, or the wait for them ran out). */
export interface SseBody {
  /**
   * Streams into `output` until the answer has ended (closing frames written) or was cut after a failure and
   * the connection closed. Interrupting it means the client went away: the upstream call is aborted and the
   * request recorded as cancelled.
   */
  readonly run: (output: SseOutput) => Effect.Effect<void>
  /** The output has room again after a `write` that returned false. */
  readonly drained: () => void
  /** The connection of a cut stream has closed: `run` completes. */
  readonly closed: () => void
}

/**
 * Internal timing knobs of streams. `firstEventWait`: how long a stream waits for the upstream's first event
 * before committing to the stream (spec Events 5 and 7). Defaults to the ping interval; tests shorten it.
 */
export const streamTiming: { firstEventWait: Duration.Input } = { firstEventWait: PING_INTERVAL }

type Opened = Exit.Exit<UpstreamCall, UpstreamError>

/**
 * An SSE stream fed directly by the upstream call's callbacks: no Effect Stream and no Node stream per
 * response. Back-pressure: when the client's socket buffer is full `onEvents` returns false and the upstream
 * read pauses until the output drains. Pings go out after 8 s without a frame.
 *
 * The first upstream event is awaited for at most `firstEventWait` (on the Effect clock):
 * - it arrives in time: `run` starts with `head` and the first frames; a failure before it fails this
 *   effect, so the caller still answers with a JSON error and its status (Event 7);
 * - it does not: this resolves at once and `run` starts with `: ping` (the 200 headers go out with it),
 *   pinged every 8 s while idle (Event 5); `head` and the frames follow when the events come, and a failure
 *   before them goes to `handlers.failed` and cuts the connection without `[DONE]`.
 */
export const sseBody: (
  context: Context.Context<never>,
  scope: Scope.Scope,
  open: (sink: UpstreamSink) => Effect.Effect<UpstreamCall, UpstreamError>,
  head: string,
  handlers: SseHandlers,
  firstEventWait?: Duration.Input
) => Effect.Effect<SseBody, UpstreamError> = Effect.fnUntraced(function*(
  context: Context.Context<never>,
  scope: Scope.Scope,
  open: (sink: UpstreamSink) => Effect.Effect<UpstreamCall, UpstreamError>,
  head: string,
  handlers: SseHandlers,
  firstEventWait: Duration.Input = streamTiming.firstEventWait
) {
  let call: UpstreamCall | null = null
  let waiting = false
  let done = false
  let out: SseOutput | null = null
  /** Completes `run`. */
  let finish: (() => void) | null = null
  let cutting = false
  let touch = () => {}
  // Fibers started from callbacks are tracked by the server, so a shutdown drain waits for their settles.
  const runFork = runForkTracked(context)
  const run = <A>(effect: Effect.Effect<A>) => runFork(effect)
  /** Interrupts the opening of the upstream call, until it has opened. */
  let cancelOpening: (() => void) | null = null

  const write = (text: string): boolean => {
    touch()
    return out!.write(text)
  }

  const pingFrame = handlers.ping ?? PING_FRAME
  const ping = () => void (!done && out !== null && out.write(pingFrame))

  /** The client went away (or `run` was interrupted) before the end. */
  const cancel = () => {
    if (done) return
    done = true
    call?.abort()
    cancelOpening?.()
    run(handlers.cancelled)
  }

  const fail = (error: UpstreamError) => {
    if (done) return
    done = true
    run(handlers.failed(error).pipe(
      Effect.tap((frame) =>
        Effect.sync(() => {
          if (typeof frame === "string" && frame.length > 0) out!.write(frame)
        })
      ),
      Effect.ensuring(Effect.sync(() => {
        cutting = true
        out!.cut()
      }))
    ))
  }

  const sink: UpstreamSink = {
    onEvents: (events) => {
      if (done) return false
      const ok = write(handlers.frames(events))
      if (!ok) waiting = true
      return ok
    },
    onEnd: () => {
      if (done) return
      done = true
      run(handlers.end.pipe(Effect.tap((last) =>
        Effect.sync(() => {
          touch()
          out!.end(last)
          finish?.()
        })
      )))
    },
    onError: fail
  }

  /** The call is open: writes the head and its first events; the rest flows once the client is ready. */
  const begin = (opened: UpstreamCall) => {
    call = opened
    cancelOpening = null
    handlers.started?.()
    if (write(head + handlers.frames(opened.first))) {
      queueMicrotask(() => {
        if (!done && !waiting) opened.resume()
      })
    } else waiting = true
  }

  // Opening runs in a fiber of its own (on this request's context: same clock and services) so that the
  // wait can give up on it without interrupting it; `scope` closing interrupts it. (A root fiber observed
  // by a callback, as `Effect.runCallbackWith` does: a fraction of the cost of `forkIn` + join.) The call is
  // owned by `scope` from the moment it resolves, so an interruption cannot leak it.
  let outcome: Opened | null = null
  let onOutcome: ((exit: Opened) => void) | null = null
  const opening = runFork(
    Effect.uninterruptibleMask((restore) =>
      restore(open(sink)).pipe(Effect.tap((c) => Scope.addFinalizer(scope, Effect.sync(c.abort))))
    )
  )
  opening.addObserver((exit) => {
    outcome = exit
    onOutcome?.(exit)
  })
  const interruptOpening = () => {
    if (outcome === null) opening.interruptUnsafe()
  }
  cancelOpening = interruptOpening
  yield* Scope.addFinalizer(scope, Effect.sync(interruptOpening))

  const early = yield* awaitAtMost<Opened>(
    firstEventWait,
    (resume) => {
      if (outcome !== null) return resume(outcome)
      onOutcome = resume
    },
    () => void (onOutcome = null)
  )
  // An outcome that came just as the wait ran out is still in time.
  const inTime = early ?? (outcome as Opened | null)
  // As if there had been no wait: a failure here is still a JSON error.
  const opened = inTime === null ? null : yield* inTime
  touch = (yield* idlePinger(PING_INTERVAL, ping, scope)).touch

  const committed = (exit: Opened) => {
    if (done) {
      if (Exit.isSuccess(exit)) exit.value.abort()
      return
    }
    if (Exit.isSuccess(exit)) return begin(exit.value)
    cancelOpening = null
    const failure = Cause.findErrorOption(exit.cause)
    if (failure._tag === "Some") return fail(failure.value)
    // Interrupted (the request's scope closed) or a defect: end the body; the request is already settled
    // (interruption) or is settled as failed here (defect).
    if (Cause.hasInterruptsOnly(exit.cause)) {
      done = true
      cutting = true
      return out!.cut()
    }
    fail(new UpstreamError({ kind: "protocol", detail: `opening the stream failed: ${Cause.pretty(exit.cause)}` }))
  }

  return {
    run: (output) =>
      Effect.callback<void>((resume) => {
        out = output
        finish = () => resume(Effect.void)
        if (opened !== null) begin(opened)
        else {
          // Committed: the 200 headers go out with the first ping.
          write(pingFrame)
          // The outcome may have come while the pinger was being set up.
          if (outcome !== null) committed(outcome)
          else onOutcome = committed
        }
        return Effect.sync(cancel)
      }),
    drained: () => {
      if (waiting && call !== null && !done) {
        waiting = false
        call.resume()
      }
    },
    closed: () => {
      if (cutting) finish?.()
    }
  }
})

/** How long a cut stream's connection may take to flush what was written before it is destroyed. */
const CUT_GRACE_MS = 5_000

/**
 * The output for a Node response: the first write sends the 200 status line with `headers` (in the same
 * packet as the first frames), `end` writes the closing frames with the last chunk. What one turn of the event
 * loop writes leaves in one socket write (`holdForTurn`): a stream whose upstream answer came whole is sent in
 * one write, head to `[DONE]`, when its completion settles in the same turn. A cut ends the socket
 * once what was written has been flushed (the client sees the body end without its last chunk), and destroys
 * it if the client does not close within `CUT_GRACE_MS`.
 */
export const nodeOutput = (
  response: Http.ServerResponse,
  headers: Http.OutgoingHttpHeaders,
  body: SseBody
): SseOutput => {
  response.on("drain", body.drained)
  response.once("close", body.closed)
  const start = () => {
    if (!response.headersSent) response.writeHead(200, headers)
    const socket = response.socket
    if (socket !== null && !socket.destroyed) holdForTurn(socket)
  }
  return {
    write: (text) => {
      start()
      return response.write(text)
    },
    end: (text) => {
      start()
      response.end(text)
    },
    cut: () => {
      const socket = response.socket
      if (socket === null || socket.destroyed) return void response.destroy()
      socket.end()
      const timer = setTimeout(() => socket.destroy(), CUT_GRACE_MS)
      timer.unref()
      socket.once("close", () => clearTimeout(timer))
    }
  }
}

/**
 * Streams `body` as this request's response and completes when it has ended. The response it returns is
 * never written: the stream has already answered (the server skips an ended or destroyed response).
 */
export const sseResponse = Effect.fnUntraced(function*(body: SseBody, headers: Readonly<Record<string, string>>) {
  const request = yield* HttpServerRequest.HttpServerRequest
  const requestId = yield* currentRequestId
  const response = NodeHttpServerRequest.toServerResponse(request) as Http.ServerResponse
  yield* body.run(nodeOutput(response, {
    ...headers,
    "content-type": "text/event-stream",
    [REQUEST_ID_HEADER]: requestId
  }, body))
  return STREAMED
})

const STREAMED = HttpServerResponse.empty({ status: 200 })

