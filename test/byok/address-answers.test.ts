/**
 * Issue 16, finding 6: the answers to a user never tell whether a host name resolved, nor to what kind of address.
 * A literal private or metadata address, a name resolving to one, a blocked name and a name that does not resolve
 * at all get byte-identical answers from verify, save and the model listing, and calls through a credential whose
 * name later resolves elsewhere (or nowhere) get byte-identical chat and embeddings errors. The operator's log
 * keeps the detailed reason.
 *
 * The gateway's address guard resolves through a table here; its one reachable name (`api.rebind.test`, on
 * 127.0.0.1, admitted by `allowed_cidrs`) is served over TLS with a certificate made for the test.
 */
import * as ChildProcess from "node:child_process"
import * as Crypto from "node:crypto"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { Resolver } from "../../src/byok/AddressGuard.js"
import { call, flushRequestLog, newUser, query, type Reply } from "../accounts/support.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { serviceGate } from "../support/Services.js"
import { type LeakyUpstream, startLeakyUpstream } from "./LeakyUpstream.js"
import { type CapturingGateway, startCapturingGateway } from "./support.js"

const postgresAvailable = await serviceGate("postgres")
const opensslAvailable = (() => {
  try {
    ChildProcess.execFileSync("openssl", ["version"], { stdio: "ignore" })
    return true
  } catch {
    return false
  }
})()

const BASE = "/api/user/me/byok"
const NAME = "api.rebind.test"
/** A second name for the same server: its own connection pool, never used before its test. */
const NAME2 = "api2.rebind.test"

/** Base URLs whose refusal depends on where they lead: each must get the same answer. */
const REFUSED = [
  "https://10.0.0.1/v1",
  "https://169.254.169.254/v1",
  "https://private.example.com/v1",
  "https://metadata.example.com/v1",
  "https://nowhere.example.com/v1",
  "https://localhost/v1"
]

describe.skipIf(!opensslAvailable)("one answer for every address refusal (issue 16)", () => {
  let gw: CapturingGateway
  let up: LeakyUpstream
  let db: FreshDatabase | undefined
  let dir: string
  let cert: Buffer
  const encryptionKey = Crypto.randomBytes(32).toString("hex")
  /** The address guard's DNS: a name maps to one address; a name absent (or null) does not resolve. */
  const dns = new Map<string, string | null>([
    ["private.example.com", "10.0.0.1"],
    ["metadata.example.com", "169.254.169.254"],
    [NAME, "127.0.0.1"],
    [NAME2, "127.0.0.1"]
  ])
  const resolver: Resolver = async (name) => {
    const address = dns.get(name)
    if (address === undefined || address === null) {
      throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${name}`), { code: "ENOTFOUND" })
    }
    return [{ address, family: 4 }]
  }

  beforeAll(async () => {
    dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-rebind-"))
    ChildProcess.execFileSync("openssl", [
      "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-sha256", "-days", "2",
      "-keyout", Path.join(dir, "key.pem"), "-out", Path.join(dir, "cert.pem"),
      "-subj", `/CN=${NAME}`, "-addext", `subjectAltName=DNS:${NAME},DNS:${NAME2},IP:127.0.0.1`
    ], { stdio: "ignore" })
    cert = Fs.readFileSync(Path.join(dir, "cert.pem"))
    up = await startLeakyUpstream({ tls: { key: Fs.readFileSync(Path.join(dir, "key.pem")), cert } })
    db = postgresAvailable ? await freshDatabase("byokaddr") : undefined
    gw = await boot(["127.0.0.1/32"])
  })
  /** A gateway on the suite's database; `cidrs`: the private ranges it admits. */
  const boot = (cidrs: ReadonlyArray<string>) =>
    startCapturingGateway({
      ...(db ? { databaseUrl: db.url } : {}),
      byokGuard: { resolver, tls: { ca: cert } },
      configure: (doc) => {
        doc.byok = {
          enabled: true,
          encryption_key: encryptionKey,
          rate_limit_rpm: 100_000,
          allowed_cidrs: cidrs
        }
        doc.abuse = { burst: 100_000, window_seconds: 10, cooldown_seconds: 60 }
        doc.limits = { ...doc.limits, failed_requests_per_minute: 100_000 }
      }
    })
  afterAll(async () => {
    await gw?.stop()
    await up?.close()
    await db?.drop()
    if (dir) Fs.rmSync(dir, { recursive: true, force: true })
  })

  const custom = (secret: string, base_url: string) => ({ provider: "custom", secret, meta: { base_url } })

  it("verify and save: the same bytes for a private, metadata, internal, blocked or unresolvable address", async () => {
    const verifier = await newUser(gw)
    const saver = await newUser(gw)
    const verified = new Set<string>()
    const saved = new Set<string>()
    for (const base of REFUSED) {
      const v = await call(gw, "POST", `${BASE}/verify`, { key: verifier.key, body: custom("sk-any-key-1234567", base) })
      expect(v.status, base).toBe(200)
      expect(v.body.data, base).toMatchObject({ ok: false, kind: "address_not_allowed" })
      verified.add(v.text)
      const s = await call(gw, "POST", BASE, { key: saver.key, body: custom("sk-any-key-1234567", base) })
      expect(s.status, base).toBe(400)
      saved.add(s.text)
    }
    expect([...verified]).toHaveLength(1)
    expect([...saved]).toHaveLength(1)
    const [answer] = [...saved]
    expect(JSON.parse(answer!)).toEqual({
      success: false,
      error: { message: expect.stringMatching(/[가-힣]/), type: "invalid_request_error", code: "address_not_allowed" }
    })
    // The operator still learns why.
    const log = gw.logs.join("\n")
    for (const reason of ["private_address", "metadata_address", "resolves_to_private", "unresolvable", "blocked_name"]) {
      expect(log).toContain(reason)
    }
  })

  it("chat, embeddings and the listing through a credential whose name moved: the same bytes, wherever it went", async () => {
    const user = await newUser(gw)
    const secret = `sk-rebind-${Crypto.randomBytes(8).toString("hex")}`
    up.valid.add(secret)
    const saved = await call(gw, "POST", BASE, { key: user.key, body: custom(secret, `https://${NAME}:${up.port}/oa/v1`) })
    expect(saved.status, saved.text).toBe(200)
    const id = saved.body.data.credential.id

    const answers = { chat: new Set<string>(), stream: new Set<string>(), embeddings: new Set<string>(), models: new Set<string>() }
    const statuses = new Set<number>()
    const record = (into: Set<string>, r: Reply) => {
      into.add(r.text)
      statuses.add(r.status)
    }
    for (const target of ["10.0.0.1", "169.254.169.254", "192.168.1.1", null]) {
      dns.set(NAME, target)
      const messages = [{ role: "user", content: "hi" }]
      record(answers.chat, await call(gw, "POST", "/v1/chat/completions", { key: user.key, body: { model: "@custom/m", messages } }))
      record(
        answers.stream,
        await call(gw, "POST", "/v1/chat/completions", { key: user.key, body: { model: "@custom/m", messages, stream: true } })
      )
      record(answers.embeddings, await call(gw, "POST", "/v1/embeddings", { key: user.key, body: { model: "@custom/e", input: ["hi"] } }))
      const listed = await call(gw, "GET", `${BASE}/${id}/models`, { key: user.key })
      expect(listed.status).toBe(400)
      answers.models.add(listed.text)
    }
    expect([...statuses]).toEqual([400])
    for (const [what, set] of Object.entries(answers)) expect([...set], what).toHaveLength(1)
    const chat = JSON.parse([...answers.chat][0]!)
    expect(chat.error.code).toBe("address_not_allowed")
    // The same Korean message as the account API's answer.
    expect(JSON.parse([...answers.models][0]!).error).toMatchObject({ code: "address_not_allowed", message: chat.error.message })

    // Back on its own address, the same credential works: the refusals were about where the name led.
    dns.set(NAME, "127.0.0.1")
    const ok = await call(gw, "POST", "/v1/chat/completions", {
      key: user.key,
      body: { model: "@custom/m", messages: [{ role: "user", content: "hi" }] }
    })
    expect(ok.status, ok.text).toBe(200)
  })

  it.skipIf(!postgresAvailable)("a saved address refused before any connection: the same chat answer as one refused at connect", async () => {
    const user = await newUser(gw)
    const secret = `sk-literal-${Crypto.randomBytes(8).toString("hex")}`
    up.valid.add(secret)
    // Saved while 127.0.0.1 is admitted; a gateway on the same database that admits no private range refuses the
    // literal before connecting.
    const saved = await call(gw, "POST", BASE, { key: user.key, body: custom(secret, `https://127.0.0.1:${up.port}/oa/v1`) })
    expect(saved.status, saved.text).toBe(200)
    const strict = await boot([])
    try {
      const messages = [{ role: "user", content: "hi" }]
      const refused = await call(strict, "POST", "/v1/chat/completions", { key: user.key, body: { model: "@custom/m", messages } })
      const other = await newUser(gw)
      up.valid.add(`${secret}-2`)
      const moved = await call(gw, "POST", BASE, {
        key: other.key,
        body: custom(`${secret}-2`, `https://${NAME2}:${up.port}/oa/v1`)
      })
      expect(moved.status, moved.text).toBe(200)
      dns.set(NAME2, "10.0.0.1")
      const atConnect = await call(gw, "POST", "/v1/chat/completions", { key: other.key, body: { model: "@custom/m", messages } })
      expect([refused.status, refused.text]).toEqual([atConnect.status, atConnect.text])
      expect(refused.body.error.code).toBe("address_not_allowed")
      // The account's request row says no more than the answer; the operator's log says why.
      await flushRequestLog(strict)
      const rows = await query(strict, "SELECT error FROM request_log WHERE account_id = $1", [user.account.id])
      expect(rows.map((r) => r.error)).toEqual(["address_not_allowed (400)"])
      expect(strict.logs.join("\n")).toContain("private_address")
    } finally {
      dns.set(NAME2, "127.0.0.1")
      await strict.stop()
    }
  })
})
