/**
 * An HTTP chat adapter is a codec over the shared transport (`Transport.ts`) and the shared push-call
 * state machine (`../PushCall.ts`); `openChat` (`ChatCall.ts`) puts the three together into
 * `UpstreamAdapter.open`. The codec is the wire format and nothing else: no I/O, no timers, no Effect.
 *
 * - `encode`: `UpstreamRequest` -> the HTTP request (path under the provider's origin, headers with the
 *   credential and an `accept` chosen by `request.stream`, body text), or an `UpstreamError` when the
 *   request cannot be expressed in the format (the call then fails without sending anything). Ask for
 *   a streamed answer only when `request.stream` is true.
 * - `decoder(request)`: a fresh `ChatDecoder` per call, fed by the transport: one SSE `data` payload at a time
 *   (`text/event-stream` answers, see `Sse.ts`), or the parsed JSON body of any other 2xx answer.
 * - `statusError`: a non-2xx answer (status and body text, the body bounded by the transport) ->
 *   `UpstreamError` (429 -> `rate_limited`, otherwise `status` with the upstream's message, bounded).
 * - `redact` (optional): removes secrets from upstream text the transport quotes (an unparseable body, a skipped
 *   frame), before it is bounded.
 *
 * The transport owns everything else: connections, the connect / first-token / idle / total timeouts,
 * back-pressure, abort, bounded bodies, transport errors (`connect`, `timeout`, dropped mid-answer).
 */
import type { Redactor } from "../../telemetry/LogText.js"
import type { UpstreamError, UpstreamEvent, UpstreamRequest, Usage } from "../Upstream.js"

/** What the transport sends: passed to undici as is (no copy). */
export interface HttpRequest {
  readonly method: "POST"
  /** Absolute path on the provider's origin, e.g. `/v1/chat/completions`. */
  readonly path: string
  readonly headers: Readonly<Record<string, string>>
  readonly body: string
}

/**
 * Decodes one answer into normalized `UpstreamEvent`s (in the order `UpstreamEvent` documents). The
 * transport reads its fields after each call to a method.
 */
export interface ChatDecoder {
  /** Events decoded and not taken yet. The transport takes them by replacing the array with `[]`. */
  events: Array<UpstreamEvent>
  /** An error reported inside a 2xx answer (an error frame / event): the call fails with it. */
  readonly error: UpstreamError | undefined
  /** The answer said it is complete (e.g. `[DONE]`, `message_stop`): the transport calls `end()`. */
  readonly sawDone: boolean
  /** Usage reported so far; attached to a failure that comes after it. */
  readonly usage: Usage | undefined
  /**
   * Frames skipped as undecodable so far, and the last one (whole: the transport redacts and bounds it), for a
   * warning log. Absent for a decoder that fails the answer on an undecodable frame instead.
   */
  readonly skipped?: number
  readonly lastSkipped?: string
  /** One SSE event's `data` (multi-line data joined with `\n`). Must not throw. */
  onData(data: string): void
  /** The whole body of a non-streamed answer, parsed; all its events, `Finish` and `Usage` included, or the reason it is not one. */
  onJson(body: unknown): UpstreamError | undefined
  /** The stream is over (`sawDone` or end of body): flushes what is pending, `Finish` and `Usage`, or says why the answer is incomplete. */
  end(): UpstreamError | undefined
}

export interface ChatCodec {
  readonly encode: (request: UpstreamRequest) => HttpRequest | UpstreamError
  readonly decoder: (request: UpstreamRequest) => ChatDecoder
  readonly statusError: (status: number, body: string) => UpstreamError
  readonly redact?: Redactor
}
