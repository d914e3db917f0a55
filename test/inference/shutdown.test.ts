/**
 * Graceful shutdown of the real process (issue [2/4] §5): on SIGTERM the gateway stops accepting
 * connections, lets the open stream finish with `[DONE]`, writes every queued request row and exits 0.
 */
import * as Fs from "node:fs"
import * as Net from "node:net"
import * as Os from "node:os"
import * as Path from "node:path"
import pg from "pg"
import * as Yaml from "yaml"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { cleanEnv, closedPort, operatorKey, type Running, startTs } from "../foundation/spawn.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { defaultConfigDoc } from "../support/Gateway.js"
import { Behaviour, Chunks, type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"
import { serviceGate } from "../support/Services.js"
import { addMockModel, parseSse, readBody, user } from "./helpers.js"
import { eventually } from "../support/Eventually.js"

const postgres = await serviceGate("postgres")

/** Resolves true once a fresh TCP connection to `port` is refused. */
const refused = (port: number) =>
  new Promise<boolean>((resolve) => {
    const socket = Net.connect({ host: "127.0.0.1", port })
    socket.once("connect", () => {
      socket.destroy()
      resolve(false)
    })
    socket.once("error", (error: NodeJS.ErrnoException) => resolve(error.code === "ECONNREFUSED"))
  })

describe.skipIf(!postgres)("graceful shutdown (SIGTERM)", () => {
  let db: FreshDatabase
  let mock: MockUpstream
  let gateway: Running | undefined
  let dir: string
  const GRACE_SECONDS = 15

  beforeAll(async () => {
    db = await freshDatabase("shutdown")
    mock = await startMockUpstream()
    dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-shutdown-"))
  })
  afterAll(async () => {
    if (gateway) await gateway.stop(5_000)
    await mock?.close()
    await db?.drop()
    if (dir) Fs.rmSync(dir, { recursive: true, force: true })
  })

  it("stops accepting, finishes the open stream with [DONE], flushes every row and exits 0", async () => {
    const doc = defaultConfigDoc()
    addMockModel(doc, { baseUrl: mock.url })
    doc.shutdown_grace_seconds = GRACE_SECONDS
    // Rows stay queued until shutdown: the final flush must write them.
    doc.request_log = { batch_size: 500, flush_ms: 600_000 }
    const configPath = Path.join(dir, "gateway.yaml")
    Fs.writeFileSync(configPath, Yaml.stringify(doc))
    const port = await closedPort()
    const env = cleanEnv({
      WELLSPRING_CONFIG: configPath,
      WELLSPRING_PORT: String(port),
      WELLSPRING_DATA_DIR: Path.join(dir, "data"),
      DATABASE_URL: db.url
    })
    gateway = startTs("src/main.ts", [], env)
    await gateway.waitFor(/ready in/, 90_000)
    const key = await operatorKey(env)
    const url = `http://127.0.0.1:${port}/v1/chat/completions`
    const headers = { authorization: `Bearer ${key}`, "content-type": "application/json" }

    // Finished requests whose rows are still queued at SIGTERM.
    for (const body of [
      { model: "ws-lite", messages: [user("one")] },
      { model: "no-such-model", messages: [user("two")] }
    ]) {
      const res = await fetch(url, { method: "POST", headers, body: JSON.stringify(body) })
      await res.text()
    }

    const frames = [Chunks.role(), ...Array.from({ length: 12 }, (_, i) => Chunks.content(`part${i} `)), Chunks.finish("stop"), Chunks.usage({ prompt: 3, completion: 12 })]
    mock.script(Behaviour.slow(frames, 150))
    const res = await fetch(url, { method: "POST", headers, body: JSON.stringify({ model: "ws-mock", messages: [user("stream")], stream: true }) })
    expect(res.status).toBe(200)
    const rowId = Number(res.headers.get("x-request-id"))
    const reader = res.body!.getReader()
    const decoder = new TextDecoder()
    let text = ""
    while (!text.includes("part0")) {
      const { value, done } = await reader.read()
      if (done) throw new Error(`stream ended early: ${text}`)
      text += decoder.decode(value, { stream: true })
    }

    const signalledAt = Date.now()
    process.kill(gateway.pid, "SIGTERM")
    // New connections are refused while the stream is still open.
    expect(await eventually(() => refused(port), { timeoutMs: 2_000, everyMs: 20, what: "new connections refused" }))
      .toBe(true)

    const rest = await readBody(new Response(new ReadableStream({
      pull: async (controller) => {
        const { value, done } = await reader.read()
        if (done) controller.close()
        else controller.enqueue(value)
      }
    })))
    const sse = parseSse(text + rest.text)
    expect(rest.error).toBeNull()
    expect(sse.doneLast).toBe(true)
    expect(sse.chunks.map((c) => c.choices[0].delta.content ?? "").join("")).toBe(
      Array.from({ length: 12 }, (_, i) => `part${i} `).join("")
    )

    const code = await gateway.exited
    const exitedAfterMs = Date.now() - signalledAt
    expect(code, gateway.output()).toBe(0)
    // Exits once the stream is done, well before the grace period would force it.
    expect(exitedAfterMs).toBeLessThan((GRACE_SECONDS - 5) * 1000)
    gateway = undefined

    const client = new pg.Client({ connectionString: db.url })
    await client.connect()
    try {
      const { rows } = await client.query<{ id: string; status: string; error_code: string | null; model_id: string }>(
        "SELECT id, status, error_code, model_id FROM request_log ORDER BY id"
      )
      expect(rows.map((r) => [r.model_id, r.status, r.error_code])).toEqual([
        ["ws-lite", "success", null],
        ["no-such-model", "error", "model_not_found"],
        ["ws-mock", "success", null]
      ])
      expect(Number(rows[2]!.id)).toBe(rowId)
    } finally {
      await client.end()
    }
  }, 120_000)
})
