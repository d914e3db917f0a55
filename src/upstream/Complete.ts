/**
 * The whole answer as one array (for non-streaming client requests), derived once from
 * `UpstreamAdapter.open` for every adapter: the same events, errors and timeouts as `open`.
 *
 * Cost: for a non-streamed request to an HTTP upstream `open` resolves when the whole JSON answer has
 * been read, with every event in `first`, and the end is delivered synchronously from the first
 * `resume()`: one `Effect.callback` for the whole call, no fiber, no Stream, no copy of the events. A
 * streamed (or paced, simulated) answer waits for its end in a second `Effect.callback`.
 */
import { Effect } from "effect"
import { NO_EVENTS } from "./PushCall.js"
import type { UpstreamAdapter, UpstreamCall, UpstreamError, UpstreamEvent, UpstreamRequest, UpstreamSink } from "./Upstream.js"

type Answer = Effect.Effect<ReadonlyArray<UpstreamEvent>, UpstreamError>

/** A sink that keeps every event and resumes the waiting fiber at the end. */
class Collector implements UpstreamSink {
  private first: ReadonlyArray<UpstreamEvent> = NO_EVENTS
  /** `first` and the later events, once there are later events. */
  private events: Array<UpstreamEvent> | undefined = undefined
  private ended = false
  private failure: UpstreamError | undefined = undefined
  private wake: ((answer: Answer) => void) | undefined = undefined

  onEvents(batch: ReadonlyArray<UpstreamEvent>): boolean {
    const events = this.events ?? (this.events = this.first.slice())
    for (let i = 0; i < batch.length; i++) events.push(batch[i]!)
    return true
  }

  onEnd(): void {
    this.ended = true
    this.settle()
  }

  onError(error: UpstreamError): void {
    this.failure = error
    this.settle()
  }

  private answer(): Answer {
    return this.failure !== undefined ? Effect.fail(this.failure) : Effect.succeed(this.events ?? this.first)
  }

  private settle(): void {
    const wake = this.wake
    if (wake !== undefined) {
      this.wake = undefined
      wake(this.answer())
    }
  }

  /** Takes `first`, resumes the call, and waits (interruptibly, aborting the call) for its end. */
  collect(call: UpstreamCall, restore: <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.Effect<A, E, R>): Answer {
    this.first = call.first
    call.resume()
    if (this.ended || this.failure !== undefined) return this.answer()
    return restore(Effect.callback<ReadonlyArray<UpstreamEvent>, UpstreamError>((resume) => {
      this.wake = resume
      return Effect.sync(call.abort)
    }))
  }
}

/**
 * `open` + collect. Interrupting it aborts the upstream request, including right after `open` resolved
 * (the call is taken over without an interruption point in between).
 */
export const completeChat = (adapter: UpstreamAdapter, request: UpstreamRequest): Answer =>
  Effect.uninterruptibleMask((restore) => {
    const collector = new Collector()
    return Effect.flatMap(restore(adapter.open(request, collector)), (call) => collector.collect(call, restore))
  })
