/**
 * Property-based fuzzing of every request-taking route with generated malformed bodies: wrong types, huge and
 * deep values, NUL and lone surrogates, unknown fields, truncated JSON. Whatever is sent, the gateway answers
 * without a 5xx, with a small error body, keeps one request row per authenticated inference request, and still
 * answers and records a valid request afterwards.
 */
import { SqlClient } from "effect/sql"
import { Effect } from "effect"
import fc from "fast-check"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { RequestLog } from "../../src/telemetry/RequestLog.js"
import { newUser } from "../accounts/support.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { type ConfigDoc, startGateway, type TestGateway } from "../support/Gateway.js"
import { serviceGate } from "../support/Services.js"

const MAX_ERROR_BODY = 16 * 1024

/** Lets the fuzz reach every check instead of stopping at the (separately tested) rate limits. */
const generousLimits = (doc: ConfigDoc) => {
  doc.abuse = { burst: 1_000_000, window_seconds: 10, cooldown_seconds: 1 }
  doc.limits = { ...doc.limits, failed_requests_per_minute: 1_000_000, failed_auth_per_minute: 1_000_000, snapshot_per_minute: 1_000_000 }
  for (const model of doc.catalog.models) model.rate_limit_rpm = 1_000_000
}

// ---- generators ------------------------------------------------------------------------------------------

const nasty = fc.constantFrom(
  "",
  "\u0000",
  "x\u0000y",
  "\ud800",
  "a\udfffb",
  "\ud83d",
  "\u202e\u200b",
  "%00",
  "../../etc/passwd",
  "'; DROP TABLE request_log; --",
  "@openai/gpt-4o",
  "@x:y/z",
  "ws-pro\n",
  "NaN"
)
const text = fc.oneof(
  { weight: 4, arbitrary: fc.string({ maxLength: 40 }) },
  { weight: 2, arbitrary: fc.string({ unit: "binary", maxLength: 40 }) },
  { weight: 3, arbitrary: nasty },
  { weight: 1, arbitrary: fc.integer({ min: 1, max: 400 }).map((kb) => "가".repeat(kb * 341)) },
  { weight: 1, arbitrary: fc.integer({ min: 1, max: 6_000 }).map((n) => "m".repeat(n)) }
)
const number = fc.oneof(
  fc.double(),
  fc.integer(),
  fc.constantFrom(0, -1, -5, 2.5, 1e308, -1e308, 2 ** 53, 0.1, Number.MAX_SAFE_INTEGER)
)
const scalar = fc.oneof(text, number, fc.boolean(), fc.constant(null))
const value: fc.Arbitrary<unknown> = fc.letrec<{ v: unknown }>((tie) => ({
  v: fc.oneof(
    { depthSize: "small", withCrossShrink: true },
    scalar,
    fc.array(tie("v"), { maxLength: 4 }),
    fc.dictionary(fc.oneof(fc.string({ maxLength: 12 }), nasty), tie("v"), { maxKeys: 4 })
  )
})).v

/** JSON text that no generic encoder produces: deep nesting, huge numbers, broken syntax. */
const rawText = fc.oneof(
  fc.integer({ min: 1, max: 120_000 }).map((d) => "[".repeat(d) + "]".repeat(d)),
  fc.integer({ min: 1, max: 120_000 }).map((d) => `{"model":"ws-pro","messages":${"[".repeat(d)}${"]".repeat(d)}}`),
  fc.integer({ min: 1, max: 50_000 }).map((d) =>
    `{"model":"ws-pro","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":${
      '{"a":'.repeat(d)
    }1${"}".repeat(d)}}}]}`
  ),
  fc.constantFrom(
    "",
    "{",
    "nul",
    "null",
    "[]",
    '"string"',
    "1e999",
    '{"model":"ws-pro","messages":[{"role":"user","content":"hi"}],"temperature":1e999}',
    '{"model":"ws-pro","messages":[{"role":"user","content":"\\ud800"}]}',
    '{"model":"x\\u0000y","messages":[{"role":"user","content":"hi"}]}',
    '{"__proto__":{"admin":true},"model":"ws-pro","messages":[{"role":"user","content":"hi"}]}'
  ),
  fc.string({ unit: "binary", maxLength: 200 })
)

const message = fc.oneof(
  fc.record({ role: fc.constantFrom("system", "user", "assistant", "tool", "developer", ""), content: value }, {
    requiredKeys: []
  }),
  fc.record({
    role: fc.constant("user"),
    content: fc.array(
      fc.oneof(
        fc.record({ type: fc.constant("text"), text }),
        fc.record({ type: fc.constant("image_url"), image_url: fc.record({ url: text, detail: value }, { requiredKeys: [] }) }),
        value
      ),
      { maxLength: 3 }
    )
  }),
  fc.record({
    role: fc.constant("assistant"),
    content: fc.option(text),
    tool_calls: fc.array(fc.record({ id: text, type: value, function: fc.record({ name: text, arguments: text }) }), {
      maxLength: 2
    })
  }),
  value
)

const tool = fc.oneof(
  fc.record({
    type: fc.constant("function"),
    function: fc.record({ name: text, description: text, parameters: value, strict: value }, { requiredKeys: ["name"] })
  }),
  value
)

const chatBody = fc.record({
  model: fc.oneof(fc.constantFrom("ws-pro", "ws-lite", "ws-reasoner", "ws-embed", "ws-legacy"), text, value),
  messages: fc.oneof(fc.array(message, { maxLength: 5 }), value),
  stream: fc.oneof(fc.boolean(), value),
  temperature: fc.oneof(number, value),
  top_p: fc.oneof(number, value),
  max_tokens: fc.oneof(number, value),
  stop: fc.oneof(text, fc.array(text, { maxLength: 6 }), value),
  reasoning_effort: fc.oneof(fc.constantFrom("none", "low", "high", "max", "extreme"), value),
  tools: fc.oneof(fc.array(tool, { maxLength: 4 }), value),
  tool_choice: fc.oneof(fc.constantFrom("auto", "none", "required"), value),
  parallel_tool_calls: value,
  n: value,
  unknown_field: value
}, { requiredKeys: [] })

const embeddingsBody = fc.record({
  model: fc.oneof(fc.constantFrom("ws-embed", "ws-pro"), text, value),
  input: fc.oneof(text, fc.array(text, { maxLength: 5 }), fc.array(fc.integer(), { maxLength: 5 }), value),
  encoding_format: fc.oneof(fc.constantFrom("float", "base64", "hex"), value),
  dimensions: value
}, { requiredKeys: [] })

const contentType = fc.constantFrom(
  "application/json",
  "application/json; charset=utf-8",
  "text/plain",
  "application/x-www-form-urlencoded",
  "multipart/form-data; boundary=x",
  ""
)

// ---- helpers ---------------------------------------------------------------------------------------------

interface Sent {
  readonly status: number
  readonly text: string
}

const send = async (
  gw: TestGateway,
  method: string,
  path: string,
  headers: Record<string, string>,
  body?: string
): Promise<Sent> => {
  const res = await fetch(`${gw.url}${path}`, {
    method,
    headers,
    ...(body !== undefined && method !== "GET" && method !== "DELETE" ? { body } : {})
  })
  return { status: res.status, text: await res.text() }
}

/** Percent-encodes every UTF-8 byte (lone surrogates become U+FFFD, as a client's encoder would send them). */
const uri = (text: string): string => Array.from(Buffer.from(text, "utf8"), (b) => `%${b.toString(16).padStart(2, "0")}`).join("")

const encode = (body: unknown): string => {
  try {
    return JSON.stringify(body) ?? "null"
  } catch {
    return "{}"
  }
}

const expectSane = (what: string, sent: Sent) => {
  expect(sent.status, `${what}: ${sent.text.slice(0, 300)}`).toBeLessThan(500)
  if (sent.status >= 400) {
    expect(sent.text.length, `${what}: error body size`).toBeLessThan(MAX_ERROR_BODY)
    expect(() => JSON.parse(sent.text), `${what}: error body is JSON`).not.toThrow()
  }
}

const rowCount = (gw: TestGateway, accountId: string) =>
  gw.run(Effect.gen(function*() {
    yield* Effect.flatMap(RequestLog, (log) => log.flush)
    const sql = yield* SqlClient.SqlClient
    const [row] = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM request_log WHERE account_id = ${accountId}`
    return row!.n
  }).pipe(Effect.orDie))

const fuzzSuite = (label: string, runs: number, database: () => FreshDatabase | undefined) => {
  describe(`fuzz (${label})`, () => {
    let gw: TestGateway
    let inference: Awaited<ReturnType<typeof newUser>>
    let dashboard: Awaited<ReturnType<typeof newUser>>
    let inferenceRequests = 0

    beforeAll(async () => {
      const db = database()
      gw = await startGateway({ configure: generousLimits, ...(db ? { databaseUrl: db.url } : {}) })
      inference = await newUser(gw)
      dashboard = await newUser(gw)
    })
    afterAll(async () => {
      await gw?.stop()
    })

    it("chat completions: generated bodies never give a 5xx or a large error", async () => {
      const headers = { authorization: `Bearer ${inference.key}`, "content-type": "application/json" }
      await fc.assert(
        fc.asyncProperty(fc.oneof({ weight: 4, arbitrary: chatBody.map(encode) }, { weight: 1, arbitrary: rawText }), async (body) => {
          inferenceRequests++
          expectSane("chat", await send(gw, "POST", "/v1/chat/completions", headers, body))
        }),
        { numRuns: runs }
      )
    })

    it("embeddings: generated bodies never give a 5xx or a large error", async () => {
      const headers = { authorization: `Bearer ${inference.key}`, "content-type": "application/json" }
      await fc.assert(
        fc.asyncProperty(fc.oneof({ weight: 4, arbitrary: embeddingsBody.map(encode) }, { weight: 1, arbitrary: rawText }), async (body) => {
          inferenceRequests++
          expectSane("embeddings", await send(gw, "POST", "/v1/embeddings", headers, body))
        }),
        { numRuns: Math.ceil(runs / 2) }
      )
    })

    it("account routes: generated bodies, ids, queries and content types never give a 5xx", async () => {
      const route = fc.oneof(
        fc.constant({ method: "GET", path: "/api/user/me" }),
        fc.record({ method: fc.constant("GET"), path: fc.tuple(text, text).map(([r, m]) =>
          `/api/user/me/metrics?range=${uri(r)}&model=${uri(m)}`) }),
        fc.record({ method: fc.constant("GET"), path: text.map((l) => `/api/user/me/requests?limit=${uri(l)}`) }),
        fc.constant({ method: "POST", path: "/api/user/sfw" }),
        fc.constant({ method: "GET", path: "/api/user/me/keys" }),
        fc.constant({ method: "POST", path: "/api/user/me/keys" }),
        fc.record({ method: fc.constant("DELETE"), path: text.map((id) => `/api/user/me/keys/${uri(id)}`) }),
        fc.record({ method: fc.constant("GET"), path: text.map((id) => `/api/user/me/keys/${uri(id)}/reveal`) }),
        fc.constant({ method: "POST", path: "/api/user/me/rotate-key" }),
        fc.constant({ method: "GET", path: "/v1/me" }),
        fc.constant({ method: "GET", path: "/v1/usage" }),
        fc.constant({ method: "GET", path: "/v1/models" })
      )
      const auth = fc.oneof(
        fc.constant<Record<string, string>>({ cookie: `ws-session=${dashboard.session}` }),
        fc.constant<Record<string, string>>({ cookie: `ws-session=${dashboard.session}`, origin: "https://evil.example" }),
        text.map((t) => ({ cookie: `ws-session=${uri(t)}` })),
        text.map((t) => ({ authorization: `Bearer ${uri(t)}` }))
      )
      await fc.assert(
        fc.asyncProperty(route, auth, contentType, fc.oneof(value.map(encode), rawText), async (r, a, type, body) => {
          const headers: Record<string, string> = { ...a, ...(type ? { "content-type": type } : {}) }
          expectSane(`${r.method} ${r.path.slice(0, 80)}`, await send(gw, r.method, r.path, headers, body))
        }),
        { numRuns: runs }
      )
    })

    it("afterwards a valid request is answered and recorded, and every fuzzed inference request left one row", async () => {
      const res = await fetch(`${gw.url}/v1/chat/completions`, {
        method: "POST",
        headers: { authorization: `Bearer ${inference.key}`, "content-type": "application/json" },
        body: JSON.stringify({ model: "ws-lite", messages: [{ role: "user", content: "안녕하세요" }] })
      })
      expect(res.status).toBe(200)
      const body = await res.json() as { choices: Array<{ message: { content: string } }> }
      expect(body.choices[0]!.message.content.length).toBeGreaterThan(0)
      const rowId = Number(res.headers.get("x-request-id"))
      expect(await rowCount(gw, inference.account.id)).toBe(inferenceRequests + 1)
      const [row] = await gw.run(Effect.flatMap(SqlClient.SqlClient, (sql) =>
        sql<{ status: string }>`SELECT status FROM request_log WHERE id = ${rowId}`).pipe(Effect.orDie))
      expect(row?.status).toBe("success")
    })
  })
}

const RUNS = Number(process.env.FUZZ_RUNS ?? 1500)

fuzzSuite("embedded PGlite", RUNS, () => undefined)

const postgres = await serviceGate("postgres")

describe.skipIf(!postgres)("real PostgreSQL", () => {
  let db: FreshDatabase | undefined
  beforeAll(async () => {
    db = await freshDatabase("fuzz")
  })
  afterAll(async () => {
    await db?.drop()
  })
  fuzzSuite("PostgreSQL", Math.ceil(RUNS / 3), () => db)
})
