import { NodeHttpServer, NodeHttpServerRequest } from "@effect/platform-node"
import { ByteSize, Cause, Context, Data, Deferred, Duration, Effect, Exit, Layer, Scope } from "effect"
import {
  HttpIncomingMessage,
  HttpMiddleware,
  HttpRouter,
  HttpServerError,
  HttpServerRequest,
  HttpServerResponse
} from "effect/http"
import * as Http from "node:http"
import * as Net from "node:net"
import type { AddressInfo } from "node:net"
import type { Duplex } from "node:stream"
import { fail, InferenceMessages } from "../errors/Catalog.js"
import { inferenceBody } from "../errors/Render.js"
import { TracingEnabled } from "../telemetry/Tracing.js"
import { declaredOver } from "./Body.js"
import * as CallbackFibers from "./CallbackFibers.js"
import * as ClientAddress from "./ClientAddress.js"
import { type BusyGate, busyGate, type BusyLimits } from "./BusyGate.js"
import { ANSWER_LINGER_MS, type ConnectionLimits, guardConnections } from "./Connections.js"
import { Lifecycle } from "./Lifecycle.js"
import { defectCode, newRequestId, REQUEST_ID_HEADER } from "./Respond.js"

/** A name for a set of routes (the config's listener `origins`: `inference`, `account`, ...). */
export type Origin = string

/**
 * Routes contributed by each domain, grouped by the origin that serves them: a layer of `HttpRouter.add(...)`
 * registrations per origin (`Layer.mergeAll` of them; `Layer.empty` for none). `R` is what the route layers
 * require: the router and the handlers' `HttpRouter.Request<"Requires" | "Error", …>` markers. An origin left out
 * (or undefined) has no routes: a listener naming it serves only the routes of every listener.
 */
export type Routes<R> = Readonly<Record<Origin, Layer.Layer<never, never, R> | undefined>>

/** One listening socket and the origins it serves (the config's `listeners[]`). */
export interface Listener {
  readonly host: string
  readonly port: number
  readonly origins: ReadonlyArray<Origin>
}

/** Node's socket timeouts, the connection guard's and the busy gate's bounds (the config's `limits` has them all). */
export interface ServerLimits extends ConnectionLimits, BusyLimits {
  readonly body_bytes: number
  readonly headers_timeout_seconds: number
  readonly body_timeout_seconds: number
  readonly keep_alive_seconds: number
  /** Listening sockets per listener sharing its port (see `listen`); absent: one. */
  readonly accept_sockets?: number | undefined
}

/** What the listeners are built from; the gateway config has every field. */
export interface ServerSettings {
  readonly listeners: ReadonlyArray<Listener>
  readonly limits: ServerLimits
  /** Proxies whose `X-Forwarded-For` names the client (`ClientAddress.ts`). */
  readonly trusted_proxies: ReadonlyArray<string>
  /** Drain time for open requests after a stop signal. */
  readonly shutdown_grace_seconds: number
  /** Not-ready time before the drain begins. */
  readonly shutdown_delay_seconds: number
}

/** A listener that could not be bound (port in use, address not available): one line for the operator. */
export class ListenError extends Data.TaggedError("ListenError")<{ readonly message: string }> {}

/** What to change when a listener cannot bind: the env variable and flag for the first listener, the file otherwise. */
const listenHint = (index: number) =>
  index === 0
    ? "choose another port with WELLSPRING_PORT or --port (or listeners[0].port in the config file)"
    : `choose another port in the config file (listeners[${index}].port)`

const listenMessage = (listener: Listener, index: number, error: NodeJS.ErrnoException) => {
  const where = `${listener.host}:${listener.port}`
  switch (error.code) {
    case "EADDRINUSE":
      return `port ${listener.port} on ${listener.host} is already in use; ${listenHint(index)}`
    case "EACCES":
      return `not allowed to listen on ${where} (ports below 1024 need privileges); ${listenHint(index)}`
    case "EADDRNOTAVAIL":
    case "ENOTFOUND":
      return `cannot listen on ${where}: no such local address; choose another host with WELLSPRING_HOST or --host`
    default:
      return `cannot listen on ${where}: ${error.message}`
  }
}

/** Paths that are never traced (probes and scrapes would flood the traces). */
const UNTRACED = new Set(["/healthz", "/readyz", "/metrics"])
const untraced = (request: HttpServerRequest.HttpServerRequest) => UNTRACED.has(request.url.split("?", 1)[0]!)

export interface LayerOptions<R> {
  /** Routes served on every listener whatever its origins (the health probes). */
  readonly everyListener?: Layer.Layer<never, never, R> | undefined
}

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
  /** Draining state and open requests, as the routes see them. */
  readonly lifecycle: Context.Service.Shape<typeof Lifecycle>
}>()("wellspring/http/BoundListeners") {}

/** Inference paths a client may call without their `/v1` prefix (a base URL set without it). */
const V1_PATHS = /^\/(chat\/completions|embeddings|models|messages\/count_tokens|messages|responses|images\/generations)(\/[^/]+)?$/

/** 404 `not_found`; a known inference path lacking `/v1` is told so (naming the fixed path, never the client's). */
const notFound = Effect.map(HttpServerRequest.HttpServerRequest, (request) => {
  const path = request.url.split("?", 1)[0]!
  const match = path.length <= 300 ? V1_PATHS.exec(path) : null
  const error = match === null
    ? fail("not_found")
    : fail("not_found", { message: InferenceMessages.missingV1(`/v1/${match[1]!}`) })
  return HttpServerResponse.jsonUnsafe(inferenceBody(error), {
    status: 404,
    headers: { [REQUEST_ID_HEADER]: newRequestId() }
  })
})

/** A failure of the router itself: no route matched this method and path. */
const isRouteNotFound = (error: unknown): error is HttpServerError.HttpServerError =>
  HttpServerError.isHttpServerError(error) && error.reason._tag === "RouteNotFound"

/** The router of one listener (its origins' routes) with 404, defect → 500/503 and the request id header. */
const appFor = <R>(origins: ReadonlyArray<Origin>, routes: Routes<R>, everyListener: Layer.Layer<never, never, R> | undefined) =>
  Effect.map(HttpRouter.toHttpEffect(mergeRoutes([
    ...origins.map((o) => routes[o] ?? (Layer.empty as Layer.Layer<never, never, R>)),
    ...(everyListener ? [everyListener] : [])
  ])), (app) =>
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

export interface RegisteredRoute {
  readonly origin: Origin
  readonly method: string
  readonly path: string
}

/**
 * Every route `routes` registers, per origin, read by building each origin's layers against a router that only
 * records (handlers are not run). Tests enumerate the routes with it, so a route added later is covered without
 * being named.
 */
export const listRoutes = (routes: Routes<any>): Effect.Effect<ReadonlyArray<RegisteredRoute>> =>
  Effect.scoped(Effect.gen(function*() {
    const found: Array<RegisteredRoute> = []
    for (const origin of Object.keys(routes) as Array<Origin>) {
      const layer = routes[origin]
      if (layer === undefined) continue
      const recorder = (prefix: string): HttpRouter.HttpRouter => ({
        prefixed: (more: string) => recorder(prefix + more),
        add: (method: string, path: string) => Effect.sync(() => void found.push({ origin, method, path: prefix + path })),
        addAll: (all: ReadonlyArray<HttpRouter.Route<any, any>>) =>
          Effect.sync(() => {
            for (const route of all) found.push({ origin, method: route.method, path: prefix + route.path })
          }),
        addGlobalMiddleware: () => Effect.void,
        asHttpEffect: () => Effect.die("recording router")
      } as unknown as HttpRouter.HttpRouter)
      yield* Layer.build(Layer.provide(layer as Layer.Layer<never>, Layer.succeed(HttpRouter.HttpRouter, recorder(""))))
    }
    return found
  }))

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
export const serverOptions = (limits: ServerLimits): Http.ServerOptions => {
  const requestTimeout = limits.body_timeout_seconds * 1000
  return {
    // Node requires headersTimeout <= requestTimeout.
    headersTimeout: Math.min(limits.headers_timeout_seconds * 1000, requestTimeout),
    requestTimeout,
    keepAliveTimeout: limits.keep_alive_seconds * 1000,
    connectionsCheckingInterval: Math.min(1000, requestTimeout / 2)
  }
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
 * The connection is closed, and destroyed shortly after: its remaining bytes cannot be trusted.
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
    // `end` only half-closes: a client that never closes its side would keep the socket (and its place under
    // the connection caps) forever. The answer gets a moment to reach the client, then the socket is destroyed.
    setTimeout(() => socket.destroy(), ANSWER_LINGER_MS).unref()
  })

/**
 * Services added per request (the request, its scope and state, route, request id, admission scope...) that
 * go past `maxDepth` overlays make `Context.add` copy the whole service map; a flat base with room for them
 * makes each add one small overlay.
 */
const REQUEST_CONTEXT_DEPTH = 24

const withRequestBase = <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E, R> =>
  Effect.updateContext(
    effect,
    (context: Context.Context<R>) => Context.makeUnsafe<R>(new Map(context.mapUnsafe), { maxDepth: REQUEST_CONTEXT_DEPTH })
  )

/**
 * After the event loop's next poll for I/O: a connection resumed now has had what its client sent read (and a
 * request head in it parsed) by then. The second turn is needed when the first check phase comes before that poll.
 */
const afterNextPoll = Effect.callback<void>((resume) => {
  setImmediate(() => setImmediate(() => resume(Effect.void)))
})

/**
 * Binds `listener` with `sockets` listening sockets sharing its port (`SO_REUSEPORT`, one: a plain listen). The
 * event loop accepts one connection per listening socket per turn (libuv since 1.45), so on a saturated loop, where
 * a turn takes milliseconds, one socket accepts a burst of new connections one turn at a time while the open ones
 * are served: the 256th connection of a burst waited 3.5 s on one core. The kernel spreads new connections over the
 * sockets; every connection goes to `server`, as if it had accepted it. Resolves with the bound port and the extra
 * sockets (closed with the listener); a port another process listens on fails, as without sharing.
 */
export const listen = (server: Http.Server, listener: Listener, sockets: number) =>
  Effect.callback<{ readonly port: number; readonly extra: ReadonlyArray<Net.Server> }, NodeJS.ErrnoException>(
    (resume) => {
      const shared = sockets > 1
      const extra: Array<Net.Server> = []
      let settled = false
      const failed = (error: NodeJS.ErrnoException) => {
        if (settled) return
        settled = true
        for (const socket of [server, ...extra]) if (socket.listening) socket.close()
        resume(Effect.fail(error))
      }
      const bound = () => {
        if (settled || extra.some((socket) => !socket.listening)) return
        settled = true
        resume(Effect.succeed({ port: (server.address() as AddressInfo).port, extra }))
      }
      const bindListener = () => {
        server.once("error", failed)
        server.listen({ port: listener.port, host: listener.host, reusePort: shared }, onBound)
      }
      const onBound = () => {
        server.off("error", failed)
        const port = (server.address() as AddressInfo).port
        for (let i = 1; i < sockets; i++) {
          // The options Node's HTTP server gives its own listening socket.
          const socket = Net.createServer({ allowHalfOpen: true, noDelay: true }, (connection) =>
            server.emit("connection", connection))
          extra.push(socket)
          socket.once("error", failed)
          socket.once("listening", () => socket.off("error", failed))
        }
        for (const socket of extra) socket.listen({ port, host: listener.host, reusePort: true }, bound)
        bound()
      }
      // A fixed port is first bound alone, and released: a port another process holds (a second gateway with
      // its own shared sockets too) fails the listen as it would without sharing, instead of being shared.
      if (!shared || listener.port === 0) return bindListener()
      const probe = Net.createServer()
      probe.once("error", failed)
      probe.listen({ port: listener.port, host: listener.host }, () => probe.close(bindListener))
    }
  )

/** What the route layers of `routes` require, all origins together. */
type RoutesServices<Rs extends Routes<any>> = Layer.Services<Exclude<Rs[keyof Rs], undefined>>

/** The listeners of `settings`, each serving the routes of its origins. */
export const layer = <Rs extends Routes<any>, RE = never>(
  routes: Rs,
  settings: ServerSettings,
  options: LayerOptions<RE> = {}
) => Layer.effect(
  BoundListeners,
  Effect.gen(function*() {
    // Per-request spans only when an exporter is configured (telemetry/Tracing.ts).
    const tracing = yield* TracingEnabled
    const grace = Duration.seconds(settings.shutdown_grace_seconds)
    const delay = settings.shutdown_delay_seconds
    const runFork = Effect.runForkWith(yield* Effect.context<never>())
    const servers: Array<Http.Server> = []
    /** Every listening socket: the servers' own and the extra ones sharing their ports. */
    const listening: Array<Net.Server> = []
    const closeIdle: Array<() => void> = []
    const bound: Array<Bound> = []
    let drained: Deferred.Deferred<void> | null = null
    const guards: Array<{ readonly inFlight: () => number }> = []
    const gates: Array<BusyGate> = []
    const lifecycle = Lifecycle.of({
      draining: () => drained !== null,
      openRequests: () => guards.reduce((n, g) => n + g.inFlight(), 0),
      busy: () => ({
        working: gates.reduce((n, g) => n + g.working, 0),
        held: gates.reduce((n, g) => n + g.held, 0),
        paused: gates.reduce((n, g) => n + g.paused, 0),
        saturated: gates.some((g) => g.saturated)
      })
    })
    const drain = Effect.gen(function*() {
      if (drained) return yield* Deferred.await(drained)
      drained = yield* Deferred.make<void>()
      // Not ready from here on; still serving during the delay, so a load balancer can stop sending first.
      if (delay > 0) yield* Effect.sleep(Duration.seconds(delay))
      const closed = listening.map((server) =>
        Effect.callback<void>((resume) => {
          server.close(() => resume(Effect.void))
        })
      )
      // Paused connections are read again first, and idle ones closed only after the event loop has polled them
      // once: a request a client sent on a paused connection is then in flight, and answered, not cut.
      gates.forEach((gate) => gate.releaseAll())
      yield* afterNextPoll
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
    const addresses = ClientAddress.make(settings.trusted_proxies)
    for (const [index, listener] of settings.listeners.entries()) {
      // No per-request tracing spans unless an exporter is configured: they cost 20-30% of the hot path. The
      // handler runs every request with the services captured here, so the setting holds for all of them.
      const app = yield* appFor(
        listener.origins,
        routes as Routes<RoutesServices<Rs> | RE>,
        options.everyListener as Layer.Layer<never, never, RoutesServices<Rs> | RE> | undefined
      )
      const handler = yield* NodeHttpServer.makeHandler(app, { scope: requests })
        .pipe(
          // Applied last, so it sees the services below: see `withRequestBase`.
          withRequestBase,
          Effect.withTracerEnabled(tracing),
          Effect.provideService(HttpMiddleware.TracerDisabledWhen, untraced),
          Effect.provideService(Lifecycle, lifecycle),
          Effect.provideService(CallbackFibers.CallbackFibers, callbackFibers),
          // Bodies are read through http/Body.ts; the platform's own readers get the same size bound all the same.
          Effect.provideService(HttpIncomingMessage.MaxBodySize, ByteSize.fromInputUnsafe(settings.limits.body_bytes))
        )
      const limits = settings.limits
      const gated = busyGate(limits, handler)
      const server = Http.createServer({ ...serverOptions(limits), ...gated.serverOptions }, gated.handler)
      gated.watch(server)
      const guard = guardConnections(server, limits, addresses, (message) => runFork(Effect.logWarning(message)))
      refuseOversizedContinue(server, limits.body_bytes)
      answerClientErrors(server)
      const { extra, port } = yield* listen(server, listener, limits.accept_sockets ?? 1).pipe(
        Effect.mapError((error) => new ListenError({ message: listenMessage(listener, index, error) }))
      )
      servers.push(server)
      listening.push(server, ...extra)
      guards.push(guard)
      gates.push(gated.gate)
      closeIdle.push(guard.drain)
      bound.push({ host: listener.host, port, origins: listener.origins })
    }
    return BoundListeners.of({ listeners: bound, drain, lifecycle })
  })
)
