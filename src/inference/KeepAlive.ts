import { Duration, Effect, Exit, Option, Queue, Stream } from "effect"

type Slot<A, E> = { readonly _tag: "Item"; readonly value: A } | { readonly _tag: "Done"; readonly exit: Exit.Exit<void, E> }

/**
 * Emits `ping` whenever `source` has been idle for longer than `idle`. The source runs in its own fiber
 * behind a one-slot queue, so it is back-pressured by the consumer and never interrupted by a ping.
 * Interrupting the result interrupts the source.
 */
export const keepAlive = <A, E, R>(source: Stream.Stream<A, E, R>, idle: Duration.DurationInput, ping: A) =>
  Stream.unwrapScoped(Effect.gen(function*() {
    const queue = yield* Effect.acquireRelease(Queue.bounded<Slot<A, E>>(1), Queue.shutdown)
    yield* source.pipe(
      Stream.runForEach((value) => Queue.offer(queue, { _tag: "Item", value })),
      Effect.exit,
      Effect.flatMap((exit) => Queue.offer(queue, { _tag: "Done", exit })),
      Effect.forkScoped
    )
    const take: Effect.Effect<A, Option.Option<E>> = Queue.take(queue).pipe(
      Effect.timeout(idle),
      Effect.matchEffect({
        onFailure: () => Effect.succeed(ping),
        onSuccess: (slot): Effect.Effect<A, Option.Option<E>> => {
          if (slot._tag === "Item") return Effect.succeed(slot.value)
          // Done: end the stream, or re-raise the source's failure (or defect).
          return Effect.mapError(slot.exit, Option.some).pipe(Effect.zipRight(Effect.fail(Option.none())))
        }
      })
    )
    return Stream.repeatEffectOption(take)
  }))

export const PING_INTERVAL = Duration.seconds(8)
