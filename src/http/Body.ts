/**
 * The request body, bounded while it is read: a declared `Content-Length` over the limit is refused before a
 * byte of the body is read, and a chunked (or lying) body is counted as it arrives and abandoned at the limit.
 * Refusals leave the rest of the body unread; the server answers them with `Connection: close` (see Server.ts)
 * so Node does not drain it.
 */
import type { HttpServerRequest } from "@effect/platform"
import { NodeHttpServerRequest } from "@effect/platform-node"
import { Effect } from "effect"
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

/** The raw bytes of the body, at most `limitBytes`; 413 `payload_too_large` past it. */
export const readBytes = (
  request: HttpServerRequest.HttpServerRequest,
  limitBytes: number
): Effect.Effect<Uint8Array, GatewayError> =>
  Effect.suspend(() => {
    const incoming = NodeHttpServerRequest.toIncomingMessage(request)
    if (declaredOver(incoming.headers, limitBytes)) return Effect.fail(tooLarge(limitBytes))
    if (incoming.readableEnded) return Effect.succeed(new Uint8Array(0))
    return Effect.async<Uint8Array, GatewayError>((resume) => {
      const chunks: Array<Buffer> = []
      let bytes = 0
      const stop = () => {
        incoming.off("data", onData)
        incoming.off("end", onEnd)
        incoming.off("error", onError)
        incoming.off("close", onClose)
      }
      const onData = (chunk: Buffer) => {
        bytes += chunk.length
        if (bytes <= limitBytes) return void chunks.push(chunk)
        // Stop reading; the rest of the body stays on the wire and the connection is closed after the 413.
        stop()
        incoming.pause()
        chunks.length = 0
        resume(Effect.fail(tooLarge(limitBytes)))
      }
      const onEnd = () => {
        stop()
        resume(Effect.succeed(chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks, bytes)))
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

const utf8 = new TextDecoder("utf-8", { fatal: true })

/** Strict UTF-8; invalid bytes are a 400, never a replacement character or a crash. */
export const decodeUtf8 = (bytes: Uint8Array): Effect.Effect<string, GatewayError> =>
  Effect.try({
    try: () => utf8.decode(bytes),
    catch: () => fail("invalid_json", { message: "요청 본문이 올바른 UTF-8 텍스트가 아닙니다." })
  })

/** The body as text, bounded by `limits.body_bytes`: 413 past it, 400 `invalid_json` for invalid UTF-8. */
export const readText = (request: HttpServerRequest.HttpServerRequest): Effect.Effect<string, GatewayError, Settings> =>
  Effect.flatMap(Settings, (settings) =>
    Effect.flatMap(readBytes(request, settings.config.limits.body_bytes), decodeUtf8))
