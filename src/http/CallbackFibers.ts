import { Context, Effect, type Fiber, FiberSet } from "effect"

/**
 * Fibers a request starts from Node or upstream callbacks (a stream's settle, its cancellation, the opening of
 * its upstream call) rather than from its own fiber. They are tracked here so that a shutdown drain waits for
 * them: a stream that ends or is cancelled just before SIGTERM still settles its charge and records its row.
 */
export class CallbackFibers extends Context.Service<CallbackFibers, {
  readonly track: (fiber: Fiber.Fiber<unknown, unknown>) => void
  /** Completes once every tracked fiber has ended. */
  readonly awaitEmpty: Effect.Effect<void>
}>()("wellspring/http/CallbackFibers") {}

/** A set whose remaining fibers are interrupted when the enclosing scope closes. */
export const make = Effect.map(FiberSet.make<unknown, unknown>(), (set) =>
  CallbackFibers.of({
    track: (fiber) => FiberSet.addUnsafe(set, fiber),
    awaitEmpty: FiberSet.awaitEmpty(set)
  }))

/**
 * `Effect.runForkWith(context)`, tracked when `context` carries `CallbackFibers` (the request contexts the server
 * creates do; a bare context in a unit test does not).
 */
export const runForkTracked = (context: Context.Context<never>) => {
  const runFork = Effect.runForkWith(context)
  const fibers = Context.getOrUndefined(context, CallbackFibers)
  if (fibers === undefined) return <A, E>(effect: Effect.Effect<A, E>) => runFork(effect)
  return <A, E>(effect: Effect.Effect<A, E>): Fiber.Fiber<A, E> => {
    const fiber = runFork(effect)
    fibers.track(fiber)
    return fiber
  }
}
