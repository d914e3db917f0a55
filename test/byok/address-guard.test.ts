/**
 * The SSRF guard (issue 10, item 7): the issue's table of addresses, each refused with its own `kind`, plus the
 * connect-time checks (DNS rebinding, IP literals reaching the transport directly), redirects (never followed),
 * and the positive cases (a public address, an allow-listed http origin, https through a resolved address with
 * the certificate checked against the name).
 */
import * as ChildProcess from "node:child_process"
import * as Fs from "node:fs"
import * as Http from "node:http"
import * as Https from "node:https"
import type { AddressInfo } from "node:net"
import * as Os from "node:os"
import * as Path from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  type AddressGuard,
  AddressRefusedError,
  makeAddressGuard,
  REFUSAL_MESSAGES,
  type RefusalKind,
  type Resolver
} from "../../src/byok/AddressGuard.js"

const guards: Array<AddressGuard> = []
const servers: Array<Http.Server> = []
afterAll(async () => {
  await Promise.all(guards.map((g) => g.close()))
  await Promise.all(servers.map((s) => new Promise((r) => s.close(r))))
})

const guard = (options: Parameters<typeof makeAddressGuard>[0] = {}) => {
  const g = makeAddressGuard({ connectTimeoutMs: 2_000, ...options })
  guards.push(g)
  return g
}

/** A resolver answering from a table; records every name it was asked for. */
const tableResolver = (table: Record<string, ReadonlyArray<string>>) => {
  const asked: Array<string> = []
  const resolver: Resolver = async (name) => {
    asked.push(name)
    const answers = table[name]
    if (answers === undefined) throw Object.assign(new Error(`ENOTFOUND ${name}`), { code: "ENOTFOUND" })
    return answers.map((address) => ({ address, family: address.includes(":") ? 6 : 4 }))
  }
  return { resolver, asked }
}

const listen = async (server: Http.Server): Promise<number> => {
  servers.push(server)
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  return (server.address() as AddressInfo).port
}

describe("static check: the issue's table", () => {
  const g = guard()
  const table: ReadonlyArray<readonly [string, RefusalKind, string?]> = [
    ["https://127.0.0.1/v1", "private_address", "loopback"],
    ["https://[::1]/v1", "private_address", "loopback"],
    ["https://0.0.0.0/", "private_address", "unspecified"],
    ["https://169.254.169.254/latest/meta-data/", "metadata_address"],
    ["https://metadata.google.internal/computeMetadata/v1/", "blocked_name"],
    ["https://100.64.0.1/", "private_address", "carrierGradeNat"],
    ["https://100.127.255.254/", "private_address", "carrierGradeNat"],
    ["https://[fd00::1]/", "private_address", "uniqueLocal"],
    ["https://[fc00::1]/", "private_address", "uniqueLocal"],
    ["https://[::ffff:a9fe:a9fe]/", "metadata_address"],
    ["https://2130706433/", "private_address", "loopback"],
    ["https://0x7f.1/", "private_address", "loopback"],
    ["https://017700000001/", "private_address", "loopback"],
    ["https://[64:ff9b::a9fe:a9fe]/", "metadata_address"],
    ["https://[2002:a9fe:a9fe::]/", "metadata_address"],
    ["https://evil#.openai.azure.com", "invalid_url", "fragment"],
    ["https://api.openai.com@evil.example", "userinfo"],
    // Beyond the issue's list: the neighbours of each case.
    ["http://api.openai.com/v1", "insecure_scheme"],
    ["ftp://api.openai.com/", "insecure_scheme"],
    ["https://localhost/", "blocked_name"],
    ["https://localhost./", "blocked_name"],
    ["https://api.localhost/", "blocked_name"],
    ["https://printer.local/", "blocked_name"],
    ["https://db.corp.internal/", "blocked_name"],
    ["https://intranet/", "blocked_name"],
    ["https://10.1.2.3/", "private_address", "private"],
    ["https://172.16.0.1/", "private_address", "private"],
    ["https://192.168.1.1/", "private_address", "private"],
    ["https://[fe80::1]/", "private_address", "linkLocal"],
    ["https://169.254.1.1/", "private_address", "linkLocal"],
    ["https://224.0.0.1/", "private_address", "multicast"],
    ["https://[ff02::1]/", "private_address", "multicast"],
    ["https://240.0.0.1/", "private_address", "reserved"],
    ["https://255.255.255.255/", "private_address", "broadcast"],
    ["https://[::]/", "private_address", "unspecified"],
    ["https://[::ffff:127.0.0.1]/", "private_address", "ipv4Mapped:loopback"],
    ["https://[::ffff:10.0.0.1]/", "private_address", "ipv4Mapped:private"],
    ["https://[64:ff9b::10.0.0.1]/", "private_address", "nat64:private"],
    ["https://[64:ff9b:1::a9fe:a9fe]/", "private_address", "nat64LocalUse"],
    ["https://[2002:7f00:1::]/", "private_address", "6to4:loopback"],
    ["https://[2001:0:4136:e378:8000:63bf:3fff:fdd2]/", "private_address", "teredo"],
    ["https://[::a9fe:a9fe]/", "metadata_address"],
    ["https://[fd00:ec2::254]/", "metadata_address"],
    ["https://100.100.100.200/", "metadata_address"],
    ["https://@evil.example/", "userinfo"],
    ["https://user:pw@api.openai.com/", "userinfo"],
    ["https://api.openai.com\\@evil.example/", "invalid_url"],
    ["https://api.openai.com/v1\n", "invalid_url"],
    ["https://api.openai.com/v1?x=1#y", "invalid_url", "fragment"],
    ["not a url", "invalid_url"],
    ["https://1.2.3.4.5/", "invalid_url"],
    ["", "invalid_url"],
    ["https:api.openai.com/v1", "invalid_url", "form"],
    ["https:///api.openai.com/v1", "invalid_url", "form"],
    ["https:/api.openai.com/v1", "invalid_url", "form"],
    ["javascript:alert(1)", "insecure_scheme"],
    ["file:///etc/passwd", "insecure_scheme"],
    ["//api.openai.com/v1", "invalid_url", "form"]
  ]
  for (const [url, kind, detail] of table) {
    it(`${JSON.stringify(url)} → ${kind}${detail ? ` (${detail})` : ""}`, () => {
      const result = g.check(url)
      expect(result.ok).toBe(false)
      if (result.ok) return
      expect(result.refusal.kind).toBe(kind)
      if (detail !== undefined) expect(result.refusal.detail).toBe(detail)
      // What the user is told: the URL's own faults apart, one code for wherever it leads (issue 16).
      const code = ["invalid_url", "insecure_scheme", "userinfo"].includes(kind) ? kind : "address_not_allowed"
      expect(result.refusal.code).toBe(code)
      expect(result.refusal.message).toBe(REFUSAL_MESSAGES[result.refusal.code])
      // The refusal never repeats the URL, nor its host.
      const text = result.refusal.message + result.refusal.detail
      expect(text).not.toContain("evil")
      expect(text).not.toContain("openai")
      expect(/[가-힣]/.test(result.refusal.message)).toBe(true)
    })
  }

  it("refuses a URL too long to be a base URL, without parsing it", () => {
    const result = g.check("https://api.example.com/" + "a".repeat(5000))
    expect(result.ok ? null : result.refusal.kind).toBe("invalid_url")
  })

  it("refuses a non-string", () => {
    expect(g.check(42).ok).toBe(false)
    expect(g.check(null).ok).toBe(false)
  })

  it("accepts public addresses and names (positive cases)", () => {
    for (
      const url of [
        "https://93.184.215.14/v1",
        "https://api.openai.com/v1",
        "https://my-resource.openai.azure.com/openai",
        "https://[2606:4700:4700::1111]/",
        "https://[::ffff:8.8.8.8]/",
        "https://[64:ff9b::808:808]/",
        "https://[2002:808:808::]/",
        "https://api.example.com:8443/v1"
      ]
    ) {
      const result = g.check(url)
      expect(result.ok, url).toBe(true)
    }
  })

  it("plain http only for an allow-listed origin (exact scheme, host and port)", () => {
    const listed = guard({ allowlist: ["http://127.0.0.1:8080", "http://models.corp.example"] })
    expect(listed.check("http://127.0.0.1:8080/v1").ok).toBe(true)
    expect(listed.check("http://models.corp.example/v1").ok).toBe(true)
    expect(listed.check("http://models.corp.example:80/v1").ok).toBe(true)
    const otherPort = listed.check("http://127.0.0.1:8081/v1")
    expect(otherPort.ok ? null : otherPort.refusal.kind).toBe("insecure_scheme")
    const https = listed.check("https://127.0.0.1:8080/v1")
    expect(https.ok ? null : https.refusal.kind).toBe("private_address")
  })

  it("a query string is refused for base URLs unless asked for", () => {
    const result = g.check("https://api.example.com/v1?api-version=1")
    expect(result.ok ? null : result.refusal.kind).toBe("invalid_url")
    expect(g.check("https://api.example.com/v1?api-version=1", { allowQuery: true }).ok).toBe(true)
  })
})

describe("resolution", () => {
  it("a public name resolving to a private address is refused (resolves_to_private)", async () => {
    const { resolver } = tableResolver({ "api.example.com": ["10.0.0.7"] })
    const g = guard({ resolver })
    expect(g.check("https://api.example.com/v1").ok).toBe(true)
    const result = await g.preflight("https://api.example.com/v1")
    expect(result.ok).toBe(false)
    if (result.ok) return
    expect(result.refusal.kind).toBe("resolves_to_private")
    expect(result.refusal.detail).toBe("private_address:private")
  })

  it("one private answer among public ones is enough to refuse", async () => {
    const { resolver } = tableResolver({ "api.example.com": ["93.184.215.14", "169.254.169.254"] })
    const result = await guard({ resolver }).preflight("https://api.example.com/v1")
    expect(result.ok ? null : [result.refusal.kind, result.refusal.detail]).toEqual([
      "resolves_to_private",
      "metadata_address:linkLocal"
    ])
  })

  it("a public name resolving to public addresses passes the preflight", async () => {
    const { resolver, asked } = tableResolver({ "api.example.com": ["93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c"] })
    const result = await guard({ resolver }).preflight("https://api.example.com/v1")
    expect(result.ok).toBe(true)
    expect(asked).toEqual(["api.example.com"])
  })

  it("the transport refuses a name that resolves to a private address (connect time)", async () => {
    const { resolver, asked } = tableResolver({ "api.example.com": ["127.0.0.1"] })
    const g = guard({ resolver })
    const result = await g.request({ url: "https://api.example.com/v1/models" })
    expect(result.ok ? null : result.refusal.kind).toBe("resolves_to_private")
    expect(asked).toEqual(["api.example.com"])
  })

  it("DNS rebinding: public at the preflight, private at connect → refused at connect", async () => {
    let calls = 0
    const resolver: Resolver = async () => {
      calls++
      return calls === 1 ? [{ address: "93.184.215.14", family: 4 }] : [{ address: "127.0.0.1", family: 4 }]
    }
    const g = guard({ resolver })
    const pre = await g.preflight("https://rebind.example.com/v1")
    expect(pre.ok).toBe(true)
    const result = await g.request({ url: "https://rebind.example.com/v1/models" })
    expect(result.ok ? null : [result.refusal.kind, result.refusal.detail]).toEqual([
      "resolves_to_private",
      "private_address:loopback"
    ])
    expect(calls).toBe(2)
  })

  it("the dispatcher on its own refuses IP literals and blocked names (no static check in front)", async () => {
    const g = guard()
    const literal = g.dispatcher.request({ origin: "https://127.0.0.1:9", path: "/", method: "GET" })
    await expect(literal).rejects.toBeInstanceOf(AddressRefusedError)
    await expect(literal).rejects.toMatchObject({ refusal: { kind: "private_address" } })
    const mapped = g.dispatcher.request({ origin: "https://[::ffff:a9fe:a9fe]", path: "/", method: "GET" })
    await expect(mapped).rejects.toMatchObject({ refusal: { kind: "metadata_address" } })
    const name = g.dispatcher.request({ origin: "https://metadata.google.internal", path: "/", method: "GET" })
    await expect(name).rejects.toMatchObject({ refusal: { kind: "blocked_name" } })
    const http = g.dispatcher.request({ origin: "http://api.example.com", path: "/", method: "GET" })
    await expect(http).rejects.toMatchObject({ refusal: { kind: "insecure_scheme" } })
  })

  it("a name that does not resolve is refused like a private one (issue 16: never tell whether it resolved)", async () => {
    const { resolver } = tableResolver({ "empty.example.com": [], "private.example.com": ["10.0.0.1"] })
    const g = guard({ resolver })
    const nowhere = await g.request({ url: "https://nowhere.example.com/v1" })
    expect(nowhere.ok ? null : [nowhere.refusal.kind, nowhere.refusal.detail]).toEqual(["unresolvable", "ENOTFOUND"])
    const empty = await g.preflight("https://empty.example.com/v1")
    expect(empty.ok ? null : [empty.refusal.kind, empty.refusal.detail]).toEqual(["unresolvable", "no address"])
    const internal = await g.request({ url: "https://private.example.com/v1" })
    const answers = [nowhere, empty, internal].map((r) => r.ok ? null : { code: r.refusal.code, message: r.refusal.message })
    expect(answers).toEqual(Array(3).fill({ code: "address_not_allowed", message: REFUSAL_MESSAGES.address_not_allowed }))
  })
})

describe("redirects and allow-listed http origins (real servers on 127.0.0.1)", () => {
  let hits = 0
  let targetHits = 0
  let origin = ""
  let target = ""
  beforeAll(async () => {
    const redirecting = Http.createServer((req, res) => {
      hits++
      if (req.url === "/ok") {
        res.writeHead(200, { "content-type": "application/json" })
        res.end(JSON.stringify({ data: [{ id: "m1" }] }))
        return
      }
      const location = req.url === "/to-local" ? `${target}/secret` : "http://169.254.169.254/latest/meta-data/"
      res.writeHead(302, { location })
      res.end()
    })
    const targetServer = Http.createServer((_req, res) => {
      targetHits++
      res.end("secret")
    })
    origin = `http://127.0.0.1:${await listen(redirecting)}`
    target = `http://127.0.0.1:${await listen(targetServer)}`
  })

  it("an allow-listed http origin is reached (positive case)", async () => {
    const g = guard({ allowlist: [origin] })
    const result = await g.request({ url: `${origin}/ok` })
    expect(result.ok).toBe(true)
    if (!result.ok) return
    expect(result.response.statusCode).toBe(200)
    expect(await result.response.body.json()).toEqual({ data: [{ id: "m1" }] })
  })

  it("the same origin is refused when it is not on the list", async () => {
    const result = await guard().request({ url: `${origin}/ok` })
    expect(result.ok ? null : result.refusal.kind).toBe("insecure_scheme")
  })

  it("a 302 to the metadata address is a `redirect` refusal, not followed", async () => {
    const g = guard({ allowlist: [origin] })
    const before = hits
    const result = await g.request({ url: `${origin}/to-metadata` })
    expect(result.ok ? null : [result.refusal.kind, result.refusal.detail]).toEqual(["redirect", "302"])
    expect(hits - before).toBe(1)
  })

  it("operator data (trusted) skips the checks without an allow-list entry; redirects are still refused", async () => {
    const g = guard()
    const ok = await g.request({ url: `${origin}/ok`, trusted: true })
    expect(ok.ok).toBe(true)
    if (ok.ok) await ok.response.body.dump()
    const redirected = await g.request({ url: `${origin}/to-local`, trusted: true })
    expect(redirected.ok ? null : redirected.refusal.kind).toBe("redirect")
    expect(targetHits).toBe(0)
    // The same URL as user input is refused.
    const user = await g.request({ url: `${origin}/ok` })
    expect(user.ok ? null : user.refusal.kind).toBe("insecure_scheme")
  })

  it("a 302 to another reachable (allow-listed) server is not followed either", async () => {
    const g = guard({ allowlist: [origin, target] })
    const result = await g.request({ url: `${origin}/to-local` })
    expect(result.ok ? null : result.refusal.kind).toBe("redirect")
    expect(targetHits).toBe(0)
  })
})

const opensslAvailable = (() => {
  try {
    ChildProcess.execFileSync("openssl", ["version"], { stdio: "ignore" })
    return true
  } catch {
    return false
  }
})()

describe.skipIf(!opensslAvailable)("https through a checked address (certificate checked against the name)", () => {
  let port = 0
  let cert = ""
  const seenServernames: Array<string | false | null> = []
  beforeAll(async () => {
    const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-guard-tls-"))
    try {
      ChildProcess.execFileSync("openssl", [
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", Path.join(dir, "key.pem"), "-out", Path.join(dir, "cert.pem"), "-days", "2",
        "-subj", "/CN=models.example.com", "-addext", "subjectAltName=DNS:models.example.com"
      ], { stdio: "ignore" })
      cert = Fs.readFileSync(Path.join(dir, "cert.pem"), "utf8")
      const key = Fs.readFileSync(Path.join(dir, "key.pem"), "utf8")
      const server = Https.createServer({ cert, key }, (req, res) => {
        seenServernames.push((req.socket as import("node:tls").TLSSocket).servername)
        res.writeHead(200, { "content-type": "application/json" })
        res.end(JSON.stringify({ ok: true }))
      })
      port = await listen(server as unknown as Http.Server)
    } finally {
      Fs.rmSync(dir, { recursive: true, force: true })
    }
  })

  it("connects to the resolved address with SNI and certificate check on the name", async () => {
    const { resolver } = tableResolver({ "models.example.com": ["127.0.0.1"] })
    // 127.0.0.1/32 admitted by the operator for this test; every other private range stays refused.
    const g = guard({ resolver, allowedCidrs: ["127.0.0.1/32"], tls: { ca: cert } })
    const result = await g.request({ url: `https://models.example.com:${port}/v1/models` })
    expect(result.ok).toBe(true)
    if (!result.ok) return
    expect(result.response.statusCode).toBe(200)
    await result.response.body.dump()
    expect(seenServernames.at(-1)).toBe("models.example.com")
  })

  it("a certificate for another name is rejected (the name, not the address, is verified)", async () => {
    const { resolver } = tableResolver({ "other.example.com": ["127.0.0.1"] })
    const g = guard({ resolver, allowedCidrs: ["127.0.0.1/32"], tls: { ca: cert } })
    await expect(g.request({ url: `https://other.example.com:${port}/v1/models` })).rejects.toMatchObject({
      code: "ERR_TLS_CERT_ALTNAME_INVALID"
    })
  })

  it("an allowed range admits only itself", async () => {
    const { resolver } = tableResolver({ "models.example.com": ["127.0.0.2"] })
    const g = guard({ resolver, allowedCidrs: ["127.0.0.1/32"], tls: { ca: cert } })
    const result = await g.request({ url: `https://models.example.com:${port}/v1/models` })
    expect(result.ok ? null : result.refusal.kind).toBe("resolves_to_private")
  })
})
