/**
 * BYOK API test support: fake OpenAI-compatible (and Anthropic) providers on 127.0.0.1, and a gateway booted in
 * this process whose every log line is captured (the canary test greps them).
 */
import { type Effect, ManagedRuntime } from "effect"
import * as Fs from "node:fs"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import * as Os from "node:os"
import * as Path from "node:path"
import * as Yaml from "yaml"
import { appLayer, type AppOptions, ensureDevAccount } from "../../src/App.js"
import { loadConfig } from "../../src/config/GatewayConfig.js"
import { BoundListeners } from "../../src/http/Server.js"
import { type ConfigDoc, defaultConfigDoc, type TestGateway } from "../support/Gateway.js"

/** Secrets the fakes accept start with this; any other key is refused with a 401 that echoes it. */
export const GOOD = "sk-good-"

export interface FakeProviders {
  readonly origin: string
  /** Listing requests per presented key (the whole auth header value). */
  readonly listings: Map<string, number>
  readonly close: () => Promise<void>
}

const send = (res: Http.ServerResponse, status: number, body: unknown) => {
  res.writeHead(status, { "content-type": "application/json" })
  res.end(JSON.stringify(body))
}

export const LISTING = { object: "list", data: [{ id: "gpt-x", object: "model" }, { id: "gpt-y", object: "model" }] }

/**
 * `/openai/v1/models` (Bearer), `/anthropic/v1/models` (x-api-key), `/custom/v1/models` (a user base URL),
 * `/down/v1/models` (always 500). A key not starting with `sk-good-` gets 401 with the key echoed in the body,
 * as real providers do.
 */
export const startFakeProviders = async (): Promise<FakeProviders> => {
  const listings = new Map<string, number>()
  const server = Http.createServer((req, res) => {
    const url = req.url ?? ""
    const auth = String(req.headers.authorization ?? req.headers["x-api-key"] ?? "")
    const key = auth.replace(/^Bearer /, "")
    if (url.startsWith("/down/")) return send(res, 500, { error: { message: `boom ${key}` } })
    if (!key.startsWith(GOOD)) return send(res, 401, { error: { message: `Incorrect API key provided: ${key}` } })
    listings.set(auth, (listings.get(auth) ?? 0) + 1)
    if (url.startsWith("/openai/v1/models") || url.startsWith("/custom/v1/models")) return send(res, 200, LISTING)
    if (url.startsWith("/anthropic/v1/models")) {
      return send(res, 200, { data: [{ id: "claude-x", display_name: "Claude X", type: "model" }], has_more: false })
    }
    send(res, 404, { error: "unknown fake path" })
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  return {
    origin: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    listings,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections()
        server.close(() => resolve())
      })
  }
}

export interface CapturingGateway extends TestGateway {
  /** Every log line of the gateway so far, as its logger wrote it (message, annotations and cause). */
  readonly logs: Array<string>
}

/** `startGateway` (test/support/Gateway.ts) plus a logger that keeps every line. */
export const startCapturingGateway = async (options: {
  readonly configure?: (doc: ConfigDoc) => void
  readonly databaseUrl?: string
  readonly admission?: AppOptions["admission"]
  readonly byokGuard?: AppOptions["byokGuard"]
}): Promise<CapturingGateway> => {
  const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-byok-"))
  const configPath = Path.join(dir, "gateway.yaml")
  const doc = defaultConfigDoc()
  options.configure?.(doc)
  Fs.writeFileSync(configPath, Yaml.stringify(doc))
  const { config, path } = loadConfig({
    path: configPath,
    env: {
      WELLSPRING_PORT: "0",
      WELLSPRING_DATA_DIR: Path.join(dir, "data"),
      ...(options.databaseUrl ? { DATABASE_URL: options.databaseUrl } : {})
    }
  })
  const logs: Array<string> = []
  // The lines exactly as the gateway's logger writes them (message, annotations and cause).
  const runtime = ManagedRuntime.make(appLayer(config, path, {
    ...(options.admission ? { admission: options.admission } : {}),
    ...(options.byokGuard ? { byokGuard: options.byokGuard } : {}),
    logSink: (line) => void logs.push(line)
  }))
  const key = await runtime.runPromise(ensureDevAccount)
  const { listeners } = await runtime.runPromise(BoundListeners)
  const port = listeners[0]!.port
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    key: key ?? "",
    dir,
    configPath,
    runtime: runtime as unknown as TestGateway["runtime"],
    run: (effect) => runtime.runPromise(effect as Effect.Effect<any, any, any>),
    rewriteConfig: () => {
      throw new Error("not supported")
    },
    stop: async () => {
      await runtime.dispose()
      Fs.rmSync(dir, { recursive: true, force: true })
    },
    logs
  }
}
