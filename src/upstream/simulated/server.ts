/**
 * A standalone OpenAI-compatible HTTP server over the simulated engine (`npm run sim-upstream`).
 * It is the upstream baseline in benchmarks, so it stays lean: plain `node:http`, no Effect runtime per
 * request, SSE frames built from string templates, unpaced answers written in one `end()`.
 *
 *   --port N (default 9100, 0 = random)   --host H (default 127.0.0.1)
 *   --first-token-ms N                     --tokens-per-second N (0 = instant)
 * Environment: SIM_PORT, SIM_HOST, SIM_FIRST_TOKEN_MS, SIM_TOKENS_PER_SECOND.
 */
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import { pathToFileURL } from "node:url"
import type { UpstreamEvent, UpstreamRequest, Usage } from "../Upstream.js"
import { type ChatPlan, countTokens, embedText, planChat, schedule, type SimulatedTiming } from "./Engine.js"

export interface SimServerOptions extends SimulatedTiming {
  readonly port: number
  readonly host: string
}

export interface SimServer {
  readonly port: number
  readonly url: string
  readonly close: () => Promise<void>
}

export const defaultSimServerOptions: SimServerOptions = {
  port: 9100,
  host: "127.0.0.1",
  first_token_ms: 0,
  tokens_per_second: 0
}

const MODELS = ["sim-pro", "sim-reasoner", "sim-lite", "sim-embed"]
const MAX_BODY = 32 * 1024 * 1024
const JSON_HEADERS = { "content-type": "application/json" }
const SSE_HEADERS = { "content-type": "text/event-stream", "cache-control": "no-cache" }
const DONE = "data: [DONE]\n\n"

let sequence = 0
const completionId = () => `chatcmpl-sim${(++sequence).toString(36).padStart(8, "0")}`

const sendJson = (res: Http.ServerResponse, status: number, body: unknown) => {
  res.writeHead(status, JSON_HEADERS)
  res.end(JSON.stringify(body))
}

const sendError = (res: Http.ServerResponse, status: number, message: string) =>
  sendJson(res, status, { error: { message, type: "invalid_request_error", code: null } })

const usageJson = (usage: Usage): string =>
  `{"prompt_tokens":${usage.prompt_tokens},"completion_tokens":${usage.completion_tokens},` +
  `"total_tokens":${usage.prompt_tokens + usage.completion_tokens},` +
  `"prompt_tokens_details":{"cached_tokens":${usage.cached_tokens}},` +
  `"completion_tokens_details":{"reasoning_tokens":${usage.reasoning_tokens}}}`

const usageObject = (usage: Usage) => ({
  prompt_tokens: usage.prompt_tokens,
  completion_tokens: usage.completion_tokens,
  total_tokens: usage.prompt_tokens + usage.completion_tokens,
  prompt_tokens_details: { cached_tokens: usage.cached_tokens },
  completion_tokens_details: { reasoning_tokens: usage.reasoning_tokens }
})

// ---------------------------------------------------------------------------------------------
// Request decoding (lenient: the gateway validated already; direct callers get 400 on nonsense)

const isRecord = (u: unknown): u is Record<string, unknown> => typeof u === "object" && u !== null && !Array.isArray(u)

const toRequest = (body: Record<string, unknown>): UpstreamRequest | string => {
  if (!Array.isArray(body.messages) || body.messages.length === 0) return "messages must be a non-empty array"
  for (const m of body.messages) if (!isRecord(m) || typeof m.role !== "string") return "invalid message"
  const maxTokens = typeof body.max_tokens === "number"
    ? body.max_tokens
    : typeof body.max_completion_tokens === "number"
    ? body.max_completion_tokens
    : 4096
  const effort = body.reasoning_effort
  if (effort !== undefined && effort !== null && effort !== "none" && effort !== "low" && effort !== "high" &&
    effort !== "max") {
    return "reasoning_effort must be none, low, high or max"
  }
  return {
    ...(body as unknown as UpstreamRequest),
    model: typeof body.model === "string" ? body.model : "sim",
    stream: body.stream === true,
    max_tokens: maxTokens
  }
}

// ---------------------------------------------------------------------------------------------
// Chat

const frameOf = (head: string, tail: string, event: UpstreamEvent): string => {
  switch (event._tag) {
    case "Reasoning":
      return `${head}{"reasoning_content":${JSON.stringify(event.text)}},"finish_reason":null}]}\n\n`
    case "Content":
      return `${head}{"content":${JSON.stringify(event.text)}},"finish_reason":null}]}\n\n`
    case "ToolCallStart":
      return `${head}{"tool_calls":[{"index":${event.index},"id":"${event.id}","type":"function","function":{"name":${
        JSON.stringify(event.name)
      },"arguments":""}}]},"finish_reason":null}]}\n\n`
    case "ToolCallArgs":
      return `${head}{"tool_calls":[{"index":${event.index},"function":{"arguments":${
        JSON.stringify(event.fragment)
      }}}]},"finish_reason":null}]}\n\n`
    case "Finish":
      return `${head}{},"finish_reason":"${event.reason}"}]}\n\n`
    case "Usage":
      return tail === "" ? "" : `${tail}${usageJson(event.usage)}}\n\n`
  }
}

const streamChat = (
  res: Http.ServerResponse,
  request: UpstreamRequest,
  plan: ChatPlan,
  includeUsage: boolean,
  timing: SimulatedTiming
) => {
  const prefix = `data: {"id":"${completionId()}","object":"chat.completion.chunk","created":${
    Math.floor(Date.now() / 1000)
  },"model":${JSON.stringify(request.model)},`
  const head = `${prefix}"choices":[{"index":0,"delta":`
  const tail = includeUsage ? `${prefix}"choices":[],"usage":` : ""
  const first = `${head}{"role":"assistant","content":""},"finish_reason":null}]}\n\n`
  const events = plan.events
  res.writeHead(200, SSE_HEADERS)
  if (timing.first_token_ms <= 0 && timing.tokens_per_second <= 0) {
    let out = first
    for (let i = 0; i < events.length; i++) out += frameOf(head, tail, events[i]!)
    res.end(out + DONE)
    return
  }
  res.write(first)
  const due = schedule(plan, timing)
  const start = performance.now()
  let next = 0
  let timer: NodeJS.Timeout | undefined
  const tick = () => {
    const now = performance.now() - start
    let out = ""
    while (next < events.length && due[next]! <= now) out += frameOf(head, tail, events[next++]!)
    if (next >= events.length) {
      res.end(out + DONE)
    } else {
      if (out !== "") res.write(out)
      timer = setTimeout(tick, due[next]! - now)
    }
  }
  res.on("close", () => clearTimeout(timer))
  timer = setTimeout(tick, due[0]!)
}

const completeChat = (res: Http.ServerResponse, request: UpstreamRequest, plan: ChatPlan) => {
  const message: Record<string, unknown> = {
    role: "assistant",
    content: plan.content === "" && plan.toolCalls.length > 0 ? null : plan.content
  }
  if (plan.reasoning !== "") message.reasoning_content = plan.reasoning
  if (plan.toolCalls.length > 0) {
    message.tool_calls = plan.toolCalls.map((call) => ({
      id: call.id,
      type: "function",
      function: { name: call.name, arguments: call.arguments }
    }))
  }
  sendJson(res, 200, {
    id: completionId(),
    object: "chat.completion",
    created: Math.floor(Date.now() / 1000),
    model: request.model,
    choices: [{ index: 0, message, finish_reason: plan.finish }],
    usage: usageObject(plan.usage)
  })
}

const handleChat = (res: Http.ServerResponse, body: Record<string, unknown>, timing: SimulatedTiming) => {
  const request = toRequest(body)
  if (typeof request === "string") return sendError(res, 400, request)
  const plan = planChat(request)
  if (request.stream) {
    const options = body.stream_options
    return streamChat(res, request, plan, isRecord(options) && options.include_usage === true, timing)
  }
  if (timing.first_token_ms <= 0 && timing.tokens_per_second <= 0) return completeChat(res, request, plan)
  const due = schedule(plan, timing)
  const timer = setTimeout(() => completeChat(res, request, plan), due[due.length - 1]!)
  res.on("close", () => clearTimeout(timer))
}

// ---------------------------------------------------------------------------------------------
// Embeddings and models

const handleEmbeddings = (res: Http.ServerResponse, body: Record<string, unknown>) => {
  const input = typeof body.input === "string" ? [body.input] : body.input
  if (!Array.isArray(input) || input.length === 0 || !input.every((s) => typeof s === "string")) {
    return sendError(res, 400, "input must be a string or a non-empty array of strings")
  }
  const base64 = body.encoding_format === "base64"
  let promptTokens = 0
  const data = (input as Array<string>).map((text, index) => {
    promptTokens += countTokens(text)
    const vector = embedText(text)
    return {
      object: "embedding",
      index,
      embedding: base64 ? Buffer.from(new Float32Array(vector).buffer).toString("base64") : vector
    }
  })
  sendJson(res, 200, {
    object: "list",
    data,
    model: typeof body.model === "string" ? body.model : "sim-embed",
    usage: { prompt_tokens: promptTokens, total_tokens: promptTokens }
  })
}

const modelsBody = JSON.stringify({
  object: "list",
  data: MODELS.map((id) => ({ id, object: "model", created: 1_767_225_600, owned_by: "wellspring-sim" }))
})

// ---------------------------------------------------------------------------------------------
// Server

const readJson = (
  req: Http.IncomingMessage,
  res: Http.ServerResponse,
  then: (body: Record<string, unknown>) => void
) => {
  const chunks: Array<Buffer> = []
  let size = 0
  req.on("data", (chunk: Buffer) => {
    size += chunk.length
    if (size > MAX_BODY) {
      sendError(res, 413, "request body too large")
      req.destroy()
      return
    }
    chunks.push(chunk)
  })
  req.on("end", () => {
    let body: unknown
    try {
      body = JSON.parse(chunks.length === 1 ? chunks[0]!.toString("utf8") : Buffer.concat(chunks).toString("utf8"))
    } catch {
      return sendError(res, 400, "body is not valid JSON")
    }
    if (!isRecord(body)) return sendError(res, 400, "body must be a JSON object")
    then(body)
  })
}

const strip = (url: string): string => {
  const q = url.indexOf("?")
  const path = q >= 0 ? url.slice(0, q) : url
  return path.startsWith("/v1/") ? path.slice(3) : path
}

export const makeSimHandler = (timing: SimulatedTiming) => (req: Http.IncomingMessage, res: Http.ServerResponse) => {
  const path = strip(req.url ?? "/")
  if (req.method === "POST" && path === "/chat/completions") {
    return readJson(req, res, (body) => handleChat(res, body, timing))
  }
  if (req.method === "POST" && path === "/embeddings") return readJson(req, res, (body) => handleEmbeddings(res, body))
  if (req.method === "GET" && path === "/models") {
    res.writeHead(200, JSON_HEADERS)
    return res.end(modelsBody)
  }
  req.resume()
  sendError(res, 404, `no route for ${req.method} ${req.url}`)
}

export const startSimServer = (options: Partial<SimServerOptions> = {}): Promise<SimServer> => {
  const o = { ...defaultSimServerOptions, ...options }
  const server = Http.createServer({ keepAliveTimeout: 65_000 }, makeSimHandler(o))
  server.headersTimeout = 70_000
  return new Promise((resolve, reject) => {
    server.once("error", reject)
    server.listen(o.port, o.host, () => {
      server.off("error", reject)
      const port = (server.address() as AddressInfo).port
      resolve({
        port,
        url: `http://${o.host.includes(":") ? `[${o.host}]` : o.host}:${port}`,
        close: () =>
          new Promise<void>((done) => {
            server.close(() => done())
            server.closeAllConnections()
          })
      })
    })
  })
}

/** Flags win over environment variables, which win over defaults. */
export const parseSimOptions = (argv: ReadonlyArray<string>, env: NodeJS.ProcessEnv): SimServerOptions => {
  const flags: Record<string, string> = {}
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!
    if (!arg.startsWith("--")) throw new Error(`unexpected argument ${arg}`)
    const eq = arg.indexOf("=")
    const name = eq > 0 ? arg.slice(2, eq) : arg.slice(2)
    const value = eq > 0 ? arg.slice(eq + 1) : argv[++i]
    if (value === undefined) throw new Error(`flag --${name} needs a value`)
    flags[name] = value
  }
  const number = (flag: string, envName: string, fallback: number): number => {
    const raw = flags[flag] ?? env[envName]
    if (raw === undefined || raw === "") return fallback
    const n = Number(raw)
    if (!Number.isFinite(n) || n < 0) throw new Error(`--${flag} must be a non-negative number, got ${raw}`)
    return n
  }
  for (const name of Object.keys(flags)) {
    if (!["port", "host", "first-token-ms", "tokens-per-second"].includes(name)) {
      throw new Error(`unknown flag --${name}`)
    }
  }
  const port = number("port", "SIM_PORT", defaultSimServerOptions.port)
  if (!Number.isInteger(port) || port > 65535) throw new Error(`--port must be an integer 0-65535`)
  return {
    port,
    host: flags.host ?? env.SIM_HOST ?? defaultSimServerOptions.host,
    first_token_ms: number("first-token-ms", "SIM_FIRST_TOKEN_MS", 0),
    tokens_per_second: number("tokens-per-second", "SIM_TOKENS_PER_SECOND", 0)
  }
}

const isMain = process.argv[1] !== undefined && import.meta.url === pathToFileURL(process.argv[1]).href

if (isMain) {
  try {
    const options = parseSimOptions(process.argv.slice(2), process.env)
    const server = await startSimServer(options)
    process.stdout.write(`listening on ${server.url}\n`)
    const stop = () => void server.close().then(() => process.exit(0))
    process.once("SIGINT", stop)
    process.once("SIGTERM", stop)
  } catch (error) {
    process.stderr.write(`sim-upstream: ${(error as Error).message}\n`)
    process.exit(1)
  }
}
