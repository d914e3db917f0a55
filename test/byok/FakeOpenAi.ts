/**
 * A fake OpenAI-compatible provider for BYOK routing tests, on 127.0.0.1: `GET <prefix>/models`,
 * `POST <prefix>/chat/completions` (JSON or SSE) and `POST <prefix>/embeddings`, with the key checked on every
 * request. Behaviour by key (the whole bearer token):
 *
 * - not starting with `sk-good-`: 401 with the key echoed in the message (as real providers do);
 * - `sk-good-...` keys listed in `revoked`: 401 on chat and embeddings, but the listing still passes (a key that is
 *   revoked after it was saved);
 * - `fail` set for a key: that status on chat and embeddings (e.g. 500, 429, 403).
 *
 * Every request is recorded with its path, headers and parsed body.
 */
import * as Http from "node:http"
import type { AddressInfo } from "node:net"

export const GOOD = "sk-good-"

export interface SeenRequest {
  readonly method: string
  readonly path: string
  readonly headers: Http.IncomingHttpHeaders
  readonly body: any
}

export interface FakeOpenAi {
  readonly origin: string
  readonly requests: Array<SeenRequest>
  /** Keys refused with 401 on chat and embeddings (their listing still passes). */
  readonly revoked: Set<string>
  /** Status answered on chat and embeddings per key. */
  readonly fail: Map<string, number>
  /** Requests to chat completions so far. */
  readonly chatCalls: () => number
  readonly close: () => Promise<void>
}

const send = (res: Http.ServerResponse, status: number, body: unknown) => {
  res.writeHead(status, { "content-type": "application/json" })
  res.end(JSON.stringify(body))
}

export const startFakeOpenAi = async (): Promise<FakeOpenAi> => {
  const requests: Array<SeenRequest> = []
  const revoked = new Set<string>()
  const fail = new Map<string, number>()
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
      requests.push({ method: req.method ?? "", path, headers: req.headers, body })
      const key = String(req.headers.authorization ?? req.headers["api-key"] ?? "").replace(/^Bearer /, "")
      if (!key.startsWith(GOOD)) return send(res, 401, { error: { message: `Incorrect API key provided: ${key}`, code: "invalid_api_key" } })
      if (path.includes("/models")) {
        return send(res, 200, { object: "list", data: [{ id: "gpt-fake", object: "model" }, { id: "text-embed-fake", object: "model" }] })
      }
      if (revoked.has(key)) return send(res, 401, { error: { message: `Incorrect API key provided: ${key}`, code: "invalid_api_key" } })
      const status = fail.get(key)
      if (status !== undefined) return send(res, status, { error: { message: `failure ${status} for ${key}` } })
      if (path.includes("/embeddings")) {
        const inputs: Array<string> = typeof body?.input === "string" ? [body.input] : body?.input ?? []
        return send(res, 200, {
          object: "list",
          data: inputs.map((s, index) => ({ object: "embedding", index, embedding: [s.length, 0.5, 0.25] })),
          model: body?.model,
          usage: { prompt_tokens: 7, total_tokens: 7 }
        })
      }
      if (path.includes("/chat/completions")) {
        const answer = `echo:${body?.model}`
        if (body?.stream) {
          res.writeHead(200, { "content-type": "text/event-stream" })
          const chunk = (delta: object, finish: string | null, usage?: object) =>
            `data: ${
              JSON.stringify({
                id: "chatcmpl-fake",
                object: "chat.completion.chunk",
                created: 1,
                model: body.model,
                choices: usage ? [] : [{ index: 0, delta, finish_reason: finish }],
                ...(usage ? { usage } : {})
              })
            }\n\n`
          res.write(chunk({ role: "assistant", content: "" }, null))
          res.write(chunk({ content: answer }, null))
          res.write(chunk({}, "stop"))
          res.write(chunk({}, null, { prompt_tokens: 11, completion_tokens: 3, total_tokens: 14 }))
          res.end("data: [DONE]\n\n")
          return
        }
        return send(res, 200, {
          id: "chatcmpl-fake",
          object: "chat.completion",
          created: 1,
          model: body?.model,
          choices: [{ index: 0, message: { role: "assistant", content: answer }, finish_reason: "stop" }],
          usage: { prompt_tokens: 11, completion_tokens: 3, total_tokens: 14 }
        })
      }
      send(res, 404, { error: { message: "unknown path" } })
    })
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  return {
    origin: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    requests,
    revoked,
    fail,
    chatCalls: () => requests.filter((r) => r.path.includes("/chat/completions")).length,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      })
  }
}
