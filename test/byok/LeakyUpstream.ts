/**
 * A provider on 127.0.0.1 that leaks: every failure it answers repeats the key it was sent, in pieces (the
 * middle, the end, every 6-character window, the whole), mixed with log-forging text (newlines, carriage returns,
 * ANSI escapes, U+2028/2029, a bidi override, a C1 CSI, DEL). It speaks both wires BYOK uses:
 *
 * - OpenAI-compatible under `/oa/v1` (`/models`, `/chat/completions`, `/embeddings`, Bearer key);
 * - Anthropic Messages under `/an/v1` (`/models?limit=1000`, `/messages`, `x-api-key`).
 *
 * A key in `valid` is served; any other gets 401 with the leak. Chat and embeddings behave by the model id sent:
 * `s<status>` (that status, JSON error body), `html502` (a non-JSON 502), `hang` (no answer), `notjson` (200 whose
 * body is not JSON), `endless` (500 whose body never ends), `midstream` (SSE, one chunk, then an error frame),
 * `badframe` (SSE, one chunk, an undecodable frame, then a normal end), `die` (SSE, one chunk, socket destroyed),
 * `stall` (SSE, one chunk, then silence); anything else is a normal answer. `listing` sets how `/models` answers a
 * valid key: `ok`, `s500`, `garbage` or `hang`.
 */
import * as Http from "node:http"
import * as Https from "node:https"
import type { AddressInfo } from "node:net"
import { FakeEvents } from "../support/FakeAnthropic.js"

/** Everything a log line must never carry raw. */
export const INJECTION = "\n[00:00:00.000] ERROR (#1): forged line\r\x1b[31mred\x1b[0m\u2028two\u2029\u202eevil\u009b2J\u007f\t"

/** The key in pieces, with the injection between them. */
export const leakOf = (secret: string): string => {
  const windows: Array<string> = []
  for (let i = 0; i + 6 <= secret.length; i++) windows.push(secret.slice(i, i + 6))
  return [
    `key ${secret.slice(8, 20)} is wrong`,
    `ends with ${secret.slice(-10)}`,
    windows.join(" "),
    `whole ${secret}`
  ].join(INJECTION)
}

export type ListingMode = "ok" | "s500" | "garbage" | "hang"

export interface LeakyUpstream {
  readonly origin: string
  readonly port: number
  readonly valid: Set<string>
  listing: ListingMode
  readonly close: () => Promise<void>
}

const chunk = (content: string) =>
  `data: ${
    JSON.stringify({
      id: "chatcmpl-leaky",
      object: "chat.completion.chunk",
      created: 1,
      model: "m",
      choices: [{ index: 0, delta: { content }, finish_reason: null }]
    })
  }\n\n`

const event = (e: { readonly type: string }) => `event: ${e.type}\ndata: ${JSON.stringify(e)}\n\n`

/** `tls`: serve https with this key and certificate instead of plain http. */
export const startLeakyUpstream = async (
  options: { readonly tls?: { readonly key: Buffer; readonly cert: Buffer } } = {}
): Promise<LeakyUpstream> => {
  const valid = new Set<string>()
  const state: { listing: ListingMode } = { listing: "ok" }
  const handler: Http.RequestListener = (req, res) => {
    const chunks: Array<Buffer> = []
    req.on("data", (c: Buffer) => chunks.push(c))
    req.on("end", () => {
      const path = req.url ?? ""
      const anthropic = path.startsWith("/an/")
      const key = anthropic
        ? String(req.headers["x-api-key"] ?? "")
        : String(req.headers.authorization ?? "").replace(/^Bearer /, "")
      const leak = leakOf(key)
      const errorJson = (status: number, type: string) => {
        res.writeHead(status, { "content-type": "application/json" })
        res.end(JSON.stringify(
          anthropic
            ? { type: "error", error: { type, message: leak }, request_id: `req_${leak}` }
            : { error: { message: leak, type, code: leak.slice(0, 40) } }
        ))
      }
      if (!valid.has(key)) return errorJson(401, "authentication_error")
      if (path.includes("/models")) {
        switch (state.listing) {
          case "hang":
            return
          case "s500":
            return errorJson(500, "api_error")
          case "garbage":
            res.writeHead(200, { "content-type": "application/json" })
            return res.end(`{"data": ${leak}`)
          case "ok":
            res.writeHead(200, { "content-type": "application/json" })
            return res.end(JSON.stringify(
              anthropic
                ? { data: [{ id: "claude-x", display_name: "X", type: "model" }], has_more: false }
                : { object: "list", data: [{ id: "gpt-x", object: "model" }] }
            ))
        }
      }
      let body: any = null
      try {
        body = JSON.parse(Buffer.concat(chunks).toString("utf8"))
      } catch {
        body = null
      }
      const model = String(body?.model ?? "")
      const status = /^s(\d{3})$/.exec(model)
      if (status !== null) {
        const code = Number(status[1])
        const type = code === 401
          ? "authentication_error"
          : code === 403
          ? "permission_error"
          : code === 429
          ? "rate_limit_error"
          : code >= 500
          ? "api_error"
          : "invalid_request_error"
        return errorJson(code, type)
      }
      const sse = () => {
        res.writeHead(200, { "content-type": "text/event-stream" })
        if (anthropic) {
          res.write(event(FakeEvents.messageStart()))
          res.write(event(FakeEvents.blockStart(0, { type: "text", text: "" })))
          res.write(event(FakeEvents.textDelta(0, "first")))
        } else {
          res.write(chunk("first"))
        }
      }
      switch (model) {
        case "hang":
          return
        case "html502":
          res.writeHead(502, { "content-type": "text/html" })
          return res.end(`<html><body>${leak}</body></html>`)
        case "notjson":
          res.writeHead(200, { "content-type": "application/json" })
          return res.end(`{"oops": ${leak}`)
        case "endless": {
          res.writeHead(500, { "content-type": "application/json" })
          res.write(anthropic ? `{"type":"error","error":{"type":"api_error","message":"` : `{"error":{"message":"`)
          const piece = Buffer.from(JSON.stringify(leak).slice(1, -1).repeat(8))
          const pump = () => {
            while (!res.destroyed) if (!res.write(piece)) return void res.once("drain", pump)
          }
          return pump()
        }
        case "midstream":
          sse()
          return res.end(
            anthropic
              ? event(FakeEvents.error("api_error", leak))
              : `data: ${JSON.stringify({ error: { message: leak, type: "server_error" } })}\n\n`
          )
        case "badframe":
          sse()
          res.write(`data: ${leak.replace(/[\r\n]/g, " ")}\n\n`)
          return res.end(
            anthropic
              ? event(FakeEvents.blockStop(0)) + event(FakeEvents.messageDelta("end_turn")) +
                event(FakeEvents.messageStop())
              : `${
                chunk("").replace('"finish_reason":null', '"finish_reason":"stop"')
              }data: [DONE]\n\n`
          )
        case "die":
          sse()
          return res.write(chunk("more"), () => res.socket?.destroy())
        case "stall":
          return sse()
      }
      if (path.endsWith("/embeddings")) {
        res.writeHead(200, { "content-type": "application/json" })
        return res.end(JSON.stringify({
          object: "list",
          data: [{ object: "embedding", index: 0, embedding: [0.1, 0.2] }],
          model,
          usage: { prompt_tokens: 1, total_tokens: 1 }
        }))
      }
      res.writeHead(200, { "content-type": "application/json" })
      res.end(JSON.stringify(
        anthropic
          ? {
            id: "msg_1",
            type: "message",
            role: "assistant",
            model,
            content: [{ type: "text", text: "fine" }],
            stop_reason: "end_turn",
            stop_sequence: null,
            usage: { input_tokens: 1, output_tokens: 1 }
          }
          : {
            id: "chatcmpl-1",
            object: "chat.completion",
            created: 1,
            model,
            choices: [{ index: 0, message: { role: "assistant", content: "fine" }, finish_reason: "stop" }],
            usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 }
          }
      ))
    })
  }
  const server = options.tls ? Https.createServer(options.tls, handler) : Http.createServer(handler)
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  const port = (server.address() as AddressInfo).port
  return {
    origin: `${options.tls ? "https" : "http"}://127.0.0.1:${port}`,
    port,
    valid,
    get listing() {
      return state.listing
    },
    set listing(mode: ListingMode) {
      state.listing = mode
    },
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      })
  }
}
