/**
 * `UpstreamRequest` -> an OpenAI chat-completions request body. Only contract fields are forwarded
 * (`model` is already the upstream's id); the gateway's own `reasoning` on assistant messages is not.
 */
import type { Message, UpstreamRequest } from "../Upstream.js"

/** Assistant `reasoning` is ours, not the wire format's: strip it before forwarding. */
const upstreamMessages = (messages: ReadonlyArray<Message>): ReadonlyArray<Message> => {
  for (let i = 0; i < messages.length; i++) {
    const m = messages[i]!
    if (m.role === "assistant" && m.reasoning !== undefined) {
      return messages.map((m) => {
        if (m.role !== "assistant" || m.reasoning === undefined) return m
        const { reasoning: _, ...rest } = m
        return rest
      })
    }
  }
  return messages
}

const INCLUDE_USAGE = { include_usage: true } as const

/** Only contract fields are forwarded; the tool options only with a non-empty `tools`. */
export const encodeChatRequest = (
  r: UpstreamRequest,
  maxTokensField: "max_tokens" | "max_completion_tokens" = "max_tokens"
): string => {
  const body: Record<string, unknown> = { model: r.model, messages: upstreamMessages(r.messages), stream: r.stream }
  if (r.stream) body.stream_options = INCLUDE_USAGE
  if (r.max_tokens !== undefined) body[maxTokensField] = r.max_tokens
  if (r.temperature !== undefined) body.temperature = r.temperature
  if (r.top_p !== undefined) body.top_p = r.top_p
  if (r.stop !== undefined) body.stop = r.stop
  if (r.reasoning_effort !== undefined) body.reasoning_effort = r.reasoning_effort
  // OpenAI-compatible servers reject tool_choice / parallel_tool_calls without tools.
  if (r.tools !== undefined && r.tools.length > 0) {
    body.tools = r.tools
    if (r.tool_choice !== undefined) body.tool_choice = r.tool_choice
    if (r.parallel_tool_calls !== undefined) body.parallel_tool_calls = r.parallel_tool_calls
  }
  return JSON.stringify(body)
}

/** The embeddings request body: float vectors (base64 answers are decoded too). */
export const encodeEmbeddingsRequest = (model: string, input: ReadonlyArray<string>): string =>
  JSON.stringify({ model, input, encoding_format: "float" })

/** Request headers: a JSON body, `accept`, and the API key as a bearer token when there is one. */
export const requestHeaders = (
  apiKey: string | undefined,
  accept: "text/event-stream" | "application/json"
): Readonly<Record<string, string>> =>
  apiKey !== undefined && apiKey !== ""
    ? { "content-type": "application/json", accept, authorization: `Bearer ${apiKey}` }
    : { "content-type": "application/json", accept }
