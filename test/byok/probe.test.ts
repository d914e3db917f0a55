/**
 * Probes (issue 10, verify/save/models): the provider's probe sent through the address guard to fake providers on
 * 127.0.0.1, every outcome classified into a `kind`, the secret never in a result, the timeout on the Effect clock.
 */
import { describe, expect, it } from "@effect/vitest"
import { Deferred, Effect, Fiber } from "effect"
import { TestClock } from "effect/testing"
import * as ChildProcess from "node:child_process"
import * as Fs from "node:fs"
import * as Http from "node:http"
import * as Https from "node:https"
import type { AddressInfo } from "node:net"
import * as Os from "node:os"
import * as Path from "node:path"
import { afterAll, beforeAll } from "vitest"
import type { AddressGuard, Resolver } from "../../src/byok/AddressGuard.js"
import { type ByokConfigEncoded, decodeByokConfig } from "../../src/byok/Config.js"
import { listModels, makeByokGuard, probe, type ProbeCredential, type ProbeResult } from "../../src/byok/Probe.js"
import { classifyStatus, rejectsCredential } from "../../src/upstream/Failure.js"
import { makeProviderCatalog, validateCredentialInput } from "../../src/byok/Providers.js"

const SECRET = "sk-CANARY-7d1e0f5a9b3c4d2e8f6a"

interface Seen {
  readonly method: string
  readonly url: string
  readonly headers: Http.IncomingHttpHeaders
}
const seen: Array<Seen> = []
let hang: { received: () => void; closed: () => void } | null = null

const json = (res: Http.ServerResponse, status: number, body: unknown) => {
  res.writeHead(status, { "content-type": "application/json" })
  res.end(JSON.stringify(body))
}

const LISTING = { object: "list", data: [{ id: "model-a", object: "model" }, { id: "model-b", object: "model" }] }

/** The fake providers: `/s/<scenario>/v1/...` for custom endpoints, `/<provider>/...` for overridden ones. */
const handler = (req: Http.IncomingMessage, res: Http.ServerResponse) => {
  seen.push({ method: req.method!, url: req.url!, headers: req.headers })
  const url = req.url!
  const key = String(req.headers.authorization ?? req.headers["x-api-key"] ?? req.headers["api-key"] ?? "")
  const scenario = /^\/s\/([^/]+)\//.exec(url)?.[1]
  switch (scenario) {
    case "ok":
      return json(res, 200, LISTING)
    // Providers that echo the key in their errors: it must not come back to the user.
    case "401":
      return json(res, 401, { error: { message: `Incorrect API key provided: ${key}`, code: "invalid_api_key" } })
    case "403":
      return json(res, 403, { error: { message: "forbidden" } })
    case "404":
      return json(res, 404, { error: { message: "no such path" } })
    case "429":
      return json(res, 429, { error: { message: "slow down" } })
    case "500":
      return json(res, 500, { error: { message: `boom ${key}` } })
    case "503":
      res.writeHead(503)
      return res.end()
    case "400key":
      return json(res, 400, [{ error: { code: 400, message: "API key not valid. Please pass a valid API key.", status: "INVALID_ARGUMENT" } }])
    case "400":
      return json(res, 400, { error: { message: "unsupported parameter" } })
    case "418":
      return json(res, 418, { error: { message: "teapot" } })
    case "302":
      res.writeHead(302, { location: "http://169.254.169.254/latest/meta-data/iam/" })
      return res.end()
    case "html":
      res.writeHead(200, { "content-type": "text/html" })
      return res.end("<html>login</html>")
    case "nodata":
      return json(res, 200, { models: [] })
    case "big":
      return json(res, 200, { data: Array.from({ length: 200 }, (_, i) => ({ id: `model-${i}`, description: "x".repeat(50) })) })
    case "bigchunked":
      res.writeHead(200, { "content-type": "application/json" })
      for (let i = 0; i < 50; i++) res.write(" ".repeat(100))
      return res.end(JSON.stringify(LISTING))
    case "hang":
      res.on("close", () => hang?.closed())
      hang?.received()
      return
  }
  if (url.startsWith("/openai/v1/models")) {
    if (key !== `Bearer ${SECRET}`) return json(res, 401, { error: { message: "bad key" } })
    return json(res, 200, LISTING)
  }
  if (url.startsWith("/anthropic/v1/models")) {
    if (key !== SECRET || req.headers["anthropic-version"] !== "2023-06-01") return json(res, 401, { type: "error" })
    return json(res, 200, { data: [{ id: "claude-x", display_name: "Claude X", type: "model" }], has_more: false })
  }
  if (url.startsWith("/azure/res1/openai/models?api-version=2024-10-21")) {
    if (key !== SECRET && key !== `Bearer ${SECRET}`) return json(res, 401, { error: { message: "bad key" } })
    return json(res, 200, { data: [{ id: "gpt-4o" }] })
  }
  if (url === "/openrouter/api/v1/key") {
    if (key !== `Bearer ${SECRET}`) return json(res, 401, { error: { message: "No auth credentials found" } })
    return json(res, 200, { data: { label: "sk-or-...", usage: 0 } })
  }
  if (url === "/openrouter/api/v1/models") return json(res, 200, { data: [{ id: "a/b", name: "A B" }, { id: "c/d" }, { id: "e/f" }] })
  return json(res, 404, { error: "unknown fake path" })
}

const server = Http.createServer(handler)
let origin = ""
const guards: Array<AddressGuard> = []

beforeAll(async () => {
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
})
afterAll(async () => {
  await Promise.all(guards.map((g) => g.close()))
  await new Promise((r) => server.close(r))
})

const setup = (extra: ByokConfigEncoded = {}, resolver?: Resolver) => {
  const config = decodeByokConfig({
    http_allowlist: [origin],
    providers: {
      openai: { base_url: `${origin}/openai/v1` },
      anthropic: { base_url: `${origin}/anthropic/v1` },
      azure: { base_url: `${origin}/azure/{resource}/openai` },
      openrouter: { base_url: `${origin}/openrouter/api/v1` }
    },
    ...extra
  })
  const catalog = makeProviderCatalog(config)
  const guard = makeByokGuard(config, resolver === undefined ? {} : { resolver })
  guards.push(guard)
  const credential = (body: Record<string, unknown>): ProbeCredential => {
    const result = validateCredentialInput(catalog, { secret: SECRET, ...body })
    if (!result.ok) throw new Error(JSON.stringify(result.error))
    return result.value
  }
  return { guard, credential }
}

const run = (guard: AddressGuard, credential: ProbeCredential) => probe(guard, credential, { timeoutMs: 10_000 })

const expectNoSecret = (result: unknown) => {
  const text = JSON.stringify(result)
  expect(text).not.toContain("CANARY")
  expect(text).not.toContain("127.0.0.1")
}

describe("successful probes against fake providers", () => {
  it.live("custom endpoint: lists models, shows the resolved base URL, sends the key as a bearer token", () =>
    Effect.gen(function*() {
      const { guard, credential } = setup()
      const before = seen.length
      const result = yield* run(guard, credential({ provider: "custom", meta: { base_url: `${origin}/s/ok/v1/` } }))
      expect(result).toEqual({
        ok: true,
        models: [{ id: "model-a", display_name: null }, { id: "model-b", display_name: null }],
        model_count: 2,
        resolved_base_url: `${origin}/s/ok/v1`
      })
      const requests = seen.slice(before)
      expect(requests.map((r) => `${r.method} ${r.url}`)).toEqual(["GET /s/ok/v1/models"])
      expect(requests[0]!.headers.authorization).toBe(`Bearer ${SECRET}`)
    }))

  it.live("OpenAI (operator override): organization and project headers; no resolved_base_url", () =>
    Effect.gen(function*() {
      const { guard, credential } = setup()
      const before = seen.length
      const result = yield* run(guard, credential({ provider: "openai", meta: { organization_id: "org-1", project_id: "proj_2" } }))
      expect(result).toMatchObject({ ok: true, model_count: 2, resolved_base_url: null })
      const request = seen.slice(before)[0]!
      expect(request.headers["openai-organization"]).toBe("org-1")
      expect(request.headers["openai-project"]).toBe("proj_2")
    }))

  it.live("Anthropic: x-api-key and anthropic-version; display names kept", () =>
    Effect.gen(function*() {
      const { guard, credential } = setup()
      const result = yield* run(guard, credential({ provider: "anthropic" }))
      expect(result).toEqual({
        ok: true,
        models: [{ id: "claude-x", display_name: "Claude X" }],
        model_count: 1,
        resolved_base_url: null
      })
    }))

  it.live("Azure, both schemes: resource and API version assemble the URL (resolved_base_url)", () =>
    Effect.gen(function*() {
      const { guard, credential } = setup()
      for (const scheme of ["api-key", "bearer"]) {
        const before = seen.length
        const result = yield* run(guard, credential({ provider: "azure", auth_scheme: scheme, meta: { resource: "res1" } }))
        expect(result).toMatchObject({ ok: true, model_count: 1, resolved_base_url: `${origin}/azure/res1/openai` })
        const headers = seen.slice(before)[0]!.headers
        if (scheme === "api-key") expect(headers["api-key"]).toBe(SECRET)
        else expect(headers.authorization).toBe(`Bearer ${SECRET}`)
      }
    }))

  it.live("OpenRouter: the key is probed, then the (public) listing is counted", () =>
    Effect.gen(function*() {
      const { guard, credential } = setup()
      const before = seen.length
      const result = yield* run(guard, credential({ provider: "openrouter" }))
      expect(result).toMatchObject({ ok: true, model_count: 3 })
      expect(seen.slice(before).map((r) => r.url)).toEqual(["/openrouter/api/v1/key", "/openrouter/api/v1/models"])
    }))

  it.live("operator overrides are trusted without the http allow-list; a user URL to the same origin is not", () =>
    Effect.gen(function*() {
      const { guard, credential } = setup({ http_allowlist: [] })
      expect((yield* run(guard, credential({ provider: "openai" }))).ok).toBe(true)
      const custom = yield* run(guard, credential({ provider: "custom", meta: { base_url: `${origin}/s/ok/v1` } }))
      expect(custom).toMatchObject({ ok: false, kind: "insecure_scheme" })
    }))
})

describe("failed probes: each classified", () => {
  const table: ReadonlyArray<readonly [string, string]> = [
    ["401", "auth_failed"],
    ["403", "permission_denied"],
    ["404", "not_found"],
    ["429", "rate_limited"],
    ["500", "upstream_error"],
    ["503", "upstream_error"],
    ["400key", "auth_failed"],
    ["400", "upstream_rejected"],
    ["418", "upstream_rejected"],
    ["302", "redirect"],
    ["html", "bad_response"],
    ["nodata", "bad_response"]
  ]
  for (const [scenario, kind] of table) {
    it.live(`${scenario} → ${kind}`, () =>
      Effect.gen(function*() {
        const { guard, credential } = setup()
        const result = yield* run(guard, credential({ provider: "custom", meta: { base_url: `${origin}/s/${scenario}/v1` } }))
        expect(result.ok).toBe(false)
        if (result.ok) return
        expect(result.kind).toBe(kind)
        expect(/[가-힣]/.test(result.message)).toBe(true)
        expectNoSecret(result)
      }))
  }

  it.live("a wrong key on a real-shaped provider is auth_failed, and the key is not in the result", () =>
    Effect.gen(function*() {
      const { guard, credential } = setup()
      const result = yield* run(guard, { ...credential({ provider: "openai" }), secret: "sk-CANARY-wrong" })
      expect(result).toMatchObject({ ok: false, kind: "auth_failed" })
      expectNoSecret(result)
    }))

  it.live("a body over the listing limit is bad_response (announced length, and chunked)", () =>
    Effect.gen(function*() {
      const { guard, credential } = setup()
      for (const scenario of ["big", "bigchunked"]) {
        const result = yield* probe(
          guard,
          credential({ provider: "custom", meta: { base_url: `${origin}/s/${scenario}/v1` } }),
          { timeoutMs: 10_000, maxListingBytes: 4096 }
        )
        expect(result).toMatchObject({ ok: false, kind: "bad_response" })
      }
    }))

  it.live("a closed port is network_error", () =>
    Effect.gen(function*() {
      const closed = Http.createServer()
      yield* Effect.promise(() => new Promise<void>((resolve) => closed.listen(0, "127.0.0.1", resolve)))
      const port = (closed.address() as AddressInfo).port
      yield* Effect.promise(() => new Promise((resolve) => closed.close(resolve)))
      const deadOrigin = `http://127.0.0.1:${port}`
      const { guard, credential } = setup({ http_allowlist: [deadOrigin] })
      const result = yield* run(guard, credential({ provider: "custom", meta: { base_url: `${deadOrigin}/v1` } }))
      expect(result).toMatchObject({ ok: false, kind: "network_error", detail: "ECONNREFUSED" })
    }))

  it.live("guard refusals are the probe's kind: private address, plain http, rebinding name, query in the base", () =>
    Effect.gen(function*() {
      const resolver: Resolver = async (name) =>
        name === "internal.example.com" ? [{ address: "10.1.2.3", family: 4 }] : []
      const { guard, credential } = setup({}, resolver)
      const cases: ReadonlyArray<readonly [string, string]> = [
        ["https://10.0.0.1/v1", "address_not_allowed"],
        ["https://[::ffff:a9fe:a9fe]/v1", "address_not_allowed"],
        ["http://api.example.com/v1", "insecure_scheme"],
        ["https://internal.example.com/v1", "address_not_allowed"],
        ["https://api.example.com/v1?x=1", "invalid_url"],
        ["https://user@api.example.com/v1", "userinfo"],
        ["https://localhost/v1", "address_not_allowed"]
      ]
      for (const [base_url, kind] of cases) {
        const result = yield* run(guard, credential({ provider: "custom", meta: { base_url } }))
        expect(result, base_url).toMatchObject({ ok: false, kind })
        expectNoSecret(result)
        if (!result.ok) expect(result.message).not.toContain("example")
      }
    }))

  it.live("issue 16: where a URL leads is one answer (private, metadata, internal name, no such name)", () =>
    Effect.gen(function*() {
      const resolver: Resolver = async (name) => {
        if (name === "private.example.com") return [{ address: "10.0.0.1", family: 4 }]
        if (name === "metadata.example.com") return [{ address: "169.254.169.254", family: 4 }]
        if (name === "mixed.example.com") return [{ address: "93.184.216.34", family: 4 }, { address: "10.0.0.1", family: 4 }]
        if (name === "empty.example.com") return []
        throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${name}`), { code: "ENOTFOUND" })
      }
      const { guard, credential } = setup({}, resolver)
      const bases = [
        "https://10.0.0.1/v1",
        "https://169.254.169.254/v1",
        "https://[fd00:ec2::254]/v1",
        "https://private.example.com/v1",
        "https://metadata.example.com/v1",
        "https://mixed.example.com/v1",
        "https://empty.example.com/v1",
        "https://nowhere.example.com/v1",
        "https://localhost/v1",
        "https://metadata.google.internal/v1"
      ]
      const answers = new Set<string>()
      for (const base_url of bases) {
        const result = yield* run(guard, credential({ provider: "custom", meta: { base_url } }))
        expect(result, base_url).toMatchObject({ ok: false, kind: "address_not_allowed" })
        if (!result.ok) answers.add(JSON.stringify({ kind: result.kind, message: result.message }))
        const listed = yield* listModels(guard, credential({ provider: "custom", meta: { base_url } }), { timeoutMs: 10_000 })
        if (!listed.ok) answers.add(JSON.stringify({ kind: listed.kind, message: listed.message }))
      }
      expect([...answers]).toHaveLength(1)
    }))

  it.effect("the probe times out on the Effect clock and aborts the request", () =>
    Effect.gen(function*() {
      const received = yield* Deferred.make<void>()
      const closed = yield* Deferred.make<void>()
      hang = {
        received: () => Deferred.doneUnsafe(received, Effect.void),
        closed: () => Deferred.doneUnsafe(closed, Effect.void)
      }
      const { guard, credential } = setup()
      const fiber = yield* probe(
        guard,
        credential({ provider: "custom", meta: { base_url: `${origin}/s/hang/v1` } }),
        { timeoutMs: 5_000 }
      ).pipe(Effect.forkChild)
      yield* Deferred.await(received)
      yield* TestClock.adjust("4999 millis")
      expect(fiber.pollUnsafe()).toBeUndefined()
      yield* TestClock.adjust("1 millis")
      const result: ProbeResult = yield* Fiber.join(fiber)
      expect(result).toMatchObject({ ok: false, kind: "timeout" })
      // The abandoned request is aborted: the fake sees its connection close.
      yield* Deferred.await(closed)
      hang = null
    }))
})

describe("model listing", () => {
  it.live("lists a credential's models; a provider refusal is classified", () =>
    Effect.gen(function*() {
      const { guard, credential } = setup()
      const ok = yield* listModels(guard, credential({ provider: "openrouter" }), { timeoutMs: 10_000 })
      expect(ok).toEqual({
        ok: true,
        models: [{ id: "a/b", display_name: "A B" }, { id: "c/d", display_name: null }, { id: "e/f", display_name: null }]
      })
      const refused = yield* listModels(
        guard,
        credential({ provider: "custom", meta: { base_url: `${origin}/s/403/v1` } }),
        { timeoutMs: 10_000 }
      )
      expect(refused).toMatchObject({ ok: false, kind: "permission_denied" })
    }))
})

describe("classification helpers", () => {
  it("only auth and permission failures reject a credential", () => {
    expect(rejectsCredential("auth_failed")).toBe(true)
    expect(rejectsCredential("permission_denied")).toBe(true)
    for (const kind of ["timeout", "upstream_error", "rate_limited", "not_found", "network_error", "bad_response"] as const) {
      expect(rejectsCredential(kind)).toBe(false)
    }
  })

  it("statuses", () => {
    expect(classifyStatus(401, "")).toBe("auth_failed")
    expect(classifyStatus(400, "{\"error\":\"invalid_api_key\"}")).toBe("auth_failed")
    expect(classifyStatus(400, "{\"error\":\"bad model\"}")).toBe("upstream_rejected")
    expect(classifyStatus(502, "")).toBe("upstream_error")
    expect(classifyStatus(422, "")).toBe("upstream_rejected")
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

describe.skipIf(!opensslAvailable)("TLS", () => {
  it.live("a self-signed endpoint is tls_error", () =>
    Effect.gen(function*() {
      const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-probe-tls-"))
      ChildProcess.execFileSync("openssl", [
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", Path.join(dir, "key.pem"), "-out", Path.join(dir, "cert.pem"), "-days", "2",
        "-subj", "/CN=llm.example.com", "-addext", "subjectAltName=DNS:llm.example.com"
      ], { stdio: "ignore" })
      const tls = Https.createServer({
        cert: Fs.readFileSync(Path.join(dir, "cert.pem")),
        key: Fs.readFileSync(Path.join(dir, "key.pem"))
      }, (_req, res) => json(res, 200, LISTING))
      Fs.rmSync(dir, { recursive: true, force: true })
      yield* Effect.promise(() => new Promise<void>((resolve) => tls.listen(0, "127.0.0.1", resolve)))
      const port = (tls.address() as AddressInfo).port
      const resolver: Resolver = async () => [{ address: "127.0.0.1", family: 4 }]
      const { guard, credential } = setup({ allowed_cidrs: ["127.0.0.1/32"] }, resolver)
      const result = yield* run(guard, credential({ provider: "custom", meta: { base_url: `https://llm.example.com:${port}/v1` } }))
      expect(result).toMatchObject({ ok: false, kind: "tls_error" })
      yield* Effect.promise(() => new Promise((resolve) => tls.close(resolve)))
    }))
})
