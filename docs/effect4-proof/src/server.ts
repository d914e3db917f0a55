/**
 * Effect 4 counterpart of src/http/Server.ts + Body.ts + Respond.ts + store/Sql.ts, reduced to what a
 * migration must prove: our own `http.createServer` (timeouts, caps) serving an Effect 4 HttpRouter via
 * `NodeHttpServer.makeHandler`, a raw-body read through the Node IncomingMessage, a Schema decode, an
 * SqlClient query, a request-id reference, and logging from a plain Node callback.
 */
import { NodeHttpServer, NodeHttpServerRequest } from "@effect/platform-node"
import { PgClient, PgTypes } from "@effect/sql-pg"
import { Cause, Context, Data, Duration, Effect, Layer, Redacted, Result, Schema, Scope } from "effect"
import { HttpRouter, HttpServerError, HttpServerRequest, HttpServerResponse } from "effect/http"
import { SqlClient } from "effect/sql"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import { Readable } from "node:stream"
import { formatIssues, PositiveInt, withDefault } from "./schema.js"

// ---------------------------------------------------------------------------------------------
// Services. v3: class Settings extends Context.Tag("id")<Settings, Shape>() {}
export class Settings extends Context.Service<Settings, {
  readonly bodyLimit: number
  readonly headersTimeoutMs: number
  readonly requestTimeoutMs: number
  readonly keepAliveMs: number
  readonly maxConnections: number
}>()("proof/Settings") {}

/** v3: FiberRef.unsafeMake<string>("") ; read with FiberRef.get ; set with Effect.locally */
export const CurrentRequestId = Context.Reference<string>("proof/CurrentRequestId", { defaultValue: () => "" })

export class StoreError extends Data.TaggedError("StoreError")<{ readonly message: string; readonly cause?: unknown }> {}
export class BodyError extends Data.TaggedError("BodyError")<{ readonly status: number; readonly message: string }> {}

// ---------------------------------------------------------------------------------------------
// SQL. v3: import { SqlClient } from "@effect/sql" ; PgClient.layer({ url, maxConnections, connectTimeout, types })
// sql-pg 4 speaks the wire protocol itself (no `pg` package). int8 decodes to bigint and numeric to string by
// default; a client registry restores the v3 behaviour of this codebase (both as JS numbers).
const numberTypes = (): PgTypes.Registry => {
  const registry = PgTypes.makeRegistry()
  registry.register<number>(PgTypes.OID.int8, {
    decode: (bytes) => Result.succeed(Number(new DataView(bytes.buffer, bytes.byteOffset, 8).getBigInt64(0))),
    encode: (value) => PgTypes.encode(BigInt(value), PgTypes.OID.int8)
  })
  registry.register<number>(PgTypes.OID.numeric, {
    decode: (bytes) => Result.map(PgTypes.decode(bytes, PgTypes.OID.numeric, 1), Number),
    encode: (value) => PgTypes.encode(String(value), PgTypes.OID.numeric)
  })
  return registry
}

/** v3: Layer.unwrapEffect(...PgClient.layer(...)).pipe(Layer.mapError(...)) ; v4 has no Layer.mapError. */
export const layerPostgres = (url: Redacted.Redacted<string>) =>
  PgClient.layerFrom(
    PgClient.make({ url, maxConnections: 10, connectTimeout: Duration.seconds(5), types: numberTypes() }).pipe(
      Effect.mapError((cause) => new StoreError({ message: `cannot connect to PostgreSQL: ${cause.message}`, cause }))
    )
  )

// ---------------------------------------------------------------------------------------------
// Body: v3 Effect.async -> v4 Effect.callback ; NodeHttpServerRequest.toIncomingMessage kept.
export const readBoundedText = (request: HttpServerRequest.HttpServerRequest, limit: number) =>
  Effect.suspend(() => {
    const incoming = NodeHttpServerRequest.toIncomingMessage(request) as Http.IncomingMessage
    if (incoming.readableEnded) return Effect.succeed("")
    // `resume` only: declaring a second (`signal`) parameter makes v4 allocate an AbortController.
    return Effect.callback<string, BodyError>((resume) => {
      const decoder = new TextDecoder("utf-8", { fatal: true })
      const parts: Array<string> = []
      let bytes = 0
      const stop = () => {
        incoming.off("data", onData)
        incoming.off("end", onEnd)
      }
      const onData = (chunk: Buffer) => {
        bytes += chunk.length
        if (bytes > limit) {
          stop()
          incoming.pause()
          return resume(Effect.fail(new BodyError({ status: 413, message: "too large" })))
        }
        parts.push(decoder.decode(chunk, { stream: true }))
      }
      const onEnd = () => {
        stop()
        parts.push(decoder.decode())
        resume(Effect.succeed(parts.join("")))
      }
      incoming.on("data", onData)
      incoming.once("end", onEnd)
      return Effect.sync(stop) // cleanup on interruption, as in v3
    })
  })

// ---------------------------------------------------------------------------------------------
// Routes. v3: HttpRouter.empty.pipe(HttpRouter.post("/path", handler)) ; v4: route layers.
const EchoBody = Schema.Struct({
  name: Schema.String.check(Schema.isPattern(/^[a-z]+$/)),
  count: PositiveInt.pipe(withDefault(() => 1))
}).check(Schema.makeFilter((b) => b.count <= 10 ? undefined : { path: ["count"], issue: "at most 10" }))
const decodeEcho = Schema.decodeUnknownResult(EchoBody)

const json = (body: unknown, status = 200) => HttpServerResponse.jsonUnsafe(body, { status })

export const echoRoute = HttpRouter.add(
  "POST",
  "/v1/echo",
  Effect.gen(function*() {
    const request = yield* HttpServerRequest.HttpServerRequest
    const settings = yield* Settings
    const text = yield* readBoundedText(request, settings.bodyLimit)
    const decoded = decodeEcho(JSON.parse(text === "" ? "{}" : text))
    if (Result.isFailure(decoded)) return json({ error: formatIssues(decoded.failure) }, 400)
    const sql = yield* SqlClient.SqlClient
    const rows = yield* sql<{ big: number; n: number; dec: number; at: Date }>`
      SELECT ${decoded.success.count}::int8 * 1000000000000 AS big, 2::int AS n, 1.5::numeric AS dec, now() AS at`.pipe(
      Effect.orDie
    )
    const requestId = yield* CurrentRequestId // v3: yield* FiberRef.get(currentRequestId)
    return json({ ...decoded.success, row: rows[0], types: Object.fromEntries(Object.entries(rows[0]!).map(([k, v]) => [k, v instanceof Date ? "Date" : typeof v])), requestId })
  }).pipe(
    Effect.catchTag("BodyError", (e) => Effect.succeed(json({ error: e.message }, e.status)))
  )
)

// v3: HttpRouter.get("/api/items/:id", Effect.map(HttpRouter.params, ...))
export const itemRoute = HttpRouter.add(
  "GET",
  "/v1/items/:id",
  Effect.map(HttpRouter.params, (params) => json({ id: params.id ?? null }))
)

// SSE as in Chat.ts/SseBody.ts: a Node Readable handed to HttpServerResponse.raw (unchanged API).
export const sseState = { destroyed: 0, interrupted: 0 }
export const sseRoute = HttpRouter.add(
  "GET",
  "/v1/sse",
  Effect.gen(function*() {
    const request = yield* HttpServerRequest.HttpServerRequest
    const forever = request.url.includes("forever")
    let i = 0
    const body = new Readable({
      read() {},
      destroy(error, callback) {
        sseState.destroyed++
        callback(error)
      }
    })
    const timer = setInterval(() => {
      body.push(`data: ${i++}\n\n`)
      if (!forever && i === 3) {
        clearInterval(timer)
        body.push("data: [DONE]\n\n")
        body.push(null)
      }
    }, 10)
    body.once("close", () => clearInterval(timer))
    yield* Effect.addFinalizer(() => Effect.void) // request scope exists in v4 handlers too
    return HttpServerResponse.raw(body, { status: 200, contentType: "text/event-stream", headers: { "cache-control": "no-cache" } })
  }).pipe(Effect.onInterrupt(() => Effect.sync(() => void sseState.interrupted++)))
)

// v3: HttpRouter.concatAll(a, b) -> Layer.mergeAll(a, b)
export const routes = Layer.mergeAll(echoRoute, itemRoute, sseRoute)

// ---------------------------------------------------------------------------------------------
// Server: our own http.Server, v4 makeHandler. v3: NodeHttpServer.makeHandler(app) (no options)
let counter = 0
const newRequestId = () => `req_${(++counter).toString(36)}`

/** v3 `appFor`: router app + 404 + defect mapping + request id. */
const appFor = <E, R>(app: Effect.Effect<HttpServerResponse.HttpServerResponse, E, R>) =>
  Effect.suspend(() => {
    const id = newRequestId()
    return app.pipe(
      // v3: RouteNotFound was the failure itself; v4 wraps it: HttpServerError { reason: RouteNotFound }
      Effect.catchIf(
        (e): e is E & HttpServerError.HttpServerError =>
          HttpServerError.isHttpServerError(e) && e.reason._tag === "RouteNotFound",
        () => Effect.succeed(json({ error: { code: "not_found" } }, 404))
      ),
      // v3: Effect.catchAllCause + Cause.isInterruptedOnly
      Effect.catchCause((cause) =>
        Cause.hasInterruptsOnly(cause)
          ? Effect.failCause(cause)
          : Effect.as(Effect.logError("request failed", cause), json({ error: { code: "internal_error" } }, 500))
      ),
      Effect.map((response) => HttpServerResponse.setHeader(response, "x-request-id", id)),
      // v3: Effect.locally(currentRequestId, id)
      Effect.provideService(CurrentRequestId, id)
    )
  })

export class BoundListener extends Context.Service<BoundListener, { readonly port: number }>()("proof/BoundListener") {}

const listen = (server: Http.Server, port: number, host: string) =>
  Effect.callback<number, Error>((resume) => {
    const onError = (error: Error) => resume(Effect.fail(error))
    server.once("error", onError)
    server.listen(port, host, () => {
      server.off("error", onError)
      resume(Effect.succeed((server.address() as AddressInfo).port))
    })
  })

/** v3: Layer.scoped(Tag, effect) -> v4 Layer.effect(Tag, effect) (the layer's Scope is provided). */
export const serverLayer = (port = 0, host = "127.0.0.1") =>
  Layer.effect(
    BoundListener,
    Effect.gen(function*() {
      const settings = yield* Settings
      // Request fibers are registered in this scope (Fiber.runIn) and interrupted when it closes; a child
      // scope with parallel finalizers, as NodeHttpServer.make does.
      const scope = yield* Scope.fork(yield* Effect.scope, "parallel")
      // v3: const runtime = yield* Effect.runtime<never>() ; Runtime.runFork(runtime)(effect)
      const context = yield* Effect.context<never>()
      const runFork = Effect.runForkWith(context)
      // Builds the router once (route layers + their services). v3: HttpRouter.toHttpApp(router)
      const app = yield* HttpRouter.toHttpEffect(routes)
      // No per-request logger and no span: makeHandler adds no middleware, and with the native
      // tracer (nothing installed) HttpEffect.toHandled skips the span. v3 needed
      // Effect.locally(HttpMiddleware.currentTracerDisabledWhen, () => true) + withTracerEnabled(false).
      const handler = yield* NodeHttpServer.makeHandler(appFor(app), { scope })
      const server = Http.createServer({
        headersTimeout: settings.headersTimeoutMs,
        requestTimeout: settings.requestTimeoutMs,
        keepAliveTimeout: settings.keepAliveMs,
        connectionsCheckingInterval: 1000
      }, handler)
      server.maxConnections = settings.maxConnections
      server.on("drop", () => runFork(Effect.logWarning("connection cap reached")))
      const bound = yield* listen(server, port, host).pipe(Effect.orDie)
      yield* Effect.addFinalizer(() =>
        Effect.callback<void>((resume) => {
          server.close(() => resume(Effect.void))
          server.closeAllConnections()
        })
      )
      return BoundListener.of({ port: bound })
    })
  )

export const settingsLayer = Layer.succeed(Settings, {
  bodyLimit: 64 * 1024,
  headersTimeoutMs: 15_000,
  requestTimeoutMs: 30_000,
  keepAliveMs: 65_000,
  maxConnections: 1024
})

export const pgUrl = Redacted.make(process.env.DATABASE_URL ?? "postgres://root@127.0.0.1:5432/test")

/** v3: Layer.provideMerge(server, services) — same name in v4. */
export const appLayer = serverLayer().pipe(
  Layer.provideMerge(Layer.mergeAll(settingsLayer, layerPostgres(pgUrl)))
)
