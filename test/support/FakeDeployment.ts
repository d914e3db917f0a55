/**
 * A fake OpenAI-compatible upstream for deployment tests: answers `POST /v1/chat/completions` (JSON or SSE) and
 * `POST /v1/embeddings` as set by `mode`, and counts what it saw (requests, in flight now and at most).
 *
 *   const up = await startFakeDeployment("a")
 *   up.mode = { _tag: "status", status: 500 }      // or ok / slow / rate_limited / hang / drop
 *   up.requests, up.maxInFlight
 *   await up.kill()                                 // closes the listener and destroys every socket
 */
import * as Http from "node:http"
import type { AddressInfo, Socket } from "node:net"

export type FakeMode =
  | { readonly _tag: "ok" }
  | { readonly _tag: "slow"; readonly delayMs: number }
  | { readonly _tag: "status"; readonly status: number }
  | { readonly _tag: "rate_limited"; readonly retryAfterSeconds: number }
  /** Headers sent, then nothing (a stream that never produces its first event). */
  | { readonly _tag: "hang" }
  /** The socket is destroyed before any answer. */
  | { readonly _tag: "drop" }
  /** A stream that sends one content frame, then the socket is destroyed. */
  | { readonly _tag: "cut_after_first" }

export interface FakeDeployment {
  readonly name: string
  /** The provider `base_url` (ends in /v1). */
  readonly url: string
  mode: FakeMode
  /** Chat and embedding requests received. */
  readonly requests: () => number
  readonly inFlight: () => number
  readonly maxInFlight: () => number
  readonly reset: () => void
  /** Stops answering: closes the listener and every open socket. */
  readonly kill: () => Promise<void>
}

const USAGE = { prompt_tokens: 7, completion_tokens: 3, total_tokens: 10 }

/** Requests in flight across several fakes (the upstream side of a model's in-flight cap). */
export interface SharedLoad {
  inFlight: number
  max: number
}

export const startFakeDeployment = async (name: string, shared?: SharedLoad): Promise<FakeDeployment> => {
  let requests = 0
  let inFlight = 0
  let maxInFlight = 0
  const sockets = new Set<Socket>()
  const timers = new Set<NodeJS.Timeout>()

  const state: { mode: FakeMode } = { mode: { _tag: "ok" } }

  const answer = (req: Http.IncomingMessage, res: Http.ServerResponse, body: Record<string, unknown>) => {
    const mode = state.mode
    const embeddings = req.url?.endsWith("/embeddings") === true
    if (mode._tag === "drop") return req.socket.destroy()
    if (mode._tag === "status") {
      res.writeHead(mode.status, { "content-type": "application/json" })
      return res.end(JSON.stringify({ error: { message: `${name} failed`, type: "server_error" } }))
    }
    if (mode._tag === "rate_limited") {
      res.writeHead(429, { "content-type": "application/json", "retry-after": String(mode.retryAfterSeconds) })
      return res.end(JSON.stringify({ error: { message: "slow down", type: "rate_limit_error" } }))
    }
    if (mode._tag === "hang") {
      res.writeHead(200, { "content-type": "text/event-stream" })
      return
    }
    if (embeddings) {
      res.writeHead(200, { "content-type": "application/json" })
      const input = Array.isArray(body.input) ? body.input : [body.input]
      return res.end(JSON.stringify({
        object: "list",
        data: input.map((_, index) => ({ object: "embedding", index, embedding: [0.1, 0.2, 0.3] })),
        model: body.model,
        usage: { prompt_tokens: 5, total_tokens: 5 }
      }))
    }
    const text = `from ${name}`
    if (body.stream === true) {
      res.writeHead(200, { "content-type": "text/event-stream" })
      const chunk = (delta: object, finish: string | null, usage?: object) =>
        `data: ${
          JSON.stringify({
            id: "chatcmpl-fake",
            object: "chat.completion.chunk",
            created: 1,
            model: body.model,
            choices: [{ index: 0, delta, finish_reason: finish }],
            ...(usage ? { usage } : {})
          })
        }\n\n`
      res.write(chunk({ role: "assistant", content: text }, null))
      if (mode._tag === "cut_after_first") {
        const timer = setTimeout(() => req.socket.destroy(), 20)
        timers.add(timer)
        return
      }
      return res.end(chunk({}, "stop") + chunk({}, null, USAGE) + "data: [DONE]\n\n")
    }
    res.writeHead(200, { "content-type": "application/json" })
    res.end(JSON.stringify({
      id: "chatcmpl-fake",
      object: "chat.completion",
      created: 1,
      model: body.model,
      choices: [{ index: 0, message: { role: "assistant", content: text }, finish_reason: "stop" }],
      usage: USAGE
    }))
  }

  const server = Http.createServer((req, res) => {
    const chunks: Array<Buffer> = []
    req.on("data", (c: Buffer) => chunks.push(c))
    req.on("end", () => {
      requests += 1
      inFlight += 1
      if (inFlight > maxInFlight) maxInFlight = inFlight
      if (shared) {
        shared.inFlight += 1
        if (shared.inFlight > shared.max) shared.max = shared.inFlight
      }
      let done = false
      const finish = () => {
        if (done) return
        done = true
        inFlight -= 1
        if (shared) shared.inFlight -= 1
      }
      res.on("close", finish)
      let body: Record<string, unknown> = {}
      try {
        body = JSON.parse(Buffer.concat(chunks).toString("utf8"))
      } catch {
        // answered as if empty
      }
      const mode = state.mode
      if (mode._tag === "slow") {
        const timer = setTimeout(() => {
          timers.delete(timer)
          answer(req, res, body)
        }, mode.delayMs)
        timers.add(timer)
      } else answer(req, res, body)
    })
  })
  server.on("connection", (socket) => {
    sockets.add(socket)
    socket.on("close", () => sockets.delete(socket))
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  const port = (server.address() as AddressInfo).port

  return {
    name,
    url: `http://127.0.0.1:${port}/v1`,
    get mode() {
      return state.mode
    },
    set mode(mode: FakeMode) {
      state.mode = mode
    },
    requests: () => requests,
    inFlight: () => inFlight,
    maxInFlight: () => maxInFlight,
    reset: () => {
      requests = 0
      maxInFlight = inFlight
    },
    kill: async () => {
      for (const timer of timers) clearTimeout(timer)
      const closed = new Promise<void>((resolve) => server.close(() => resolve()))
      for (const socket of sockets) socket.destroy()
      await closed
    }
  }
}

/** A catalog provider entry for `fake` (openai-compatible, short connect timeout). */
export const providerFor = (fake: FakeDeployment, firstTokenMs = 5_000) => ({
  kind: "openai-compatible",
  base_url: fake.url,
  timeouts: { connect_ms: 1_000, first_token_ms: firstTokenMs, idle_ms: 5_000, total_ms: 30_000 }
})
