/**
 * Issue 18 (8): what a new operator sees, from the real process (`node --import tsx src/main.ts`, what `npm start`
 * runs): a port already in use and a malformed WELLSPRING_ENCRYPTION_KEY are one line naming what to change (no
 * stack trace); a hex key is accepted; a live reload validates the whole file and says when a change or a typo is
 * in a section read only at boot; SIGTERM says it is draining and how many requests are open, a second SIGTERM
 * exits at once. The CLI's messages are in test/foundation/cli.test.ts.
 */
import * as Crypto from "node:crypto"
import * as Fs from "node:fs"
import * as Net from "node:net"
import * as Os from "node:os"
import * as Path from "node:path"
import * as Yaml from "yaml"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { loadConfig } from "../../src/config/GatewayConfig.js"
import { cleanEnv, closedPort, type Running, runTs, startTs } from "../foundation/spawn.js"
import { type ConfigDoc, defaultConfigDoc } from "../support/Gateway.js"
import { Behaviour, Chunks, type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"
import { addMockModel, user } from "../inference/helpers.js"

const tmp = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-ops-"))
afterAll(() => Fs.rmSync(tmp, { recursive: true, force: true }))

const writeConfig = (name: string, doc: ConfigDoc) => {
  const file = Path.join(tmp, name)
  Fs.writeFileSync(file, Yaml.stringify(doc))
  return file
}

/** One line on stderr, no stack trace, nothing on stdout but log lines. */
const expectOneLine = (stderr: string) => {
  expect(stderr.trim().split("\n"), stderr).toHaveLength(1)
  expect(stderr).not.toMatch(/^\s+at /m)
}

describe("boot failures are one line naming what to change", () => {
  it("a port already in use names WELLSPRING_PORT and --port (exit 1)", async () => {
    const taken = Net.createServer()
    await new Promise<void>((resolve) => taken.listen(0, "127.0.0.1", resolve))
    const port = (taken.address() as Net.AddressInfo).port
    try {
      const r = await runTs("src/main.ts", [], cleanEnv({
        WELLSPRING_CONFIG: writeConfig("port.yaml", defaultConfigDoc()),
        WELLSPRING_PORT: String(port),
        WELLSPRING_DATA_DIR: Path.join(tmp, "port-data")
      }))
      expect(r.code, r.stderr).toBe(1)
      expectOneLine(r.stderr)
      expect(r.stderr.trim()).toBe(
        `wellspring: cannot start: port ${port} on 127.0.0.1 is already in use; choose another port with ` +
          "WELLSPRING_PORT or --port (or listeners[0].port in the config file)"
      )
      expect(r.stdout).not.toMatch(/^\s+at /m)
    } finally {
      taken.close()
    }
  })

  it("a malformed WELLSPRING_ENCRYPTION_KEY names the variable, never its value (exit 2)", async () => {
    const secret = "not-a-key-but-secret"
    const r = await runTs("src/main.ts", [], cleanEnv({
      WELLSPRING_CONFIG: writeConfig("key.yaml", defaultConfigDoc()),
      WELLSPRING_PORT: String(await closedPort()),
      WELLSPRING_DATA_DIR: Path.join(tmp, "key-data"),
      WELLSPRING_ENCRYPTION_KEY: secret
    }))
    expect(r.code, r.stderr).toBe(2)
    expectOneLine(r.stderr)
    expect(r.stderr.trim()).toBe(
      `wellspring: WELLSPRING_ENCRYPTION_KEY must be 32 bytes, as 64 hex digits or base64 (got ${secret.length} characters)`
    )
    expect(r.stderr + r.stdout).not.toContain(secret)
  })

  it("the key is accepted as hex or base64 (as byok.encryption_key), and a bad one in the file names the field", () => {
    const key = Crypto.randomBytes(32)
    const file = writeConfig("keys.yaml", defaultConfigDoc())
    for (const text of [key.toString("hex"), key.toString("base64"), key.toString("base64url")]) {
      expect(loadConfig({ path: file, env: { WELLSPRING_ENCRYPTION_KEY: text } }).config.encryption_key).toBeDefined()
    }
    const doc = defaultConfigDoc()
    doc.encryption_key = "short"
    expect(() => loadConfig({ path: writeConfig("bad-key.yaml", doc), env: {} })).toThrow(
      /encryption_key: must be 32 bytes, as 64 hex digits or base64/
    )
    expect(() => loadConfig({ path: file, env: { WELLSPRING_BYOK_KEY: "xyz" } })).toThrow(/^WELLSPRING_BYOK_KEY must be 32 bytes/)
  })
})

describe("a running gateway: live reload and signals", () => {
  let mock: MockUpstream
  let gateway: Running | undefined
  let doc: ConfigDoc
  let configPath: string
  let url: string
  let key: string

  beforeAll(async () => {
    mock = await startMockUpstream()
    doc = defaultConfigDoc()
    addMockModel(doc, { baseUrl: mock.url })
    doc.catalog_reload_seconds = 0.2
    configPath = writeConfig("running.yaml", doc)
    const port = await closedPort()
    gateway = startTs("src/main.ts", [], cleanEnv({
      WELLSPRING_CONFIG: configPath,
      WELLSPRING_PORT: String(port),
      WELLSPRING_DATA_DIR: Path.join(tmp, "running-data"),
      // Hex, as byok.encryption_key takes it.
      WELLSPRING_ENCRYPTION_KEY: Crypto.randomBytes(32).toString("hex")
    }))
    key = (await gateway.waitFor(/^API key: (\S+)$/m, 120_000))[1]!
    await gateway.waitFor(/ready in \d+ ms/)
    url = `http://127.0.0.1:${port}`
  })
  afterAll(async () => {
    await gateway?.stop(5_000)
    await mock?.close()
  })

  const rewrite = (edit: (d: ConfigDoc) => void) => {
    doc = structuredClone(doc)
    edit(doc)
    Fs.writeFileSync(configPath, Yaml.stringify(doc))
  }

  it("a changed boot-only section is taken with a warning that it applies at the next restart", async () => {
    rewrite((d) => {
      d.limits.body_bytes = 1_000_000
      d.catalog.models[0].rate_limit_rpm = 7
    })
    const line = (await gateway!.waitFor(/^.*sections read only at boot.*$/m, 10_000))[0]
    expect(line).toMatch(/level=WARN .*take effect at the next restart.* sections=limits/)
    // The catalog part of the same edit is live.
    await gateway!.waitFor(/catalog reloaded" version=2/)
  })

  it("a typo in a boot-only section is refused at reload, saying a restart would fail", async () => {
    rewrite((d) => {
      d.limits.body_bytse = 10
    })
    const line = (await gateway!.waitFor(/^.*config reload rejected.*$/m, 10_000))[0]
    expect(line).toMatch(/level=WARN .*keeping previous catalog \(a restart with this file would fail\).*limits\.body_bytse/)
    // Fixed again: taken.
    rewrite((d) => {
      delete d.limits.body_bytse
    })
    await gateway!.waitFor(/catalog reloaded" version=3/)
  })

  it("SIGTERM logs the drain with the open requests; a second SIGTERM exits at once", async () => {
    mock.script(Behaviour.stream([Chunks.role(), Chunks.content("never ends")], { then: "hang" }))
    const res = await fetch(`${url}/v1/chat/completions`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify({ model: "ws-mock", stream: true, messages: [user("hi")] })
    })
    expect(res.status).toBe(200)
    const reader = res.body!.getReader()
    await reader.read()

    process.kill(gateway!.pid, "SIGTERM")
    const draining = (await gateway!.waitFor(/^.*SIGTERM received.*$/m, 10_000))[0]
    expect(draining).toMatch(
      /level=WARN .*message="SIGTERM received: draining 1 open request \(up to 20 s\); send SIGTERM again to exit at once"/
    )
    // Still draining (the stream is open, the grace period is 20 s).
    await new Promise((resolve) => setTimeout(resolve, 300))
    const started = Date.now()
    process.kill(gateway!.pid, "SIGTERM")
    expect(await gateway!.exited).toBe(143)
    expect(Date.now() - started).toBeLessThan(3_000)
    expect(gateway!.stderr()).toContain("wellspring: second SIGTERM: exiting now with 1 request open")
    await reader.cancel().catch(() => undefined)
  })
})
