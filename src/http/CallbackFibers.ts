import { Context, Effect, Fiber } from "effect"

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

/** One tracked fiber in the list; unlinked and emptied when the fiber ends. */
interface Node {
  fiber: Fiber.Fiber<unknown, unknown> | null
  prev: Node | null
  next: Node | null
}

/**
 * The tracked fibers, as a linked list whose entries are unlinked and emptied when their fiber ends; the ones left
 * when the enclosing scope closes are interrupted.
 *
 * Not a `Set` (nor effect's `FiberSet`, which keeps one): a set that fibers keep entering and leaving is rebuilt as
 * it grows and shrinks, and each table it leaves behind in the old generation still points at the fibers it held,
 * and through their results at their whole requests, until the next mark-compact. Measured on streams (each
 * tracks two fibers): 17.9 KB promoted per request with the set, 0.9 KB without it, and twice the requests per
 * second (docs/decisions.md, "No generator function per request").
 */
export const make = Effect.gen(function*() {
  let head: Node | null = null
  let size = 0
  let closed = false
  let waiters: Array<() => void> = []

  const remove = (node: Node): void => {
    if (node.fiber === null) return
    node.fiber = null
    if (node.prev !== null) node.prev.next = node.next
    else head = node.next
    if (node.next !== null) node.next.prev = node.prev
    node.prev = null
    node.next = null
    size--
    if (size === 0 && waiters.length > 0) {
      const woken = waiters
      waiters = []
      for (const wake of woken) wake()
    }
  }

  yield* Effect.addFinalizer(() =>
    Effect.suspend(() => {
      closed = true
      const left: Array<Fiber.Fiber<unknown, unknown>> = []
      for (let node = head; node !== null; node = node.next) if (node.fiber !== null) left.push(node.fiber)
      return Fiber.interruptAll(left)
    })
  )

  return CallbackFibers.of({
    track: (fiber) => {
      if (closed) return void fiber.interruptUnsafe()
      const node: Node = { fiber, prev: null, next: head }
      if (head !== null) head.prev = node
      head = node
      size++
      fiber.addObserver(() => remove(node))
    },
    awaitEmpty: Effect.callback<void>((resume) => {
      if (size === 0) return resume(Effect.void)
      const wake = () => resume(Effect.void)
      waiters.push(wake)
      return Effect.sync(() => {
        waiters = waiters.filter((waiter) => waiter !== wake)
      })
    })
  })
})

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
