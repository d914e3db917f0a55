/**
 * Dashboard sign-in (issue 21): an API key is exchanged for a `ws-session` cookie, which the account API already
 * accepts (SessionAuth.ts). Sessions are rows of `sessions` (token stored as SHA-256), so signing out, listing and
 * revoking need no new table.
 *
 * - `POST /api/user/session` `{api_key}`: the key is checked by `Auth.authenticateKey`, so every wrong key counts
 *   against the client address's failed-authentication limit (`auth/FailedAuth.ts`, 429 `too_many_failed_requests`).
 *   The request must be same-origin JSON even without a cookie (a cross-site page could otherwise sign a victim's
 *   browser into the attacker's account). Per account at most `SIGN_IN_LIMIT` sign-ins a minute, and at most
 *   `MAX_SESSIONS` live sessions: the oldest go, and dead rows of the account are deleted, so the table stays bounded.
 * - `DELETE /api/user/session`: revokes the cookie's session (same-origin only) and clears the cookie.
 * - `GET /api/user/me/sessions`, `DELETE /api/user/me/sessions/:id`: the account's live sessions, the id being the
 *   first 16 hex digits of the token hash (never the token); revoking takes effect on the next request, since
 *   sessions are looked up on every request.
 *
 * The cookie: `HttpOnly; SameSite=Lax; Path=/api/user` (only the account API reads it), `Max-Age` = the session's
 * lifetime, `Secure` when the request came over https (first `X-Forwarded-Proto`).
 */
import { Effect, Layer } from "effect"
import { HttpRouter, HttpServerRequest, HttpServerResponse } from "effect/http"
import { SqlClient } from "effect/sql"
import { Auth, MAX_SESSION_TOKEN_LENGTH } from "../auth/Auth.js"
import { hashKey } from "../auth/KeyMaterial.js"
import { Settings } from "../config/Live.js"
import { fail, type GatewayError } from "../errors/Catalog.js"
import { renderAccount } from "../errors/Render.js"
import { readJson } from "../http/Body.js"
import { handle, json } from "../http/Respond.js"
import { AccountsRepo } from "./AccountsRepo.js"
import { endpointLimit, enforce } from "./Limits.js"
import { allowedOrigins, cookieRequestRefusal } from "./SameOrigin.js"
import { authenticateAccount, SESSION_COOKIE } from "./SessionAuth.js"

/** A dashboard session lasts a week. */
export const SESSION_HOURS = 24 * 7
/** Live sessions per account; a sign-in beyond it revokes the oldest. */
export const MAX_SESSIONS = 10
/** Longest `api_key` accepted (real keys are under 140 characters). */
const MAX_KEY_CHARS = 256
/** The sign-in body is one key. */
const SIGN_IN_BODY_BYTES = 4 * 1024
/** Characters of the token hash that name a session. */
const SESSION_ID_CHARS = 16

export const SIGN_IN_LIMIT = endpointLimit("sign-in", 10, 60, "로그인 요청이 너무 많습니다. 1분에 10회까지 가능합니다.")
export const SESSIONS_LIMIT = endpointLimit("sessions", 60, 60, "세션 요청이 너무 많습니다. 1분에 60회까지 가능합니다.")

export const SignInMessages = {
  missingKey: "api_key 필드에 API 키를 입력하세요.",
  wrongKey: "API 키가 올바르지 않거나 폐기되었습니다.",
  sessionNotFound: "세션을 찾을 수 없습니다."
} as const

const COOKIE_PATH = "/api/user"

/** True when the request reached the gateway over https (through a proxy that says so). */
const overHttps = (headers: Readonly<Record<string, string | undefined>>) =>
  headers["x-forwarded-proto"]?.split(",")[0]?.trim().toLowerCase() === "https"

export const sessionCookie = (token: string, maxAgeSeconds: number, secure: boolean): string =>
  `${SESSION_COOKIE}=${token}; Path=${COOKIE_PATH}; Max-Age=${maxAgeSeconds}; HttpOnly; SameSite=Lax${secure ? "; Secure" : ""}`

const sessionId = (tokenHash: string) => tokenHash.slice(0, SESSION_ID_CHARS)

/** The same-origin and JSON rules of cookie mutations (SameOrigin.ts), applied whether or not a cookie came. */
const requireSameOrigin = Effect.gen(function*() {
  const request = yield* HttpServerRequest.HttpServerRequest
  const settings = yield* Settings
  const refusal = cookieRequestRefusal(request.method, request.headers, allowedOrigins(settings.config.dashboard_origins), request.url)
  if (refusal !== null) return yield* Effect.fail(fail(refusal))
})

const signIn = Effect.gen(function*() {
  yield* requireSameOrigin
  const request = yield* HttpServerRequest.HttpServerRequest
  const auth = yield* Auth
  const repo = yield* AccountsRepo
  const sql = yield* SqlClient.SqlClient
  const body = yield* readJson(request, { maxBytes: SIGN_IN_BODY_BYTES })
  const raw = typeof body === "object" && body !== null && !Array.isArray(body) ? (body as Record<string, unknown>).api_key : undefined
  const key = typeof raw === "string" ? raw.trim() : ""
  if (key === "" || key.length > MAX_KEY_CHARS) {
    return yield* Effect.fail(fail("invalid_request", { message: SignInMessages.missingKey }))
  }
  // Counted against the client address like any key; a wrong one is 401, past the limit 429.
  const caller = yield* auth.authenticateKey(`Bearer ${key}`, auth.clientAddress(request)).pipe(
    Effect.catchIf((e) => e.code === "invalid_api_key", () => Effect.fail(fail("invalid_api_key", { message: SignInMessages.wrongKey })))
  )
  const account = caller.account
  yield* enforce(SIGN_IN_LIMIT, account.id)
  const token = yield* repo.createSession(account.id, SESSION_HOURS)
  // Dead rows of this account go; live ones beyond the cap are revoked, oldest first.
  yield* Effect.orDie(sql`
    DELETE FROM sessions WHERE account_id = ${account.id} AND (revoked_at IS NOT NULL OR expires_at <= now())`)
  yield* Effect.orDie(sql`
    UPDATE sessions SET revoked_at = now()
    WHERE token_hash IN (
      SELECT token_hash FROM sessions WHERE account_id = ${account.id} AND revoked_at IS NULL
      ORDER BY created_at DESC, token_hash OFFSET ${MAX_SESSIONS})`)
  const rows = yield* Effect.orDie(sql<{ expires_at: Date }>`SELECT expires_at FROM sessions WHERE token_hash = ${hashKey(token)}`)
  yield* repo.audit(account.id, "session.create", sessionId(hashKey(token)), { via: "api_key", key_id: caller.key?.id ?? null })
  const response = json({
    success: true,
    data: { expires_at: rows[0]!.expires_at.toISOString(), username: account.username, display_name: account.display_name }
  })
  return HttpServerResponse.setHeader(response, "set-cookie", sessionCookie(token, SESSION_HOURS * 3600, overHttps(request.headers)))
})

const clearCookie = (request: HttpServerRequest.HttpServerRequest, response: HttpServerResponse.HttpServerResponse) =>
  HttpServerResponse.setHeader(response, "set-cookie", sessionCookie("", 0, overHttps(request.headers)))

const signOut = Effect.gen(function*() {
  yield* requireSameOrigin
  const request = yield* HttpServerRequest.HttpServerRequest
  const token = request.cookies[SESSION_COOKIE]
  if (token) {
    const auth = yield* Auth
    // Looked up first (counted, negative-cached like any cookie), so random cookies cost no write.
    const session = yield* auth.authenticateSession(token, auth.clientAddress(request))
    if (session !== null && token.length <= MAX_SESSION_TOKEN_LENGTH) {
      const sql = yield* SqlClient.SqlClient
      const repo = yield* AccountsRepo
      yield* Effect.orDie(sql`UPDATE sessions SET revoked_at = now() WHERE token_hash = ${hashKey(token)} AND revoked_at IS NULL`)
      yield* repo.audit(session.account.id, "session.delete", sessionId(hashKey(token)), { via: "sign_out" })
    }
  }
  return clearCookie(request, json({ success: true }))
})

const currentId = (request: HttpServerRequest.HttpServerRequest): string | null => {
  const token = request.cookies[SESSION_COOKIE]
  return token && token.length <= MAX_SESSION_TOKEN_LENGTH ? sessionId(hashKey(token)) : null
}

const listSessions = Effect.gen(function*() {
  const { account } = yield* authenticateAccount
  yield* enforce(SESSIONS_LIMIT, account.id)
  const request = yield* HttpServerRequest.HttpServerRequest
  const sql = yield* SqlClient.SqlClient
  const rows = yield* Effect.orDie(sql<{ token_hash: string; created_at: Date; expires_at: Date }>`
    SELECT token_hash, created_at, expires_at FROM sessions
    WHERE account_id = ${account.id} AND revoked_at IS NULL AND expires_at > now()
    ORDER BY created_at DESC, token_hash LIMIT 50`)
  const current = currentId(request)
  return json({
    success: true,
    data: {
      sessions: rows.map((row) => ({
        id: sessionId(row.token_hash),
        created_at: row.created_at.toISOString(),
        expires_at: row.expires_at.toISOString(),
        current: sessionId(row.token_hash) === current
      })),
      max: MAX_SESSIONS
    }
  })
})

const revokeSession = Effect.gen(function*() {
  const caller = yield* authenticateAccount
  const accountId = caller.account.id
  yield* enforce(SESSIONS_LIMIT, accountId)
  const request = yield* HttpServerRequest.HttpServerRequest
  const id = (yield* HttpRouter.params).id ?? ""
  if (!/^[0-9a-f]{16}$/.test(id)) return yield* Effect.fail(fail("not_found", { message: SignInMessages.sessionNotFound }))
  const sql = yield* SqlClient.SqlClient
  const repo = yield* AccountsRepo
  const revoked = yield* Effect.orDie(sql<{ token_hash: string }>`
    UPDATE sessions SET revoked_at = now()
    WHERE account_id = ${accountId} AND left(token_hash, ${SESSION_ID_CHARS}) = ${id}
      AND revoked_at IS NULL AND expires_at > now()
    RETURNING token_hash`)
  if (revoked.length === 0) return yield* Effect.fail(fail("not_found", { message: SignInMessages.sessionNotFound }))
  yield* repo.audit(accountId, "session.delete", id, { via: caller.key === null ? "session" : "api_key" })
  const response = json({ success: true })
  return id === currentId(request) ? clearCookie(request, response) : response
})

const route = (
  method: "GET" | "POST" | "DELETE",
  path: `/${string}`,
  handler: Effect.Effect<HttpServerResponse.HttpServerResponse, GatewayError, any>
) => HttpRouter.add(method, path, handle(renderAccount, handler))

export const signInRoutes = Layer.mergeAll(
  route("POST", "/api/user/session", signIn),
  route("DELETE", "/api/user/session", signOut),
  route("GET", "/api/user/me/sessions", listSessions),
  route("DELETE", "/api/user/me/sessions/:id", revokeSession)
)
