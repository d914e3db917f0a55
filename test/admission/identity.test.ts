/**
 * `GET /v1/me` and `GET /v1/usage` over HTTP with the real engine, in both modes (spec: Account, Usage;
 * issue [3/4] §5): /v1/me is an exact whitelist of 11 keys that never carries the email address; /v1/usage
 * reports percentages only, agreeing with the receipts, with `by_model` counting successful requests only.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { newAccount, newKey } from "../accounts/support.js"
import { Behaviour, Chunks, type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"
import { readBody } from "../inference/helpers.js"
import {
  account,
  addQuotaModel,
  chat,
  estimateOf,
  getJson,
  MODES,
  postgresUp,
  type QuotaGateway,
  quotaConfig,
  rowsOf,
  standing,
  startQuotaGateway,
  type TestAccount,
  user
} from "./helpers.js"

const ME_KEYS = [
  "object",
  "id",
  "display_id",
  "display_name",
  "username",
  "is_legacy",
  "is_admin",
  "key_label",
  "created_at",
  "last_rotated_at",
  "email_registered"
].sort()
const BUCKET_KEYS = ["by_model", "remaining_pct", "resets_at", "resets_in_seconds", "used_pct"]
/** Names that would leak weights or absolute figures. */
const FORBIDDEN = new Set(["weighted", "weights", "used", "limit", "remaining", "weighted_cost", "tokens", "anchor_at", "email"])

const keysDeep = (value: unknown, out: Array<string> = []): Array<string> => {
  if (Array.isArray(value)) value.forEach((v) => keysDeep(v, out))
  else if (typeof value === "object" && value !== null) {
    for (const [k, v] of Object.entries(value)) {
      out.push(k)
      keysDeep(v, out)
    }
  }
  return out
}

const completion = (prompt: number, completionTokens: number) =>
  Behaviour.json(Chunks.completion({ content: "answer", usage: { prompt, completion: completionTokens } }))

describe.skipIf(!postgresUp).each(MODES)("GET /v1/me and GET /v1/usage (%s admission)", (mode) => {
  let q: QuotaGateway
  let mock: MockUpstream

  beforeAll(async () => {
    mock = await startMockUpstream()
    q = await startQuotaGateway(mode, (doc) => {
      quotaConfig(doc)
      addQuotaModel(doc, { id: "ws-u1", baseUrl: mock.url })
      addQuotaModel(doc, { id: "ws-u2", baseUrl: mock.url })
    }, "identity")
  })
  afterAll(async () => {
    await q?.stop()
    await mock?.close()
  })

  it("/v1/me: exactly the 11 whitelisted keys; the email address appears nowhere", async () => {
    const { gw } = q
    const email = "very.private.person@mail.example.org"
    const a = await account(gw, "default", email)
    const me = await getJson(gw, a, "/v1/me")
    expect(me.status).toBe(200)
    expect(Object.keys(me.body).sort()).toEqual(ME_KEYS)
    expect(me.body).toMatchObject({
      object: "account",
      id: a.id,
      key_label: "quota-test",
      is_admin: false,
      is_legacy: false,
      email_registered: true
    })
    expect(Number.isInteger(me.body.display_id)).toBe(true)
    expect(Number.isInteger(me.body.created_at)).toBe(true)
    expect(Number.isInteger(me.body.last_rotated_at)).toBe(true)
    expect(me.text).not.toContain(email)
    expect(me.text).not.toContain("very.private.person")
    expect(me.text).not.toContain("mail.example.org")
    expect(me.text.includes("@")).toBe(false)

    // No email on file, or an unverified one: email_registered false, still 11 keys.
    for (const input of [{ email: undefined }, { email: "unverified.person@mail.example.org", emailVerified: false }]) {
      const row = await newAccount(gw, input as any)
      const { key } = await newKey(gw, row.id, "k")
      const other = await getJson(gw, { id: row.id, key, plan: "default", email: "" }, "/v1/me")
      expect(Object.keys(other.body).sort()).toEqual(ME_KEYS)
      expect(other.body.email_registered).toBe(false)
      expect(other.text.includes("@")).toBe(false)
    }
  })

  it("/v1/usage: percentages only, equal to the last receipt; by_model counts successful requests only", async () => {
    const { gw } = q
    const a: TestAccount = await account(gw)

    const idle = await getJson(gw, a, "/v1/usage")
    expect(idle.status).toBe(200)
    const empty = { used_pct: 0, remaining_pct: 100, resets_at: null, resets_in_seconds: 0, by_model: [] }
    expect(idle.body).toEqual({ object: "usage", session: empty, weekly: empty })

    // ws-u1: 600 + 59 weighted in two successes, one upstream failure (refunded, not counted);
    // ws-u2: one success of 300 and one cut stream charged its estimate (an error: not in by_model).
    mock.script(
      completion(100, 250),
      completion(37, 11),
      Behaviour.status(500, { error: { message: "boom" } }),
      Behaviour.dropAfter([Chunks.role(), Chunks.content("0123456789"), Chunks.content("abcdefghij")]),
      completion(100, 100)
    )
    expect((await chat(gw, a, { model: "ws-u1", messages: [user("hello")] })).status).toBe(200)
    expect((await chat(gw, a, { model: "ws-u1", messages: [user("hello")] })).status).toBe(200)
    expect((await chat(gw, a, { model: "ws-u1", messages: [user("hello")] })).status).toBe(500)
    await readBody(await chat(gw, a, { model: "ws-u2", messages: [user("hello")], stream: true }))
    const last = await chat(gw, a, { model: "ws-u2", messages: [user("hello")] })
    const receipt = ((await last.json()) as any).wellspring
    const cut = estimateOf("hello") + 5 * 2
    expect((await standing(gw, a)).session.used).toBe(600 + 59 + cut + 300)
    await rowsOf(gw, a) // flushes the request log: by_model reads the rows

    const usage = await getJson(gw, a, "/v1/usage")
    expect(usage.status).toBe(200)
    expect(Object.keys(usage.body).sort()).toEqual(["object", "session", "weekly"])
    expect(usage.body.object).toBe("usage")
    for (const bucket of ["session", "weekly"] as const) {
      const b = usage.body[bucket]
      expect(Object.keys(b).sort()).toEqual(BUCKET_KEYS)
      expect(b.used_pct).toBe(receipt[bucket].used_pct)
      expect(b.remaining_pct).toBe(receipt[bucket].remaining_pct)
      expect(b.resets_at).toBe(receipt[bucket].resets_at)
      expect(Math.abs(b.resets_in_seconds - receipt[bucket].resets_in_seconds)).toBeLessThanOrEqual(2)
      expect(b.by_model).toEqual([
        { model_id: "ws-u1", request_count: 2, pct_of_total: 68.72 }, // 659 / 959
        { model_id: "ws-u2", request_count: 1, pct_of_total: 31.28 } // 300 / 959
      ])
    }
    expect(usage.body.session.used_pct).toBe(9.72) // (659 + 13 + 300) / 10000
    expect(usage.body.weekly.used_pct).toBe(0.97)
    const leaked = keysDeep(usage.body).filter((k) => FORBIDDEN.has(k))
    expect(leaked).toEqual([])
    expect(usage.text).not.toMatch(/\b(600|659|972|959)\b/)
  })
})
