/**
 * The consumer side of every `UpstreamAdapter.open`, written once: resolving `open` with the first
 * events, holding the consumer until `resume()`, delivering held events then the end or the failure in
 * order, back-pressure from `onEvents` returning false, and an idempotent `abort()` (the guarantees
 * listed on `UpstreamSink` and `UpstreamCall`).
 *
 * A producer (the HTTP chat call, the simulated model) extends `PushCall` and
 * - makes events available through `take()`, and sets `done` (and `failure` when the answer failed)
 *   when no more will come; events taken before a failure are delivered before it;
 * - calls `signal()` after new events, the end or a failure (never from inside `take()`);
 * - implements `start()` (begin producing), `release()` (stop early: close sockets, stop timers), and
 *   may override `throttle()` / `unthrottle()` (stop / restart producing while the consumer is held)
 *   and `waiting()` (the consumer wants more, none is ready and the answer is not over).
 *
 * No fiber and no Stream: `open` is one `Effect.callback`, later deliveries are plain calls from the
 * producer's callbacks.
 */
import { Cause, type Context, Effect, type Fiber } from "effect"
import type { UpstreamCall, UpstreamError, UpstreamEvent, UpstreamSink } from "./Upstream.js"

/** `open` not resolved yet. */
const PENDING = 0
/** Resolved; the sink gets the rest. */
const OPEN = 1
/** The terminal callback was made, `open` failed, or the call was aborted: nothing more happens. */
const FINISHED = 2

export const NO_EVENTS: ReadonlyArray<UpstreamEvent> = []

export abstract class PushCall implements UpstreamCall {
  first: ReadonlyArray<UpstreamEvent> = NO_EVENTS
  /** No more events will come from the producer: the answer is complete, or failed (`failure`). */
  protected done = false
  protected failure: UpstreamError | undefined = undefined
  private phase = PENDING
  /** The consumer is paused: after resolution until `resume()`, after `onEvents` returned false. */
  protected held = true
  private delivering = false
  /** `resume()` was called from inside `onEvents`: its false return does not hold the call. */
  private resumedInside = false
  private resolve: ((effect: Effect.Effect<UpstreamCall, UpstreamError>) => void) | undefined = undefined
  /** The opening fiber's context (loggers, log level, annotations) for logs made from callbacks. */
  private readonly context: Context.Context<never>

  constructor(opener: Fiber.Fiber<unknown, unknown>, private readonly sink: UpstreamSink) {
    this.context = opener.context
  }

  // --- the producer's part --------------------------------------------------------------------

  /** Takes the events ready for the consumer, in order; an empty array when none is. */
  protected abstract take(): ReadonlyArray<UpstreamEvent>
  /** Starts producing (from inside `open`'s Effect, once). May `signal()` synchronously. */
  protected abstract start(): void
  /** The call ends before its answer did (abort, interruption): release what the producer holds. */
  protected abstract release(): void
  /** The consumer is held: stop producing if possible (e.g. pause the socket read). */
  protected throttle(): void {}
  /** The consumer was resumed and took everything held: produce again. */
  protected unthrottle(): void {}
  /** The consumer wants more, none is ready yet and the answer is not over. */
  protected waiting(): void {}
  /** A rare log to emit (e.g. skipped frames), or undefined; checked before each delivery. */
  protected pendingLog(): Effect.Effect<void> | undefined {
    return undefined
  }

  /** The consumer has finished with the call (terminal callback made, `open` failed, or aborted). */
  protected get finished(): boolean {
    return this.phase === FINISHED
  }

  /** `open`'s Effect: resolves with the first events, fails with a failure that comes before any. */
  readonly run: Effect.Effect<UpstreamCall, UpstreamError> = Effect.callback((resume) => {
    this.resolve = resume
    this.start()
    return Effect.sync(this.abort)
  })

  /** New events, the end, or a failure: the consumer's turn. */
  protected signal(): void {
    if (this.phase === OPEN) {
      if (!this.held) this.deliver()
      else this.throttle()
      return
    }
    if (this.phase !== PENDING) return
    const resolve = this.resolve!
    const events = this.take()
    if (events.length > 0 || (this.done && this.failure === undefined)) {
      // A failure or the end that came with the first events stays held for the sink.
      this.first = events
      this.phase = OPEN
      this.resolve = undefined
      const log = this.pendingLog()
      resolve(log === undefined ? Effect.succeed(this) : Effect.as(log, this))
    } else if (this.failure !== undefined) {
      this.phase = FINISHED
      this.resolve = undefined
      resolve(Effect.fail(this.failure))
    } else {
      this.waiting()
    }
  }

  private deliver(): void {
    if (this.delivering) return
    this.delivering = true
    const sink = this.sink
    try {
      while (this.phase === OPEN && !this.held) {
        const log = this.pendingLog()
        if (log !== undefined) this.runLog(log)
        const events = this.take()
        if (events.length > 0) {
          this.resumedInside = false
          if (!sink.onEvents(events) && !this.resumedInside) {
            this.held = true
            this.throttle()
          }
        } else {
          if (this.failure !== undefined) {
            this.phase = FINISHED
            sink.onError(this.failure)
          } else if (this.done) {
            this.phase = FINISHED
            sink.onEnd()
          } else {
            this.waiting()
          }
          break
        }
      }
    } catch (defect) {
      this.abort()
      this.runLog(Effect.logError("upstream sink callback threw; call aborted", Cause.die(defect)))
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
    if (this.phase === OPEN && !this.held) this.unthrottle()
  }

  readonly abort = (): void => {
    if (this.phase === FINISHED) return
    this.phase = FINISHED
    this.resolve = undefined
    this.release()
  }

  /** Runs `log` now, in a fiber of its own, with the opening fiber's log settings. For rare events only. */
  protected runLog(log: Effect.Effect<void>): void {
    Effect.runForkWith(this.context)(log)
  }
}
