/**
 * A wire codec: what one client protocol (chat completions, Anthropic Messages, OpenAI Responses) contributes to
 * the one inference pipeline (Pipeline.ts). The pipeline owns everything else: authentication, the exchange and
 * its row, the catalog gates, admission, the upstream call, settling; a codec only translates at the edge. It
 * reads the exchange through `ExchangeView` and counts a stream's output through `AnswerMeter`, nothing more.
 */
import type { Effect } from "effect"
import type { HttpServerResponse } from "effect/http"
import type { LimitsConfig } from "../config/GatewayConfig.js"
import type { GatewayError } from "../errors/Catalog.js"
import type { UpstreamEvent } from "../upstream/Upstream.js"
import type { ChatRequest } from "./ChatRequest.js"
import type { Answer } from "./ChatWire.js"
import type { AnswerMeter, ExchangeView } from "./Exchange.js"
import type { receipt } from "./Receipt.js"

/** The `wellspring` receipt block of a settled request. */
export type Receipt = ReturnType<typeof receipt>

/** A decoded request in the internal (chat) form. */
export interface Decoded {
  readonly request: ChatRequest
  /** Top-level fields the client sent that the gateway drops (named in `x-wellspring-ignored-fields`). */
  readonly ignored?: ReadonlyArray<string>
  /**
   * `request.reasoning_effort` is a preference (Anthropic's `thinking` budget, Responses' efforts): the pipeline
   * replaces it with the model's nearest allowed effort (dropped when the model has none) instead of answering
   * `invalid_reasoning_effort`.
   */
  readonly effortPreference?: boolean
}

/** What a successful answer carries besides its body. */
export interface Delivery {
  /** The `wellspring` receipt, or null when the settlement is unknown. */
  readonly receipt: Receipt | null
  /** Quota and request-id headers (plus the pipeline's own, such as ignored fields). */
  readonly headers: Readonly<Record<string, string>>
}

/** The SSE frames of one streamed answer. Frames are complete SSE events, each ending with a blank line. */
export interface StreamFraming {
  /** Written before the first events. */
  readonly head: string
  /** The frames of one batch of upstream events (may be empty); counts delivered output and usage on the meter. */
  readonly frames: (events: ReadonlyArray<UpstreamEvent>) => string
  /** The closing frames, once the exchange has settled. */
  readonly last: (receipt: Receipt | null) => string
  /** Written just before the connection is cut on a mid-stream failure (empty: nothing). */
  readonly failed: (error: GatewayError) => string
}

export interface WireCodec {
  /** The request row's `api` (`chat`, `messages`, `responses`). */
  readonly api: string
  /** Accept `x-api-key` as the key when there is no `Authorization` header (Anthropic clients). */
  readonly xApiKey?: boolean
  /** The error envelope, with the status and retry headers of the error. */
  readonly render: (error: GatewayError) => HttpServerResponse.HttpServerResponse
  /**
   * The bounded parsed body to the internal request, or the error to answer. An Effect, so a codec may load
   * state (a stored previous response).
   */
  readonly decode: (body: unknown, exchange: ExchangeView, limits: LimitsConfig) => Effect.Effect<Decoded, GatewayError>
  /** The non-stream response of a completed exchange (the body shape is the codec's). */
  readonly answer: (exchange: ExchangeView, answer: Answer, delivery: Delivery) => HttpServerResponse.HttpServerResponse
  /** The framing of a streamed answer; its frames count delivered output and usage on `meter`. */
  readonly stream: (exchange: ExchangeView, meter: AnswerMeter) => StreamFraming
  /** The frame written while the upstream is idle. */
  readonly ping: string
  /**
   * Called with the whole answer once a request succeeded (before the non-stream body, or before a stream's
   * closing frames). Must not fail: what it cannot do it logs.
   */
  readonly completed?: (exchange: ExchangeView, answer: Answer) => Effect.Effect<void>
}

/** At most this many ignored field names go in the header. */
export const MAX_IGNORED_NAMES = 16
export const FIELD_NAME = /^[A-Za-z0-9_.-]{1,64}$/u

/** The top-level fields dropped, names only (a name that is not a plain identifier is not echoed). */
export const ignoredFields = (body: Record<string, unknown>, honoured: ReadonlySet<string>): Array<string> => {
  const out: Array<string> = []
  let unnamed = false
  for (const key of Object.keys(body)) {
    if (honoured.has(key)) continue
    if (!FIELD_NAME.test(key)) {
      unnamed = true
      continue
    }
    if (out.length < MAX_IGNORED_NAMES) out.push(key)
  }
  if (unnamed) out.push("(unnamed)")
  return out
}

