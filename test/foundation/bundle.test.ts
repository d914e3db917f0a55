/**
 * The build that `npm run serve` runs: `scripts/build.mjs` bundles the gateway into one folder, and the bundle,
 * started with plain `node` (no TypeScript loader), boots embedded mode, answers chat on both wires, and serves
 * the status page and the dashboard from the checkout.
 */
import * as ChildProcess from "node:child_process"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { cleanEnv, closedPort, type Running, startNode } from "./spawn.js"
import { SEMI_SPACE_MB } from "../../src/runtime/HeapBound.js"

const outDir = Path.join("test-artifacts", `bundle-${process.pid}`)
const tmp = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-bundle-"))

let gw: Running
let port: number
let key: string

beforeAll(async () => {
  const built = ChildProcess.spawnSync(process.execPath, ["scripts/build.mjs", outDir], { encoding: "utf8" })
  expect(built.status, built.stderr).toBe(0)
  port = await closedPort()
  gw = startNode(
    ["--max-old-space-size=160", Path.join(outDir, "main.js")],
    cleanEnv({ WELLSPRING_PORT: String(port), WELLSPRING_DATA_DIR: Path.join(tmp, "data") })
  )
  await gw.waitFor(new RegExp(`listening on http://127\\.0\\.0\\.1:${port}`), 120_000)
  key = (await gw.waitFor(/^API key: (\S+)$/m))[1]!
}, 180_000)

afterAll(async () => {
  if (gw !== undefined) expect(await gw.stop()).toBe(0)
  Fs.rmSync(outDir, { recursive: true, force: true })
  Fs.rmSync(tmp, { recursive: true, force: true })
})

const post = (path: string, body: unknown) =>
  fetch(`http://127.0.0.1:${port}${path}`, {
    method: "POST",
    headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
    body: JSON.stringify(body)
  })

describe("the bundled build (dist/ of npm run build)", () => {
  it("is a few files of JavaScript, without effect's documentation comments", () => {
    const files = Fs.readdirSync(outDir).filter((f) => f.endsWith(".js"))
    expect(files).toContain("main.js")
    const gateway = files.filter((f) => f.startsWith("Gateway-"))
    expect(gateway).toHaveLength(1)
    const text = Fs.readFileSync(Path.join(outDir, gateway[0]!), "utf8")
    // Schema.js opens with this sentence in node_modules; the bundle drops comments.
    expect(text).not.toContain("Describes data shapes and how unknown input becomes trusted values")
    expect(text).toContain("wellspring/http/CurrentRequestId")
  })

  it("restarts itself with the young-generation cap before loading the gateway", () => {
    const cmdline = Fs.readFileSync(`/proc/${gw.pid}/cmdline`, "utf8").split("\0")
    expect(cmdline).toContain(`--max-semi-space-size=${SEMI_SPACE_MB}`)
    expect(cmdline).toContain("--max-old-space-size=160")
  })

  it("answers a chat completion and a stream with the dev key", async () => {
    const res = await post("/v1/chat/completions", { model: "ws-pro", messages: [{ role: "user", content: "안녕" }] })
    expect(res.status).toBe(200)
    const body = await res.json() as { choices: Array<{ message: { content: string } }>; usage: { total_tokens: number } }
    expect(body.choices[0]!.message.content.length).toBeGreaterThan(0)
    expect(body.usage.total_tokens).toBeGreaterThan(0)
    const stream = await post("/v1/chat/completions", {
      model: "ws-pro",
      stream: true,
      messages: [{ role: "user", content: "안녕" }]
    })
    expect(stream.headers.get("content-type")).toMatch(/^text\/event-stream/)
    const text = await stream.text()
    expect(text.trimEnd().endsWith("data: [DONE]")).toBe(true)
  })

  it("serves the status page from the checkout's src/status/page", async () => {
    const res = await fetch(`http://127.0.0.1:${port}/`)
    expect(res.status).toBe(200)
    expect(res.headers.get("content-security-policy")).toContain("default-src 'none'")
    expect(await res.text()).toBe(Fs.readFileSync("src/status/page/index.html", "utf8"))
  })

  it("serves the dashboard build when there is one", async () => {
    const res = await fetch(`http://127.0.0.1:${port}/dashboard/`)
    expect(res.status).toBe(Fs.existsSync("dashboard/dist/index.html") ? 200 : 404)
  })
})

