/**
 * An Effect `Stream` of an upstream answer, derived from `UpstreamAdapter.open` (tests only: the gateway
 * consumes `open` directly, a Stream per request costs more than its CPU budget).
 *
 * The call is opened on the first pull, on the pulling fiber (its Clock and loggers), and aborted when
 * the stream ends early or is interrupted. Batches are the call's batches (`first`, then each
 * `onEvents`). Back-pressure: once `highWater` events are queued the sink returns false, so the call
 * stops reading the upstream until the consumer has pulled everything queued.
 */
import { Cause, Effect, Stream } from "effect"
import type { NonEmptyReadonlyArray } from "effect/Array"
import type {
  UpstreamAdapter,
  UpstreamCall,
  UpstreamError,
  UpstreamEvent,
  UpstreamRequest,
  UpstreamSink
} from "../../src/upstream/Upstream.js"

type Pull = Effect.Effect<NonEmptyReadonlyArray<UpstreamEvent>, UpstreamError | Cause.Done>

class StreamSink implements UpstreamSink {
  call: UpstreamCall | undefined = undefined
  private readonly queue: Array<NonEmptyReadonlyArray<UpstreamEvent>> = []
  private queued = 0
  /** `onEvents` returned false: the call waits for a `resume()`. */
  private held = false
  private ended = false
  private failure: UpstreamError | undefined = undefined
  private waiter: ((pull: Pull) => void) | undefined = undefined

  constructor(private readonly highWater: number) {}

  opened(call: UpstreamCall): void {
    this.call = call
    if (call.first.length > 0) this.enqueue(call.first)
    call.resume()
  }

  onEvents(events: ReadonlyArray<UpstreamEvent>): boolean {
    this.enqueue(events)
    if (this.queued < this.highWater) return true
    this.held = true
    return false
  }

  onEnd(): void {
    this.ended = true
    this.wake()
  }

  onError(error: UpstreamError): void {
    this.failure = error
    this.wake()
  }

  private enqueue(events: ReadonlyArray<UpstreamEvent>): void {
    if (events.length === 0) return
    this.queue.push(events as NonEmptyReadonlyArray<UpstreamEvent>)
    this.queued += events.length
    this.wake()
  }

  private wake(): void {
    const waiter = this.waiter
    if (waiter !== undefined) {
      this.waiter = undefined
      waiter(this.next())
    }
  }

  readonly next = (): Pull => {
    const batch = this.queue.shift()
    if (batch !== undefined) {
      this.queued -= batch.length
      if (this.held && this.queue.length === 0) {
        this.held = false
        this.call!.resume()
      }
      return Effect.succeed(batch)
    }
    if (this.failure !== undefined) return Effect.fail(this.failure)
    if (this.ended) return Cause.done()
    return Effect.callback<NonEmptyReadonlyArray<UpstreamEvent>, UpstreamError | Cause.Done>((resume) => {
      this.waiter = resume
      return Effect.sync(() => {
        this.waiter = undefined
      })
    })
  }
}

/** The events of `adapter.open(request, ..)` as a Stream; its failures are the stream's. */
export const upstreamStream = (
  adapter: UpstreamAdapter,
  request: UpstreamRequest,
  highWater = 1024
): Stream.Stream<UpstreamEvent, UpstreamError> =>
  Stream.suspend(() => {
    const sink = new StreamSink(highWater)
    const pull: Pull = Effect.suspend(sink.next)
    const start = Effect.uninterruptibleMask((restore) =>
      Effect.map(restore(adapter.open(request, sink)), (call) => {
        sink.opened(call)
        return pull
      })
    )
    return Stream.ensuring(Stream.fromPull(start), Effect.sync(() => sink.call?.abort()))
  })
