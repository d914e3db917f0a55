/**
 * `npm run bench`: the simulated upstream, a minimal undici reverse proxy (the floor) and the gateway,
 * each in its own process, driven by the same load generator in one run.
 *
 * Env BENCH_DIST: the build folder to run (default dist; e.g. an older build copied aside for an A/B).
 * Flags: --requests N (per scenario at concurrency 32, default 6000), --modes embedded,redis,
 * --only images (just the in-process image queue scenario, `bench/images.ts`, which always runs first).
 * Prints requests/s, latency p50/p99, added stream TTFB, gateway CPU per request and per streamed
 * chunk, gateway peak RSS, and the ratios gateway/floor and gateway/direct.
 */
import { type ChildProcess, spawn } from "node:child_process"
import * as Fs from "node:fs"
import * as Net from "node:net"
import * as Os from "node:os"
import * as Path from "node:path"
import { Pool } from "undici"
import * as Yaml from "yaml"
import { printImageBench, runImageBench } from "./images.js"

const arg = (name: string, fallback: string) => {
  const i = process.argv.indexOf(`--${name}`)
  return i > 0 ? process.argv[i + 1]! : fallback
}
const REQUESTS = Number(arg("requests", "6000"))
const MODES = arg("modes", "embedded,redis").split(",")
const ONLY = arg("only", "")
const root = Path.resolve(import.meta.dirname, "..")
const tmp = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-bench-"))
const children: Array<ChildProcess> = []
/** The heap bound of `npm run serve` (see README, Production mode). */
const SERVE_NODE_FLAGS = [`--max-old-space-size=${process.env.WELLSPRING_HEAP_MB ?? 160}`]

const freePort = () =>
  new Promise<number>((resolve) => {
    const s = Net.createServer().listen(0, "127.0.0.1", () => {
      const port = (s.address() as Net.AddressInfo).port
      s.close(() => resolve(port))
    })
  })

const start = (name: string, args: Array<string>, env: Record<string, string>, ready: RegExp) =>
  new Promise<{ child: ChildProcess; match: RegExpMatchArray }>((resolve, reject) => {
    // The gateway runs from the compiled build, as in production; helpers run through tsx.
    const argv = args[0]!.endsWith(".ts") ? ["--import", "tsx", ...args] : [...SERVE_NODE_FLAGS, ...args]
    const child = spawn(process.execPath, argv, {
      cwd: root,
      env: { ...process.env, ...env },
      stdio: ["ignore", "pipe", "pipe"]
    })
    children.push(child)
    let out = ""
    const timer = setTimeout(() => reject(new Error(`${name} did not start:\n${out}`)), 60_000)
    const onData = (d: Buffer) => {
      out += d.toString()
      const match = out.match(ready)
      if (match) {
        clearTimeout(timer)
        resolve({ child, match })
      }
    }
    child.stdout!.on("data", onData)
    child.stderr!.on("data", (d: Buffer) => (out += d.toString()))
    child.once("exit", (code) => reject(new Error(`${name} exited ${code}:\n${out}`)))
  })

const procStat = (pid: number) => {
  const stat = Fs.readFileSync(`/proc/${pid}/stat`, "utf8")
  const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ")
  const ticks = Number(fields[11]) + Number(fields[12])
  const status = Fs.readFileSync(`/proc/${pid}/status`, "utf8")
  const hwm = Number(/VmHWM:\s+(\d+)/.exec(status)?.[1] ?? 0)
  return { cpuMs: (ticks * 1000) / 100, peakRssMb: hwm / 1024 }
}

const percentile = (sorted: Array<number>, p: number) => sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]!

interface Result {
  readonly rps: number
  readonly p50: number
  readonly p99: number
  readonly ttfb50: number
  readonly frames: number
}

const body = (stream: boolean) =>
  JSON.stringify({
    model: "ws-bench",
    stream,
    max_tokens: 48,
    messages: [{ role: "system", content: "You are terse." }, { role: "user", content: "Say hello to the benchmark." }]
  })

/** Sends `count` requests with `concurrency` in flight; latencies in ms. */
const drive = async (url: string, key: string | null, stream: boolean, concurrency: number, count: number): Promise<Result> => {
  const pool = new Pool(url, { connections: concurrency, pipelining: 1 })
  const payload = body(stream)
  const headers: Record<string, string> = { "content-type": "application/json" }
  if (key) headers.authorization = `Bearer ${key}`
  const latencies: Array<number> = []
  const ttfbs: Array<number> = []
  let frames = 0
  let next = 0
  let failures = 0
  const one = async () => {
    const t0 = performance.now()
    const res = await pool.request({ method: "POST", path: "/v1/chat/completions", headers, body: payload }).catch((e) => {
      throw new Error(`${url}: ${e.message}`)
    })
    let first = -1
    let text = ""
    for await (const chunk of res.body) {
      if (first < 0) first = performance.now() - t0
      if (stream) text += chunk.toString()
    }
    if (res.statusCode !== 200) failures++
    latencies.push(performance.now() - t0)
    ttfbs.push(first)
    if (stream) frames += text.split("data: ").length - 1
  }
  const worker = async () => {
    while (next < count) {
      next++
      await one()
    }
  }
  const t0 = performance.now()
  await Promise.all(Array.from({ length: concurrency }, worker))
  const seconds = (performance.now() - t0) / 1000
  await pool.close()
  if (failures > 0) throw new Error(`${failures} of ${count} requests to ${url} failed`)
  latencies.sort((a, b) => a - b)
  ttfbs.sort((a, b) => a - b)
  return { rps: count / seconds, p50: percentile(latencies, 0.5), p99: percentile(latencies, 0.99), ttfb50: percentile(ttfbs, 0.5), frames: frames / count }
}

const benchConfig = (simUrl: string) => {
  const doc = Yaml.parse(Fs.readFileSync(Path.join(root, "config/gateway.yaml"), "utf8"))
  doc.plans.default = { session_limit: 1e12, weekly_limit: 1e12, session_hours: 5, show_request_pct: true }
  doc.abuse = { burst: 1e9, window_seconds: 1, cooldown_seconds: 1 }
  doc.catalog.providers.simhttp = { kind: "openai-compatible", base_url: simUrl, connections: 64 }
  doc.catalog.models.push({
    id: "ws-bench",
    owned_by: "bench",
    max_input_tokens: 100000,
    max_output_tokens: 4096,
    rate_limit_rpm: 1e9,
    concurrency: 1e6,
    route: { provider: "simhttp", model: "sim-lite" }
  })
  const file = Path.join(tmp, "bench.yaml")
  Fs.writeFileSync(file, Yaml.stringify(doc))
  return file
}

const scenarios = [
  { name: "json c=1", stream: false, concurrency: 1, count: Math.max(500, Math.floor(REQUESTS / 3)) },
  { name: "json c=32", stream: false, concurrency: 32, count: REQUESTS },
  { name: "sse c=1", stream: true, concurrency: 1, count: Math.max(500, Math.floor(REQUESTS / 3)) },
  { name: "sse c=32", stream: true, concurrency: 32, count: REQUESTS }
]

const fmt = (n: number, d = 2) => n.toFixed(d)

const main = async () => {
  const images = await runImageBench()
  printImageBench(images)
  if (ONLY === "images") return
  await new Promise<void>((resolve, reject) =>
    spawn(process.execPath, ["scripts/build.mjs"], { cwd: root, stdio: "inherit" }).once("exit", (code) =>
      code === 0 ? resolve() : reject(new Error(`build failed (${code})`))
    )
  )
  const sim = await start("sim", ["src/upstream/simulated/server.ts", "--port", "0"], {}, /listening on (\S+)/)
  const simUrl = sim.match[1]!
  const floor = await start("floor", ["bench/floor-proxy.ts", "--port", "0", "--upstream", simUrl], {}, /listening on (\S+)/)
  const floorUrl = floor.match[1]!
  const skeleton = await start("effect skeleton", ["bench/effect-skeleton.ts", "--port", "0", "--upstream", simUrl], {}, /listening on (\S+)/)
  const skeletonUrl = skeleton.match[1]!
  const config = benchConfig(simUrl)
  const rows: Array<string> = []
  const out: Record<string, unknown> = {}

  for (const mode of MODES) {
    const port = await freePort()
    const env: Record<string, string> = {
      WELLSPRING_CONFIG: config,
      WELLSPRING_PORT: String(port),
      WELLSPRING_DATA_DIR: Path.join(tmp, `data-${mode}`)
    }
    if (mode === "redis") {
      const pg = await import("pg")
      const name = `ws_bench_${Date.now().toString(36)}`
      const client = new pg.default.Client({ host: "127.0.0.1", user: "root", database: "test" })
      await client.connect()
      await client.query(`CREATE DATABASE ${name}`)
      await client.end()
      env.DATABASE_URL = `postgres://root@127.0.0.1:5432/${name}`
      env.REDIS_URL = "redis://127.0.0.1:6379"
    }
    // First start creates the database and prints the dev key; the measured process is a restart (steady state).
    const first = await start(`gateway (${mode}, first start)`, [`${process.env.BENCH_DIST ?? "dist"}/main.js`], env, /API key: (\S+)/)
    const key = first.match[1]!
    first.child.kill("SIGTERM")
    await new Promise((r) => first.child.once("exit", r))
    const gw = await start(`gateway (${mode})`, [`${process.env.BENCH_DIST ?? "dist"}/main.js`], env, /ready in/)
    const gwUrl = `http://127.0.0.1:${port}`
    // Warm-up: JIT, pools, caches.
    for (const target of [simUrl, floorUrl, skeletonUrl, gwUrl]) {
      await drive(target, target === gwUrl ? key : null, false, 8, 400)
      await drive(target, target === gwUrl ? key : null, true, 8, 400)
    }
    for (const s of scenarios) {
      const direct = await drive(simUrl, null, s.stream, s.concurrency, s.count)
      const viaFloor = await drive(floorUrl, null, s.stream, s.concurrency, s.count)
      const viaSkeleton = await drive(skeletonUrl, null, s.stream, s.concurrency, s.count)
      const before = procStat(gw.child.pid!)
      const viaGw = await drive(gwUrl, key, s.stream, s.concurrency, s.count)
      const after = procStat(gw.child.pid!)
      const cpuPerReq = (after.cpuMs - before.cpuMs) / s.count
      const result = {
        direct,
        floor: viaFloor,
        skeleton: viaSkeleton,
        gateway: viaGw,
        addedP50: viaGw.p50 - direct.p50,
        addedP99: viaGw.p99 - direct.p99,
        addedTtfb50: viaGw.ttfb50 - direct.ttfb50,
        cpuMsPerRequest: cpuPerReq,
        cpuUsPerFrame: s.stream ? (cpuPerReq * 1000) / viaGw.frames : null,
        peakRssMb: after.peakRssMb
      }
      out[`${mode} ${s.name}`] = result
      rows.push([
        mode,
        s.name,
        fmt(direct.rps, 0),
        fmt(viaFloor.rps, 0),
        fmt(viaSkeleton.rps, 0),
        fmt(viaGw.rps, 0),
        fmt(viaGw.rps / viaFloor.rps),
        fmt(viaGw.rps / direct.rps),
        `${fmt(direct.p50)}/${fmt(direct.p99)}`,
        `${fmt(viaGw.p50)}/${fmt(viaGw.p99)}`,
        `${fmt(result.addedP50)}/${fmt(result.addedP99)}`,
        s.stream ? fmt(result.addedTtfb50) : "-",
        fmt(cpuPerReq * 1000, 0),
        result.cpuUsPerFrame === null ? "-" : fmt(result.cpuUsPerFrame, 1),
        fmt(after.peakRssMb, 0)
      ].join(" | "))
      process.stderr.write(`done: ${mode} ${s.name}\n`)
    }
    gw.child.kill("SIGTERM")
    await new Promise((r) => gw.child.once("exit", r))
  }
  const header = [
    "mode", "scenario", "direct rps", "floor rps", "effect skeleton rps", "gateway rps", "gw/floor", "gw/direct",
    "direct p50/p99 ms", "gateway p50/p99 ms", "added p50/p99 ms", "added TTFB p50 ms",
    "gw CPU µs/req", "gw CPU µs/frame", "gw peak RSS MB"
  ]
  console.log(`| ${header.join(" | ")} |`)
  console.log(`|${header.map(() => "---").join("|")}|`)
  for (const row of rows) console.log(`| ${row} |`)
  Fs.mkdirSync(Path.join(root, "bench/results"), { recursive: true })
  Fs.writeFileSync(Path.join(root, "bench/results/latest.json"), JSON.stringify({ ...out, images }, null, 2))
}

main()
  .catch((error) => {
    console.error(error)
    process.exitCode = 1
  })
  .finally(() => {
    for (const c of children) c.kill("SIGTERM")
    Fs.rmSync(tmp, { recursive: true, force: true })
  })
