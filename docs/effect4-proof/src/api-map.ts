/**
 * Compile-and-run check of the v3 -> v4 renames used by wellspring that the server/test proofs do not cover.
 * Every line is `v4 call  // v3: old call`. `npx tsx src/api-map.ts` prints PASS/FAIL lines.
 */
import { NodeRuntime } from "@effect/platform-node"
import {
  Cause,
  Chunk,
  Clock,
  Context,
  Data,
  Deferred,
  Duration,
  Effect,
  Exit,
  Fiber,
  Layer,
  Logger,
  ManagedRuntime,
  Option,
  Queue,
  Redacted,
  References,
  Result,
  Schedule,
  Schema,
  Scope,
  Semaphore,
  Stream
} from "effect"
import { HttpRouter, HttpServerResponse } from "effect/http"
import { HttpApi, HttpApiEndpoint, HttpApiGroup, HttpApiSchema, OpenApi } from "effect/http-api"
import type { Statement } from "effect/sql"
import { SqlError } from "effect/sql"

const results: Array<string> = []
const check = (label: string, ok: boolean, detail?: unknown) => {
  results.push(`${ok ? "PASS" : "FAIL"} ${label}${detail === undefined ? "" : ` ${JSON.stringify(detail)}`}`)
  if (!ok) process.exitCode = 1
}

class Boom extends Data.TaggedError("Boom")<{ readonly n: number }> {} // unchanged

// Context.GenericTag-style function syntax (v3: Context.GenericTag<Shape>("id"))
const Plain = Context.Service<{ readonly v: number }>("proof/Plain")

// ---- Effect combinators -------------------------------------------------------------------
const effects = Effect.gen(function*() {
  // v3: Effect.either -> Effect.result ; Either.isLeft -> Result.isFailure
  const r = yield* Effect.result(Effect.fail(new Boom({ n: 1 })))
  check("Effect.result (v3 Effect.either)", r._tag === "Failure" && r.failure.n === 1)
  // v3: Either.match(r, { onLeft, onRight }) -> Result.match(r, { onFailure, onSuccess })
  check("Result.match", Result.match(r, { onFailure: (e) => e.n, onSuccess: () => 0 }) === 1)
  // v3: Effect.catchAll -> Effect.catch ; catchAllCause -> catchCause ; catchAllDefect -> catchDefect
  check("Effect.catch", (yield* Effect.catch(Effect.fail(1), (n) => Effect.succeed(n + 1))) === 2)
  check("Effect.catchCause", (yield* Effect.catchCause(Effect.die("x"), () => Effect.succeed(3))) === 3)
  check("Effect.catchDefect", (yield* Effect.catchDefect(Effect.die("x"), () => Effect.succeed(4))) === 4)
  check("Effect.catchIf unchanged", (yield* Effect.catchIf(Effect.fail(5), (n) => n === 5, () => Effect.succeed(6))) === 6)
  // v3: Effect.zipRight(a, b) -> Effect.andThen(a, b) ; zipLeft(a, b) -> Effect.tap(a, () => b)
  check("Effect.andThen (zipRight)", (yield* Effect.andThen(Effect.succeed(1), Effect.succeed(2))) === 2)
  check("Effect.tap (zipLeft)", (yield* Effect.tap(Effect.succeed(1), () => Effect.succeed(2))) === 1)
  check("Effect.zipWith unchanged", (yield* Effect.zipWith(Effect.succeed(1), Effect.succeed(2), (a, b) => a + b)) === 3)
  // v3: Effect.tapErrorCause -> Effect.tapCause
  yield* Effect.exit(Effect.tapCause(Effect.fail(1), () => Effect.void))
  // v3: Effect.timeoutTo({ duration, onSuccess, onTimeout }) -> Effect.timeoutOrElse + map
  const timed = yield* Effect.never.pipe(
    Effect.map((): boolean => true),
    Effect.timeoutOrElse({ duration: Duration.millis(5), orElse: () => Effect.succeed(false) })
  )
  check("Effect.timeoutOrElse (timeoutTo)", timed === false)
  // v3: Effect.timeoutFail({ duration, onTimeout }) -> timeoutOrElse with Effect.fail
  const tf = yield* Effect.exit(Effect.never.pipe(Effect.timeoutOrElse({ duration: 5, orElse: () => Effect.fail(new Boom({ n: 9 })) })))
  check("Effect.timeoutOrElse (timeoutFail)", Exit.isFailure(tf))
  // v3: Effect.repeatN(e, n) -> Effect.repeat(e, { times: n })
  let runs = 0
  yield* Effect.repeat(Effect.sync(() => runs++), { times: 2 })
  check("Effect.repeat({ times })", runs === 3, runs)
  // v3: Effect.retry(Schedule.exponential(d).pipe(Schedule.compose(Schedule.recurs(n)))) -> { schedule, times }
  let tries = 0
  yield* Effect.exit(Effect.retry(Effect.suspend(() => (tries++, Effect.fail(0))), { schedule: Schedule.exponential(1), times: 3 }))
  check("Effect.retry({ schedule, times }) (Schedule.compose)", tries === 4, tries)
  // v3: Effect.makeSemaphore(1) -> Semaphore.make(1) ; sem.withPermits(1)(e)
  const sem = yield* Semaphore.make(1)
  check("Semaphore.make + withPermits", (yield* sem.withPermits(1)(Effect.succeed(7))) === 7)
  // v3: Effect.fork -> forkChild ; forkDaemon -> forkDetach ; forkScoped/forkIn unchanged
  const child = yield* Effect.forkChild(Effect.succeed(1))
  const daemon = yield* Effect.forkDetach(Effect.succeed(2))
  check("forkChild/forkDetach + Fiber.join", (yield* Fiber.join(child)) + (yield* Fiber.join(daemon)) === 3)
  const scope = yield* Scope.make() // v3 Scope.CloseableScope -> Scope.Closeable
  const inScope = yield* Effect.forkIn(Effect.never, scope)
  // v3: Scope.extend(effect, scope) -> Scope.provide(scope)(effect)
  yield* Scope.provide(scope)(Effect.addFinalizer(() => Effect.void))
  yield* Scope.close(scope, Exit.void)
  check("forkIn + Scope.close interrupts", Exit.hasInterrupts(yield* Fiber.await(inScope)))
  // v3: Effect.withFiberRuntime((fiber) => ... Context.get(fiber.currentDefaultServices, Clock.Clock))
  const clock = yield* Effect.withFiber((fiber) => Effect.succeed(fiber.getRef(Clock.Clock)))
  check("Effect.withFiber + fiber.getRef(Clock.Clock)", clock === Context.get(Context.empty(), Clock.Clock))
  // v3: Effect.withClock(e, clock) -> Effect.provideService(e, Clock.Clock, clock)
  const fixed: Clock.Clock = { ...clock, currentTimeMillisUnsafe: () => 42, currentTimeMillis: Effect.succeed(42) }
  check("provideService(Clock.Clock) (withClock)", (yield* Effect.provideService(Clock.currentTimeMillis, Clock.Clock, fixed)) === 42)
  // v3: Effect.serviceOption(PgClient) -> Effect.serviceOption still exists
  const opt = yield* Effect.serviceOption(Plain)
  check("Effect.serviceOption", Option.isNone(opt))
  // v3: Effect.withTracerEnabled(false) ; v4 same name, backed by References.TracerEnabled
  check("Effect.withTracerEnabled", (yield* Effect.withTracerEnabled(References.TracerEnabled, false)) === false)
  // v3: Effect.orElseSucceed / ignore / flip / uninterruptibleMask / onInterrupt: unchanged names
  check("flip/orElseSucceed", (yield* Effect.flip(Effect.fail(1))) === 1 && (yield* Effect.orElseSucceed(Effect.fail(1), () => 2)) === 2)
  // v3: Effect.matchCauseEffect unchanged
  yield* Effect.matchCauseEffect(Effect.fail(1), { onFailure: () => Effect.void, onSuccess: () => Effect.void })
})

// ---- Cause / Exit / Deferred / Queue / Chunk / Duration ------------------------------------
const data = Effect.gen(function*() {
  const cause = Cause.combine(Cause.fail(new Boom({ n: 1 })), Cause.die("d")) // v3: Cause.sequential
  // v3: Cause.failureOption -> Cause.findErrorOption
  check("Cause.findErrorOption", Option.isSome(Cause.findErrorOption(cause)))
  // v3: Cause.failures(c) / Cause.defects(c) -> filter c.reasons
  const failures = cause.reasons.filter(Cause.isFailReason).map((r) => r.error)
  const defects = cause.reasons.filter(Cause.isDieReason).map((r) => r.defect)
  check("cause.reasons filters (failures/defects)", failures.length === 1 && defects[0] === "d")
  // v3: Cause.isInterruptedOnly -> Cause.hasInterruptsOnly ; isDie -> hasDies
  check("Cause.hasInterruptsOnly / hasDies", !Cause.hasInterruptsOnly(cause) && Cause.hasDies(cause))
  check("Cause.pretty / squash", Cause.pretty(cause).includes("Boom") && Cause.squash(cause) instanceof Boom)
  // v3: Exit.isInterrupted -> Exit.hasInterrupts ; others unchanged
  check("Exit.* unchanged", Exit.isSuccess(Exit.succeed(1)) && Exit.isFailure(Exit.fail(1)) && Exit.isExit(Exit.void))
  // v3: Deferred.unsafeMake(fiberId) -> Deferred.makeUnsafe() ; unsafeDone -> doneUnsafe
  const d = Deferred.makeUnsafe<number>()
  Deferred.doneUnsafe(d, Exit.succeed(5))
  check("Deferred.makeUnsafe/doneUnsafe/await", (yield* Deferred.await(d)) === 5)
  // v3: Queue.unbounded/take/takeAll ; queue.unsafeOffer(x) -> Queue.offerUnsafe(queue, x)
  const q = yield* Queue.unbounded<number>()
  Queue.offerUnsafe(q, 1)
  Queue.offerUnsafe(q, 2)
  check("Queue.take", (yield* Queue.take(q)) === 1)
  check("Queue.takeAll returns an Array (v3 Chunk)", Array.isArray(yield* Queue.takeAll(q)))
  // v3 Queue.takeAll never waited (empty Chunk); v4 takeAll WAITS for >= 1 item. Non-blocking drain: Queue.clear
  const blocked = yield* Effect.timeoutOption(Queue.takeAll(q), 20)
  check("v4 Queue.takeAll on an empty queue suspends", Option.isNone(blocked))
  check("Queue.clear drains without waiting (v3 takeAll semantics)", (yield* Queue.clear(q)).length === 0)
  // v3: Chunk.unsafeFromArray -> Chunk.fromArrayUnsafe
  check("Chunk.fromArrayUnsafe", Chunk.size(Chunk.fromArrayUnsafe([1, 2])) === 2)
  // v3: Duration.DurationInput -> Duration.Input ; Duration.decode -> Duration.fromInputUnsafe
  const input: Duration.Input = "5 seconds"
  check("Duration.fromInputUnsafe/toMillis", Duration.toMillis(Duration.fromInputUnsafe(input)) === 5000)
  check("Redacted unchanged", Redacted.value(Redacted.make("s")) === "s" && Redacted.isRedacted(Redacted.make(1)))
})

// ---- Stream ----------------------------------------------------------------------------------
const streams = Effect.gen(function*() {
  // v3: Stream.repeatEffectChunkOption(pull) with Option.none() = end -> Stream.fromIterableEffectRepeat + Cause.done
  let n = 0
  const pull = Effect.suspend(() => (n < 3 ? Effect.succeed([n++, n++]) : Cause.done()))
  const pulled = yield* Stream.runCollect(Stream.fromIterableEffectRepeat(pull))
  check("Stream.fromIterableEffectRepeat (repeatEffectChunkOption)", pulled.length === 4, pulled)
  // v3: Stream.unfoldChunkEffect(s, f => Option<[Chunk, s]>) -> Stream.paginate(s, f => [array, Option<s>])
  const paged = yield* Stream.runCollect(Stream.paginate(0, (from: number) =>
    Effect.succeed([[from, from + 1], from < 4 ? Option.some(from + 2) : Option.none()] as const)))
  check("Stream.paginate (unfoldChunkEffect)", paged.length === 6, paged)
  const s = yield* Stream.fromIterable([1, 2, 3]).pipe(Stream.tap(() => Effect.void), Stream.ensuring(Effect.void), Stream.take(2), Stream.runCollect)
  check("Stream.fromIterable/tap/ensuring/take/runCollect (Array result)", Array.isArray(s) && s.length === 2)
  yield* Stream.runForEach(Stream.unwrap(Effect.succeed(Stream.suspend(() => Stream.make(1)))), () => Effect.void)
})

// ---- Logging: Logger.replace / minimumLogLevel / DetachedLog -----------------------------------
const logging = Effect.gen(function*() {
  const lines: Array<string> = []
  // v3: Logger.replace(Logger.defaultLogger, custom) -> Logger.layer([custom])
  const custom = Logger.make(({ message, logLevel, fiber }) =>
    lines.push(`${logLevel} ${String(message)} ${JSON.stringify(fiber.getRef(References.CurrentLogAnnotations))}`))
  yield* Effect.logInfo("hello").pipe(Effect.annotateLogs({ a: 1 }), Effect.provide(Logger.layer([custom])))
  check("Logger.layer([custom]) (Logger.replace)", lines[0] === `Info hello {"a":1}`, lines)
  // v3: Logger.minimumLogLevel(LogLevel.None) -> Layer.succeed(References.MinimumLogLevel, "None")
  yield* Effect.logError("hidden").pipe(
    Effect.provide(Layer.succeed(References.MinimumLogLevel, "None")),
    Effect.provide(Logger.layer([custom]))
  )
  check("References.MinimumLogLevel 'None' silences", lines.length === 1, lines)
  // v3 DetachedLog captured 4 FiberRefs; v4: loggers, level, annotations, spans are all in fiber.context.
  const captured = yield* Effect.withFiber((fiber) => Effect.succeed(fiber.context)).pipe(
    Effect.annotateLogs({ req: "r1" }),
    Effect.provide(Logger.layer([custom]))
  )
  yield* Fiber.await(Effect.runForkWith(captured)(Effect.logWarning("later")))
  check("runForkWith(fiber.context) keeps loggers+annotations (DetachedLog)", lines[1] === `Warn later {"req":"r1"}`, lines)
})

// ---- Layers / ManagedRuntime ---------------------------------------------------------------------
class Repo extends Context.Service<Repo, { readonly n: number }>()("proof/Repo") {}
class Probe extends Context.Service<Probe, { readonly ok: boolean }>()("proof/Probe") {}
const layers = Effect.gen(function*() {
  // v3: Layer.scopedContext(Effect.map(make, (m) => Context.make(A, a).pipe(Context.add(B, b))))
  const both = Layer.effectContext(Effect.succeed(Context.make(Repo, { n: 1 }).pipe(Context.add(Probe, { ok: true }))))
  // v3: Layer.unwrapEffect / unwrapScoped -> Layer.unwrap
  const unwrapped = Layer.unwrap(Effect.succeed(both))
  // v3: Layer.mapError(f) -> Layer.catch((e) => Layer.effectDiscard(Effect.fail(f(e))))
  const failing = Layer.effectDiscard(Effect.fail("raw")).pipe(
    Layer.catch((e) => Layer.effectDiscard(Effect.fail(new Boom({ n: e.length }))))
  )
  const exit = yield* Effect.exit(Effect.provide(Effect.void, failing))
  check("Layer.catch as mapError", Exit.isFailure(exit) && Option.getOrUndefined(Cause.findErrorOption(exit.cause)) instanceof Boom)
  const v = yield* Effect.provide(Effect.all([Repo, Probe]) /* service keys are Effects in v4 */, unwrapped)
  check("Layer.effectContext + Layer.unwrap", v[0].n === 1 && v[1].ok)
  // v3: Layer.succeed(Tag, value) ; v4 also curried Layer.succeed(Tag)(value)
  const l1 = Layer.succeed(Plain, { v: 1 })
  const l2 = Layer.succeed(Plain)({ v: 2 })
  check("Layer.succeed both forms", (yield* Effect.provide(Plain, l1)).v + (yield* Effect.provide(Plain, l2)).v === 3)
  // ManagedRuntime.make unchanged; runtime.runPromise / dispose
  const rt = ManagedRuntime.make(l1)
  const got = yield* Effect.promise(() => rt.runPromise(Plain))
  yield* Effect.promise(() => rt.dispose())
  check("ManagedRuntime.make/runPromise/dispose", got.v === 1)
  // v3: Tag.of({...}) still exists on Context.Service classes
  check("Service.of", Repo.of({ n: 3 }).n === 3)
})

// ---- HttpApi / OpenApi (docs only) ----------------------------------------------------------------
const Envelope = Schema.Struct({ error: Schema.Struct({ message: Schema.String }) }).annotate({ identifier: "ErrorEnvelope" })
class Group extends HttpApiGroup.make("inference").add(
  // v3: HttpApiEndpoint.post("id", "/path").setPayload(P).addSuccess(S).addError(E, { status: 400 })
  HttpApiEndpoint.post("chat", "/v1/chat", {
    payload: Schema.Struct({ model: Schema.String }),
    success: Schema.Struct({ id: Schema.String }),
    error: Envelope.pipe(HttpApiSchema.status(400))
  }),
  HttpApiEndpoint.get("models", "/v1/models", { success: Schema.Struct({ data: Schema.Array(Schema.String) }) })
) {}
// v3: HttpApi.make("x").add(G).annotate(OpenApi.Title, "...") -> same
class Api extends HttpApi.make("wellspring").add(Group).annotate(OpenApi.Title, "wellspring").annotate(OpenApi.Version, "1.0.0") {}
const openapi = Effect.sync(() => {
  const spec = OpenApi.fromApi(Api)
  check("OpenApi.fromApi", spec.openapi.startsWith("3.1") && spec.info.title === "wellspring" && "/v1/chat" in spec.paths, spec.openapi)
  check("error schema in components", JSON.stringify(spec).includes("ErrorEnvelope"))
  check("no default HttpApiDecodeError/Issue/PropertyKey components", !["HttpApiDecodeError", "Issue", "PropertyKey"].some((k) => k in spec.components.schemas), Object.keys(spec.components.schemas))
  // v3: HttpRouter.get("/openapi.json", ...) -> HttpRouter.add("GET", ...)
  return HttpRouter.add("GET", "/openapi.json", HttpServerResponse.text(JSON.stringify(spec), { contentType: "application/json" }))
})

// Types only
export type Fragment = Statement.Fragment // v3 Statement.Fragment
export const isSqlError = SqlError.isSqlError // v3: error._tag === "SqlError" still works

const main = Effect.gen(function*() {
  yield* effects
  yield* data
  yield* streams
  yield* logging
  yield* layers
  yield* openapi
  for (const line of results) console.log(line)
})

NodeRuntime.runMain(main)

// Type helpers. v3: Context.Tag.Service<Settings> -> Context.Service.Shape<typeof Settings>
export type RepoShape = Context.Service.Shape<typeof Repo>
export const repoShape: RepoShape = { n: 1 }
// v3: Layer.Layer.Success<typeof l> -> Layer.Success<typeof l>
export type PlainOut = Layer.Success<ReturnType<typeof Layer.succeed<{ readonly v: number }, { readonly v: number }>>>
// v3: <S extends Schema.Schema.All>(s: S) => Schema.optionalWith(s, { exact: true }) -> Schema.optionalKey(s)
export const opt = <S extends Schema.Top>(schema: S) => Schema.optionalKey(schema)
// v3 Server.ts reads response.headers[name] directly; still a plain record in v4
export const hasConnectionHeader = (r: HttpServerResponse.HttpServerResponse): boolean =>
  r.headers["connection"] !== undefined
