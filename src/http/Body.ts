/**
 * The one reader of request bodies. Every route that takes a body calls `readJson` (or `readJsonWith`) after it
 * has authenticated the caller and checked the account's status, and nothing else in `src/` reads a body
 * (test/edge/hostile-routes.test.ts checks both: it sends hostile bodies to every registered route, and refuses
 * any other body read in the source). In order:
 * - the content type: a JSON body may come as JSON (`application/json`, `application/<anything>+json`), `text/plain`, curl's
 *   default `application/x-www-form-urlencoded`, or with none; anything else is 415 `unsupported_content_type`
 *   before a byte is read;
 * - the size, bounded while it is read: a declared `Content-Length` over the limit is refused before a byte of the
 *   body is read, and a chunked (or lying) body is counted as it arrives and abandoned at the limit. Refusals
 *   leave the rest of the body unread; the server answers them with `Connection: close` (see Server.ts) so Node
 *   does not drain it;
 * - UTF-8, decoded chunk by chunk (invalid: 400 `invalid_json`);
 * - the nesting depth, scanned piece by piece as the body arrives (400 `invalid_request` at the first piece past
 *   it, the rest left unread), then the parse (400 `invalid_json`).
 */
import { NodeHttpServerRequest } from "@effect/platform-node"
import { Context, Effect } from "effect"
import type { HttpServerRequest } from "effect/http"
import type * as Http from "node:http"
import { fail, GatewayError } from "../errors/Catalog.js"
import { makeDepthScanner, parseScannedJson, tooDeep } from "./Json.js"
import { headersOf } from "./Respond.js"

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
/** What a bounded read does with the chunks: null to go on, or the error that ends the read. */
interface Sink<A> {
  readonly push: (chunk: Buffer) => GatewayError | null
  readonly finish: () => GatewayError | A
  readonly empty: A
}

/**
 * Reads the body into `sink`, at most `limitBytes`: 413 `payload_too_large` past it (a declared length before a
 * byte is read). Each chunk is handled as it arrives, so no event-loop turn works on more than one socket chunk.
 */
const readBounded = <A>(
  request: HttpServerRequest.HttpServerRequest,
  limitBytes: number,
  makeSink: () => Sink<A>
): Effect.Effect<A, GatewayError> =>
  Effect.suspend(() => {
    // HTTP/1.1 only (our own `http.createServer`), so always an `IncomingMessage`.
    const incoming = NodeHttpServerRequest.toIncomingMessage(request) as Http.IncomingMessage
    if (declaredOver(incoming.headers, limitBytes)) return Effect.fail(tooLarge(limitBytes))
    const sink = makeSink()
    if (incoming.readableEnded) return Effect.succeed(sink.empty)
    // `resume` only: declaring a second (`signal`) parameter makes v4 allocate an AbortController per call.
    return Effect.callback<A, GatewayError>((resume) => {
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
        resume(Effect.fail(error))
      }
      const onData = (chunk: Buffer) => {
        bytes += chunk.length
        if (bytes > limitBytes) return refuse(tooLarge(limitBytes))
        const error = sink.push(chunk)
        if (error !== null) refuse(error)
      }
      const onEnd = () => {
        stop()
        const result = sink.finish()
        resume(result instanceof GatewayError ? Effect.fail(result) : Effect.succeed(result))
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

/**
 * The body as text: invalid UTF-8 is 400 `invalid_json` (never a replacement character); with `maxDepth`, JSON
 * nested deeper is 400 `invalid_request` as soon as the piece that passes it arrives.
 */
const readBoundedText = (request: HttpServerRequest.HttpServerRequest, limitBytes: number, maxDepth?: number) =>
  readBounded(request, limitBytes, (): Sink<string> => {
    const decoder = new TextDecoder("utf-8", { fatal: true })
    const deeper = maxDepth === undefined ? null : makeDepthScanner(maxDepth)
    const parts: Array<string> = []
    return {
      empty: "",
      push: (chunk) => {
        let text: string
        try {
          text = decoder.decode(chunk, { stream: true })
        } catch {
          parts.length = 0
          return invalidUtf8()
        }
        if (deeper !== null && deeper(text)) {
          parts.length = 0
          return tooDeep(maxDepth!)
        }
        parts.push(text)
        return null
      },
      finish: () => {
        let rest: string
        try {
          rest = decoder.decode()
        } catch {
          return invalidUtf8()
        }
        if (deeper !== null && deeper(rest)) return tooDeep(maxDepth!)
        parts.push(rest)
        return parts.length === 1 ? parts[0]! : parts.join("")
      }
    }
  })

/**
 * A binary body (a worker's PNG) of one of `contentTypes`, at most `maxBytes`: 415 for another type, 413 past
 * the bound. Like `readJson`, call it only once the caller is authenticated.
 */
export const readBytes = (
  request: HttpServerRequest.HttpServerRequest,
  options: { readonly maxBytes: number; readonly contentTypes: ReadonlyArray<string> }
): Effect.Effect<Uint8Array, GatewayError> => {
  const header = headersOf(request)["content-type"]
  const type = typeof header === "string" ? header.split(";", 1)[0]!.trim().toLowerCase() : ""
  if (!options.contentTypes.includes(type)) {
    return Effect.fail(fail("unsupported_content_type", { message: `요청 본문은 ${options.contentTypes.join(", ")} 이어야 합니다.` }))
  }
  return readBounded(request, options.maxBytes, (): Sink<Uint8Array> => {
    const parts: Array<Buffer> = []
    return {
      empty: new Uint8Array(0),
      push: (chunk) => {
        parts.push(chunk)
        return null
      },
      finish: () => Buffer.concat(parts)
    }
  })
}

/**
 * Content types a JSON body is read under: none, JSON, `text/plain` and `application/x-www-form-urlencoded`
 * (what `curl -d` sends by default). Multipart, binary and every other type are refused unread.
 */
export const acceptsContentType = (header: string | ReadonlyArray<string> | undefined): boolean => {
  if (header === undefined) return true
  if (typeof header !== "string") return false
  const type = header.split(";", 1)[0]!.trim().toLowerCase()
  return type === "" || type === "application/json" || type === "text/plain" ||
    type === "application/x-www-form-urlencoded" || (type.startsWith("application/") && type.endsWith("+json"))
}

/** The bounds of a JSON body (the config's `limits` has them). */
export interface BodyLimitsShape {
  /** Largest body. */
  readonly body_bytes: number
  /** Deepest nesting of objects and arrays. */
  readonly json_depth: number
}

/** The bounds `readJson` applies; provided from the config's `limits` by `config/Live.ts`. */
export class BodyLimits extends Context.Service<BodyLimits, BodyLimitsShape>()("wellspring/http/BodyLimits") {}

export interface JsonBodyOptions {
  /** A tighter bound than `limits.body_bytes` for routes that take small bodies. */
  readonly maxBytes?: number
  /** An empty (or all-whitespace) body is `undefined` instead of 400 `invalid_json`. */
  readonly emptyIsAbsent?: boolean
}

/**
 * The body as parsed JSON under `limits` (see the module comment for the order of checks). Call it only after
 * the caller is authenticated and allowed to use the route: until then the body stays on the wire.
 */
export const readJsonWith = (
  request: HttpServerRequest.HttpServerRequest,
  limits: BodyLimitsShape,
  options: JsonBodyOptions = {}
): Effect.Effect<unknown, GatewayError> => {
  if (!acceptsContentType(headersOf(request)["content-type"])) return Effect.fail(fail("unsupported_content_type"))
  const maxBytes = Math.min(options.maxBytes ?? limits.body_bytes, limits.body_bytes)
  return Effect.flatMap(readBoundedText(request, maxBytes, limits.json_depth), (text) =>
    options.emptyIsAbsent === true && text.trim() === ""
      ? Effect.succeed(undefined)
      : parseScannedJson(text))
}

/** `readJsonWith` under the configured bounds (`BodyLimits`). */
export const readJson = (
  request: HttpServerRequest.HttpServerRequest,
  options: JsonBodyOptions = {}
): Effect.Effect<unknown, GatewayError, BodyLimits> =>
  Effect.flatMap(BodyLimits, (limits) => readJsonWith(request, limits, options))
