/**
 * The public status API (no authentication) and the status page.
 *
 * - `GET /api/stats/fleet`, `/api/stats/server`, `/api/incidents` on the status and account origins;
 *   `GET /api/quota` on the account origin; `GET /` (and its two assets) on the status origin.
 * - Every answer is built from memory (`Status.ts` snapshots, the live catalog, the clock): no request touches
 *   the database. `Cache-Control: public, max-age=<status.refresh_seconds>`; unknown query fields are ignored.
 * - `status.per_minute` (60) requests per minute per client address (`http/ClientAddress.ts`, with
 *   `trusted_proxies`), all four endpoints together, on the admission engine's limiter: shared by every replica
 *   when Redis is configured. Over it: 429 `rate_limited` with `Retry-After`. If the limiter's store is
 *   unreachable the request is served (the status page is what people read during an outage).
 * - CORS: `Access-Control-Allow-Origin: *` on every answer of the four endpoints, no credentials.
 */
import { Clock, Effect, Layer, Option } from "effect"
import { HttpRouter, HttpServerRequest, HttpServerResponse } from "effect/http"
import type { GatewayConfig } from "../config/GatewayConfig.js"
import { LiveCatalog, Settings } from "../config/Live.js"
import { fail, type GatewayError } from "../errors/Catalog.js"
import { renderInference } from "../errors/Render.js"
import * as ClientAddress from "../http/ClientAddress.js"
import { handle, json } from "../http/Respond.js"
import { Admission } from "../quota/Admission.js"
import { type Asset, CONTENT_SECURITY_POLICY, loadAssets } from "./Page.js"
import { fleetBody, incidentsBody, parseIncidentsLimit, quotaBody, serverBody, StatusCache } from "./Status.js"

/** Key of the per-address limiter (shared by the four endpoints). */
export const publicLimitKey = (address: string) => `pub:${address}`

const addressRules = new WeakMap<GatewayConfig, ClientAddress.ClientAddresses>()
const addressesOf = (config: GatewayConfig) => {
  let rules = addressRules.get(config)
  if (rules === undefined) {
    rules = ClientAddress.make(config.trusted_proxies)
    addressRules.set(config, rules)
  }
  return rules
}

const limitMessage = (perMinute: number) => `상태 조회 요청이 너무 많습니다. 1분에 ${perMinute}회까지 가능합니다.`

/** Counts the request against its client address; 429 over the limit. */
const enforcePublicLimit = (request: HttpServerRequest.HttpServerRequest) =>
  Effect.gen(function*() {
    const { config } = yield* Settings
    const admission = yield* Admission
    const address = addressesOf(config).of(Option.getOrUndefined(request.remoteAddress), request.headers["x-forwarded-for"])
    const perMinute = config.status.per_minute
    const verdict = yield* admission.limit(publicLimitKey(address), perMinute, 60).pipe(
      // Fail open: a Redis outage must not take the status page down with it.
      Effect.catch((error: GatewayError) =>
        error.status === 503
          ? Effect.logWarning("public status limit unavailable; serving unlimited").pipe(
            Effect.as({ allowed: true, remaining: 0, reset_seconds: 0 })
          )
          : Effect.fail(error)
      )
    )
    if (!verdict.allowed) {
      return yield* Effect.fail(
        fail("rate_limited", { message: limitMessage(perMinute), retryAfter: Math.max(1, verdict.reset_seconds) })
      )
    }
  })

const query = (request: HttpServerRequest.HttpServerRequest): URLSearchParams => {
  const i = request.url.indexOf("?")
  return new URLSearchParams(i < 0 ? "" : request.url.slice(i + 1))
}

/** A public GET: limit, body from memory, CORS and caching headers. */
const publicGet = <R>(path: `/${string}`, body: (q: URLSearchParams) => Effect.Effect<unknown, never, R>) =>
  HttpRouter.add(
    "GET",
    path,
    Effect.gen(function*() {
      const request = yield* HttpServerRequest.HttpServerRequest
      const { config } = yield* Settings
      const response = yield* handle(
        renderInference,
        Effect.gen(function*() {
          yield* enforcePublicLimit(request)
          return json(yield* body(query(request)))
        })
      )
      return HttpServerResponse.setHeaders(response, {
        "access-control-allow-origin": "*",
        "cache-control": response.status === 200 ? `public, max-age=${config.status.refresh_seconds}` : "no-store"
      })
    })
  )

const fleet = publicGet("/api/stats/fleet", () =>
  Effect.gen(function*() {
    const cache = yield* StatusCache
    const catalog = yield* LiveCatalog
    return fleetBody(catalog.current(), yield* cache.fleet.get)
  }))

const server = publicGet("/api/stats/server", () =>
  Effect.gen(function*() {
    const cache = yield* StatusCache
    const catalog = yield* LiveCatalog
    const [quota, server, allTime] = yield* Effect.all([cache.quota.get, cache.server.get, cache.allTime.get], {
      concurrency: "unbounded"
    })
    return serverBody(catalog.current(), { quota, server, allTime }, yield* Clock.currentTimeMillis)
  }))

const incidents = publicGet("/api/incidents", (q) =>
  Effect.gen(function*() {
    const cache = yield* StatusCache
    return incidentsBody(yield* cache.incidents.get, parseIncidentsLimit(q.get("limit")))
  }))

const quota = publicGet("/api/quota", () =>
  Effect.gen(function*() {
    const cache = yield* StatusCache
    const catalog = yield* LiveCatalog
    return quotaBody(catalog.current(), yield* cache.quota.get, yield* Clock.currentTimeMillis)
  }))

/**
 * The public endpoints both the status and the account origin serve. One layer value: a listener serving both
 * origins builds it once (layers are memoized by reference), so its routes are registered once.
 */
export const publicStatsRoutes = Layer.mergeAll(fleet, server, incidents)

/** The account origin's quota endpoint. */
export const quotaRoute = quota

const assetRoute = (asset: Asset) =>
  HttpRouter.add(
    "GET",
    asset.path,
    Effect.map(HttpServerRequest.HttpServerRequest, (request) => {
      const headers = {
        "content-security-policy": CONTENT_SECURITY_POLICY,
        "x-content-type-options": "nosniff",
        "referrer-policy": "no-referrer",
        "x-frame-options": "DENY",
        // The HTML is revalidated on every load, so a new version's assets are picked up at once.
        "cache-control": asset.path === "/" ? "no-cache" : "public, max-age=300",
        etag: asset.etag
      }
      if (request.headers["if-none-match"] === asset.etag) return HttpServerResponse.empty({ status: 304, headers })
      return HttpServerResponse.uint8Array(asset.body, { contentType: asset.contentType, headers })
    })
  )

/** `GET /` of the status origin and its assets (read once, when the routes are built). */
export const pageRoutes = Layer.unwrap(Effect.sync(() => {
  const [first, ...rest] = loadAssets().map(assetRoute)
  return Layer.mergeAll(first!, ...rest)
}))
