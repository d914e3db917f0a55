/**
 * Fibers a request starts from callbacks (a stream's settle or cancellation) are tracked by the server: the
 * shutdown drain waits for them, and the ones still running after the grace period are interrupted.
 */
import { Deferred, Effect, Exit, Fiber, Layer, ManagedRuntime, References, Scope } from "effect"
import { HttpRouter, HttpServerResponse } from "effect/http"
import { describe, expect, it } from "vitest"
import { loadConfig } from "../../src/config/GatewayConfig.js"
import { Settings } from "../../src/config/Live.js"
import * as CallbackFibers from "../../src/http/CallbackFibers.js"
import { runForkTracked } from "../../src/http/CallbackFibers.js"
import * as Server from "../../src/http/Server.js"

const gatewayWith = (graceSeconds: number, started: (release: Promise<void>) => Effect.Effect<void>) => {
  const loaded = loadConfig({ path: "config/gateway.yaml", env: { WELLSPRING_PORT: "0" } })
  const config = { ...loaded.config, shutdown_grace_seconds: graceSeconds }
  let releaseFiber = () => {}
  const release = new Promise<void>((resolve) => (releaseFiber = resolve))
  const routes = {
    inference: HttpRouter.add(
      "GET",
      "/start",
      Effect.gen(function*() {
        const run = runForkTracked(yield* Effect.context<never>())
        // As a stream's end does: from a callback, after the handler has answered.
        setImmediate(() => run(started(release)))
        return HttpServerResponse.text("started")
      })
    ),
    account: Layer.empty,
    status: Layer.empty
  }
  const settings = Layer.succeed(Settings, {
    config,
    path: loaded.path,
    encryptionKey: null,
    embedded: true,
    planFor: () => config.plans[config.default_plan]!
  })
  const runtime = ManagedRuntime.make(
    Layer.provideMerge(Server.layer(routes, config), settings).pipe(
      Layer.provide(Layer.succeed(References.MinimumLogLevel, "None"))
    )
  )
  return { runtime, releaseFiber }
}

/** Resolves once the listener refuses connections, i.e. the drain has begun. */
const refused = async (url: string) => {
  for (let attempt = 0; attempt < 500; attempt++) {
    if (await fetch(url).then(() => false, () => true)) return
  }
  throw new Error("the listener kept accepting connections")
}

describe("callback fibers and the shutdown drain", () => {
  it("the drain waits for a tracked fiber that finishes during the grace period", async () => {
    const order: Array<string> = []
    const { runtime, releaseFiber } = gatewayWith(30, (release) =>
      Effect.promise(() => release).pipe(Effect.andThen(Effect.sync(() => order.push("settled")))))
    const { listeners } = await runtime.runPromise(Server.BoundListeners)
    const url = `http://127.0.0.1:${listeners[0]!.port}`
    expect(await (await fetch(`${url}/start`)).text()).toBe("started")
    const disposed = runtime.dispose().then(() => order.push("disposed"))
    await refused(`${url}/start`)
    order.push("released")
    releaseFiber()
    await disposed
    expect(order).toEqual(["released", "settled", "disposed"])
  })

  it("a tracked fiber still running after the grace period is interrupted when the server closes", async () => {
    const order: Array<string> = []
    const { runtime } = gatewayWith(0, (release) =>
      Effect.promise(() => release).pipe(
        Effect.andThen(Effect.sync(() => order.push("settled"))),
        Effect.onInterrupt(() => Effect.sync(() => order.push("interrupted")))
      ))
    const { listeners } = await runtime.runPromise(Server.BoundListeners)
    const url = `http://127.0.0.1:${listeners[0]!.port}`
    // The fiber is started on the server's turn after the answer, before the client has read it.
    expect(await (await fetch(`${url}/start`)).text()).toBe("started")
    await runtime.dispose()
    expect(order).toEqual(["interrupted"])
  })
})

describe("the tracked-fiber list", () => {
  it("the wait for it to empty ends only after the last tracked fiber, whichever order they end in", async () => {
    const stillWaiting = await Effect.runPromise(Effect.scoped(Effect.gen(function*() {
      const fibers = yield* CallbackFibers.make
      // Empty: nothing to wait for.
      yield* fibers.awaitEmpty
      const gates = yield* Effect.forEach([0, 1, 2, 3], () => Deferred.make<void>())
      const started = gates.map((gate) => Effect.runFork(Deferred.await(gate)))
      for (const fiber of started) fibers.track(fiber)
      // One that has already ended leaves the list at once.
      fibers.track(Effect.runFork(Effect.void))
      const waiting = yield* Effect.forkChild(fibers.awaitEmpty)
      const seen: Array<boolean> = []
      // The middle, the first, the last, then the one left.
      for (const index of [1, 0, 3, 2]) {
        seen.push(waiting.pollUnsafe() === undefined)
        yield* Deferred.succeed(gates[index]!, undefined)
        yield* Fiber.await(started[index]!)
      }
      yield* Fiber.join(waiting)
      return seen
    })))
    expect(stillWaiting).toEqual([true, true, true, true])
  })

  it("interrupts the fibers left when its scope closes, and any tracked after", async () => {
    const exits = await Effect.runPromise(Effect.gen(function*() {
      const scope = yield* Scope.make()
      const fibers = yield* Scope.provide(CallbackFibers.make, scope)
      const left = Effect.runFork(Effect.never)
      fibers.track(left)
      yield* Scope.close(scope, Exit.void)
      const late = Effect.runFork(Effect.never)
      fibers.track(late)
      return [yield* Fiber.await(left), yield* Fiber.await(late)]
    }))
    expect(exits.map((exit) => Exit.hasInterrupts(exit))).toEqual([true, true])
  })
})
