import { HttpServerResponse } from "@effect/platform"
import { Catalog, type GatewayError } from "./Catalog.js"

const retryHeaders = (error: GatewayError): Record<string, string> => {
  if (error.code === "rotate_cooldown") return {}
  if (error.retryAfter !== undefined) return { "retry-after": String(Math.max(0, Math.ceil(error.retryAfter))) }
  if (error.resetsAt !== undefined) {
    return { "retry-after": String(Math.max(0, Math.ceil((error.resetsAt - Date.now()) / 1000))) }
  }
  return {}
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
  HttpServerResponse.unsafeJson(inferenceBody(error), { status: error.status, headers: retryHeaders(error) })

/** Image endpoint: `{statusCode, message}`. */
export const imageBody = (error: GatewayError) => ({ statusCode: error.status, message: error.userMessage })

export const renderImage = (error: GatewayError): HttpServerResponse.HttpServerResponse =>
  HttpServerResponse.unsafeJson(imageBody(error), { status: error.status, headers: retryHeaders(error) })

/** Wrapped account endpoints: `{success: false, error: {message, type, code?}}`. */
export const accountBody = (error: GatewayError) => ({ success: false as const, ...inferenceBody(error) })

export const renderAccount = (error: GatewayError): HttpServerResponse.HttpServerResponse =>
  HttpServerResponse.unsafeJson(accountBody(error), { status: error.status, headers: retryHeaders(error) })

/** Bare `{error: "<string>"}` (the 403 of GET /api/user/me). */
export const renderBare = (error: GatewayError): HttpServerResponse.HttpServerResponse =>
  HttpServerResponse.unsafeJson({ error: error.userMessage }, { status: error.status })
