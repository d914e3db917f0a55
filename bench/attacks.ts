/**
 * `npm run bench:attacks`: what the attacks of issue 16 cost the gateway now. Starts the compiled gateway
 * (`dist/main.js`, embedded mode, default limits, the 160 MB heap of `npm run serve`) and, while a legitimate
 * client on another loopback address sends a request every 10 ms, runs in turn:
 * - a silent flood: 4,096 sockets from one address, then from 64 addresses, none sending a byte;
 * - slow headers: 256 sockets sending a header line every second;
 * - a body bomb: three concurrent 4 MB `[[[…]]]` bodies on `POST /api/user/sfw`, ten times;
 * - failed authentication: 2,000 random keys and 2,000 random session cookies from one address.
 * Prints, per phase, the legitimate client's p50/p99 and failures, and what the attacker got.
 */
import { type ChildProcess, spawn } from "node:child_process"
import * as Crypto from "node:crypto"
import * as Fs from "node:fs"
import * as Http from "node:http"
import * as Net from "node:net"
import * as Os from "node:os"
import * as Path from "node:path"

const root = Path.resolve(import.meta.dirname, "..")
const tmp = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-attacks-"))
let gateway: ChildProcess | null = null

const freePort = () =>
  new Promise<number>((resolve) => {
    const s = Net.createServer().listen(0, "127.0.0.1", () => {
      const port = (s.address() as Net.AddressInfo).port
      s.close(() => resolve(port))
    })
  })

const startGateway = async () => {
  const port = await freePort()
  const child = spawn(process.execPath, ["--max-old-space-size=160", "--max-semi-space-size=8", "dist/main.js"], {
    cwd: root,
    env: { ...process.env, WELLSPRING_PORT: String(port), WELLSPRING_DATA_DIR: Path.join(tmp, "data") },
    stdio: ["ignore", "pipe", "pipe"]
  })
  gateway = child
  let output = ""
  const key = await new Promise<string>((resolve, reject) => {
    const onData = (d: Buffer) => {
      output += d.toString()
      const m = /API key: (\S+)/.exec(output)
      if (m && /ready in/.test(output)) resolve(m[1]!)
    }
    child.stdout!.on("data", onData)
    child.stderr!.on("data", onData)
    child.once("exit", (code) => reject(new Error(`gateway exited (${code}):\n${output}`)))
  })
  return { port, key, child, output: () => output }
}

/** A legitimate client: a request every 10 ms (open loop) from 127.0.0.200, until stopped. */
const legitimate = (port: number, key: string) => {
  const agent = new Http.Agent({ keepAlive: true, maxSockets: 16 })
  const latencies: Array<number> = []
  let failures = 0
  const timer = setInterval(() => {
    const started = performance.now()
    const req = Http.request({
      host: "127.0.0.1",
      port,
      path: "/v1/models",
      localAddress: "127.0.0.200",
      agent,
      timeout: 10_000,
      headers: { authorization: `Bearer ${key}` }
    }, (res) => {
      res.resume()
      res.on("end", () => {
        if (res.statusCode === 200) latencies.push(performance.now() - started)
        else failures++
      })
    })
    req.on("timeout", () => req.destroy(new Error("timeout")))
    req.on("error", () => failures++)
    req.end()
  }, 10)
  return {
    stop: () => {
      clearInterval(timer)
      agent.destroy()
      const sorted = latencies.sort((a, b) => a - b)
      const at = (q: number) => sorted.length === 0 ? NaN : sorted[Math.min(sorted.length - 1, Math.floor(sorted.length * q))]!
      return { ok: sorted.length, failures, p50: at(0.5), p99: at(0.99) }
    }
  }
}

const wait = (ms: number) => new Promise((r) => setTimeout(r, ms))

/** Opens `count` sockets from the given addresses and holds them; counts how many the server closed. */
const holdSockets = async (port: number, count: number, from: (i: number) => string, onOpen?: (s: Net.Socket) => void) => {
  const sockets: Array<Net.Socket> = []
  let closedByServer = 0
  let released = false
  await Promise.all(Array.from({ length: count }, (_, i) =>
    new Promise<void>((resolve) => {
      const socket = Net.connect({ host: "127.0.0.1", port, localAddress: from(i), allowHalfOpen: true })
      let ended = false
      const closed = () => {
        if (!ended && !released) closedByServer++
        ended = true
      }
      socket.on("error", closed)
      socket.once("end", closed)
      socket.once("close", () => {
        closed()
        resolve()
      })
      socket.once("connect", () => {
        sockets.push(socket)
        onOpen?.(socket)
        resolve()
      })
    })))
  return {
    sockets,
    closedByServer: () => closedByServer,
    release: () => {
      released = true
      sockets.forEach((s) => s.destroy())
    }
  }
}

const phase = async (name: string, port: number, key: string, attack: () => Promise<string>) => {
  const client = legitimate(port, key)
  const attacker = await attack()
  const r = client.stop()
  console.log(
    `${name.padEnd(34)} legit p50 ${r.p50.toFixed(1).padStart(6)} ms  p99 ${r.p99.toFixed(1).padStart(7)} ms  ` +
      `ok ${String(r.ok).padStart(5)}  failed ${String(r.failures).padStart(4)}  | ${attacker}`
  )
}

const request = (port: number, from: string, method: string, path: string, headers: Record<string, string>, body?: Buffer) =>
  new Promise<number>((resolve) => {
    const req = Http.request({ host: "127.0.0.1", port, localAddress: from, method, path, headers, agent: false }, (res) => {
      res.resume()
      res.on("end", () => resolve(res.statusCode ?? 0))
    })
    req.on("error", () => resolve(-1))
    req.end(body)
  })

const main = async () => {
  if (!Fs.existsSync(Path.join(root, "dist/main.js"))) throw new Error("run `npm run build` first")
  const { port, key, child, output } = await startGateway()

  await phase("baseline", port, key, async () => {
    await wait(3000)
    return "-"
  })

  await phase("4,096 silent sockets, 1 address", port, key, async () => {
    const held = await holdSockets(port, 4096, () => "127.0.0.1")
    await wait(8000)
    const closed = held.closedByServer()
    held.release()
    return `server closed ${closed} of 4096 within 8 s`
  })

  await phase("4,096 silent sockets, 64 addresses", port, key, async () => {
    const held = await holdSockets(port, 4096, (i) => `127.0.1.${(i % 64) + 1}`)
    await wait(8000)
    const closed = held.closedByServer()
    held.release()
    return `server closed ${closed} of 4096 within 8 s`
  })

  await phase("256 slow-header sockets, 64 addr.", port, key, async () => {
    const timers: Array<NodeJS.Timeout> = []
    const held = await holdSockets(port, 256, (i) => `127.0.2.${(i % 64) + 1}`, (s) => {
      s.write("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
      timers.push(setInterval(() => s.writable && s.write("x-slow: 1\r\n"), 1000))
    })
    await wait(20_000)
    timers.forEach(clearInterval)
    const closed = held.closedByServer()
    held.release()
    return `server closed ${closed} of 256 within 20 s`
  })

  await phase("body bomb: 3 × 4 MB on /api/user/sfw", port, key, async () => {
    const bomb = Buffer.from("[".repeat(4 * 1024 * 1024 - 16))
    const statuses = new Map<number, number>()
    for (let round = 0; round < 10; round++) {
      const answers = await Promise.all(Array.from({ length: 3 }, () =>
        request(port, "127.0.4.1", "POST", "/api/user/sfw", { authorization: `Bearer ${key}`, "content-type": "application/json" }, bomb)
      ))
      for (const s of answers) statuses.set(s, (statuses.get(s) ?? 0) + 1)
    }
    return `answers ${[...statuses].map(([s, n]) => `${s}×${n}`).join(" ")}; gateway ${child.exitCode === null ? "alive" : "DEAD"}`
  })

  await phase("2,000 random keys, 1 address", port, key, async () => {
    const statuses = new Map<number, number>()
    const started = performance.now()
    for (let i = 0; i < 2000; i += 32) {
      const answers = await Promise.all(Array.from({ length: 32 }, () =>
        request(port, "127.0.3.1", "GET", "/v1/models", { authorization: `Bearer sk-ws-${Crypto.randomBytes(32).toString("base64url")}` })
      ))
      for (const s of answers) statuses.set(s, (statuses.get(s) ?? 0) + 1)
    }
    const seconds = (performance.now() - started) / 1000
    return `${[...statuses].map(([s, n]) => `${s}×${n}`).join(" ")} in ${seconds.toFixed(1)} s (each 401 is a lookup)`
  })

  await phase("2,000 random cookies, 1 address", port, key, async () => {
    const statuses = new Map<number, number>()
    for (let i = 0; i < 2000; i += 32) {
      const answers = await Promise.all(Array.from({ length: 32 }, () =>
        request(port, "127.0.3.2", "GET", "/api/user/me", { cookie: `ws-session=${Crypto.randomBytes(36).toString("base64url")}` })
      ))
      for (const s of answers) statuses.set(s, (statuses.get(s) ?? 0) + 1)
    }
    return `${[...statuses].map(([s, n]) => `${s}×${n}`).join(" ")}`
  })

  if (/heap out of memory/.test(output())) console.log("gateway ran out of heap")
}

main().then(
  () => {
    gateway?.kill("SIGTERM")
    Fs.rmSync(tmp, { recursive: true, force: true })
  },
  (error) => {
    console.error(error)
    gateway?.kill("SIGKILL")
    process.exitCode = 1
  }
)
