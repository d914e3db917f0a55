import { Clock, Context, DefaultServices, Duration, Effect, Runtime, Scope } from "effect"
import { Readable } from "node:stream"
import type { UpstreamCall, UpstreamError, UpstreamEvent, UpstreamSink } from "../upstream/Upstream.js"

export const PING_INTERVAL = Duration.seconds(8)
export const PING_FRAME = ": ping\n\n"

const liveClock = Context.get(DefaultServices.liveServices, Clock.Clock)

/**
 * Calls `ping` whenever `touch` has not been called for `idle`, on the Effect clock (TestClock drives it).
 * On the live clock it is one plain re-armed timer; on any other clock a fiber in `scope`. Either way it stops
 * when `scope` closes, and costs nothing per chunk but a clock read.
 */
export const idlePinger = (idle: Duration.DurationInput, ping: () => void, scope: Scope.Scope) =>
  Effect.gen(function*() {
    const clock = yield* Effect.clock
    const idleMs = Duration.toMillis(idle)
    let last = clock.unsafeCurrentTimeMillis()
    const touch = () => void (last = clock.unsafeCurrentTimeMillis())
    if (clock === liveClock) {
      let timer: ReturnType<typeof setTimeout> | undefined
      const arm = (wait: number) => {
        timer = setTimeout(() => {
          const left = last + idleMs - Date.now()
          if (left > 0) return arm(left)
          ping()
          last = Date.now()
          arm(idleMs)
        }, wait)
        timer.unref()
      }
      arm(idleMs)
      yield* Scope.addFinalizer(scope, Effect.sync(() => clearTimeout(timer)))
      return { touch }
    }
    const tick = Effect.suspend(() => {
      const wait = last + idleMs - clock.unsafeCurrentTimeMillis()
      if (wait > 0) return Effect.sleep(Duration.millis(wait))
      return Effect.sync(() => {
        ping()
        last = clock.unsafeCurrentTimeMillis()
      })
    })
    yield* Effect.forkIn(Effect.forever(tick), scope)
    return { touch }
  })

export interface SseHandlers {
  /** Frames for one batch of upstream events (may be empty). */
  readonly frames: (events: ReadonlyArray<UpstreamEvent>) => string
  /** The closing frames (usage, receipt, `[DONE]`), computed once the answer is complete. */
  readonly end: Effect.Effect<string>
  /** The upstream failed mid-stream; the connection is then cut without `[DONE]`. */
  readonly failed: (error: UpstreamError) => Effect.Effect<void>
  /** The client went away or the body was dropped before the end. */
  readonly cancelled: Effect.Effect<void>
}

/**
 * The SSE body as a Node Readable fed directly by the upstream call's callbacks: no Effect Stream per
 * chunk. Back-pressure: when the socket buffer is full `onEvents` returns false and the upstream read
 * pauses until the client drains (`_read` resumes it). Pings go out after 8 s without a frame.
 */
export const sseBody = <E>(
  runtime: Runtime.Runtime<never>,
  scope: Scope.Scope,
  open: (sink: UpstreamSink) => Effect.Effect<UpstreamCall, E>,
  head: string,
  handlers: SseHandlers
) =>
  Effect.gen(function*() {
    let call: UpstreamCall | null = null
    let waiting = false
    let done = false
    /** A mid-stream failure waits until the frames already queued have been handed to the client. */
    let cutWhenDrained: Error | null = null
    const cut = () => setImmediate(() => body.destroy(cutWhenDrained!))
    let touch = () => {}
    const run = <A>(effect: Effect.Effect<A>) => Runtime.runFork(runtime)(effect)

    const body = new Readable({
      highWaterMark: 16 * 1024,
      read() {
        if (cutWhenDrained) return cut()
        if (waiting && call && !done) {
          waiting = false
          call.resume()
        }
      },
      destroy(error, callback) {
        if (!done) {
          done = true
          call?.abort()
          run(handlers.cancelled)
        }
        callback(error)
      }
    })

    const write = (text: string): boolean => {
      touch()
      return body.push(text)
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
            write(last)
            body.push(null)
          })
        )))
      },
      onError: (error) => {
        if (done) return
        done = true
        run(handlers.failed(error).pipe(Effect.ensuring(Effect.sync(() => {
          cutWhenDrained = new Error(error.detail)
          if (body.readableLength === 0) cut()
        }))))
      }
    }

    // The call is owned by `scope` from the moment it resolves, so an interruption cannot leak it.
    call = yield* Effect.uninterruptibleMask((restore) =>
      restore(open(sink)).pipe(Effect.tap((c) => Scope.addFinalizer(scope, Effect.sync(c.abort))))
    )
    const pinger = yield* idlePinger(PING_INTERVAL, () => void (!done && body.push(PING_FRAME)), scope)
    touch = pinger.touch
    // Everything after `first` flows once the consumer is ready: now, or from `read()` on back-pressure.
    if (write(head + handlers.frames(call.first))) {
      const ready = call
      queueMicrotask(() => {
        if (!done && !waiting) ready.resume()
      })
    } else waiting = true
    return body
  })
