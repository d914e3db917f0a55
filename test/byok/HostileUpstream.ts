/**
 * A hostile OpenAI-compatible provider on 127.0.0.1 for the BYOK robustness tests. Listings (`.../models`,
 * OpenRouter's `.../key`) answer for any `sk-good-` key; chat and embeddings behave by the model id the gateway
 * sends (what follows `@provider/`):
 *
 * - `ok...` (any other id): a normal answer (JSON or SSE), the model id echoed;
 * - `slow`: SSE headers and a first chunk, then one more chunk every 25 ms, never ending;
 * - `hang`: never answers (no status line);
 * - `die`: SSE headers and two chunks, then the socket is destroyed;
 * - `huge-error`: 500 with a 20 MB JSON error body; `endless-error`: 500 whose body never ends;
 * - `huge-json`: 200 with a 20 MB JSON body that is not an answer; `endless-json`: 200 whose JSON body never ends;
 * - `redirect-metadata`: 302 to http://169.254.169.254/latest/meta-data/; `redirect-target`: 302 to `target`.
 *
 * A key not starting with `sk-good-`, or listed in `revoked`, gets 401 on chat and embeddings. Every chat and
 * embeddings request is recorded: how many bytes were written to it and whether its connection closed before the
 * answer was complete (`aborted`). `sockets` counts the connections open right now.
 */
import * as Http from "node:http"
import type { AddressInfo } from "node:net"

export const GOOD = "sk-good-"
const MB = 1024 * 1024
/** What the endless bodies stop at if nobody closes them (a runaway guard; far beyond any gateway bound). */
const RUNAWAY = 512 * MB

export interface HostileRequest {
  readonly path: string
  readonly headers: Http.IncomingHttpHeaders
  readonly body: any
  readonly model: string
  /** Bytes of body written to the response so far. */
  sent: number
  /** The response ended normally. */
  finished: boolean
  /** The connection closed before the response ended. */
  aborted: boolean
  /** Resolves when the response is closed (either way). */
  readonly closed: Promise<void>
}

export interface HostileUpstream {
  readonly origin: string
  readonly requests: Array<HostileRequest>
  readonly revoked: Set<string>
  /** Connections open right now. */
  readonly sockets: () => number
  /** Resolves with the next chat/embeddings request whose model is `model` (including one already recorded and unclaimed). */
  readonly arrival: (model: string) => Promise<HostileRequest>
  /** Requests (chat and embeddings) that presented `key`. */
  readonly callsWith: (key: string) => number
  readonly close: () => Promise<void>
}

export interface RedirectTarget {
  readonly origin: string
  readonly hits: () => number
  readonly close: () => Promise<void>
}

const listen = async (server: Http.Server): Promise<string> => {
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`
}

const closeServer = (server: Http.Server) =>
  new Promise<void>((resolve) => {
    server.closeAllConnections()
    server.close(() => resolve())
  })

/** A server that only counts what reaches it (a redirect's target must never be called). */
export const startRedirectTarget = async (): Promise<RedirectTarget> => {
  let hits = 0
  const server = Http.createServer((_req, res) => {
    hits++
    res.writeHead(200, { "content-type": "application/json" })
    res.end(JSON.stringify({ secret: "metadata" }))
  })
  const origin = await listen(server)
  return { origin, hits: () => hits, close: () => closeServer(server) }
}

const chunk = (model: string, delta: object, finish: string | null) =>
  `data: ${
    JSON.stringify({
      id: "chatcmpl-hostile",
      object: "chat.completion.chunk",
      created: 1,
      model,
      choices: [{ index: 0, delta, finish_reason: finish }]
    })
  }\n\n`

/** Writes `piece` repeatedly (respecting back-pressure) until `total` bytes or the connection closes, then `tail`. */
const pump = (res: Http.ServerResponse, seen: HostileRequest, piece: string, total: number, tail: string | null) => {
  const buffer = Buffer.from(piece)
  const step = () => {
    while (!res.destroyed && seen.sent < total) {
      seen.sent += buffer.length
      if (!res.write(buffer)) return void res.once("drain", step)
    }
    if (!res.destroyed && tail !== null) {
      seen.sent += tail.length
      res.end(tail)
    }
  }
  step()
}

export const startHostileUpstream = async (options: { readonly redirectTo?: string } = {}): Promise<HostileUpstream> => {
  const requests: Array<HostileRequest> = []
  const claimed = new Set<HostileRequest>()
  const waiters: Array<{ model: string; resolve: (r: HostileRequest) => void }> = []
  const revoked = new Set<string>()
  let open = 0

  const server = Http.createServer((req, res) => {
    const chunks: Array<Buffer> = []
    req.on("data", (c: Buffer) => chunks.push(c))
    req.on("end", () => {
      const text = Buffer.concat(chunks).toString("utf8")
      let body: any = null
      try {
        body = text === "" ? null : JSON.parse(text)
      } catch {
        body = text
      }
      const path = req.url ?? ""
      const key = String(req.headers.authorization ?? req.headers["api-key"] ?? "").replace(/^Bearer /, "")
      const json = (status: number, value: unknown) => {
        res.writeHead(status, { "content-type": "application/json" })
        res.end(JSON.stringify(value))
      }
      if (!key.startsWith(GOOD)) return json(401, { error: { message: `Incorrect API key provided: ${key}` } })
      if (path.includes("/models")) {
        return json(200, { object: "list", data: [{ id: "gpt-hostile", object: "model" }] })
      }
      if (path.endsWith("/key")) return json(200, { data: { label: "hostile", limit: null } })

      const model = typeof body?.model === "string" ? body.model : ""
      let resolveClosed!: () => void
      const seen: HostileRequest = {
        path,
        headers: req.headers,
        body,
        model,
        sent: 0,
        finished: false,
        aborted: false,
        closed: new Promise<void>((resolve) => (resolveClosed = resolve))
      }
      requests.push(seen)
      res.on("finish", () => (seen.finished = true))
      res.on("close", () => {
        if (!seen.finished) seen.aborted = true
        resolveClosed()
      })
      const waiter = waiters.findIndex((w) => w.model === model)
      if (waiter >= 0) {
        claimed.add(seen)
        waiters.splice(waiter, 1)[0]!.resolve(seen)
      }

      if (revoked.has(key)) return json(401, { error: { message: `Incorrect API key provided: ${key}` } })
      switch (model) {
        case "hang":
          return
        case "slow": {
          res.writeHead(200, { "content-type": "text/event-stream" })
          res.write(chunk(model, { role: "assistant", content: "" }, null))
          res.write(chunk(model, { content: "first" }, null))
          const timer = setInterval(() => {
            if (res.destroyed) return clearInterval(timer)
            res.write(chunk(model, { content: "." }, null))
          }, 25)
          res.on("close", () => clearInterval(timer))
          return
        }
        case "die": {
          res.writeHead(200, { "content-type": "text/event-stream" })
          res.write(chunk(model, { role: "assistant", content: "" }, null))
          res.write(chunk(model, { content: "partial" }, null), () => res.socket?.destroy())
          return
        }
        case "huge-error":
        case "endless-error": {
          res.writeHead(500, { "content-type": "application/json" })
          res.write('{"error":{"message":"')
          return pump(res, seen, "x".repeat(64 * 1024), model === "huge-error" ? 20 * MB : RUNAWAY, model === "huge-error" ? '"}}' : null)
        }
        case "huge-json":
        case "endless-json": {
          res.writeHead(200, { "content-type": "application/json" })
          res.write('{"junk":[')
          return pump(res, seen, "1,".repeat(32 * 1024), model === "huge-json" ? 20 * MB : RUNAWAY, model === "huge-json" ? "1]}" : null)
        }
        case "redirect-metadata":
        case "redirect-target": {
          const location = model === "redirect-metadata"
            ? "http://169.254.169.254/latest/meta-data/"
            : `${options.redirectTo ?? "http://169.254.169.254"}/stolen`
          res.writeHead(302, { location, "content-type": "text/plain" })
          return res.end("moved")
        }
      }
      if (path.includes("/embeddings")) {
        const inputs: Array<string> = typeof body?.input === "string" ? [body.input] : body?.input ?? []
        return json(200, {
          object: "list",
          data: inputs.map((s, index) => ({ object: "embedding", index, embedding: [s.length, 0.5, 0.25] })),
          model,
          usage: { prompt_tokens: 3, total_tokens: 3 }
        })
      }
      if (body?.stream) {
        res.writeHead(200, { "content-type": "text/event-stream" })
        res.write(chunk(model, { role: "assistant", content: "" }, null))
        res.write(chunk(model, { content: `echo:${model}` }, null))
        res.write(chunk(model, {}, "stop"))
        return res.end("data: [DONE]\n\n")
      }
      json(200, {
        id: "chatcmpl-hostile",
        object: "chat.completion",
        created: 1,
        model,
        choices: [{ index: 0, message: { role: "assistant", content: `echo:${model}` }, finish_reason: "stop" }],
        usage: { prompt_tokens: 5, completion_tokens: 2, total_tokens: 7 }
      })
    })
  })
  server.on("connection", (socket) => {
    open++
    socket.on("close", () => open--)
  })
  const origin = await listen(server)
  return {
    origin,
    requests,
    revoked,
    sockets: () => open,
    arrival: (model) => {
      const already = requests.find((r) => r.model === model && !claimed.has(r))
      if (already !== undefined) {
        claimed.add(already)
        return Promise.resolve(already)
      }
      return new Promise((resolve) => waiters.push({ model, resolve }))
    },
    callsWith: (key) =>
      requests.filter((r) => String(r.headers.authorization ?? r.headers["api-key"] ?? "").endsWith(key)).length,
    close: () => closeServer(server)
  }
}
