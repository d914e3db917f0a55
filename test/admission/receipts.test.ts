/**
 * Quota receipts over HTTP with the real admission engine (spec: wellspring receipt, response headers;
 * issue [3/4] §4), in both modes: the `wellspring` block of a non-streaming answer and of the last SSE frame
 * carries the exact post-request figures; `request_pct` appears only when the plan surfaces it; the headers are
 * exact on non-streaming answers and reservation-time estimates on streams.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Behaviour, Chunks, type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"
import { parseSse, readBody } from "../inference/helpers.js"
import {
  account,
  addQuotaModel,
  chat,
  estimateOf,
  expectInstant,
  HOUR_MS,
  MODES,
  pct,
  postgresUp,
  type QuotaGateway,
  quotaConfig,
  round2,
  standing,
  startQuotaGateway,
  user,
  WEEK_MS
} from "./helpers.js"

const SESSION_LIMIT = 10_000
const WEEKLY_LIMIT = 100_000
const RPM = 10

const completion = (prompt: number, completionTokens: number) =>
  Behaviour.json(Chunks.completion({ content: "answer", usage: { prompt, completion: completionTokens } }))
const streamed = (prompt: number, completionTokens: number) =>
  Behaviour.stream([Chunks.role(), Chunks.content("streamed"), Chunks.finish("stop"), Chunks.usage({ prompt, completion: completionTokens })])

const POOL_KEYS = ["remaining_pct", "resets_at", "resets_in_seconds", "used_pct"]

const headerFigures = (res: Response) => ({
  limit: res.headers.get("x-ratelimit-limit-requests"),
  remaining: res.headers.get("x-ratelimit-remaining-requests"),
  sessionUsed: res.headers.get("x-session-used-pct"),
  sessionRemaining: res.headers.get("x-session-remaining-pct"),
  sessionReset: res.headers.get("x-session-reset"),
  weeklyUsed: res.headers.get("x-weekly-used-pct"),
  weeklyRemaining: res.headers.get("x-weekly-remaining-pct"),
  weeklyReset: res.headers.get("x-weekly-reset")
})

/** Headers that repeat the receipt's figures exactly. */
const headersOfReceipt = (w: any) => ({
  limit: String(w.rpm.limit),
  remaining: String(w.rpm.remaining),
  sessionUsed: String(w.session.used_pct),
  sessionRemaining: String(w.session.remaining_pct),
  sessionReset: String(w.session.resets_in_seconds),
  weeklyUsed: String(w.weekly.used_pct),
  weeklyRemaining: String(w.weekly.remaining_pct),
  weeklyReset: String(w.weekly.resets_in_seconds)
})

describe.skipIf(!postgresUp).each(MODES)("receipts and quota headers (%s admission)", (mode) => {
  let q: QuotaGateway
  let mock: MockUpstream

  beforeAll(async () => {
    mock = await startMockUpstream()
    q = await startQuotaGateway(mode, (doc) => {
      quotaConfig(doc)
      addQuotaModel(doc, { id: "ws-r", rpm: RPM, baseUrl: mock.url })
    }, "receipts")
  })
  afterAll(async () => {
    await q?.stop()
    await mock?.close()
  })

  it("default plan: exact post-request receipts and headers, request_pct, rpm counting down; streams report the reservation in headers", async () => {
    const { gw } = q
    const a = await account(gw, "default")

    // 1. non-streaming, usage 100 in + 250 out -> 100×1 + 250×2 = 600 weighted
    mock.script(completion(100, 250), completion(37, 11), streamed(50, 100))
    const before = Date.now()
    const r1 = await chat(gw, a, { model: "ws-r", messages: [user("hello")] })
    const after = Date.now()
    expect(r1.status).toBe(200)
    const b1 = (await r1.json()) as any
    const w1 = b1.wellspring
    expect(Object.keys(w1).sort()).toEqual(["request_id", "rpm", "session", "weekly"])
    expect(w1.request_id).toBe(r1.headers.get("x-request-id"))
    expect(Object.keys(w1.session).sort()).toEqual([...POOL_KEYS, "request_pct"].sort())
    expect(Object.keys(w1.weekly).sort()).toEqual([...POOL_KEYS, "request_pct"].sort())
    expect(w1.rpm).toEqual({ limit: RPM, remaining: RPM - 1 })
    expect(w1.session).toMatchObject({ used_pct: 6, remaining_pct: 94, request_pct: 6 })
    expect(w1.weekly).toMatchObject({ used_pct: 0.6, remaining_pct: 99.4, request_pct: 0.6 })
    // The window opened at this request's admission: resets_at = start + session_hours (weekly: + 7 days).
    const sessionEnd = expectInstant(w1.session.resets_at, (before + after) / 2 + 5 * HOUR_MS, after - before + 1_000)
    const weeklyEnd = expectInstant(w1.weekly.resets_at, (before + after) / 2 + WEEK_MS, after - before + 1_000)
    expect(weeklyEnd - sessionEnd).toBe(WEEK_MS - 5 * HOUR_MS)
    expect(w1.session.resets_in_seconds).toBeGreaterThan(5 * 3600 - 5)
    expect(w1.session.resets_in_seconds).toBeLessThanOrEqual(5 * 3600)
    expect(w1.weekly.resets_in_seconds).toBeGreaterThan(7 * 86400 - 5)
    expect(w1.weekly.resets_in_seconds).toBeLessThanOrEqual(7 * 86400)
    expect(headerFigures(r1)).toEqual(headersOfReceipt(w1))
    expect(Number(r1.headers.get("x-ratelimit-reset-requests"))).toBe(60)
    // The engine agrees (absolute figures never leave it).
    const s1 = await standing(gw, a)
    expect([s1.session.used, s1.weekly.used]).toEqual([600, 600])

    // 2. non-streaming, 37 + 11×2 = 59 -> 659 in total
    const r2 = await chat(gw, a, { model: "ws-r", messages: [user("hello again")] })
    expect(r2.status).toBe(200)
    const w2 = ((await r2.json()) as any).wellspring
    expect(w2.rpm).toEqual({ limit: RPM, remaining: RPM - 2 })
    expect(w2.session).toEqual({
      used_pct: 6.59,
      remaining_pct: 93.41,
      resets_at: w1.session.resets_at,
      resets_in_seconds: w2.session.resets_in_seconds,
      request_pct: 0.59
    })
    expect(w2.weekly).toEqual({
      used_pct: 0.66,
      remaining_pct: 99.34,
      resets_at: w1.weekly.resets_at,
      resets_in_seconds: w2.weekly.resets_in_seconds,
      request_pct: 0.06
    })
    expect(headerFigures(r2)).toEqual(headersOfReceipt(w2))
    const reset2 = Number(r2.headers.get("x-ratelimit-reset-requests"))
    expect(reset2).toBeGreaterThanOrEqual(58)
    expect(reset2).toBeLessThanOrEqual(60)

    // 3. streaming: headers at reservation time (659 + the input estimate), the last frame exact (659 + 250)
    const reserved = 659 + estimateOf("hello")
    const r3 = await chat(gw, a, { model: "ws-r", messages: [user("hello")], stream: true })
    expect(r3.status).toBe(200)
    expect(headerFigures(r3)).toMatchObject({
      limit: String(RPM),
      remaining: String(RPM - 3),
      sessionUsed: String(pct(reserved, SESSION_LIMIT)),
      sessionRemaining: String(round2(100 - pct(reserved, SESSION_LIMIT))),
      weeklyUsed: String(pct(reserved, WEEKLY_LIMIT)),
      weeklyRemaining: String(round2(100 - pct(reserved, WEEKLY_LIMIT)))
    })
    const { text, error } = await readBody(r3)
    expect(error).toBeNull()
    const sse = parseSse(text)
    expect(sse.doneLast).toBe(true)
    const last = sse.chunks[sse.chunks.length - 1]
    expect(last.choices[0].finish_reason).toBe("stop")
    expect(last.usage).toEqual({ prompt_tokens: 50, completion_tokens: 100, total_tokens: 150 })
    // Only the last frame carries the receipt.
    expect(sse.chunks.slice(0, -1).some((c) => "wellspring" in c)).toBe(false)
    const w3 = last.wellspring
    expect(w3.request_id).toBe(r3.headers.get("x-request-id"))
    expect(w3.rpm).toEqual({ limit: RPM, remaining: RPM - 3 })
    expect(w3.session).toMatchObject({ used_pct: 9.09, remaining_pct: 90.91, request_pct: 2.5, resets_at: w1.session.resets_at })
    expect(w3.weekly).toMatchObject({ used_pct: 0.91, remaining_pct: 99.09, request_pct: 0.25, resets_at: w1.weekly.resets_at })
    // The headers were the reservation, not the final charge.
    expect(r3.headers.get("x-session-used-pct")).not.toBe(String(w3.session.used_pct))
    const s3 = await standing(gw, a)
    expect([s3.session.used, s3.weekly.used]).toEqual([909, 909])
  })

  it("community plan (show_request_pct off): no request_pct in either receipt; the same exact figures", async () => {
    const { gw } = q
    const c = await account(gw, "community")
    mock.script(completion(100, 250), streamed(10, 20))
    const r1 = await chat(gw, c, { model: "ws-r", messages: [user("hello")] })
    expect(r1.status).toBe(200)
    const w1 = ((await r1.json()) as any).wellspring
    expect(Object.keys(w1.session).sort()).toEqual(POOL_KEYS)
    expect(Object.keys(w1.weekly).sort()).toEqual(POOL_KEYS)
    expect(w1.session).toMatchObject({ used_pct: 6, remaining_pct: 94 })
    expect(w1.weekly).toMatchObject({ used_pct: 0.6, remaining_pct: 99.4 })
    expect(w1.rpm).toEqual({ limit: RPM, remaining: RPM - 1 })
    expect(headerFigures(r1)).toEqual(headersOfReceipt(w1))

    const r2 = await chat(gw, c, { model: "ws-r", messages: [user("hello")], stream: true })
    const sse = parseSse((await readBody(r2)).text)
    const w2 = sse.chunks[sse.chunks.length - 1].wellspring
    // 600 + 10 + 20×2 = 650
    expect(w2.session).toEqual({
      used_pct: 6.5,
      remaining_pct: 93.5,
      resets_at: w1.session.resets_at,
      resets_in_seconds: w2.session.resets_in_seconds
    })
    expect(Object.keys(w2.weekly).sort()).toEqual(POOL_KEYS)
    expect(w2.rpm).toEqual({ limit: RPM, remaining: RPM - 2 })
  })
})
