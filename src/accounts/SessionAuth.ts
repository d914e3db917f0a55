import { Effect } from "effect"
import { HttpServerRequest } from "effect/http"
import { Auth, type Caller } from "../auth/Auth.js"
import { Settings } from "../config/Live.js"
import { fail, type GatewayError } from "../errors/Catalog.js"
import { AccountsRepo } from "./AccountsRepo.js"
import { allowedOrigins, cookieRequestRefusal } from "./SameOrigin.js"

/** Cookie carrying a dashboard session token (sessions table, SHA-256 hashed at rest). */
export const SESSION_COOKIE = "ws-session"

/**
 * Account API authentication (spec Authentication 2): the `ws-session` cookie, else a Bearer key.
 * An unknown cookie falls through to the key; anything else is 401 without a `code`.
 * The account row is re-read so mutations see the current status, not the key cache's copy.
 *
 * A mutation authenticated by the cookie must also pass the CSRF check of SameOrigin.ts (403
 * `cross_site_request`, 415 `unsupported_content_type`); a refused cookie request that also carries a Bearer key is
 * authenticated by the key instead. Every account route authenticates first, and the
 * session lookup only reads, so the check runs before any body is parsed, any limiter counts or any row changes.
 *
 * Both credentials are counted against the request's client address (Auth): an unknown cookie and a refused key
 * count one failure each; past the limit the answer is 429 `too_many_failed_requests`, unless a key already in
 * the positive key cache comes along.
 */
export const authenticateAccount: Effect.Effect<
  Caller,
  GatewayError,
  Auth | AccountsRepo | Settings | HttpServerRequest.HttpServerRequest
> = Effect.gen(function*() {
  const request = yield* HttpServerRequest.HttpServerRequest
  const auth = yield* Auth
  const repo = yield* AccountsRepo
  const authorization = request.headers.authorization
  const hasBearer = authorization !== undefined && /^Bearer\s/i.test(authorization)
  const client = auth.clientAddress(request)
  const token = request.cookies[SESSION_COOKIE]
  if (token) {
    const session = yield* auth.authenticateSession(token, client).pipe(
      // A refused address may still be served by a cached valid key: the key path decides.
      Effect.catchIf((e) => e.code === "too_many_failed_requests" && hasBearer, () => Effect.succeed(null))
    )
    if (session) {
      const settings = yield* Settings
      const refusal = cookieRequestRefusal(
        request.method,
        request.headers,
        allowedOrigins(settings.config.dashboard_origins),
        request.url
      )
      if (refusal === null) return session
      // A refused cookie request may still carry an explicit Bearer key, which a browser never adds by itself.
      if (!hasBearer) return yield* Effect.fail(fail(refusal))
    }
  }
  if (!authorization) return yield* Effect.fail(fail("unauthorized"))
  const caller = yield* auth.authenticateKey(authorization, client).pipe(
    Effect.catchIf((e) => e.code === "invalid_api_key", () => Effect.fail(fail("unauthorized")))
  )
  const account = yield* repo.findAccount(caller.account.id)
  if (account === null) return yield* Effect.fail(fail("unauthorized"))
  return { account, key: caller.key }
})
