import { Context, Data, type Effect } from "effect"
import type * as Wire from "../wire/ChatSchemas.js"

// The message and tool types are derived from the schemas that validate the client's request
// (src/wire/ChatSchemas.ts), so what is validated is what adapters receive, without casts.
export type ContentPart = typeof Wire.ContentPart.Type
export type ToolCall = typeof Wire.ToolCall.Type
/** A chat message as the gateway forwards it (the spec's Message shape, already validated). */
export type Message = typeof Wire.Message.Type
export type ToolDefinition = typeof Wire.ToolDefinition.Type
export type ToolChoice = typeof Wire.ToolChoice.Type
export type ReasoningEffort = typeof Wire.ReasoningEffort.Type

/** What an adapter receives: only contract fields, `model` already mapped to the upstream id. */
export interface UpstreamRequest {
  readonly model: string
  readonly messages: ReadonlyArray<Message>
  /** Whether the adapter should ask the upstream for a streamed answer. */
  readonly stream: boolean
  /** Output cap. Always set for catalog models (clamped); a BYOK request sends only what the client asked. */
  readonly max_tokens?: number
  readonly temperature?: number
  readonly top_p?: number
  readonly stop?: string | ReadonlyArray<string>
  readonly reasoning_effort?: ReasoningEffort
  readonly tools?: ReadonlyArray<ToolDefinition>
  readonly tool_choice?: ToolChoice
  readonly parallel_tool_calls?: boolean
}

export interface Usage {
  readonly prompt_tokens: number
  readonly completion_tokens: number
  readonly reasoning_tokens: number
  readonly cached_tokens: number
}

export type FinishReason = "stop" | "length" | "tool_calls"

/**
 * Normalized events. Order guaranteed by adapters: reasoning before content/tool calls,
 * `ToolCallStart` before that call's `ToolCallArgs`, `Finish` then `Usage` last (Usage may be absent).
 * Tool call ids are already `call_` + 32 hex.
 */
export type UpstreamEvent =
  | { readonly _tag: "Reasoning"; readonly text: string }
  | { readonly _tag: "Content"; readonly text: string }
  | { readonly _tag: "ToolCallStart"; readonly index: number; readonly id: string; readonly name: string }
  | { readonly _tag: "ToolCallArgs"; readonly index: number; readonly fragment: string }
  | { readonly _tag: "Finish"; readonly reason: FinishReason }
  | { readonly _tag: "Usage"; readonly usage: Usage }

/**
 * Why an upstream call failed.
 * - `connect`: could not connect (503 service_unavailable)
 * - `timeout`: connect / first token / idle / total timeout (503 upstream_timeout)
 * - `rate_limited`: upstream answered 429 (503 upstream_rate_limited, retryable)
 * - `status`: upstream answered another non-2xx
 * What each means for the client, for failover and for health is decided in one place: `./Failure.ts`.
 * - `protocol`: unparseable answer (500 upstream_error)
 * - `address`: the BYOK address guard refused the connection (where a user's URL leads; 400 address_not_allowed)
 */
export class UpstreamError extends Data.TaggedError("UpstreamError")<{
  readonly kind: "connect" | "timeout" | "rate_limited" | "status" | "protocol" | "address"
  readonly status?: number
  readonly detail: string
  /** Usage the upstream had reported before the failure (a stream cut after its usage chunk). */
  readonly usage?: Usage
  /** The upstream's `Retry-After` (a 429), in milliseconds. */
  readonly retryAfterMs?: number
}> {}

/**
 * The consumer side of a push-based streamed call (`UpstreamAdapter.open`): plain callbacks, called
 * synchronously from the adapter's I/O or timer callbacks, never from inside `open`'s Effect.
 *
 * - Batches are non-empty and in order; `onEnd` / `onError` come after the last batch.
 * - Exactly one of `onEnd` / `onError` is called, once, unless the call was aborted first; nothing
 *   is called after it, nor after `abort()`.
 * - No callback is made while the consumer is paused: after `open` resolves (until the first
 *   `resume()`) and after `onEvents` returned false (until the next `resume()`). Events, the end
 *   or a failure that arrive meanwhile are held and delivered, in that order, from `resume()`.
 * - Callbacks must not throw. If one does, the call is aborted and the exception logged (as a
 *   defect on the fiber that opened the call).
 */
export interface UpstreamSink {
  /**
   * A batch of events (usually one upstream socket read's worth). Return false when backed up: the
   * adapter stops reading the upstream socket (at most the data already read is buffered) and makes
   * no further callback until `call.resume()`.
   */
  onEvents(events: ReadonlyArray<UpstreamEvent>): boolean
  /** The answer is complete; all its events were delivered (in `first` and `onEvents`). */
  onEnd(): void
  /** A failure after `open` resolved: idle / total timeout, connection lost, protocol error. */
  onError(error: UpstreamError): void
}

/** A streamed call opened by `UpstreamAdapter.open`. Its functions may be passed detached. */
export interface UpstreamCall {
  /**
   * The events available when `open` resolved, in order, at least one. Later events go to the sink,
   * starting from the first `resume()`.
   */
  readonly first: ReadonlyArray<UpstreamEvent>
  /**
   * The consumer is ready for more: delivers what was held since it paused (possibly synchronously,
   * from inside this call) and resumes reading the upstream socket. Must be called once after
   * handling `first` to receive anything else. Called from inside `onEvents`, it cancels that
   * call's false return. Otherwise a no-op when not paused, after the end, or after abort.
   */
  readonly resume: () => void
  /**
   * Gives up on the call: closes the upstream socket unless the answer already arrived completely,
   * stops the timers, and no sink callback is made after it returns. Idempotent; a no-op after
   * `onEnd` / `onError`.
   */
  readonly abort: () => void
}

/**
 * The upstream port: what every upstream kind (openai-compatible, anthropic, simulated) implements. The
 * non-streaming `complete` is derived from `open` once, in `./Complete.ts`; tests that want an Effect Stream
 * derive one from `open` too (`test/support/UpstreamStream.ts`).
 */
export interface UpstreamAdapter {
  /**
   * Push-based streaming: sends the request and resolves once the first events are available, with
   * them in `call.first`; fails with the `UpstreamError` when the call fails before any event
   * (connect, non-2xx status, first-token timeout, dropped before an event, ...), so the caller can
   * still answer with a JSON error. Interrupting it before it resolves aborts the upstream request.
   * An HTTP upstream is asked for a streamed answer only if `request.stream` is true; otherwise `open`
   * resolves once the whole answer has been read, with all of it in `first`, and the end follows at the
   * first `resume()` (the simulated upstream paces its answer either way).
   *
   * After it resolves the call is paused: the caller handles `first`, then calls `call.resume()` to
   * receive the rest through `sink` (see `UpstreamSink` for the ordering guarantees). The caller owns
   * the call from then on and must end it with `abort()` if it stops listening before `onEnd` /
   * `onError` -- e.g. acquire it with `Effect.uninterruptibleMask((restore) => restore(open(..)).pipe(
   * Effect.tap((call) => Scope.addFinalizer(scope, Effect.sync(call.abort)))))` so that an
   * interruption right after resolution cannot leak it.
   *
   * Timeouts (first token, idle, total) follow the opening fiber's `Clock`, so `TestClock` drives them.
   */
  readonly open: (request: UpstreamRequest, sink: UpstreamSink) => Effect.Effect<UpstreamCall, UpstreamError>
  /** Embeddings: one vector per input. */
  readonly embed: (model: string, input: ReadonlyArray<string>) => Effect.Effect<
    { readonly vectors: ReadonlyArray<ReadonlyArray<number>>; readonly prompt_tokens: number },
    UpstreamError
  >
}

/** Resolves a catalog provider name to its adapter; adapters are cached per provider config. */
export class Upstreams extends Context.Service<Upstreams, {
  readonly get: (provider: string) => Effect.Effect<UpstreamAdapter, UpstreamError>
}>()("wellspring/upstream/Upstreams") {}
