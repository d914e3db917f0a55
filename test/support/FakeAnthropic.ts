/**
 * A fake Anthropic Messages API on 127.0.0.1 (random port): checks the credential and `anthropic-version`,
 * applies a few of Anthropic's request rules, records requests and answers with scripted behaviours shaped like
 * recorded Anthropic traffic (`event: <type>` + `data: <json>` SSE events, `ping`s, empty first deltas, the
 * error envelope).
 *
 *   const fake = await startFakeAnthropic({ apiKey: "sk-ant-test" })
 *   fake.script(FakeBehaviour.message(FakeMessages.text("Hello")))   // streamed or JSON per the request's `stream`
 *   // base URL: fake.url (the path is /v1/messages)
 *   fake.requests                                                      // method, path, headers, parsed body
 *   await fake.close()
 *
 * `script(a, b, c)` answers the next requests with a, b, then c for every request after that. Requests refused by
 * the credential or validation checks do not consume a behaviour.
 */
import * as Http from "node:http"
import type { AddressInfo, Socket } from "node:net"

/** Written to the socket verbatim (no SSE framing). */
export class RawText {
  constructor(readonly text: string) {}
}

/** An event object is sent as `event: <its type>\ndata: <json>\n\n`; `RawText` verbatim. */
export type FakeEvent = RawText | { readonly type: string; readonly [key: string]: unknown }

export type FakeBlock =
  | { readonly type: "text"; readonly text: string }
  | { readonly type: "thinking"; readonly thinking: string; readonly signature?: string }
  | { readonly type: "redacted_thinking"; readonly data: string }
  | { readonly type: "tool_use"; readonly id: string; readonly name: string; readonly input: object }

export interface FakeUsage {
  readonly input_tokens?: number
  readonly output_tokens?: number
  readonly cache_creation_input_tokens?: number
  readonly cache_read_input_tokens?: number
}

export interface FakeMessage {
  readonly content: ReadonlyArray<FakeBlock>
  readonly stop_reason?: string | null
  readonly stop_sequence?: string | null
  readonly usage?: FakeUsage
  readonly model?: string
}

export type FakeBehaviourT =
  /** A whole answer: streamed (deltas of `chunk` characters) when the request asks for a stream, else JSON. */
  | { readonly kind: "message"; readonly message: FakeMessage; readonly chunk?: number }
  /** These SSE events verbatim (200, text/event-stream); then end the response, drop the socket, or hang. */
  | { readonly kind: "events"; readonly events: ReadonlyArray<FakeEvent>; readonly then?: "end" | "drop" | "hang" }
  /** A non-2xx JSON answer before any byte of content. */
  | { readonly kind: "status"; readonly status: number; readonly body: unknown }
  /** Destroy the socket before any headers. */
  | { readonly kind: "drop" }

export const errorBody = (type: string, message: string) => ({
  type: "error",
  error: { type, message },
  request_id: "req_011CfakeRequest0000000000"
})

export const FakeBehaviour = {
  message: (message: FakeMessage, chunk?: number): FakeBehaviourT =>
    chunk === undefined ? { kind: "message", message } : { kind: "message", message, chunk },
  events: (events: ReadonlyArray<FakeEvent>, then: "end" | "drop" | "hang" = "end"): FakeBehaviourT => ({
    kind: "events",
    events,
    then
  }),
  status: (status: number, body: unknown): FakeBehaviourT => ({ kind: "status", status, body }),
  /** Anthropic's error envelope with the status it documents for `type`. */
  error: (status: number, type: string, message: string): FakeBehaviourT => ({
    kind: "status",
    status,
    body: errorBody(type, message)
  }),
  drop: (): FakeBehaviourT => ({ kind: "drop" })
}

// ---------------------------------------------------------------------------------------------
// Event builders (shapes as Anthropic sends them)

const MESSAGE_ID = "msg_01XFDUDYJgAACzvnptvVoYEL"
const MODEL = "claude-fake-4"

export const FakeEvents = {
  messageStart: (usage: FakeUsage = { input_tokens: 25, output_tokens: 1 }, model = MODEL) => ({
    type: "message_start",
    message: {
      id: MESSAGE_ID,
      type: "message",
      role: "assistant",
      model,
      content: [],
      stop_reason: null,
      stop_sequence: null,
      usage
    }
  }),
  blockStart: (index: number, block: FakeBlock) => ({
    type: "content_block_start",
    index,
    content_block: block.type === "text"
      ? { type: "text", text: "" }
      : block.type === "thinking"
      ? { type: "thinking", thinking: "", signature: "" }
      : block.type === "tool_use"
      ? { type: "tool_use", id: block.id, name: block.name, input: {} }
      : block
  }),
  textDelta: (index: number, text: string) => ({
    type: "content_block_delta",
    index,
    delta: { type: "text_delta", text }
  }),
  thinkingDelta: (index: number, thinking: string) => ({
    type: "content_block_delta",
    index,
    delta: { type: "thinking_delta", thinking }
  }),
  signatureDelta: (index: number, signature = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds") => ({
    type: "content_block_delta",
    index,
    delta: { type: "signature_delta", signature }
  }),
  jsonDelta: (index: number, partial_json: string) => ({
    type: "content_block_delta",
    index,
    delta: { type: "input_json_delta", partial_json }
  }),
  blockStop: (index: number) => ({ type: "content_block_stop", index }),
  messageDelta: (stop_reason: string | null, usage: FakeUsage = { output_tokens: 15 }, stop_sequence = null) => ({
    type: "message_delta",
    delta: { stop_reason, stop_sequence },
    usage
  }),
  messageStop: () => ({ type: "message_stop" }),
  ping: () => ({ type: "ping" }),
  error: (type: string, message: string) => ({ type: "error", error: { type, message } })
}

const pieces = (text: string, size: number): Array<string> => {
  const out: Array<string> = []
  for (let i = 0; i < text.length; i += size) out.push(text.slice(i, i + size))
  return out
}

/** The event sequence Anthropic streams for `message`, deltas of `chunk` characters (which split JSON tokens). */
export const streamEvents = (message: FakeMessage, chunk = 5): Array<FakeEvent> => {
  const usage = message.usage ?? { input_tokens: 25, output_tokens: 15 }
  const events: Array<FakeEvent> = [
    FakeEvents.messageStart({
      input_tokens: usage.input_tokens ?? 0,
      ...(usage.cache_creation_input_tokens !== undefined
        ? { cache_creation_input_tokens: usage.cache_creation_input_tokens }
        : {}),
      ...(usage.cache_read_input_tokens !== undefined ? { cache_read_input_tokens: usage.cache_read_input_tokens } : {}),
      output_tokens: 1
    }, message.model)
  ]
  message.content.forEach((block, index) => {
    events.push(FakeEvents.blockStart(index, block))
    if (index === 0) events.push(FakeEvents.ping())
    switch (block.type) {
      case "text":
        for (const p of pieces(block.text, chunk)) events.push(FakeEvents.textDelta(index, p))
        break
      case "thinking":
        for (const p of pieces(block.thinking, chunk)) events.push(FakeEvents.thinkingDelta(index, p))
        events.push(FakeEvents.signatureDelta(index, block.signature))
        break
      case "tool_use":
        // Anthropic opens with an empty fragment, then streams the JSON in pieces that split tokens.
        events.push(FakeEvents.jsonDelta(index, ""))
        for (const p of pieces(JSON.stringify(block.input), chunk)) events.push(FakeEvents.jsonDelta(index, p))
        break
      case "redacted_thinking":
        break
    }
    events.push(FakeEvents.blockStop(index))
  })
  events.push(
    FakeEvents.messageDelta(message.stop_reason ?? "end_turn", { output_tokens: usage.output_tokens ?? 0 }),
    FakeEvents.messageStop()
  )
  return events
}

/** The non-streamed body Anthropic answers for `message`. */
export const messageBody = (message: FakeMessage) => ({
  id: MESSAGE_ID,
  type: "message",
  role: "assistant",
  model: message.model ?? MODEL,
  content: message.content.map((b) => (b.type === "thinking" ? { signature: "EqQBCgIYAhIM", ...b } : b)),
  stop_reason: message.stop_reason ?? "end_turn",
  stop_sequence: message.stop_sequence ?? null,
  usage: message.usage ?? { input_tokens: 25, output_tokens: 15 }
})

export const FakeMessages = {
  text: (text: string, usage?: FakeUsage): FakeMessage => ({
    content: [{ type: "text", text }],
    stop_reason: "end_turn",
    ...(usage ? { usage } : {})
  }),
  thinkingThenText: (thinking: string, text: string, usage?: FakeUsage): FakeMessage => ({
    content: [{ type: "thinking", thinking }, { type: "text", text }],
    stop_reason: "end_turn",
    ...(usage ? { usage } : {})
  }),
  toolUse: (
    calls: ReadonlyArray<{ readonly id: string; readonly name: string; readonly input: object }>,
    text?: string
  ): FakeMessage => ({
    content: [
      ...(text !== undefined ? [{ type: "text" as const, text }] : []),
      ...calls.map((c) => ({ type: "tool_use" as const, ...c }))
    ],
    stop_reason: "tool_use"
  })
}

// ---------------------------------------------------------------------------------------------
// The server

export interface FakeRequest {
  readonly method: string
  readonly path: string
  readonly headers: Http.IncomingHttpHeaders
  /** Parsed JSON body, or the raw text when it is not JSON. */
  readonly body: any
}

export interface FakeAnthropic {
  /** Base URL (origin); requests go to `${url}/v1/messages`. */
  readonly url: string
  readonly script: (...behaviours: ReadonlyArray<FakeBehaviourT>) => void
  /** Every request received, refused ones included. */
  readonly requests: Array<FakeRequest>
  readonly close: () => Promise<void>
}

export interface FakeAnthropicOptions {
  /** The only credential accepted. Default `sk-ant-fake-0123456789`. */
  readonly apiKey?: string
  /** Where the credential is expected: `x-api-key` (default) or `Authorization: Bearer`. */
  readonly scheme?: "x-api-key" | "bearer"
}

const frame = (event: FakeEvent): string =>
  event instanceof RawText ? event.text : `event: ${event.type}\ndata: ${JSON.stringify(event)}\n\n`

/** Some of the rules Anthropic enforces on a request: the first one broken, or undefined. */
const invalid = (body: any): string | undefined => {
  if (typeof body !== "object" || body === null) return "body must be a JSON object"
  if (typeof body.model !== "string" || body.model.length === 0) return "model: Field required"
  if (!Number.isInteger(body.max_tokens) || body.max_tokens < 1) return "max_tokens: Field required"
  if (!Array.isArray(body.messages)) return "messages: Field required"
  let previous: string | undefined
  for (const [i, m] of body.messages.entries()) {
    if (m?.role !== "user" && m?.role !== "assistant") return `messages.${i}.role: Input should be 'user' or 'assistant'`
    if (m.role === previous) return `messages.${i}: roles must alternate between "user" and "assistant"`
    previous = m.role
    if (Array.isArray(m.content)) {
      if (m.content.length === 0) return `messages.${i}: all messages must have non-empty content`
      for (const block of m.content) {
        if (block?.type === "text" && (typeof block.text !== "string" || block.text.length === 0)) {
          return `messages.${i}: text content blocks must be non-empty`
        }
      }
    } else if (typeof m.content !== "string" || m.content.length === 0) {
      return `messages.${i}: all messages must have non-empty content`
    }
  }
  if (body.temperature !== undefined && (body.temperature < 0 || body.temperature > 1)) {
    return "temperature: Input should be less than or equal to 1"
  }
  if (body.temperature !== undefined && body.top_p !== undefined) {
    return "`temperature` and `top_p` cannot both be specified for this model. Please use only one."
  }
  if (body.thinking !== undefined) {
    const budget = body.thinking?.budget_tokens
    if (!Number.isInteger(budget) || budget < 1024) return "thinking.budget_tokens: Input should be >= 1024"
    if (budget >= body.max_tokens) return "`max_tokens` must be greater than `thinking.budget_tokens`"
    if (body.temperature !== undefined && body.temperature !== 1) {
      return "`temperature` may only be set to 1 when thinking is enabled"
    }
  }
  return undefined
}

export const startFakeAnthropic = async (options: FakeAnthropicOptions = {}): Promise<FakeAnthropic> => {
  const apiKey = options.apiKey ?? "sk-ant-fake-0123456789"
  const scheme = options.scheme ?? "x-api-key"
  let queue: Array<FakeBehaviourT> = []
  let current: FakeBehaviourT = FakeBehaviour.message(FakeMessages.text("Hello from the fake."))
  const requests: Array<FakeRequest> = []
  const sockets = new Set<Socket>()

  const nextBehaviour = (): FakeBehaviourT => {
    const next = queue.shift()
    if (next !== undefined) current = next
    return current
  }

  const json = (res: Http.ServerResponse, status: number, body: unknown) => {
    res.writeHead(status, { "content-type": "application/json", "request-id": "req_011CfakeRequest0000000000" })
    res.end(JSON.stringify(body))
  }

  const stream = (req: Http.IncomingMessage, res: Http.ServerResponse, events: ReadonlyArray<FakeEvent>, then: string) => {
    res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache" })
    res.flushHeaders()
    const frames = events.map(frame)
    let i = 0
    // One event per write, each on its own event-loop turn, so the client reads them as separate chunks.
    const step = () => {
      if (res.destroyed) return
      if (i < frames.length) {
        res.write(frames[i++])
        return void setImmediate(step)
      }
      if (then === "end") res.end()
      // Dropped once what was written is flushed, so the client sees every event before the cut.
      else if (then === "drop") req.socket.destroySoon()
    }
    step()
  }

  const serve = (req: Http.IncomingMessage, res: Http.ServerResponse, body: any) => {
    const behaviour = nextBehaviour()
    switch (behaviour.kind) {
      case "drop":
        return req.socket.destroy()
      case "status":
        return json(res, behaviour.status, behaviour.body)
      case "events":
        return stream(req, res, behaviour.events, behaviour.then ?? "end")
      case "message":
        if (body.stream === true) return stream(req, res, streamEvents(behaviour.message, behaviour.chunk), "end")
        return json(res, 200, messageBody(behaviour.message))
    }
  }

  const server = Http.createServer((req, res) => {
    const chunks: Array<Buffer> = []
    req.on("data", (c: Buffer) => chunks.push(c))
    req.on("end", () => {
      const text = Buffer.concat(chunks).toString("utf8")
      let body: any = text
      try {
        body = JSON.parse(text)
      } catch {
        // keep the text
      }
      requests.push({ method: req.method ?? "", path: req.url ?? "", headers: req.headers, body })
      if (req.method !== "POST" || req.url !== "/v1/messages") {
        return json(res, 404, errorBody("not_found_error", `Not found: ${req.method} ${req.url}`))
      }
      const given = scheme === "bearer"
        ? req.headers.authorization?.replace(/^Bearer /, "")
        : req.headers["x-api-key"]
      if (given !== apiKey) return json(res, 401, errorBody("authentication_error", "invalid x-api-key"))
      if (req.headers["anthropic-version"] !== "2023-06-01") {
        return json(res, 400, errorBody("invalid_request_error", "anthropic-version: header is required"))
      }
      if (!String(req.headers["content-type"]).startsWith("application/json")) {
        return json(res, 400, errorBody("invalid_request_error", "content-type must be application/json"))
      }
      const problem = invalid(body)
      if (problem !== undefined) return json(res, 400, errorBody("invalid_request_error", problem))
      serve(req, res, body)
    })
  })
  server.on("connection", (socket: Socket) => {
    sockets.add(socket)
    socket.on("close", () => sockets.delete(socket))
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  const port = (server.address() as AddressInfo).port

  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    script: (...behaviours) => {
      queue = [...behaviours]
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve())
        for (const socket of sockets) socket.destroy()
      })
  }
}
