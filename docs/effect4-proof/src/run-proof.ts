/**
 * Runs the proof end to end: `npx tsx src/run-proof.ts` (exit code 0 = every check passed).
 */
import { NodeHttpServer, NodeRuntime } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { Clock, Context, Effect, Exit, Fiber, Layer, Logger, Queue, References, Stream } from "effect"
import { HttpRouter, HttpServer, HttpServerResponse } from "effect/http"
import { Migrator, SqlClient } from "effect/sql"
import * as Http from "node:http"
import { runSchemaChecks } from "./schema-check.js"
import { appLayer, BoundListener, CurrentRequestId, sseState } from "./server.js"

const checks: Array<string> = []
const check = (label: string, ok: boolean, detail?: unknown) => {
  checks.push(`${ok ? "PASS" : "FAIL"} ${label}${detail === undefined ? "" : ` ${JSON.stringify(detail)}`}`)
  if (!ok) process.exitCode = 1
}

const post = (port: number, path: string, body: string) =>
  Effect.promise(async () => {
    const res = await fetch(`http://127.0.0.1:${port}${path}`, { method: "POST", body, headers: { "content-type": "application/json" } })
    return { status: res.status, id: res.headers.get("x-request-id"), body: await res.json() as any }
  })

const get = (port: number, path: string) =>
  Effect.promise(async () => {
    const res = await fetch(`http://127.0.0.1:${port}${path}`)
    return { status: res.status, body: await res.text() }
  })

// ---- A: our own http.Server + makeHandler --------------------------------------------------
const proofA = Effect.gen(function*() {
  const { port } = yield* BoundListener
  const ok = yield* post(port, "/v1/echo", JSON.stringify({ name: "abc" }))
  check("A POST decode default + SQL row", ok.status === 200 && ok.body.count === 1 && ok.body.row.big === 1e12, ok.body)
  check("A int8/numeric -> number via registry, timestamptz -> Date", ok.body.types.big === "number" && ok.body.types.dec === "number" && ok.body.types.at === "Date", ok.body.types)
  check("A request id reference set per request", ok.body.requestId === ok.id && ok.id !== null, ok.id)
  const bad = yield* post(port, "/v1/echo", JSON.stringify({ name: "ABC", count: 11 }))
  check("A decode failure formatted with paths", bad.status === 400, bad.body)
  const big = yield* post(port, "/v1/echo", JSON.stringify({ name: "x".repeat(100_000) }))
  check("A raw body limit via IncomingMessage", big.status === 413, big.body)
  const item = yield* get(port, "/v1/items/42")
  check("A route params", item.status === 200 && JSON.parse(item.body).id === "42", item.body)
  const missing = yield* get(port, "/nope")
  check("A 404 from HttpServerError.reason RouteNotFound", missing.status === 404, missing.body)
  const sse = yield* get(port, "/v1/sse")
  check("A SSE via HttpServerResponse.raw(Readable)", sse.body === "data: 0\n\ndata: 1\n\ndata: 2\n\ndata: [DONE]\n\n", sse.body)
  const before = sseState.destroyed
  yield* Effect.promise(async () => {
    const controller = new AbortController()
    const res = await fetch(`http://127.0.0.1:${port}/v1/sse?forever`, { signal: controller.signal })
    const reader = res.body!.getReader()
    await reader.read()
    controller.abort()
    await new Promise((r) => setTimeout(r, 200))
  })
  check("A client abort mid-stream destroys the Readable", sseState.destroyed > before, sseState)
  const outside = yield* CurrentRequestId
  check("A reference default outside requests", outside === "", outside)
}).pipe(Effect.provide(appLayer))

// ---- B: HttpRouter.serve + NodeHttpServer.layer, logger on/off --------------------------------
const serveWith = (disableLogger: boolean) =>
  Effect.gen(function*() {
    const route = HttpRouter.add("GET", "/hello", HttpServerResponse.text("hello"))
    const server = HttpRouter.serve(route, { disableLogger, disableListenLog: true }).pipe(
      Layer.provideMerge(NodeHttpServer.layer(() => Http.createServer({ keepAliveTimeout: 1000 }), { port: 0, host: "127.0.0.1" }))
    )
    yield* Effect.gen(function*() {
      const { address } = yield* HttpServer.HttpServer
      const port = address._tag === "UnixPathAddress" ? 0 : address.port
      const res = yield* get(port, "/hello")
      check(`B serve(disableLogger: ${disableLogger}) answers`, res.body === "hello", res.body)
    }).pipe(Effect.provide(server))
  }).pipe(Effect.provide(Logger.layer([Logger.make((options) => void capturedAll.push(String(options.message)))])))
const capturedAll: Array<string> = []

const proofB = Effect.gen(function*() {
  capturedAll.length = 0
  yield* serveWith(false)
  const withLogger = capturedAll.slice()
  capturedAll.length = 0
  yield* serveWith(true)
  const without = capturedAll.slice()
  check("B default serve logs each request (v4 default)", withLogger.some((l) => l.includes("Sent HTTP response")), withLogger)
  check("B disableLogger: true logs nothing per request", without.length === 0, without)
})

// ---- C: SQL: Migrator, SQLSTATE in errors, LISTEN/NOTIFY ---------------------------------------
const migration = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE TABLE IF NOT EXISTS v4map_proof (id serial PRIMARY KEY, n int8 NOT NULL)`
})
const proofC = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`DROP TABLE IF EXISTS v4map_proof`
  yield* sql`DROP TABLE IF EXISTS v4map_migrations`
  const applied = yield* Migrator.make({})({ loader: Migrator.fromRecord({ "0001_init": migration }), table: "v4map_migrations" })
  check("C Migrator.make + fromRecord applied", applied.length === 1 && applied[0]![1] === "init", applied)
  const again = yield* Migrator.make({})({ loader: Migrator.fromRecord({ "0001_init": migration }), table: "v4map_migrations" })
  check("C Migrator idempotent", again.length === 0, again)
  // reserve + execute, as runMigrationsLocked does
  const held = yield* Effect.scoped(Effect.gen(function*() {
    const conn = yield* sql.reserve
    return yield* conn.execute("SELECT pg_advisory_lock($1) AS l, pg_advisory_unlock($1) AS u", [0x77736d67], undefined)
  }))
  check("C reserve + execute with params", held.length === 1, held)
  const failure = yield* Effect.exit(sql`SELECT 1/0`)
  let code: unknown = undefined
  if (Exit.isFailure(failure)) {
    let current: unknown = failure.cause.reasons[0]?._tag === "Fail" ? (failure.cause.reasons[0] as any).error : undefined
    for (let depth = 0; depth < 8 && current !== null && typeof current === "object"; depth++) {
      if (typeof (current as any).code === "string") {
        code = (current as any).code
        break
      }
      current = (current as any).cause
    }
  }
  check("C SQLSTATE reachable through SqlError.cause chain (isStoreOutage)", code === "22012", code)
  // v3: pg.listen(channel): Stream<string> ; v4: Effect<Queue.Dequeue<Notification>, SqlError, Scope>
  const pg = yield* PgClient.PgClient
  const payload = yield* Effect.scoped(Effect.gen(function*() {
    const queue = yield* pg.listen("v4map_channel")
    yield* sql`SELECT pg_notify(${"v4map_channel"}, ${"hello"})`
    const message = yield* Queue.take(queue)
    return message.payload
  }))
  check("C PgClient.listen -> Queue; pg_notify payload", payload === "hello", payload)
  yield* pg.notify("v4map_channel", "via notify").pipe(
    Effect.exit,
    Effect.map((exit) => check("C PgClient.notify(channel, payload) works (v3 0.53 sent NOTIFY \"c\", $1 and failed)", Exit.isSuccess(exit), Exit.isFailure(exit) ? String(exit.cause) : undefined))
  )
  const stream = yield* Effect.scoped(Effect.gen(function*() {
    const queue = yield* pg.listen("v4map_channel2")
    yield* sql`SELECT pg_notify(${"v4map_channel2"}, ${"s"})`
    return yield* Stream.fromQueue(queue).pipe(Stream.take(1), Stream.runCollect)
  }))
  check("C Stream.fromQueue over listen (v3 Stream.runForEach shape)", stream.length === 1, stream.map((n) => n.payload))
  yield* sql`DROP TABLE v4map_proof`
  yield* sql`DROP TABLE v4map_migrations`
}).pipe(Effect.provide(appLayer))

// ---- D: runtime pieces: live clock detection, runForkWith, fibers, references ----------------
// v3: Context.get(DefaultServices.liveServices, Clock.Clock)
const liveClock = Context.get(Context.empty(), Clock.Clock)
const proofD = Effect.gen(function*() {
  const clock = yield* Clock.Clock // v3: yield* Effect.clock
  check("D default Clock === Context.get(Context.empty(), Clock.Clock)", clock === liveClock)
  check("D Clock.currentTimeMillisUnsafe (v3 unsafeCurrentTimeMillis)", Math.abs(clock.currentTimeMillisUnsafe() - Date.now()) < 1000)
  const context = yield* Effect.context<never>()
  const fiber = Effect.runForkWith(context)(Effect.succeed(1)) // v3: Runtime.runFork(runtime)(effect)
  const observed = yield* Effect.callback<number>((resume) => {
    fiber.addObserver((exit) => resume(Exit.isSuccess(exit) ? Effect.succeed(exit.value) : Effect.succeed(-1)))
  })
  check("D runForkWith + fiber.addObserver", observed === 1)
  const sleeper = yield* Effect.forkChild(Effect.never) // v3: Effect.fork
  sleeper.interruptUnsafe() // v3: fiber.unsafeInterruptAsFork(FiberId.none)
  const exit = yield* Fiber.await(sleeper)
  check("D fiber.interruptUnsafe() then Fiber.await -> interrupted", Exit.hasInterrupts(exit))
  const level = yield* References.MinimumLogLevel // v3: FiberRef.currentMinimumLogLevel
  check("D References.MinimumLogLevel is a string", level === "Info", level)
})

const main = Effect.gen(function*() {
  runSchemaChecks()
  yield* proofA
  yield* proofB
  yield* proofC
  yield* proofD
  console.log(`node ${process.version}`)
  for (const line of checks) console.log(line)
})

NodeRuntime.runMain(main)
