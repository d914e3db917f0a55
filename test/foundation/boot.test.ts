/**
 * `src/main.ts` as its own process (what `npm start` runs): first-start key, restart, bad config, database down.
 */
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import * as Yaml from "yaml"
import { defaultConfigDoc } from "../support/Gateway.js"
import { cleanEnv, closedPort, runTs, startTs } from "./spawn.js"

const tmp = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-boot-"))
afterAll(() => Fs.rmSync(tmp, { recursive: true, force: true }))

const models = (port: number, key: string) =>
  fetch(`http://127.0.0.1:${port}/v1/models`, { headers: { authorization: `Bearer ${key}` } })

describe("boot (embedded mode)", () => {
  const dataDir = Path.join(tmp, "data")
  let port: number
  let key: string

  it("prints the dev account's key on the first start, and serves it", async () => {
    port = await closedPort()
    const started = performance.now()
    const gw = startTs("src/main.ts", [], cleanEnv({ WELLSPRING_PORT: String(port), WELLSPRING_DATA_DIR: dataDir }))
    try {
      await gw.waitFor(new RegExp(`listening on http://127\\.0\\.0\\.1:${port}`), 120_000)
      const bootMs = Math.round(performance.now() - started)
      const match = await gw.waitFor(/^API key: (\S+)$/m)
      key = match[1]!
      console.log(`embedded boot, first start (initdb + migrations): ${bootMs} ms until the listening line`)
      expect(key).toMatch(/^sk-ws-[0-9A-Za-z]{43}$/)
      // Exactly once, on a line of its own.
      expect(gw.output().match(/API key: /g)).toHaveLength(1)
      const res = await models(port, key)
      expect(res.status).toBe(200)
      expect(res.headers.get("x-wellspring-request-id")).toMatch(/^req_/)
      // The data folder holds the database, the generated key-encryption key (0600) and the lock.
      expect(Fs.statSync(Path.join(dataDir, "encryption.key")).mode & 0o777).toBe(0o600)
      expect(JSON.parse(Fs.readFileSync(Path.join(dataDir, "embedded.lock"), "utf8")).pid).toBe(gw.pid)
    } finally {
      expect(await gw.stop()).toBe(0)
    }
    // A clean shutdown releases the data folder.
    expect(Fs.existsSync(Path.join(dataDir, "embedded.lock"))).toBe(false)
  })

  it("prints no key on the second start with the same data folder; the first key still works", async () => {
    expect(key).toBeDefined()
    const started = performance.now()
    const gw = startTs("src/main.ts", [], cleanEnv({ WELLSPRING_PORT: String(port), WELLSPRING_DATA_DIR: dataDir }))
    try {
      await gw.waitFor(/listening on http:/, 120_000)
      console.log(`embedded boot, second start: ${Math.round(performance.now() - started)} ms until the listening line`)
      await gw.waitFor(/ready in \d+ ms/)
      // A full request round trip after "ready": anything printed at startup is in the output by now.
      expect((await models(port, key)).status).toBe(200)
      expect(gw.output()).not.toContain("API key:")
      expect(gw.output()).not.toContain(key)
    } finally {
      expect(await gw.stop()).toBe(0)
    }
  })

  it("a second gateway on a data folder in use refuses to start", async () => {
    const first = startTs("src/main.ts", [], cleanEnv({ WELLSPRING_PORT: String(port), WELLSPRING_DATA_DIR: dataDir }))
    try {
      await first.waitFor(/listening on http:/, 120_000)
      const other = await closedPort()
      const second = await runTs("src/main.ts", [], cleanEnv({ WELLSPRING_PORT: String(other), WELLSPRING_DATA_DIR: dataDir }))
      expect(second.code).not.toBe(0)
      expect(second.stdout + second.stderr).toContain(`in use by process ${first.pid}`)
      expect((await models(port, key)).status).toBe(200)
    } finally {
      expect(await first.stop()).toBe(0)
    }
  })
})

describe("boot failures write nothing", () => {
  it("a bad config file exits 2 with the field name on stderr", async () => {
    const doc = defaultConfigDoc()
    doc.catalog.models[0].rate_limit_rpm = -1
    doc.abuse.burst = "many"
    const file = Path.join(tmp, "bad.yaml")
    Fs.writeFileSync(file, Yaml.stringify(doc))
    const dataDir = Path.join(tmp, "bad-config-data")
    const r = await runTs("src/main.ts", [], cleanEnv({ WELLSPRING_CONFIG: file, WELLSPRING_DATA_DIR: dataDir }))
    expect(r.code).toBe(2)
    expect(r.stderr).toContain("catalog.models.0.rate_limit_rpm")
    expect(r.stderr).toContain("abuse.burst")
    expect(r.stderr).toMatch(/^wellspring: /)
    expect(Fs.existsSync(dataDir)).toBe(false)
  })

  it("an unknown command-line flag exits 2", async () => {
    const r = await runTs("src/main.ts", ["--prot", "1"], cleanEnv({ WELLSPRING_DATA_DIR: Path.join(tmp, "flag-data") }))
    expect(r.code).toBe(2)
    expect(r.stderr).toContain("unknown flag --prot")
    expect(Fs.existsSync(Path.join(tmp, "flag-data"))).toBe(false)
  })

  it("DATABASE_URL at a closed port exits non-zero naming the database, and writes nothing", async () => {
    const dbPort = await closedPort()
    const dataDir = Path.join(tmp, "db-down-data")
    const r = await runTs("src/main.ts", [], cleanEnv({
      DATABASE_URL: `postgres://root:secret@127.0.0.1:${dbPort}/wellspring`,
      WELLSPRING_PORT: String(await closedPort()),
      WELLSPRING_DATA_DIR: dataDir
    }))
    expect(r.code).not.toBe(0)
    const output = r.stdout + r.stderr
    expect(output).toContain(`cannot connect to PostgreSQL at 127.0.0.1:${dbPort}/wellspring: connect ECONNREFUSED`)
    expect(output).not.toContain("secret")
    expect(output).not.toMatch(/listening on/)
    expect(Fs.existsSync(dataDir)).toBe(false)
  })
})
