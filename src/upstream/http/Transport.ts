/**
 * The HTTP transport shared by every HTTP upstream kind: one undici `Pool` per provider origin,
 * requests sent with the low-level `dispatch` API (no body Readable, no header objects beyond one
 * parse), bounded bodies, and transport failures mapped to `UpstreamError`. The streamed chat call on
 * top of it (undici handler, watchdogs, decoding) is `ChatCall.ts`; a buffered request (embeddings) is
 * `HttpTransport.request` below.
 *
 * `connect_ms` is the socket (and TLS) connect timeout of the pool, real time only; the first-token,
 * idle and total timeouts are the chat call's watchdog on the Effect clock. The pool's own
 * `headersTimeout` / `bodyTimeout` are only backstops for abandoned requests.
 */
import { Duration, Effect } from "effect"
import { type buildConnector, type Dispatcher, Pool } from "undici"
import type { Timeouts } from "../../config/GatewayConfig.js"
import { UpstreamError } from "../Upstream.js"
import type { HttpRequest } from "./Codec.js"

/** Error bodies are read up to this size for the message (the rest is not read). */
export const MAX_ERROR_BODY = 64 * 1024
/** A whole (non-streamed) answer larger than this is a protocol error. */
export const MAX_JSON_BODY = 64 * 1024 * 1024
/** The `code` of the address guard's refusal at connect time (BYOK user origins): an `address` failure. */
export const ADDRESS_REFUSED = "WS_ADDRESS_REFUSED"

/** The reason given to undici when the gateway gives up on a request. */
export const ABORTED = new Error("request interrupted by the gateway")

const codeOf = (error: Error): string | undefined => {
  const code = (error as { code?: unknown }).code ?? (error.cause as { code?: unknown } | undefined)?.code
  return typeof code === "string" ? code : undefined
}

/** An undici failure: connect timeout, pool backstop timeouts, refused / dropped before or after the headers. */
export const transportError = (error: Error, gotHeaders: boolean, connectMs: number): UpstreamError => {
  const code = codeOf(error)
  const what = `${code ?? error.name}: ${error.message}`
  if (code === ADDRESS_REFUSED) return new UpstreamError({ kind: "address", detail: error.message })
  if (code === "UND_ERR_CONNECT_TIMEOUT") {
    return new UpstreamError({ kind: "timeout", detail: `connect timed out after ${connectMs} ms (${what})` })
  }
  if (code === "UND_ERR_HEADERS_TIMEOUT" || code === "UND_ERR_BODY_TIMEOUT") {
    return new UpstreamError({ kind: "timeout", detail: what })
  }
  return gotHeaders
    ? new UpstreamError({ kind: "protocol", detail: `connection lost mid-answer (${what})` })
    : new UpstreamError({ kind: "connect", detail: `could not get an answer (${what})` })
}

export const headerText = (value: string | Array<string> | undefined): string =>
  value === undefined ? "" : typeof value === "string" ? value : value.join(",")

export class HttpTransport {
  readonly pool: Pool

  /**
   * `connector`: replaces undici's socket connector (BYOK's address guard checks every resolved address at
   * connect time); it owns the connect timeout then.
   */
  constructor(origin: string, connections: number, readonly timeouts: Timeouts, connector?: buildConnector.connector) {
    this.pool = new Pool(origin, {
      connections,
      pipelining: 1,
      connect: connector ?? { timeout: timeouts.connect_ms },
      // The chat call's watchdog owns first-token and idle timeouts; these are backstops for abandoned requests.
      headersTimeout: timeouts.total_ms,
      bodyTimeout: timeouts.idle_ms + 1_000,
      keepAliveTimeout: 30_000
    })
  }

  dispatch(request: HttpRequest, handler: Dispatcher.DispatchHandler): void {
    this.pool.dispatch(request, handler)
  }

  /**
   * One buffered request: the status and the body text (bounded by `MAX_JSON_BODY`), its headers within
   * `first_token_ms` and the whole within `total_ms` on the Effect clock (`what` names the answer in the timeout's detail). Interruption aborts the request.
   */
  request(
    request: HttpRequest,
    what = "answer"
  ): Effect.Effect<{ readonly status: number; readonly text: string }, UpstreamError> {
    const totalMs = this.timeouts.total_ms
    return Effect.callback<{ status: number; text: string }, UpstreamError>((resume) => {
      const call = new BufferCall(this.timeouts.connect_ms, (result) =>
        resume(result instanceof UpstreamError ? Effect.fail(result) : Effect.succeed(result)))
      // The answer's headers within `first_token_ms`, as for a non-streamed chat call (real time: undici's timer).
      this.pool.dispatch({ ...request, headersTimeout: this.timeouts.first_token_ms }, call)
      return Effect.sync(() => call.abort())
    }).pipe(
      Effect.timeoutOrElse({
        duration: Duration.millis(totalMs),
        orElse: () => Effect.fail(new UpstreamError({ kind: "timeout", detail: `${what} took longer than ${totalMs} ms` }))
      })
    )
  }

  /** Closes the pool: lets in-flight requests finish for up to `grace`, then destroys it. */
  close(grace: Duration.Input = "5 seconds"): Effect.Effect<void> {
    const pool = this.pool
    return Effect.promise(() => pool.close()).pipe(
      Effect.timeout(grace),
      Effect.catch(() => Effect.promise(() => pool.destroy())),
      Effect.ignore
    )
  }
}

/** The undici handler of a buffered request. */
class BufferCall implements Dispatcher.DispatchHandler {
  private controller: Dispatcher.DispatchController | undefined = undefined
  private closed = false
  private ended = false
  private status = 0
  private body: Array<Buffer> = []
  private size = 0

  constructor(
    private readonly connectMs: number,
    private readonly callback: (result: { status: number; text: string } | UpstreamError) => void
  ) {}

  onRequestStart(controller: Dispatcher.DispatchController): void {
    this.controller = controller
    if (this.closed) controller.abort(ABORTED)
  }

  onResponseStart(_controller: Dispatcher.DispatchController, status: number): void {
    if (status >= 200) this.status = status
  }

  onResponseData(controller: Dispatcher.DispatchController, chunk: Buffer): void {
    if (this.closed) return
    this.size += chunk.length
    const failed = this.status < 200 || this.status >= 300
    if (this.size <= (failed ? MAX_ERROR_BODY : MAX_JSON_BODY)) return void this.body.push(chunk)
    // Past the bound: answer now (an error with what was read, else too large) and stop reading a body that may
    // never end.
    this.closed = true
    controller.abort(ABORTED)
    this.callback(
      failed
        ? { status: this.status, text: Buffer.concat(this.body).toString("utf8") }
        : new UpstreamError({ kind: "protocol", detail: "answer too large" })
    )
  }

  onResponseEnd(): void {
    this.ended = true
    if (this.closed) return
    this.callback({ status: this.status, text: Buffer.concat(this.body).toString("utf8") })
  }

  onResponseError(_controller: Dispatcher.DispatchController, error: Error): void {
    this.ended = true
    if (this.closed) return
    this.callback(transportError(error, this.status !== 0, this.connectMs))
  }

  abort(): void {
    this.closed = true
    if (!this.ended) this.controller?.abort(ABORTED)
  }
}
