/**
 * Issue 16, findings 3 and 4: every way a call through a user's credential can fail, against a provider that
 * echoes the key in pieces and log-forging text (LeakyUpstream.ts), on both wires (OpenAI-compatible, Anthropic).
 * Afterwards no line the gateway logged, no answer it gave and no row it wrote holds a run of 6 characters of any
 * key, and no log line holds a raw control character (C0, DEL, C1, U+2028/2029, bidi controls).
 */
import * as Crypto from "node:crypto"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { call, flushRequestLog, newUser, query, type Reply } from "../accounts/support.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { serviceGate } from "../support/Services.js"
import { type LeakyUpstream, startLeakyUpstream } from "./LeakyUpstream.js"
import { type CapturingGateway, startCapturingGateway } from "./support.js"
import { readBody } from "../inference/helpers.js"

const postgresAvailable = await serviceGate("postgres")
const BASE = "/api/user/me/byok"
const CHAT = "/v1/chat/completions"
const EMBEDDINGS = "/v1/embeddings"

const ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
const random = (n: number) => Array.from(Crypto.randomBytes(n), (b) => ALPHABET[b % ALPHABET.length]).join("")

/** What no log line may hold raw. */
const CONTROL = /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]/

/** The first run of 6 characters of `secret` found in `text`, or null. */
export const secretRun = (text: string, secret: string): string | null => {
  for (let i = 0; i + 6 <= secret.length; i++) {
    const gram = secret.slice(i, i + 6)
    if (text.includes(gram)) return gram
  }
  return null
}

/** Every failure of a chat call, streamed and not. */
const CHAT_FAILURES = ["s400", "s404", "s429", "s500", "html502", "hang", "notjson", "endless", "midstream", "badframe", "die", "stall"]
/** Failures of an embeddings call (OpenAI-compatible only: Anthropic has no embeddings endpoint). */
const EMBEDDING_FAILURES = ["s400", "s429", "s500", "html502", "hang", "notjson", "endless"]

describe("BYOK failures leave no piece of a key and no raw control character in the log", () => {
  let up: LeakyUpstream
  let spare: LeakyUpstream
  let gw: CapturingGateway
  let db: FreshDatabase | undefined
  const secrets: Array<string> = []
  const answers: Array<string> = []

  const openaiSecret = () => {
    const s = `sk-${random(44)}`
    secrets.push(s)
    return s
  }
  const anthropicSecret = () => {
    const s = `sk-ant-api03-${random(44)}`
    secrets.push(s)
    return s
  }
  const req = async (method: string, path: string, key: string, body?: unknown): Promise<Reply> => {
    const r = await call(gw, method, path, body === undefined ? { key } : { key, body })
    answers.push(r.text)
    return r
  }
  /** A chat or embeddings call; a stream cut after its first byte is read up to the cut. */
  const infer = async (path: string, key: string, body: Record<string, unknown>): Promise<number> => {
    const res = await fetch(`${gw.url}${path}`, {
      method: "POST",
      headers: { authorization: `Bearer ${key}`, "content-type": "application/json" },
      body: JSON.stringify(body)
    })
    // Cut mid-stream: what arrived is the answer.
    answers.push((await readBody(res)).text)
    return res.status
  }
  const save = async (key: string, body: Record<string, unknown>) => {
    const r = await req("POST", BASE, key, body)
    expect(r.status, r.text).toBe(200)
    return r.body.data.credential as { id: number }
  }

  beforeAll(async () => {
    up = await startLeakyUpstream()
    spare = await startLeakyUpstream()
    db = postgresAvailable ? await freshDatabase("byoklogs") : undefined
    gw = await startCapturingGateway({
      ...(db ? { databaseUrl: db.url } : {}),
      configure: (doc) => {
        doc.byok = {
          enabled: true,
          encryption_key: Crypto.randomBytes(32).toString("hex"),
          rate_limit_rpm: 100_000,
          max_per_provider: 20,
          probe_timeout_ms: 1_000,
          http_allowlist: [up.origin, spare.origin],
          dispatch_timeouts: { first_token_ms: 300, idle_ms: 300, total_ms: 5_000 },
          providers: {
            openai: { base_url: `${up.origin}/oa/v1` },
            anthropic: { base_url: `${up.origin}/an/v1` }
          }
        }
        doc.abuse = { burst: 100_000, window_seconds: 10, cooldown_seconds: 60 }
        doc.limits = { ...doc.limits, failed_requests_per_minute: 100_000 }
      }
    })
  })
  afterAll(async () => {
    await gw?.stop()
    await up?.close()
    await spare?.close()
    await db?.drop()
  })

  for (const kind of ["openai", "anthropic"] as const) {
    it(`${kind}: chat (and embeddings) failures, auth rejections included`, async () => {
      const user = await newUser(gw)
      const fresh = kind === "openai" ? openaiSecret : anthropicSecret
      for (const label of ["main", "a401", "a403"]) {
        const secret = fresh()
        up.valid.add(secret)
        await save(user.key, { provider: kind, secret, label })
      }
      for (const model of CHAT_FAILURES) {
        for (const stream of [false, true]) {
          const status = await infer(CHAT, user.key, {
            model: `@${kind}:main/${model}`,
            stream,
            messages: [{ role: "user", content: "hi" }]
          })
          if (!stream && model !== "badframe") expect(status, model).not.toBe(200)
        }
      }
      if (kind === "openai") {
        for (const model of EMBEDDING_FAILURES) {
          const status = await infer(EMBEDDINGS, user.key, { model: `@openai:main/${model}`, input: ["hi"] })
          expect(status, model).not.toBe(200)
        }
      }
      for (const status of [401, 403]) {
        const r = await req("POST", CHAT, user.key, {
          model: `@${kind}:a${status}/s${status}`,
          messages: [{ role: "user", content: "hi" }]
        })
        expect([r.status, r.body?.error?.code]).toEqual([400, "byok_credential_rejected"])
      }
    })

    it(`${kind}: verify and save refused, then every failing model listing`, async () => {
      const user = await newUser(gw)
      const fresh = kind === "openai" ? openaiSecret : anthropicSecret
      const refused = fresh()
      const verify = await req("POST", `${BASE}/verify`, user.key, { provider: kind, secret: refused })
      expect(verify.body.data).toMatchObject({ ok: false, kind: "auth_failed" })
      expect((await req("POST", BASE, user.key, { provider: kind, secret: refused })).status).toBe(400)
      const secret = fresh()
      up.valid.add(secret)
      const { id } = await save(user.key, { provider: kind, secret })
      try {
        for (const mode of ["s500", "garbage", "hang"] as const) {
          up.listing = mode
          const r = await req("GET", `${BASE}/${id}/models`, user.key)
          expect(r.status, mode).toBe(400)
        }
      } finally {
        up.listing = "ok"
      }
      up.valid.delete(secret)
      const r = await req("GET", `${BASE}/${id}/models`, user.key)
      expect([r.status, r.body.error.code]).toEqual([400, "auth_failed"])
    })
  }

  it("a provider that stopped listening: chat, embeddings, listing and verify", async () => {
    const user = await newUser(gw)
    const secret = openaiSecret()
    spare.valid.add(secret)
    const { id } = await save(user.key, { provider: "custom", secret, meta: { base_url: `${spare.origin}/oa/v1` } })
    await spare.close()
    for (const stream of [false, true]) {
      expect(await infer(CHAT, user.key, { model: "@custom/x", stream, messages: [{ role: "user", content: "hi" }] })).toBe(503)
    }
    expect(await infer(EMBEDDINGS, user.key, { model: "@custom/x", input: ["hi"] })).toBe(503)
    expect((await req("GET", `${BASE}/${id}/models`, user.key)).body.error.code).toBe("network_error")
    const verify = await req("POST", `${BASE}/verify`, user.key, {
      provider: "custom",
      secret,
      meta: { base_url: `${spare.origin}/oa/v1` }
    })
    expect(verify.body.data).toMatchObject({ ok: false, kind: "network_error" })
  })

  it("no log line, answer or row holds 6 characters of a key; no log line a raw control character", async () => {
    await flushRequestLog(gw)
    const rows = await query<{ t: string }>(gw, "SELECT r::text AS t FROM request_log r")
    expect(rows.length).toBeGreaterThan(40)
    const logs = gw.logs
    for (const secret of secrets) {
      for (const line of logs) expect(secretRun(line, secret), line.slice(0, 2_000)).toBeNull()
      for (const text of answers) expect(secretRun(text, secret), text.slice(0, 2_000)).toBeNull()
      for (const { t } of rows) expect(secretRun(t, secret), t.slice(0, 2_000)).toBeNull()
    }
    for (const line of logs) expect(CONTROL.test(line), JSON.stringify(line.slice(0, 2_000))).toBe(false)
    // The failures were logged, with their upstream text (redacted, escaped): the checks above are not vacuous.
    expect(logs.filter((l) => l.includes("request failed")).length).toBeGreaterThan(30)
    expect(logs.some((l) => l.includes("[redacted]"))).toBe(true)
    expect(logs.some((l) => l.includes("forged line\\r\\x1b[31m"))).toBe(true)
  })
})
