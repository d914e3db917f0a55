/**
 * The request body, bounded while it is read: a declared `Content-Length` over the limit is refused before a
 * byte of the body is read, and a chunked (or lying) body is counted as it arrives and abandoned at the limit.
 * Refusals leave the rest of the body unread; the server answers them with `Connection: close` (see Server.ts)
 * so Node does not drain it.
 */
import { NodeHttpServerRequest } from "@effect/platform-node"
import { Effect } from "effect"
import type { HttpServerRequest } from "effect/http"
import type * as Http from "node:http"
import { Settings } from "../config/Live.js"
import { fail, type GatewayError } from "../errors/Catalog.js"

const MB = 1024 * 1024

/** `4 MB`, `1.5 MB`, or `512 KB` below one megabyte. */
export const formatLimit = (bytes: number): string =>
  bytes >= MB
    ? `${Number((bytes / MB).toFixed(1))} MB`
    : `${Math.max(1, Math.floor(bytes / 1024))} KB`

export const tooLarge = (limitBytes: number): GatewayError =>
  fail("payload_too_large", { message: `요청 본문이 너무 큽니다. 최대 ${formatLimit(limitBytes)}까지 보낼 수 있습니다.` })

/** The declared length is over the limit (false when absent: the body is then counted while read). */
export const declaredOver = (headers: Readonly<Record<string, string | ReadonlyArray<string> | undefined>>, limitBytes: number) => {
  const raw = headers["content-length"]
  if (typeof raw !== "string") return false
  const declared = Number(raw)
  return Number.isFinite(declared) && declared > limitBytes
}

const invalidUtf8 = () => fail("invalid_json", { message: "요청 본문이 올바른 UTF-8 텍스트가 아닙니다." })

/**
 * The body as text, at most `limitBytes`: 413 `payload_too_large` past it, 400 `invalid_json` for invalid UTF-8
 * (never a replacement character). Each chunk is decoded as it arrives, so no event-loop turn decodes more than
 * one socket chunk, whatever the body size.
 */
export const readBoundedText = (
  request: HttpServerRequest.HttpServerRequest,
  limitBytes: number
): Effect.Effect<string, GatewayError> =>
  Effect.suspend(() => {
    // HTTP/1.1 only (our own `http.createServer`), so always an `IncomingMessage`.
    const incoming = NodeHttpServerRequest.toIncomingMessage(request) as Http.IncomingMessage
    if (declaredOver(incoming.headers, limitBytes)) return Effect.fail(tooLarge(limitBytes))
    if (incoming.readableEnded) return Effect.succeed("")
    // `resume` only: declaring a second (`signal`) parameter makes v4 allocate an AbortController per call.
    return Effect.callback<string, GatewayError>((resume) => {
      const decoder = new TextDecoder("utf-8", { fatal: true })
      const parts: Array<string> = []
      let bytes = 0
      const stop = () => {
        incoming.off("data", onData)
        incoming.off("end", onEnd)
        incoming.off("error", onError)
        incoming.off("close", onClose)
      }
      /** Stops reading; the rest of the body stays on the wire and the connection is closed after the answer. */
      const refuse = (error: GatewayError) => {
        stop()
        incoming.pause()
        parts.length = 0
        resume(Effect.fail(error))
      }
      const onData = (chunk: Buffer) => {
        bytes += chunk.length
        if (bytes > limitBytes) return refuse(tooLarge(limitBytes))
        try {
          parts.push(decoder.decode(chunk, { stream: true }))
        } catch {
          refuse(invalidUtf8())
        }
      }
      const onEnd = () => {
        stop()
        try {
          parts.push(decoder.decode())
        } catch {
          return resume(Effect.fail(invalidUtf8()))
        }
        resume(Effect.succeed(parts.length === 1 ? parts[0]! : parts.join("")))
      }
      const onError = () => {
        stop()
        resume(Effect.fail(fail("invalid_json", { detail: "request body aborted" })))
      }
      const onClose = () => {
        if (!incoming.readableEnded) onError()
      }
      incoming.on("data", onData)
      incoming.once("end", onEnd)
      incoming.once("error", onError)
      incoming.once("close", onClose)
      return Effect.sync(stop)
    })
  })

/** The body as text, bounded by `limits.body_bytes`: 413 past it, 400 `invalid_json` for invalid UTF-8. */
export const readText = (request: HttpServerRequest.HttpServerRequest): Effect.Effect<string, GatewayError, Settings> =>
  Effect.flatMap(Settings, (settings) => readBoundedText(request, settings.config.limits.body_bytes))
