/**
 * The account API on the dashboard origin (spec: Endpoints → Account API, rules 1–7; Errors → Account endpoints).
 *
 * Response forms:
 * - wrapped (`{success, data}`; errors `{success: false, error: {message, type, code?}}`): keys, rotate, sfw;
 * - bare (`GET /api/user/me`, metrics, requests; errors in the inference envelope `{error: {message, type, code?}}`),
 *   except the legacy 403 of `GET /api/user/me`, which is a bare `{error: "<string>"}`.
 *
 * Cookie-authenticated mutations are refused unless same-origin and JSON (SameOrigin.ts), inside
 * `authenticateAccount`, which every route runs first.
 */
import { Effect, Layer } from "effect"
import { HttpRouter, HttpServerRequest } from "effect/http"
import { Auth } from "../auth/Auth.js"
import { Settings } from "../config/Live.js"
import type { GatewayError } from "../errors/Catalog.js"
import { renderAccount, renderBare, renderInference } from "../errors/Render.js"
import { handle, json } from "../http/Respond.js"
import { readJson } from "../http/Body.js"
import { AccountsRepo } from "./AccountsRepo.js"
import { createKey, deleteKey, listKeys, revealKey, rotateKey } from "./Keys.js"
import { enforce, READ_LIMIT, snapshotLimit } from "./Limits.js"
import { metrics, parseLimit, parseModel, parseRange, recentRequests } from "./Metrics.js"
import { authenticateAccount } from "./SessionAuth.js"
import { snapshot } from "./Snapshot.js"

const query = (request: HttpServerRequest.HttpServerRequest): URLSearchParams => {
  const i = request.url.indexOf("?")
  return new URLSearchParams(i < 0 ? "" : request.url.slice(i + 1))
}

/** Account bodies are a flag or a label: a few bytes. */
export const ACCOUNT_BODY_BYTES = 16 * 1024

/**
 * The body as JSON, or undefined when absent, malformed, too deep or of another content type (these endpoints
 * never reject a body's content; another content type is not read at all); a body over `ACCOUNT_BODY_BYTES` is
 * still a 413.
 */
const lenientJson = (request: HttpServerRequest.HttpServerRequest) =>
  readJson(request, { maxBytes: ACCOUNT_BODY_BYTES, emptyIsAbsent: true }).pipe(
    Effect.catchIf((error) => error.code !== "payload_too_large", () => Effect.succeed(undefined as unknown))
  )

/** `GET /api/user/me`: its 403 is bare; everything else uses the envelope. */
const renderSnapshotError = (error: GatewayError) => (error.status === 403 ? renderBare(error) : renderInference(error))

const param = (name: string) => Effect.map(HttpRouter.params, (params) => params[name])

export const accountRoutes = Layer.mergeAll(
  HttpRouter.add(
    "GET",
    "/api/user/me",
    handle(
      renderSnapshotError,
      Effect.gen(function*() {
        const { account } = yield* authenticateAccount
        const settings = yield* Settings
        yield* enforce(snapshotLimit(settings.config.limits.snapshot_per_minute), account.id)
        return json(yield* snapshot(account))
      })
    )
  ),
  HttpRouter.add(
    "GET",
    "/api/user/me/metrics",
    Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) =>
      handle(
        renderInference,
        Effect.gen(function*() {
          const { account } = yield* authenticateAccount
          const q = query(request)
          const range = yield* parseRange(q.get("range"))
          yield* enforce(READ_LIMIT, account.id)
          return json(yield* metrics(account.id, range, parseModel(q.get("model"))))
        })
      ))
  ),
  HttpRouter.add(
    "GET",
    "/api/user/me/requests",
    Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) =>
      handle(
        renderInference,
        Effect.gen(function*() {
          const { account } = yield* authenticateAccount
          yield* enforce(READ_LIMIT, account.id)
          const limit = parseLimit(query(request).get("limit"))
          return json({ requests: yield* recentRequests(account.id, limit), limit })
        })
      ))
  ),
  HttpRouter.add(
    "POST",
    "/api/user/sfw",
    Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) =>
      handle(
        renderAccount,
        Effect.gen(function*() {
          const { account } = yield* authenticateAccount
          const body = yield* lenientJson(request)
          // Only boolean `true` turns safe mode on; anything else (including a malformed body) is false.
          const on = typeof body === "object" && body !== null && (body as Record<string, unknown>).sfw_mode === true
          const repo = yield* AccountsRepo
          const auth = yield* Auth
          yield* repo.setSfw(account.id, on)
          yield* auth.invalidateAccount(account.id)
          return json({ success: true, sfw_mode: on })
        })
      ))
  ),
  HttpRouter.add(
    "GET",
    "/api/user/me/keys",
    handle(
      renderAccount,
      Effect.flatMap(authenticateAccount, listKeys).pipe(Effect.map((data) => json({ success: true, data })))
    )
  ),
  HttpRouter.add(
    "POST",
    "/api/user/me/keys",
    Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) =>
      handle(
        renderAccount,
        Effect.gen(function*() {
          const caller = yield* authenticateAccount
          const data = yield* createKey(caller, lenientJson(request))
          return json({ success: true, data })
        })
      ))
  ),
  HttpRouter.add(
    "DELETE",
    "/api/user/me/keys/:id",
    handle(
      renderAccount,
      Effect.gen(function*() {
        const caller = yield* authenticateAccount
        yield* deleteKey(caller, yield* param("id"))
        return json({ success: true })
      })
    )
  ),
  HttpRouter.add(
    "GET",
    "/api/user/me/keys/:id/reveal",
    handle(
      renderAccount,
      Effect.gen(function*() {
        const caller = yield* authenticateAccount
        const data = yield* revealKey(caller, yield* param("id"))
        return json({ success: true, data })
      })
    )
  ),
  HttpRouter.add(
    "POST",
    "/api/user/me/rotate-key",
    handle(
      renderAccount,
      Effect.flatMap(authenticateAccount, rotateKey).pipe(Effect.map((data) => json({ success: true, data })))
    )
  )
)
