/**
 * Issue #16 finding 2: every registered route, on every origin, takes hostile bodies without a 5xx, without
 * echoing them, and without stalling other users. The routes come from `listRoutes` over the app's routers, so
 * a route added later is covered without being named here.
 *
 * The gateway runs as its own process (embedded mode) under the heap bound of `npm run serve` (160 MB): one
 * unbounded parse of a 4 MB `[[[…]]]` body used to exhaust it. A legitimate client measures its latency while
 * the bodies are sent.
 */
import { Effect } from "effect"
import * as Fs from "node:fs"
import * as Net from "node:net"
import * as Os from "node:os"
import * as Path from "node:path"
import { Worker } from "node:worker_threads"
import { request as undiciRequest } from "undici"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as Yaml from "yaml"
import { accountRouter, inferenceRouter, statusRouter } from "../../src/App.js"
import { listRoutes, type RegisteredRoute } from "../../src/http/Server.js"
import { defaultConfigDoc } from "../support/Gateway.js"
import { cleanEnv, closedPort, type Running, runTs, startTs } from "../foundation/spawn.js"
import { parseHead } from "./raw.js"

const BODY_LIMIT = 4 * 1024 * 1024
const HEAP_MB = 160

interface Hostile {
  readonly name: string
  readonly contentType: string | null
  /** The bytes, or a size to send chunked (zeros) until the server answers. */
  readonly body: Buffer | { readonly chunkedBytes: number }
}

/** Seeded generator, so a failing fuzz case can be replayed. */
const prng = (seed: number) => () => {
  seed = (seed * 1103515245 + 12345) & 0x7fffffff
  return seed / 0x7fffffff
}

const hostileBodies = (): ReadonlyArray<Hostile> => {
  const json = "application/json"
  const random = prng(16)
  const fuzz = Array.from({ length: 4 }, (_, i): Hostile => {
    const length = Math.floor(random() * 200_000)
    const bytes = Buffer.alloc(length)
    for (let j = 0; j < length; j++) bytes[j] = Math.floor(random() * 256)
    return { name: `random bytes #${i} (${length})`, contentType: i % 2 === 0 ? json : null, body: bytes }
  })
  return [
    { name: "deep arrays (4 MB)", contentType: json, body: Buffer.from("[".repeat(BODY_LIMIT - 16)) },
    { name: "deep objects", contentType: json, body: Buffer.from("{\"a\":".repeat(400_000) + "1" + "}".repeat(400_000)) },
    { name: "10 MB chunked", contentType: json, body: { chunkedBytes: 10 * 1024 * 1024 } },
    { name: "10 MB declared", contentType: json, body: Buffer.alloc(10 * 1024 * 1024, "[") },
    {
      name: "invalid UTF-8",
      contentType: json,
      body: Buffer.concat([Buffer.from("{\"model\":\"ws-lite\",\"label\":\""), Buffer.from([0xff, 0xfe, 0xc3]), Buffer.from("\"}")])
    },
    {
      name: "huge numbers",
      contentType: json,
      body: Buffer.from(
        `{"model":"ws-lite","max_tokens":${"9".repeat(1_000_000)},"temperature":1e999999,"sfw_mode":-0,` +
          `"messages":[{"role":"user","content":"hi"}],"input":[${"1e308,".repeat(50_000)}1]}`
      )
    },
    {
      name: "__proto__ keys",
      contentType: json,
      body: Buffer.from(
        "{\"__proto__\":{\"sfw_mode\":true,\"label\":\"polluted\",\"status\":\"active\",\"model\":\"ws-lite\"}," +
          "\"constructor\":{\"prototype\":{\"polluted\":true}},\"messages\":{\"__proto__\":[]}}"
      )
    },
    { name: "multipart", contentType: "multipart/form-data; boundary=x", body: Buffer.from("--x\r\n\r\n" + "A".repeat(100_000)) },
    ...fuzz
  ]
}

interface Answer {
  readonly status: number
  readonly body: string
}

/**
 * Sends one request on a fresh socket and returns the answer. A body is written in 64 KiB pieces with
 * back-pressure and no longer than the server is listening: it stops at the first byte of an answer.
 */
const send = (port: number, method: string, path: string, headers: Record<string, string>, hostile: Hostile) =>
  new Promise<Answer>((resolve, reject) => {
    const socket = Net.connect({ host: "127.0.0.1", port })
    let received = Buffer.alloc(0)
    let answered = false
    const timer = setTimeout(() => finish(new Error(`${method} ${path} ${hostile.name}: no answer within 30 s`)), 30_000)
    const finish = (error: Error | null) => {
      clearTimeout(timer)
      socket.destroy()
      const head = parseHead(received)
      if (head) return resolve({ status: head.status, body: head.body })
      reject(error ?? new Error(`${method} ${path} ${hostile.name}: closed without an answer`))
    }
    socket.on("data", (chunk: Buffer) => {
      answered = true
      received = Buffer.concat([received, chunk])
      const head = parseHead(received)
      if (head && head.headers["content-length"] !== undefined && Buffer.byteLength(head.body) >= Number(head.headers["content-length"])) {
        finish(null)
      }
    })
    socket.on("error", () => undefined)
    socket.on("close", () => finish(null))
    socket.on("connect", async () => {
      const chunked = !Buffer.isBuffer(hostile.body)
      const total = Buffer.isBuffer(hostile.body) ? hostile.body.length : hostile.body.chunkedBytes
      const lines = [`${method} ${path} HTTP/1.1`, "host: 127.0.0.1", "connection: close"]
      for (const [k, v] of Object.entries(headers)) lines.push(`${k}: ${v}`)
      if (hostile.contentType !== null) lines.push(`content-type: ${hostile.contentType}`)
      lines.push(chunked ? "transfer-encoding: chunked" : `content-length: ${total}`)
      socket.write(lines.join("\r\n") + "\r\n\r\n")
      const piece = 64 * 1024
      for (let offset = 0; offset < total && !answered && !socket.destroyed; offset += piece) {
        const size = Math.min(piece, total - offset)
        const data = Buffer.isBuffer(hostile.body) ? hostile.body.subarray(offset, offset + size) : Buffer.alloc(size, "0")
        const ok = socket.write(chunked ? Buffer.concat([Buffer.from(`${size.toString(16)}\r\n`), data, Buffer.from("\r\n")]) : data)
        if (!ok) await new Promise((drained) => { socket.once("drain", drained); socket.once("close", drained) })
      }
      if (chunked && !answered && !socket.destroyed) socket.write("0\r\n\r\n")
    })
  })

/** A route path with its parameters filled in. */
const concrete = (path: string) => path.replace(/:[A-Za-z_]+/g, "1")

let gw: Running
let port: number
let dir: string
const callers: Array<{ readonly name: string; headers: Record<string, string> }> = []
let routes: ReadonlyArray<RegisteredRoute> = []
/** The legitimate client's key, of an account no hostile caller can touch. */
let proberKey = ""
let session = ""

/**
 * Keys of two accounts that no hostile case sends (the prober's and one of its own), alternated so that neither
 * reaches the per-account sign-in limit. Sign-out ends the session it is sent, so the cookie caller's sign-out cases
 * send a fresh session of one of these instead of the dev account's, which the other cases keep using.
 */
const signOutKeys: Array<string> = []
let signOuts = 0
const throwawaySession = async () => {
  const signIn = await undiciRequest(`http://127.0.0.1:${port}/api/user/session`, {
    method: "POST",
    headers: { origin: `http://127.0.0.1:${port}`, "content-type": "application/json" },
    body: JSON.stringify({ api_key: signOutKeys[signOuts++ % signOutKeys.length] })
  })
  await signIn.body.text()
  const token = /^ws-session=([^;]+)/.exec(String(signIn.headers["set-cookie"] ?? ""))?.[1]
  if (signIn.statusCode !== 200 || token === undefined) throw new Error(`sign-in for a sign-out case: ${signIn.statusCode}`)
  return token
}

/**
 * The active caller's key, replaced through the session when a case revoked it (rotation and key deletion are
 * among the routes, and a refusal of the body does not stop them: their bodies are optional).
 */
const keepActiveKey = async () => {
  const active = callers.find((c) => c.name === "active key")!
  const check = await undiciRequest(`http://127.0.0.1:${port}/v1/models`, { headers: active.headers })
  await check.body.text()
  if (check.statusCode === 200) return
  const created = await undiciRequest(`http://127.0.0.1:${port}/api/user/me/keys`, {
    method: "POST",
    headers: { cookie: `ws-session=${session}`, origin: `http://127.0.0.1:${port}`, "content-type": "application/json" },
    body: "{}"
  })
  const body = (await created.body.json()) as { data: { apiKey: string } }
  if (created.statusCode !== 200) {
    // Five keys at most: make room by revoking the oldest of the account's keys, then try again.
    const list = await undiciRequest(`http://127.0.0.1:${port}/api/user/me/keys`, { headers: { cookie: `ws-session=${session}` } })
    const keys = ((await list.body.json()) as { data: { keys: Array<{ id: number }> } }).data.keys
    const del = await undiciRequest(`http://127.0.0.1:${port}/api/user/me/keys/${keys[0]!.id}`, {
      method: "DELETE",
      headers: { cookie: `ws-session=${session}`, origin: `http://127.0.0.1:${port}`, "content-type": "application/json" }
    })
    await del.body.text()
    return keepActiveKey()
  }
  active.headers = { authorization: `Bearer ${body.data.apiKey}` }
}

beforeAll(async () => {
  routes = await Effect.runPromise(listRoutes({ inference: inferenceRouter, account: accountRouter, status: statusRouter }))
  dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-hostile-"))
  const doc = defaultConfigDoc()
  // Every hostile body is read: the per-key and per-address failure limits would otherwise refuse most of them
  // unread (they have tests of their own).
  Object.assign(doc.limits, { failed_requests_per_minute: 1_000_000, failed_auth_per_minute: 1_000_000 })
  doc.request_log = { batch_size: 500, flush_ms: 200 }
  const configFile = Path.join(dir, "gateway.yaml")
  Fs.writeFileSync(configFile, Yaml.stringify(doc))
  port = await closedPort()
  const env = cleanEnv({
    WELLSPRING_PORT: String(port),
    WELLSPRING_DATA_DIR: Path.join(dir, "data"),
    WELLSPRING_CONFIG: configFile,
    NODE_OPTIONS: `--max-old-space-size=${HEAP_MB}`
  })
  gw = startTs("src/main.ts", [], env)
  const activeKey = (await gw.waitFor(/^API key: (\S+)$/m, 120_000))[1]!
  await gw.waitFor(/ready in \d+ ms/)
  const cli = async (...args: Array<string>) => {
    const run = await runTs("src/cli.ts", args, env)
    if (run.code !== 0) throw new Error(`cli ${args.join(" ")}: ${run.stderr}`)
    return run.stdout
  }
  await cli("account:create", "--username", "dormant", "--display-name", "Dormant", "--status", "unlinked")
  const unlinkedKey = /API key: (\S+)/.exec(await cli("key:create", "--username", "dormant"))![1]!
  session = /ws-session=(\S+)/.exec(await cli("session:create", "--username", "dev"))![1]!
  await cli("account:create", "--username", "prober", "--display-name", "Prober")
  proberKey = /API key: (\S+)/.exec(await cli("key:create", "--username", "prober"))![1]!
  await cli("account:create", "--username", "leaver", "--display-name", "Leaver")
  signOutKeys.push(proberKey, /API key: (\S+)/.exec(await cli("key:create", "--username", "leaver"))![1]!)
  const origin = `http://127.0.0.1:${port}`
  callers.push(
    { name: "anonymous", headers: {} },
    { name: "active key", headers: { authorization: `Bearer ${activeKey}` } },
    { name: "unlinked key", headers: { authorization: `Bearer ${unlinkedKey}` } },
    { name: "session cookie", headers: { cookie: `ws-session=${session}`, origin, "sec-fetch-site": "same-origin" } }
  )
}, 240_000)

afterAll(async () => {
  if (process.env.HOSTILE_DEBUG) Fs.writeFileSync(process.env.HOSTILE_DEBUG, gw.output())
  await gw?.stop()
  if (dir) Fs.rmSync(dir, { recursive: true, force: true })
})

/**
 * Latencies of a legitimate client that starts a request every 10 ms whatever the answers (open loop), until
 * `stop` resolves: an event loop stalled for 400 ms delays ~40 of them, not one. It runs on a thread of its own,
 * so the hostile senders' work in this thread does not count as the gateway's.
 */
const PROBER = `
const { parentPort, workerData } = require("node:worker_threads")
const http = require("node:http")
const agent = new http.Agent({ keepAlive: true, maxSockets: 16 })
const latencies = []
let failure = null
let inFlight = 0
let stopping = false
const probe = () => {
  const started = performance.now()
  inFlight++
  const req = http.request({
    host: "127.0.0.1", port: workerData.port, path: "/v1/models", localAddress: "127.0.0.2", agent,
    headers: { authorization: "Bearer " + workerData.key }
  }, (res) => {
    res.resume()
    res.on("end", () => {
      if (res.statusCode !== 200) failure = "legitimate request answered " + res.statusCode
      latencies.push(performance.now() - started)
      done()
    })
  })
  req.on("error", (e) => { failure = String(e); done() })
  req.end()
}
const done = () => {
  inFlight--
  if (stopping && inFlight === 0) { agent.destroy(); parentPort.postMessage({ latencies, failure }) }
}
const timer = setInterval(probe, 10)
parentPort.on("message", () => { stopping = true; clearInterval(timer); if (inFlight === 0) done.call(null, inFlight++) })
`

const measureLatencies = async (stop: Promise<unknown>) => {
  const worker = new Worker(PROBER, { eval: true, workerData: { port, key: proberKey } })
  await stop
  const result = await new Promise<{ latencies: Array<number>; failure: string | null }>((resolve, reject) => {
    worker.once("message", resolve)
    worker.once("error", reject)
    worker.postMessage("stop")
  })
  await worker.terminate()
  if (result.failure !== null) throw new Error(result.failure)
  return result.latencies.sort((a, b) => a - b)
}

/** Every TypeScript file under `dir`. */
const sourceFiles = (dir: string): Array<string> =>
  Fs.readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = Path.join(dir, entry.name)
    return entry.isDirectory() ? sourceFiles(path) : entry.name.endsWith(".ts") ? [path] : []
  })

describe("one body reader", () => {
  it("nothing in src/ reads a request body except http/Body.ts", () => {
    // The Node request (its stream) is reached in two places: the reader, and the server's check of whether a
    // body was left unread (headers only). The platform's body accessors are used nowhere.
    // The platform's body accessors on an inbound request, and the Node request under it. (`stream` is left out:
    // chat requests have a `stream` flag.)
    const readers = /toIncomingMessage\(|\.(?:arrayBuffer|urlParamsBody|multipart|multipartStream|textUnsafe)\b|schemaBody\w*\(|HttpServerRequest\.\w*[Bb]ody|\brequest\.(?:text|json)\b/
    const found = sourceFiles("src").filter((file) => readers.test(Fs.readFileSync(file, "utf8"))).map((f) => f.split(Path.sep).join("/"))
    expect(found.sort()).toEqual(["src/http/Body.ts", "src/http/Server.ts"])
    const server = Fs.readFileSync("src/http/Server.ts", "utf8")
    expect(server.match(/toIncomingMessage\(/g)?.length).toBe(1)
    expect(server).not.toMatch(/incoming\.(?:on|read|resume|pipe)\(/)
  })
})

describe("hostile bodies on every registered route", () => {
  it("finds the routes of every origin, bodies or not", () => {
    const keys = routes.map((r) => `${r.method} ${r.path}`)
    // A few known ones, to prove the enumeration reads real registrations (not that the list is complete).
    expect(keys).toContain("POST /v1/chat/completions")
    expect(keys).toContain("POST /api/user/sfw")
    expect(keys).toContain("POST /api/user/me/keys")
    expect(routes.filter((r) => r.method !== "GET").length).toBeGreaterThanOrEqual(6)
  })

  it("no 5xx, no echo, no crash under the heap bound, and a concurrent client's p99 stays under 50 ms", async () => {
    const bodies = hostileBodies().filter((b) => !process.env.HOSTILE_ONLY || b.name.startsWith(process.env.HOSTILE_ONLY))
    const cases: Array<() => Promise<void>> = []
    const failures: Array<string> = []
    // Body by body, so that the same body reaches several routes and callers at once.
    for (const hostile of bodies) {
      for (const route of routes) {
        // The route's own method, also on a GET route: the server must not read that body either.
        const method = route.method === "*" ? "POST" : route.method
        for (const caller of callers) {
          cases.push(async () => {
            if (caller.name === "active key") await keepActiveKey()
            const what = `${caller.name} ${method} ${route.path} ${hostile.name}`
            const signOut = caller.name === "session cookie" && method === "DELETE" && route.path === "/api/user/session"
            const headers = signOut ? { ...caller.headers, cookie: `ws-session=${await throwawaySession()}` } : caller.headers
            const answer = await send(port, method, concrete(route.path), headers, hostile).catch((e: Error) => ({
              status: -1,
              body: e.message
            }))
            if (answer.status < 200 || answer.status >= 500) failures.push(`${what}: ${answer.status} ${answer.body.slice(0, 200)}`)
            // Never echoed: refusals are short, and no answer holds a long run of what was sent.
            if (answer.status >= 400 && answer.body.length > 4096) failures.push(`${what}: answer of ${answer.body.length} bytes`)
            if (/\[{8}|9{16}|(\{"a":){4}|A{64}/.test(answer.body)) failures.push(`${what}: echoes the body`)
            if (route.path === "/api/user/sfw" && answer.status === 200 && JSON.parse(answer.body).sfw_mode !== false) {
              failures.push(`${what}: sfw_mode read from a prototype or a non-boolean`)
            }
          })
        }
      }
    }
    let finished!: () => void
    const allSent = new Promise<void>((resolve) => (finished = resolve))
    const latencies = measureLatencies(allSent)
    // Two hostile clients at a time: the senders share the machine's two cores with the gateway, and more of them
    // would measure the load generator's CPU rather than the gateway's stalls.
    let next = 0
    await Promise.all(Array.from({ length: 2 }, async () => {
      while (next < cases.length) await cases[next++]!()
    }))
    finished()
    const measured = await latencies

    const p99 = measured[Math.min(measured.length - 1, Math.floor(measured.length * 0.99))]!
    const summary = `p50 ${measured[Math.floor(measured.length / 2)]!.toFixed(1)} ms, p99 ${p99.toFixed(1)} ms over ${measured.length}`
    console.log(`legitimate client during ${cases.length} hostile requests: ${summary}`)
    expect(failures, gw.output().slice(-3000)).toEqual([])
    expect(cases.length).toBeGreaterThan(100)
    // The process survived every body under its 160 MB heap.
    expect(gw.output()).not.toMatch(/heap out of memory|FATAL ERROR/)
    const alive = await undiciRequest(`http://127.0.0.1:${port}/v1/models`, { headers: { authorization: `Bearer ${proberKey}` } })
    await alive.body.text()
    expect(alive.statusCode).toBe(200)
    expect(measured.length).toBeGreaterThan(50)
    expect(p99, summary).toBeLessThan(50)
  }, 600_000)
})
