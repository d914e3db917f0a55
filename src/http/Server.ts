import { HttpRouter, HttpServerResponse } from "@effect/platform"
import type { RouteNotFound } from "@effect/platform/HttpServerError"
import { NodeHttpServer } from "@effect/platform-node"
import { Context, Deferred, Duration, Effect, Layer } from "effect"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import type { Listener, Origin } from "../config/GatewayConfig.js"
import { Settings } from "../config/Live.js"
import { fail } from "../errors/Catalog.js"
import { inferenceBody } from "../errors/Render.js"
import { newRequestId, REQUEST_ID_HEADER } from "./Respond.js"

/** Routers contributed by each domain, grouped by the origin that serves them. */
export type Routes<R> = Readonly<Record<Origin, HttpRouter.HttpRouter<unknown, R>>>

export interface Bound {
  readonly host: string
  readonly port: number
  readonly origins: ReadonlyArray<Origin>
}

/** The listeners actually bound (port 0 resolved). */
export class BoundListeners extends Context.Tag("wellspring/http/BoundListeners")<BoundListeners, {
  readonly listeners: ReadonlyArray<Bound>
  /** Stops accepting; open requests get the grace period, then sockets are destroyed. */
  readonly drain: Effect.Effect<void>
}>() {}

const notFound = Effect.sync(() =>
  HttpServerResponse.unsafeJson(inferenceBody(fail("not_found")), {
    status: 404,
    headers: { [REQUEST_ID_HEADER]: newRequestId() }
  })
)

const appFor = <R>(origins: ReadonlyArray<Origin>, routes: Routes<R>) =>
  Effect.map(HttpRouter.toHttpApp(HttpRouter.concatAll(...origins.map((o) => routes[o]))), (app) =>
  app.pipe(
    Effect.catchIf((e): e is RouteNotFound => (e as { _tag?: string })?._tag === "RouteNotFound", () => notFound),
    Effect.catchAllCause((cause) =>
      Effect.logError("request failed outside a handler", cause).pipe(
        Effect.as(HttpServerResponse.unsafeJson(inferenceBody(fail("internal_error")), { status: 500 }))
      )
    ),
    // Every response carries a request id, also from routes that do not go through `handle`.
    Effect.map((response) =>
      response.headers[REQUEST_ID_HEADER] === undefined
        ? HttpServerResponse.setHeader(response, REQUEST_ID_HEADER, newRequestId())
        : response
    )
  ))

const listen = (server: Http.Server, listener: Listener) =>
  Effect.async<number, Error>((resume) => {
    const onError = (error: Error) => resume(Effect.fail(error))
    server.once("error", onError)
    server.listen(listener.port, listener.host, () => {
      server.off("error", onError)
      resume(Effect.succeed((server.address() as AddressInfo).port))
    })
  })

export const layer = <R>(routes: Routes<R>) => Layer.scoped(
  BoundListeners,
  Effect.gen(function*() {
    const settings = yield* Settings
    const grace = Duration.seconds(settings.config.shutdown_grace_seconds)
    const servers: Array<Http.Server> = []
    const bound: Array<Bound> = []
    for (const listener of settings.config.listeners) {
      const handler = yield* NodeHttpServer.makeHandler(yield* appFor(listener.origins, routes))
      const server = Http.createServer({ keepAliveTimeout: 65_000 }, handler)
      const port = yield* listen(server, listener).pipe(
        Effect.mapError((error) => new Error(`cannot listen on ${listener.host}:${listener.port}: ${error.message}`)),
        Effect.orDie
      )
      servers.push(server)
      bound.push({ host: listener.host, port, origins: listener.origins })
    }
    let drained: Deferred.Deferred<void> | null = null
    const drain = Effect.gen(function*() {
      if (drained) return yield* Deferred.await(drained)
      drained = yield* Deferred.make<void>()
      const closed = servers.map((server) =>
        Effect.async<void>((resume) => {
          server.close(() => resume(Effect.void))
          server.closeIdleConnections()
        })
      )
      yield* Effect.all(closed, { concurrency: "unbounded", discard: true }).pipe(
        Effect.timeoutTo({ duration: grace, onSuccess: () => true, onTimeout: () => false }),
        Effect.flatMap((clean) =>
          clean ? Effect.void : Effect.logWarning("grace period over; closing open connections")
        ),
        Effect.ensuring(Effect.sync(() => servers.forEach((s) => s.closeAllConnections())))
      )
      yield* Deferred.succeed(drained, undefined)
    })
    yield* Effect.addFinalizer(() => drain)
    return BoundListeners.of({ listeners: bound, drain })
  })
)
