import { HttpServerRequest, HttpServerResponse } from "@effect/platform"
import { Cause, Effect, FiberRef } from "effect"
import * as Crypto from "node:crypto"
import { fail, GatewayError } from "../errors/Catalog.js"

/** Correlation id of the current request (`x-wellspring-request-id`). */
export const currentRequestId = FiberRef.unsafeMake<string>("")

export const REQUEST_ID_HEADER = "x-wellspring-request-id"

let counter = 0
const processTag = Crypto.randomBytes(4).toString("hex")
/** Unique per process without a syscall per request. */
export const newRequestId = (): string => `req_${processTag}${(++counter).toString(36).padStart(8, "0")}`

type Renderer = (error: GatewayError) => HttpServerResponse.HttpServerResponse

/**
 * Runs a handler, rendering a GatewayError with the given envelope and any defect as a 500.
 * The request id header is added here, so every response carries it.
 */
export const handle = <R>(
  render: Renderer,
  handler: Effect.Effect<HttpServerResponse.HttpServerResponse, GatewayError, R>
): Effect.Effect<HttpServerResponse.HttpServerResponse, never, R | HttpServerRequest.HttpServerRequest> =>
  Effect.suspend(() => {
    const id = newRequestId()
    return handler.pipe(
      Effect.catchAllCause((cause) => {
        const failure = Cause.failureOption(cause)
        if (failure._tag === "Some") return Effect.succeed(render(failure.value))
        if (Cause.isInterruptedOnly(cause)) return Effect.failCause(cause) as never
        return Effect.logError("unhandled defect", cause).pipe(Effect.as(render(fail("internal_error"))))
      }),
      Effect.map((response) => HttpServerResponse.setHeader(response, REQUEST_ID_HEADER, id)),
      Effect.locally(currentRequestId, id)
    )
  })

/** Headers as a plain lowercase record. */
export const headersOf = (request: HttpServerRequest.HttpServerRequest): Readonly<Record<string, string | undefined>> =>
  request.headers as Readonly<Record<string, string | undefined>>

export const json = (body: unknown, status = 200, headers?: Record<string, string>) =>
  HttpServerResponse.unsafeJson(body, headers ? { status, headers } : { status })

export { GatewayError }
