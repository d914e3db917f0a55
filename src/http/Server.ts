import { NodeHttpServer, NodeHttpServerRequest } from "@effect/platform-node"
import { Cause, Context, Deferred, Duration, Effect, Exit, Layer, Scope } from "effect"
import { HttpRouter, HttpServerError, HttpServerRequest, HttpServerResponse } from "effect/http"
import * as Http from "node:http"
import type { AddressInfo, Socket } from "node:net"
import type { Duplex } from "node:stream"
import type { LimitsConfig, Listener, Origin } from "../config/GatewayConfig.js"
import { Settings } from "../config/Live.js"
import { fail } from "../errors/Catalog.js"
import { inferenceBody } from "../errors/Render.js"
import { declaredOver } from "./Body.js"
import * as CallbackFibers from "./CallbackFibers.js"
import { defectCode, newRequestId, REQUEST_ID_HEADER } from "./Respond.js"

/**
 * Routes contributed by each domain, grouped by the origin that serves them: a layer of `HttpRouter.add(...)`
 * registrations per origin (`Layer.mergeAll` of them; `Layer.empty` for none). `R` is what the route layers
 * require: the router and the handlers' `HttpRouter.Request<"Requires" | "Error", …>` markers.
 */
export type Routes<R> = Readonly<Record<Origin, Layer.Layer<never, never, R>>>

export interface Bound {
  readonly host: string
  readonly port: number
  readonly origins: ReadonlyArray<Origin>
}

/** The listeners actually bound (port 0 resolved). */
export class BoundListeners extends Context.Service<BoundListeners, {
  readonly listeners: ReadonlyArray<Bound>
  /** Stops accepting; open requests get the grace period, then sockets are destroyed. */
  readonly drain: Effect.Effect<void>
}>()("wellspring/http/BoundListeners") {}

const notFound = Effect.sync(() =>
  HttpServerResponse.jsonUnsafe(inferenceBody(fail("not_found")), {
    status: 404,
    headers: { [REQUEST_ID_HEADER]: newRequestId() }
  })
)

/** A failure of the router itself: no route matched this method and path. */
const isRouteNotFound = (error: unknown): error is HttpServerError.HttpServerError =>
  HttpServerError.isHttpServerError(error) && error.reason._tag === "RouteNotFound"

/** The router of one listener (its origins' routes) with 404, defect → 500/503 and the request id header. */
const appFor = <R>(origins: ReadonlyArray<Origin>, routes: Routes<R>) =>
  Effect.map(HttpRouter.toHttpEffect(mergeRoutes(origins.map((o) => routes[o]))), (app) =>
    app.pipe(
      Effect.catchIf(isRouteNotFound, () => notFound),
      Effect.catchCause((cause) =>
        // A client that went away interrupts its fiber: nothing to answer, nothing to report.
        Cause.hasInterruptsOnly(cause)
          ? Effect.failCause(cause)
          : Effect.logError("request failed outside a handler", cause).pipe(
            Effect.map(() => {
              const error = fail(defectCode(cause))
              return HttpServerResponse.jsonUnsafe(inferenceBody(error), { status: error.status })
            })
          )
      ),
      // Every response carries a request id, also from routes that do not go through `handle`.
      Effect.map((response) =>
        response.headers[REQUEST_ID_HEADER] === undefined
          ? HttpServerResponse.setHeader(response, REQUEST_ID_HEADER, newRequestId())
          : response
      ),
      Effect.zipWith(HttpServerRequest.HttpServerRequest, closeIfBodyUnread)
    ))

const mergeRoutes = <R>(layers: ReadonlyArray<Layer.Layer<never, never, R>>): Layer.Layer<never, never, R> =>
  layers.length === 0 ? Layer.empty as Layer.Layer<never, never, R> : Layer.mergeAll(layers[0]!, ...layers.slice(1))

/** Unread bodies up to this size are discarded by Node to keep the connection; cheaper than a new one. */
const DRAIN_BYTES = 64 * 1024

/**
 * A response sent before a large (or chunked) request body has fully arrived, i.e. a refusal that did not read
 * it, closes the connection; otherwise Node would read and discard the rest of the body to reuse the connection.
 */
const closeIfBodyUnread = (
  response: HttpServerResponse.HttpServerResponse,
  request: HttpServerRequest.HttpServerRequest
) => {
  if (response.headers["connection"] !== undefined) return response
  const incoming = NodeHttpServerRequest.toIncomingMessage(request) as Http.IncomingMessage
  if (incoming.complete) return response
  // Without Content-Length or Transfer-Encoding a request has no body (a GET, typically).
  const declared = incoming.headers["content-length"]
  const chunked = incoming.headers["transfer-encoding"] !== undefined
  const large = chunked || (declared !== undefined && !(Number(declared) <= DRAIN_BYTES))
  return large ? HttpServerResponse.setHeader(response, "connection", "close") : response
}

/**
 * Node's socket-level bounds from `limits`. `requestTimeout` only covers receiving the request: a response that
 * streams for minutes is not cut. Expiry is checked every `connectionsCheckingInterval`, so it stays short.
 */
export const serverOptions = (limits: LimitsConfig): Http.ServerOptions => {
  const requestTimeout = limits.body_timeout_seconds * 1000
  return {
    // Node requires headersTimeout <= requestTimeout.
    headersTimeout: Math.min(limits.headers_timeout_seconds * 1000, requestTimeout),
    requestTimeout,
    keepAliveTimeout: limits.keep_alive_seconds * 1000,
    connectionsCheckingInterval: Math.min(1000, requestTimeout / 2)
  }
}

/** Connection cap; a warning at most once a minute while connections are refused. */
const capConnections = (server: Http.Server, max: number, warn: (message: string) => void) => {
  server.maxConnections = max
  let lastWarning = 0
  server.on("drop", () => {
    const now = Date.now()
    if (now - lastWarning < 60_000) return
    lastWarning = now
    warn(`connection cap of ${max} reached; refusing new connections`)
  })
}

/**
 * `Expect: 100-continue` with a declared body over the limit gets no `100 Continue`: the handler answers 413
 * and the client never sends the body.
 */
const refuseOversizedContinue = (server: Http.Server, limitBytes: number) =>
  server.on("checkContinue", (request: Http.IncomingMessage, response: Http.ServerResponse) => {
    if (!declaredOver(request.headers, limitBytes)) response.writeContinue()
    server.emit("request", request, response)
  })

/**
 * Requests Node refuses before any handler runs (malformed HTTP, oversized headers or URL, a request not received
 * within the timeouts) get the inference error envelope with a Korean message instead of Node's bare status line.
 * The connection is closed: its remaining bytes cannot be trusted.
 */
const answerClientErrors = (server: Http.Server) =>
  server.on("clientError", (error: NodeJS.ErrnoException, socket: Duplex) => {
    // A response already under way (or a socket that went away) cannot take another status line.
    const busy = (socket as Duplex & { _httpMessage?: Http.ServerResponse | null })._httpMessage
    if (error.code === "ECONNRESET" || !socket.writable || (busy && busy.headersSent)) return void socket.destroy()
    const code = error.code === "HPE_HEADER_OVERFLOW"
      ? "headers_too_large"
      : error.code === "ERR_HTTP_REQUEST_TIMEOUT"
      ? "request_timeout"
      : "malformed_http"
    const failure = fail(code)
    const body = JSON.stringify(inferenceBody(failure))
    socket.end(
      `HTTP/1.1 ${failure.status} ${Http.STATUS_CODES[failure.status]}\r\n` +
        `content-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\n` +
        `${REQUEST_ID_HEADER}: ${newRequestId()}\r\nconnection: close\r\n\r\n${body}`
    )
  })

const listen = (server: Http.Server, listener: Listener) =>
  Effect.callback<number, Error>((resume) => {
    const onError = (error: Error) => resume(Effect.fail(error))
    server.once("error", onError)
    server.listen(listener.port, listener.host, () => {
      server.off("error", onError)
      resume(Effect.succeed((server.address() as AddressInfo).port))
    })
  })

/**
 * Which connections have a request in flight. Node's `closeIdleConnections` misses connections that
 * never sent a request (clients and load balancers open spare ones) and connections whose response
 * ends after the drain started; `drain` closes both, so the process exits as soon as the last open
 * response is done instead of after the grace period.
 */
const trackConnections = (server: Http.Server) => {
  const sockets = new Set<Socket>()
  const inFlight = new Map<Socket, number>()
  let draining = false
  server.on("connection", (socket: Socket) => {
    sockets.add(socket)
    socket.once("close", () => {
      sockets.delete(socket)
      inFlight.delete(socket)
    })
  })
  server.on("request", (request: Http.IncomingMessage, response: Http.ServerResponse) => {
    const socket = request.socket
    inFlight.set(socket, (inFlight.get(socket) ?? 0) + 1)
    response.once("close", () => {
      const left = (inFlight.get(socket) ?? 1) - 1
      if (left > 0) return void inFlight.set(socket, left)
      inFlight.delete(socket)
      // The response is complete: end the connection after it, gracefully.
      if (draining) socket.end()
    })
  })
  return () => {
    draining = true
    for (const socket of sockets) if (!inFlight.has(socket)) socket.destroy()
  }
}

/** What the route layers of `routes` require, all origins together. */
type RoutesServices<Rs extends Routes<any>> = Layer.Services<Rs[Origin]>

export const layer = <Rs extends Routes<any>>(routes: Rs) => Layer.effect(
  BoundListeners,
  Effect.gen(function*() {
    const settings = yield* Settings
    const grace = Duration.seconds(settings.config.shutdown_grace_seconds)
    const runFork = Effect.runForkWith(yield* Effect.context<never>())
    const servers: Array<Http.Server> = []
    const closeIdle: Array<() => void> = []
    const bound: Array<Bound> = []
    let drained: Deferred.Deferred<void> | null = null
    const drain = Effect.gen(function*() {
      if (drained) return yield* Deferred.await(drained)
      drained = yield* Deferred.make<void>()
      const closed = servers.map((server) =>
        Effect.callback<void>((resume) => {
          server.close(() => resume(Effect.void))
        })
      )
      closeIdle.forEach((close) => close())
      // Finalizers run uninterruptibly: without `interruptible` the timeout could not stop the wait, and
      // the grace period would last until the last connection closed by itself.
      // Connections first, then the fibers their streams started from callbacks (settles, cancellations).
      yield* Effect.all(closed, { concurrency: "unbounded", discard: true }).pipe(
        Effect.andThen(Effect.suspend(() => callbackFibers.awaitEmpty)),
        Effect.interruptible,
        Effect.as(true),
        Effect.timeoutOrElse({ duration: grace, orElse: () => Effect.succeed(false) }),
        Effect.flatMap((clean) =>
          clean ? Effect.void : Effect.logWarning("grace period over; closing open connections")
        ),
        Effect.ensuring(Effect.sync(() => servers.forEach((s) => s.closeAllConnections())))
      )
      yield* Deferred.succeed(drained, undefined)
    })
    // Request fibers live in this scope (NodeHttpServer.makeHandler registers each one) and are interrupted
    // when it closes: only after the drain, so open requests get the grace period first.
    const requests = yield* Scope.make("parallel")
    // Created before the drain's finalizer is added, so it is closed (remaining fibers interrupted) after it.
    const callbackFibers = yield* CallbackFibers.make
    yield* Effect.addFinalizer((exit) => Effect.ensuring(drain, Scope.close(requests, exit.pipe(Exit.asVoid))))
    for (const listener of settings.config.listeners) {
      // No per-request tracing spans: they cost 20-30% of the hot path and nothing exports them. The handler
      // runs every request with the services captured here, so the setting holds for all of them.
      const handler = yield* NodeHttpServer.makeHandler(yield* appFor(listener.origins, routes as Routes<RoutesServices<Rs>>), { scope: requests })
        .pipe(Effect.withTracerEnabled(false), Effect.provideService(CallbackFibers.CallbackFibers, callbackFibers))
      const limits = settings.config.limits
      const server = Http.createServer(serverOptions(limits), handler)
      capConnections(server, limits.connections, (message) => runFork(Effect.logWarning(message)))
      refuseOversizedContinue(server, limits.body_bytes)
      answerClientErrors(server)
      const port = yield* listen(server, listener).pipe(
        Effect.mapError((error) => new Error(`cannot listen on ${listener.host}:${listener.port}: ${error.message}`)),
        Effect.orDie
      )
      servers.push(server)
      closeIdle.push(trackConnections(server))
      bound.push({ host: listener.host, port, origins: listener.origins })
    }
    return BoundListeners.of({ listeners: bound, drain })
  })
)
