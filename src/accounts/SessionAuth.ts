import { HttpServerRequest } from "@effect/platform"
import { Effect } from "effect"
import { Auth, type Caller } from "../auth/Auth.js"
import { fail, type GatewayError } from "../errors/Catalog.js"
import { AccountsRepo } from "./AccountsRepo.js"

/** Cookie carrying a dashboard session token (sessions table, SHA-256 hashed at rest). */
export const SESSION_COOKIE = "ws-session"

/** Longest token we bother hashing; real tokens are 48 base62 characters. */
const MAX_TOKEN_LENGTH = 256

/**
 * Account API authentication (spec Authentication 2): the `ws-session` cookie, else a Bearer key.
 * An unknown cookie falls through to the key; anything else is 401 without a `code`.
 * The account row is re-read so mutations see the current status, not the key cache's copy.
 */
export const authenticateAccount: Effect.Effect<
  Caller,
  GatewayError,
  Auth | AccountsRepo | HttpServerRequest.HttpServerRequest
> = Effect.gen(function*() {
  const request = yield* HttpServerRequest.HttpServerRequest
  const auth = yield* Auth
  const repo = yield* AccountsRepo
  const token = request.cookies[SESSION_COOKIE]
  if (token && token.length <= MAX_TOKEN_LENGTH) {
    const session = yield* auth.authenticateSession(token)
    if (session) return session
  }
  const authorization = request.headers.authorization
  if (!authorization) return yield* Effect.fail(fail("unauthorized"))
  const caller = yield* auth.authenticateKey(authorization).pipe(
    Effect.catchIf((e) => e.code === "invalid_api_key", () => Effect.fail(fail("unauthorized")))
  )
  const account = yield* repo.findAccount(caller.account.id)
  if (account === null) return yield* Effect.fail(fail("unauthorized"))
  return { account, key: caller.key }
})
