import { HttpServerResponse } from "effect/http"
import { Catalog, type GatewayError } from "./Catalog.js"

/** A 429 whose wait is longer than this tells SDKs not to retry (they would retry within seconds). */
export const LONG_WAIT_SECONDS = 60

/** Seconds until the client may retry, from `retryAfter` or `resetsAt`; undefined when neither is set. */
const waitSeconds = (error: GatewayError): number | undefined =>
  error.retryAfter !== undefined
    ? Math.max(0, Math.ceil(error.retryAfter))
    : error.resetsAt !== undefined
    ? Math.max(0, Math.ceil((error.resetsAt - Date.now()) / 1000))
    : undefined

/**
 * `Retry-After` (never on `rotate_cooldown`, per the spec) and `x-should-retry`, which the openai SDKs honour
 * over their own rule (they retry 408, 409, 429 and 5xx twice within seconds): `false` when the error says so
 * (an upstream misconfiguration) or for a 429 whose wait is more than a minute away; absent otherwise.
 */
export const retryHeaders = (error: GatewayError): Record<string, string> => {
  const wait = waitSeconds(error)
  const headers: Record<string, string> = {}
  if (wait !== undefined && error.code !== "rotate_cooldown") headers["retry-after"] = String(wait)
  if (error.shouldRetry !== undefined) headers["x-should-retry"] = String(error.shouldRetry)
  else if (error.status === 429 && wait !== undefined && wait > LONG_WAIT_SECONDS) headers["x-should-retry"] = "false"
  return headers
}

/** `{error: {message, type, code?, resets_at?}}` */
export const inferenceBody = (error: GatewayError) => {
  const entry = Catalog[error.code]
  return {
    error: {
      message: error.userMessage,
      type: entry.type,
      ...(entry.wire !== null ? { code: entry.wire } : {}),
      ...(error.resetsAt !== undefined ? { resets_at: new Date(error.resetsAt).toISOString() } : {})
    }
  }
}

export const renderInference = (error: GatewayError): HttpServerResponse.HttpServerResponse =>
  HttpServerResponse.jsonUnsafe(inferenceBody(error), { status: error.status, headers: retryHeaders(error) })

/** Image endpoint: `{statusCode, message}`. */
export const imageBody = (error: GatewayError) => ({ statusCode: error.status, message: error.userMessage })

export const renderImage = (error: GatewayError): HttpServerResponse.HttpServerResponse =>
  HttpServerResponse.jsonUnsafe(imageBody(error), { status: error.status, headers: retryHeaders(error) })

/** Wrapped account endpoints: `{success: false, error: {message, type, code?}}`. */
export const accountBody = (error: GatewayError) => ({ success: false as const, ...inferenceBody(error) })

export const renderAccount = (error: GatewayError): HttpServerResponse.HttpServerResponse =>
  HttpServerResponse.jsonUnsafe(accountBody(error), { status: error.status, headers: retryHeaders(error) })

/** Bare `{error: "<string>"}` (the 403 of GET /api/user/me). */
export const renderBare = (error: GatewayError): HttpServerResponse.HttpServerResponse =>
  HttpServerResponse.jsonUnsafe({ error: error.userMessage }, { status: error.status })
