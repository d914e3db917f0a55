/**
 * Health probes for load balancers and Kubernetes, served on every listener (`http/Server.ts` `everyListener`):
 * - `GET /healthz`: the process is alive and serving HTTP: always 200 while it answers at all (also while draining,
 *   so a liveness probe never kills a gateway finishing its streams);
 * - `GET /readyz`: 200 when the database answers, Redis answers (when configured) and the catalog is loaded; 503
 *   otherwise, and from the moment a SIGTERM / SIGINT starts the drain.
 * Neither touches a rate limit or an account. The database and Redis checks are cached for 1 s, so a probe costs
 * at most one `SELECT 1` and one `PING` per second per replica however often it comes; each is bounded by 1 s.
 * The answer names only which check failed; the reason goes to the log, once per change.
 */
import { Cause, Context, Duration, Effect, Layer, type Redacted } from "effect"
import { HttpRouter, HttpServerResponse } from "effect/http"
import { SqlClient } from "effect/sql"
import { LiveCatalog, Settings } from "../config/Live.js"
import { Lifecycle } from "../http/Lifecycle.js"
import * as StoreRedis from "../store/Redis.js"
import { rootMessage } from "../store/Sql.js"

export type CheckState = "ok" | "down" | "not_configured"

export interface ReadinessReport {
  readonly ready: boolean
  readonly checks: {
    readonly database: CheckState
    readonly redis: CheckState
    readonly catalog: CheckState
  }
  /** The live catalog's version and enabled models. */
  readonly catalog: { readonly version: number; readonly models: number }
}

export class Readiness extends Context.Service<Readiness, {
  /** The dependencies' state, at most 1 s old. */
  readonly check: Effect.Effect<ReadinessReport>
}>()("wellspring/telemetry/Readiness") {}

/** How long one check may take, and how long its answer is reused. */
const CHECK_TIMEOUT = Duration.seconds(1)
const CACHE_FOR = Duration.seconds(1)

/** `ok`, or `down` with its reason; never fails. */
const probe = (what: Effect.Effect<unknown, unknown>): Effect.Effect<{ readonly ok: boolean; readonly why: string }> =>
  what.pipe(
    Effect.timeoutOrElse({ duration: CHECK_TIMEOUT, orElse: () => Effect.fail(new Error("no answer within 1 s")) }),
    Effect.as({ ok: true, why: "" }),
    Effect.catchCause((cause) => Effect.succeed({ ok: false, why: rootMessage(Cause.squash(cause)) }))
  )

export const make = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const { config } = yield* Settings
  const catalog = yield* LiveCatalog
  // Its own connection: the admission client is private to the admission layer, and a probe must not queue
  // behind admission traffic.
  const redis = config.redis_url === undefined
    ? null
    : yield* StoreRedis.make({ url: config.redis_url as Redacted.Redacted<string>, connectWaitMs: 1_000 })
  let last = ""
  const dependencies = yield* Effect.cachedWithTTL(
    Effect.gen(function*() {
      const [database, cache] = yield* Effect.all([
        probe(sql`SELECT 1`),
        redis === null ? Effect.succeed(null) : probe(Effect.promise(() => redis.client.ping()))
      ], { concurrency: "unbounded" })
      const why = [
        database.ok ? "" : `database: ${database.why}`,
        cache === null || cache.ok ? "" : `redis: ${cache.why}`
      ].filter((s) => s !== "").join("; ")
      // One line per change of state, not per probe.
      if (why !== last) {
        yield* why === ""
          ? Effect.logInfo("readiness: dependencies answer again")
          : Effect.logWarning("readiness: not ready").pipe(Effect.annotateLogs({ why }))
        last = why
      }
      return {
        database: database.ok ? "ok" : "down",
        redis: cache === null ? "not_configured" : cache.ok ? "ok" : "down"
      } as const
    }),
    CACHE_FOR
  )
  return Readiness.of({
    check: Effect.map(dependencies, (deps) => {
      const view = catalog.current()
      const checks = { ...deps, catalog: "ok" as const }
      return {
        ready: checks.database === "ok" && checks.redis !== "down",
        checks,
        catalog: { version: view.version, models: view.listed.length }
      }
    })
  })
})

export const layer = Layer.effect(Readiness, make)

const NO_STORE = { "cache-control": "no-store" }

const healthz = HttpRouter.add(
  "GET",
  "/healthz",
  Effect.sync(() => HttpServerResponse.jsonUnsafe({ status: "ok" }, { headers: NO_STORE }))
)

const readyz = HttpRouter.add(
  "GET",
  "/readyz",
  Effect.gen(function*() {
    const lifecycle = yield* Lifecycle
    if (lifecycle.draining()) {
      return HttpServerResponse.jsonUnsafe({ status: "draining" }, { status: 503, headers: NO_STORE })
    }
    const report = yield* (yield* Readiness).check
    return HttpServerResponse.jsonUnsafe(
      { status: report.ready ? "ready" : "not_ready", checks: report.checks, catalog: report.catalog },
      { status: report.ready ? 200 : 503, headers: NO_STORE }
    )
  })
)

/** `/healthz` and `/readyz`; `http/Server.ts` adds them to every listener. */
export const routes = Layer.mergeAll(healthz, readyz)
