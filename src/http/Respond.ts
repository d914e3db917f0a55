import { Cause, Clock, Context, Effect } from "effect"
import { type HttpServerRequest, HttpServerResponse } from "effect/http"
import * as Crypto from "node:crypto"
import * as Http from "node:http"
import { fail, GatewayError } from "../errors/Catalog.js"

/** Correlation id of the current request (`x-wellspring-request-id`); read it with `yield* currentRequestId`. */
export const currentRequestId = Context.Reference<string>("wellspring/http/CurrentRequestId", {
  defaultValue: () => ""
})

export const REQUEST_ID_HEADER = "x-wellspring-request-id"

let counter = 0
const processTag = Crypto.randomBytes(4).toString("hex")
/** Unique per process without a syscall per request. */
export const newRequestId = (): string => `req_${processTag}${(++counter).toString(36).padStart(8, "0")}`

type Renderer = (error: GatewayError) => HttpServerResponse.HttpServerResponse

/** Refusals answered without reading the body: the connection is closed so Node does not drain it. */
const REFUSED_UNREAD: ReadonlySet<GatewayError["code"]> = new Set(["payload_too_large", "too_many_failed_requests"])

const closingIfRefused = (error: GatewayError, response: HttpServerResponse.HttpServerResponse) =>
  REFUSED_UNREAD.has(error.code) ? HttpServerResponse.setHeader(response, "connection", "close") : response

/** SQLSTATE classes of errors a request's own data or a bug causes (data, integrity, syntax): not an outage. */
const DETERMINISTIC_SQLSTATE = /^(22|23|42)/
/** Socket errors of a lost or refused database connection. */
const CONNECTION_ERRNO = new Set(["ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "EPIPE", "EHOSTUNREACH", "ENETUNREACH", "EAI_AGAIN"])

const sqlStateOf = (error: unknown): string | undefined => {
  let current = error
  for (let depth = 0; depth < 8 && current !== null && typeof current === "object"; depth++) {
    const code = (current as { code?: unknown }).code
    if (typeof code === "string") return code
    current = (current as { cause?: unknown }).cause
  }
  return undefined
}

/** The database (or the connection to it) failed: a SqlError that is not about the query's own data, or a socket error. */
export const isStoreOutage = (error: unknown): boolean => {
  if (error === null || typeof error !== "object") return false
  const code = sqlStateOf(error)
  if ((error as { _tag?: unknown })._tag === "SqlError") return code === undefined || !DETERMINISTIC_SQLSTATE.test(code)
  return code !== undefined && CONNECTION_ERRNO.has(code)
}

/** An outage fails every request: it is logged once per interval with the number of failures since. */
const OUTAGE_LOG_INTERVAL_MS = 10_000
let outageLoggedAt = Number.NEGATIVE_INFINITY
let outageFailures = 0

const reportOutage = (cause: Cause.Cause<unknown>) =>
  Effect.flatMap(Clock.currentTimeMillis, (now) => {
    outageFailures++
    if (now - outageLoggedAt < OUTAGE_LOG_INTERVAL_MS) return Effect.void
    const failures = outageFailures
    outageLoggedAt = now
    outageFailures = 0
    return Effect.logError("database unavailable", cause).pipe(Effect.annotateLogs({ failed_requests: failures }))
  })

/** 503 `service_unavailable` when the store is down, 500 `internal_error` for any other defect. */
export const defectCode = (cause: Cause.Cause<unknown>): "service_unavailable" | "internal_error" => {
  for (const reason of cause.reasons) {
    if (Cause.isDieReason(reason) ? isStoreOutage(reason.defect) : Cause.isFailReason(reason) && isStoreOutage(reason.error)) {
      return "service_unavailable"
    }
  }
  return "internal_error"
}

/**
 * Runs a handler, rendering a GatewayError with the given envelope, a store outage as 503 and any other
 * defect as 500. The request id header is added here, so every response carries it.
 */
export const handle = <R>(
  render: Renderer,
  handler: Effect.Effect<HttpServerResponse.HttpServerResponse, GatewayError, R>
): Effect.Effect<HttpServerResponse.HttpServerResponse, never, R | HttpServerRequest.HttpServerRequest> =>
  Effect.suspend(() => {
    const id = newRequestId()
    // One step for both outcomes (a `catchCause` then a `map` would take two on every request).
    return Effect.matchCauseEffect(handler, {
      onFailure: (cause) => {
        const failure = Cause.findErrorOption(cause)
        if (failure._tag === "Some" && failure.value instanceof GatewayError) {
          return Effect.succeed(withRequestId(closingIfRefused(failure.value, render(failure.value)), id))
        }
        if (Cause.hasInterruptsOnly(cause)) return Effect.failCause(cause) as never
        const code = defectCode(cause)
        const report = code === "service_unavailable" ? reportOutage(cause) : Effect.logError("unhandled defect", cause)
        return report.pipe(Effect.as(withRequestId(render(fail(code)), id)))
      },
      onSuccess: (response) => Effect.succeed(withRequestId(response, id))
    }).pipe(Effect.provideService(currentRequestId, id))
  })

const withRequestId = (response: HttpServerResponse.HttpServerResponse, id: string) =>
  HttpServerResponse.setHeader(response, REQUEST_ID_HEADER, id)

/**
 * Headers as a plain lowercase record. On Node this is the incoming message's own record (Node lowercases the
 * names and joins repeated values as `Headers.fromInput` would); `request.headers` copies it on every read.
 */
export const headersOf = (request: HttpServerRequest.HttpServerRequest): Readonly<Record<string, string | undefined>> => {
  const source = (request as { readonly source?: unknown }).source
  return (source instanceof Http.IncomingMessage ? source.headers : request.headers) as Readonly<
    Record<string, string | undefined>
  >
}

export const json = (body: unknown, status = 200, headers?: Record<string, string>) =>
  HttpServerResponse.jsonUnsafe(body, headers ? { status, headers } : { status })

export { GatewayError }
