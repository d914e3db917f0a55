import { Context, Data, type Effect, type Stream } from "effect"

/** A chat message as the gateway forwards it (the spec's Message shape, already validated). */
export type ContentPart =
  | { readonly type: "text"; readonly text: string }
  | { readonly type: "image_url"; readonly image_url: { readonly url: string; readonly detail?: "auto" | "low" | "high" } }

export interface ToolCall {
  readonly id: string
  readonly type: "function"
  readonly function: { readonly name: string; readonly arguments: string }
}

export type Message =
  | { readonly role: "system"; readonly content: string | ReadonlyArray<ContentPart> }
  | { readonly role: "user"; readonly content: string | ReadonlyArray<ContentPart> }
  | {
    readonly role: "assistant"
    readonly content: string | null
    readonly tool_calls?: ReadonlyArray<ToolCall>
    readonly reasoning?: string
  }
  | { readonly role: "tool"; readonly tool_call_id: string; readonly content: string }

export interface ToolDefinition {
  readonly type: "function"
  readonly function: {
    readonly name: string
    readonly description?: string
    readonly parameters?: Readonly<Record<string, unknown>>
    readonly strict?: boolean
  }
}

export type ToolChoice =
  | "auto"
  | "required"
  | "none"
  | { readonly type: "function"; readonly function: { readonly name: string } }

/** What an adapter receives: only contract fields, `model` already mapped to the upstream id. */
export interface UpstreamRequest {
  readonly model: string
  readonly messages: ReadonlyArray<Message>
  /** Whether the adapter should ask the upstream for a streamed answer. */
  readonly stream: boolean
  readonly max_tokens: number
  readonly temperature?: number
  readonly top_p?: number
  readonly stop?: string | ReadonlyArray<string>
  readonly reasoning_effort?: "none" | "low" | "high" | "max"
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
 * - `status`: upstream answered another non-2xx (5xx -> 500 upstream_error; 4xx -> 500 upstream_rejected)
 * - `protocol`: unparseable answer (500 upstream_error)
 */
export class UpstreamError extends Data.TaggedError("UpstreamError")<{
  readonly kind: "connect" | "timeout" | "rate_limited" | "status" | "protocol"
  readonly status?: number
  readonly detail: string
}> {}

export interface UpstreamAdapter {
  /** Interrupting the stream must abort the upstream HTTP request (socket closed). */
  readonly chat: (request: UpstreamRequest) => Stream.Stream<UpstreamEvent, UpstreamError>
  /** Embeddings: one vector per input. */
  readonly embed: (model: string, input: ReadonlyArray<string>) => Effect.Effect<
    { readonly vectors: ReadonlyArray<ReadonlyArray<number>>; readonly prompt_tokens: number },
    UpstreamError
  >
}

/** Resolves a catalog provider name to its adapter; adapters are cached per provider config. */
export class Upstreams extends Context.Tag("wellspring/upstream/Upstreams")<Upstreams, {
  readonly get: (provider: string) => Effect.Effect<UpstreamAdapter, UpstreamError>
}>() {}
