/**
 * A scripted OpenAI-wire upstream on 127.0.0.1 (random port) for adapter and failure tests.
 *
 *   const mock = await startMockUpstream()
 *   mock.script(Behaviour.stream([Chunks.role(), Chunks.content("hi"), Chunks.finish("stop")]))
 *   // provider base_url: mock.url (ends in /v1)
 *   mock.requests          // recorded requests (JSON bodies parsed)
 *   await mock.waitForClientAborts(1)   // a client went away before the answer was complete
 *   await mock.close()
 *
 * `script(a, b, c)` answers the next requests with a, b, then c for every request after that.
 */
import * as Http from "node:http"
import type { AddressInfo, Socket } from "node:net"

/** Written to the socket verbatim (no `data:` framing); a Buffer may split a UTF-8 character. */
export class Raw {
  constructor(readonly text: string | Buffer) {}
}
export const raw = (text: string | Buffer): Raw => new Raw(text)

/** An object is sent as `data: <json>\n\n`, a string as `data: <string>\n\n`, a `Raw` verbatim. */
export type MockFrame = Raw | string | object

export type MockBehaviour =
  | {
    readonly kind: "stream"
    readonly frames: ReadonlyArray<MockFrame>
    /** Delay before each frame after the first (ms). */
    readonly delayMs?: number
    /** Delay before the first frame (ms); headers are sent at once. Default `delayMs`. */
    readonly firstDelayMs?: number
    /** Append `data: [DONE]`. Default true for `then: "end"`. */
    readonly done?: boolean
    /** After the frames: end the response, keep it open forever, or destroy the socket. */
    readonly then?: "end" | "hang" | "drop"
    readonly contentType?: string
  }
  | { readonly kind: "json"; readonly body: unknown; readonly status?: number; readonly delayMs?: number }
  | { readonly kind: "status"; readonly status: number; readonly body?: unknown }
  /** Never answer (no headers). */
  | { readonly kind: "hang" }
  /** Destroy the socket before any headers. */
  | { readonly kind: "drop" }

export const Behaviour = {
  stream: (
    frames: ReadonlyArray<MockFrame>,
    options: Omit<Extract<MockBehaviour, { kind: "stream" }>, "kind" | "frames"> = {}
  ): MockBehaviour => ({ kind: "stream", frames, ...options }),
  json: (body: unknown, options: { readonly status?: number; readonly delayMs?: number } = {}): MockBehaviour => ({
    kind: "json",
    body,
    ...options
  }),
  status: (status: number, body?: unknown): MockBehaviour => ({ kind: "status", status, body }),
  rateLimited: (message = "Rate limit reached"): MockBehaviour => ({
    kind: "status",
    status: 429,
    body: { error: { message, type: "rate_limit_error" } }
  }),
  hangBeforeHeaders: (): MockBehaviour => ({ kind: "hang" }),
  dropBeforeHeaders: (): MockBehaviour => ({ kind: "drop" }),
  /** Sends the frames, then goes silent with the response open. */
  hangAfter: (frames: ReadonlyArray<MockFrame>): MockBehaviour => ({ kind: "stream", frames, then: "hang", done: false }),
  /** Sends the frames, then destroys the socket mid-response. */
  dropAfter: (frames: ReadonlyArray<MockFrame>): MockBehaviour => ({ kind: "stream", frames, then: "drop", done: false }),
  /** Sends each frame `delayMs` after the previous one. */
  slow: (frames: ReadonlyArray<MockFrame>, delayMs: number): MockBehaviour => ({ kind: "stream", frames, delayMs })
}

// ---------------------------------------------------------------------------------------------
// OpenAI chunk builders

const base = { id: "chatcmpl-mock", object: "chat.completion.chunk", created: 1_767_225_600, model: "mock-model" }
const deltaChunk = (delta: object, finish_reason: string | null = null) => ({
  ...base,
  choices: [{ index: 0, delta, finish_reason }]
})

export const Chunks = {
  role: () => deltaChunk({ role: "assistant", content: "" }),
  content: (text: string) => deltaChunk({ content: text }),
  reasoning: (text: string, field: "reasoning_content" | "reasoning" = "reasoning_content") =>
    deltaChunk({ [field]: text }),
  toolStart: (index: number, id: string, name: string, args = "") =>
    deltaChunk({ tool_calls: [{ index, id, type: "function", function: { name, arguments: args } }] }),
  toolArgs: (index: number, args: string) => deltaChunk({ tool_calls: [{ index, function: { arguments: args } }] }),
  finish: (reason: string) => deltaChunk({}, reason),
  usage: (u: { prompt: number; completion: number; reasoning?: number; cached?: number }) => ({
    ...base,
    choices: [],
    usage: {
      prompt_tokens: u.prompt,
      completion_tokens: u.completion,
      total_tokens: u.prompt + u.completion,
      ...(u.cached !== undefined ? { prompt_tokens_details: { cached_tokens: u.cached } } : {}),
      ...(u.reasoning !== undefined ? { completion_tokens_details: { reasoning_tokens: u.reasoning } } : {})
    }
  }),
  /** A non-streaming `chat.completion` body. */
  completion: (m: {
    content?: string | null
    reasoning?: string
    tool_calls?: ReadonlyArray<{ id: string; name: string; arguments: string }>
    finish?: string
    usage?: { prompt: number; completion: number; reasoning?: number; cached?: number }
  }) => ({
    id: "chatcmpl-mock",
    object: "chat.completion",
    created: 1_767_225_600,
    model: "mock-model",
    choices: [{
      index: 0,
      message: {
        role: "assistant",
        content: m.content ?? null,
        ...(m.reasoning !== undefined ? { reasoning_content: m.reasoning } : {}),
        ...(m.tool_calls
          ? {
            tool_calls: m.tool_calls.map((c) => ({
              id: c.id,
              type: "function",
              function: { name: c.name, arguments: c.arguments }
            }))
          }
          : {})
      },
      finish_reason: m.finish ?? "stop"
    }],
    ...(m.usage ? { usage: Chunks.usage(m.usage).usage } : {})
  })
}

// ---------------------------------------------------------------------------------------------
// The server

export interface RecordedRequest {
  readonly method: string
  readonly path: string
  readonly headers: Http.IncomingHttpHeaders
  /** Parsed JSON body, or the raw text when it is not JSON. */
  readonly body: any
}

export interface MockUpstream {
  /** Base URL for a provider config, e.g. `http://127.0.0.1:1234/v1`. */
  readonly url: string
  readonly port: number
  readonly script: (...behaviours: ReadonlyArray<MockBehaviour>) => void
  readonly requests: Array<RecordedRequest>
  /** Responses the client closed before they were complete. */
  readonly clientAborts: () => number
  /** Resolves once `clientAborts() >= n`; rejects after `timeoutMs`. */
  readonly waitForClientAborts: (n: number, timeoutMs?: number) => Promise<void>
  /** TCP connections accepted so far, and how many of them are closed. */
  readonly connections: () => { readonly opened: number; readonly closed: number }
  readonly close: () => Promise<void>
}

const frameText = (frame: MockFrame): string | Buffer =>
  frame instanceof Raw ? frame.text : `data: ${typeof frame === "string" ? frame : JSON.stringify(frame)}\n\n`

export const startMockUpstream = async (): Promise<MockUpstream> => {
  let queue: Array<MockBehaviour> = []
  let current: MockBehaviour = Behaviour.stream([Chunks.role(), Chunks.content("ok"), Chunks.finish("stop")])
  const requests: Array<RecordedRequest> = []
  let aborts = 0
  let closing = false
  const abortWaiters = new Set<() => void>()
  const sockets = new Set<Socket>()
  let opened = 0
  let closed = 0

  const nextBehaviour = (): MockBehaviour => {
    const next = queue.shift()
    if (next !== undefined) current = next
    return current
  }

  const serve = (req: Http.IncomingMessage, res: Http.ServerResponse, behaviour: MockBehaviour) => {
    let deliberate = false
    let timer: NodeJS.Timeout | undefined
    res.on("close", () => {
      clearTimeout(timer)
      if (!res.writableFinished && !deliberate && !closing) {
        aborts++
        for (const wake of abortWaiters) wake()
      }
    })
    switch (behaviour.kind) {
      case "hang":
        return
      case "drop":
        deliberate = true
        return req.socket.destroy()
      case "status":
      case "json": {
        const status = behaviour.kind === "status" ? behaviour.status : behaviour.status ?? 200
        const body = behaviour.body === undefined ? "" : typeof behaviour.body === "string"
          ? behaviour.body
          : JSON.stringify(behaviour.body)
        const send = () => {
          res.writeHead(status, { "content-type": "application/json" })
          res.end(body)
        }
        if (behaviour.kind === "json" && behaviour.delayMs) timer = setTimeout(send, behaviour.delayMs)
        else send()
        return
      }
      case "stream": {
        const then = behaviour.then ?? "end"
        const frames = behaviour.frames.map(frameText)
        if (behaviour.done ?? then === "end") frames.push("data: [DONE]\n\n")
        res.writeHead(200, {
          "content-type": behaviour.contentType ?? "text/event-stream",
          "cache-control": "no-cache"
        })
        res.flushHeaders()
        const delay = behaviour.delayMs ?? 0
        let i = 0
        const step = () => {
          if (res.destroyed) return
          if (i === frames.length - 1 && then === "end") return void res.end(frames[i++])
          if (i < frames.length) {
            res.write(frames[i++])
            if (delay > 0) timer = setTimeout(step, delay)
            else setImmediate(step)
            return
          }
          if (then === "end") res.end()
          else if (then === "drop") {
            deliberate = true
            req.socket.destroy()
          }
        }
        const first = behaviour.firstDelayMs ?? delay
        if (first > 0) timer = setTimeout(step, first)
        else step()
      }
    }
  }

  const server = Http.createServer((req, res) => {
    const chunks: Array<Buffer> = []
    req.on("data", (c: Buffer) => chunks.push(c))
    req.on("end", () => {
      const text = Buffer.concat(chunks).toString("utf8")
      let body: unknown = text
      try {
        body = text === "" ? undefined : JSON.parse(text)
      } catch {
        // keep the text
      }
      requests.push({ method: req.method ?? "", path: req.url ?? "", headers: req.headers, body })
      serve(req, res, nextBehaviour())
    })
  })
  server.keepAliveTimeout = 60_000
  server.on("connection", (socket: Socket) => {
    opened++
    sockets.add(socket)
    socket.on("close", () => {
      closed++
      sockets.delete(socket)
    })
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  const port = (server.address() as AddressInfo).port

  return {
    url: `http://127.0.0.1:${port}/v1`,
    port,
    requests,
    script: (...behaviours) => {
      queue = [...behaviours]
    },
    clientAborts: () => aborts,
    waitForClientAborts: (n, timeoutMs = 5_000) =>
      new Promise<void>((resolve, reject) => {
        if (aborts >= n) return resolve()
        const timeout = setTimeout(() => {
          abortWaiters.delete(check)
          reject(new Error(`expected ${n} client aborts within ${timeoutMs} ms, saw ${aborts}`))
        }, timeoutMs)
        const check = () => {
          if (aborts >= n) {
            clearTimeout(timeout)
            abortWaiters.delete(check)
            resolve()
          }
        }
        abortWaiters.add(check)
      }),
    connections: () => ({ opened, closed }),
    close: () =>
      new Promise<void>((resolve) => {
        closing = true
        server.close(() => resolve())
        for (const socket of sockets) socket.destroy()
      })
  }
}
