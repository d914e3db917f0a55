/**
 * Admission rejections over HTTP with the real engine, in both modes (spec: chat errors 429/529; issue [3/4]
 * §2): rate_limited with Retry-After; session_exhausted and weekly_exhausted with `resets_at` and Retry-After;
 * model_quota_exceeded resetting at 09:00 KST (00:00 UTC); abuse_cooldown across every model; 529
 * model_overloaded whose message and Retry-After agree, with the slot coming back when the holder ends or
 * disconnects. A request rejected by a later check consumes nothing from the earlier ones.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Behaviour, Chunks, type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"
import { eventually, HANGUL, readBody } from "../inference/helpers.js"
import {
  account,
  addQuotaModel,
  chat,
  currentRpm,
  dailyUsage,
  expectInstant,
  MODES,
  postgresUp,
  type QuotaGateway,
  quotaConfig,
  rejection,
  standing,
  startQuotaGateway,
  user,
  WEEK_MS,
  withoutCountdowns
} from "./helpers.js"

const DAY_MS = 86_400_000
const nextUtcMidnight = (now: number) => (Math.floor(now / DAY_MS) + 1) * DAY_MS

const completion = (prompt: number, completionTokens: number) =>
  Behaviour.json(Chunks.completion({ content: "answer", usage: { prompt, completion: completionTokens } }))
const hi = [user("hello")]

/** Asserts a 429/529 envelope; returns it. */
const expectRejected = async (res: Response, status: number, code: string, type: string) => {
  const r = await rejection(res)
  expect({ status: r.status, code: r.code, type: r.type }, r.text).toEqual({ status, code, type })
  expect(r.body.error.message).toMatch(HANGUL)
  return r
}

describe.skipIf(!postgresUp).each(MODES)("admission rejections over HTTP (%s admission)", (mode) => {
  let q: QuotaGateway
  let mock: MockUpstream

  beforeAll(async () => {
    mock = await startMockUpstream()
    q = await startQuotaGateway(mode, (doc) => {
      quotaConfig(doc)
      addQuotaModel(doc, { id: "ws-rpm2", rpm: 2, baseUrl: mock.url })
      addQuotaModel(doc, { id: "ws-open", rpm: 1_000, baseUrl: mock.url })
      addQuotaModel(doc, { id: "ws-pool", rpm: 2, baseUrl: mock.url })
      addQuotaModel(doc, { id: "ws-capped", rpm: 2, daily_cap: 500, baseUrl: mock.url })
      addQuotaModel(doc, { id: "ws-single", rpm: 2, concurrency: 1, baseUrl: mock.url })
      addQuotaModel(doc, { id: "ws-live", rpm: 1, baseUrl: mock.url })
      doc.catalog_reload_seconds = 0.2
    }, "rejections")
  })
  afterAll(async () => {
    await q?.stop()
    await mock?.close()
  })

  it("rate_limited: the third request in 60 s on an rpm-2 model is 429 with Retry-After; other models and accounts are unaffected", async () => {
    const { gw } = q
    const a = await account(gw)
    mock.script(completion(3, 1))
    for (const remaining of [1, 0]) {
      const ok = await chat(gw, a, { model: "ws-rpm2", messages: hi })
      expect(ok.status).toBe(200)
      expect(((await ok.json()) as any).wellspring.rpm).toEqual({ limit: 2, remaining })
    }
    const before = await standing(gw, a)
    const r = await expectRejected(await chat(gw, a, { model: "ws-rpm2", messages: hi }), 429, "rate_limited", "rate_limit_error")
    expect(r.retryAfter).toBeGreaterThanOrEqual(55)
    expect(r.retryAfter).toBeLessThanOrEqual(60)
    expect(r.body.error.resets_at).toBeUndefined()
    // The rejection reserved nothing.
    expect(withoutCountdowns(await standing(gw, a))).toEqual(withoutCountdowns(before))
    // RPM is per account and model.
    expect((await chat(gw, a, { model: "ws-open", messages: hi })).status).toBe(200)
    expect((await chat(gw, await account(gw), { model: "ws-rpm2", messages: hi })).status).toBe(200)
  })

  it("the RPM limit is the live rate_limit_rpm: a catalog edit applies to the next request", async () => {
    const { gw } = q
    const a = await account(gw)
    mock.script(completion(3, 1))
    expect((await chat(gw, a, { model: "ws-live", messages: hi })).status).toBe(200)
    await expectRejected(await chat(gw, a, { model: "ws-live", messages: hi }), 429, "rate_limited", "rate_limit_error")
    gw.rewriteConfig((doc) => {
      doc.catalog.models.find((m: any) => m.id === "ws-live").rate_limit_rpm = 3
    })
    let res: Response | undefined
    await eventually(async () => {
      res = await chat(gw, a, { model: "ws-live", messages: hi })
      await res.clone().text()
      expect(res.status).toBe(200)
    })
    expect(res!.headers.get("x-ratelimit-limit-requests")).toBe("3")
    expect(res!.headers.get("x-ratelimit-remaining-requests")).toBe("1")
  })

  it("session_exhausted: 429 with the window's resets_at and Retry-After; the rejections consume no RPM", async () => {
    const { gw } = q
    const a = await account(gw, "tiny_session")
    // 600 + 300×2 = 1200 weighted >= the 1000 session limit: admitted (used < limit), then overrun.
    mock.script(completion(600, 300))
    const first = await chat(gw, a, { model: "ws-pool", messages: hi })
    expect(first.status).toBe(200)
    const receipt = ((await first.json()) as any).wellspring
    expect(receipt.session.used_pct).toBe(100)
    expect(receipt.session.remaining_pct).toBe(0)
    const rpmBefore = await currentRpm(gw, a)
    expect(rpmBefore).toBe(1)
    // rpm is 2 on this model: if a rejection took an RPM slot, the third attempt would be rate_limited.
    for (let i = 0; i < 3; i++) {
      const r = await expectRejected(await chat(gw, a, { model: "ws-pool", messages: hi }), 429, "session_exhausted", "quota_exceeded")
      expect(r.body.error.resets_at).toBe(receipt.session.resets_at)
      const wait = (Date.parse(r.body.error.resets_at) - Date.now()) / 1000
      expect(Math.abs(r.retryAfter! - wait)).toBeLessThanOrEqual(2)
      expect(r.retryAfter).toBeGreaterThan(5 * 3600 - 10)
    }
    expect(await currentRpm(gw, a)).toBe(rpmBefore)
    const s = await standing(gw, a)
    expect(s.session.used).toBe(1200)
    // Every model is refused: the pool is per account.
    await expectRejected(await chat(gw, a, { model: "ws-open", messages: hi }), 429, "session_exhausted", "quota_exceeded")
  })

  it("weekly_exhausted: 429 with the weekly resets_at (anchor + 7 days) and Retry-After", async () => {
    const { gw } = q
    const a = await account(gw, "tiny_weekly")
    mock.script(completion(600, 300))
    const before = Date.now()
    const first = await chat(gw, a, { model: "ws-pool", messages: hi })
    expect(first.status).toBe(200)
    const receipt = ((await first.json()) as any).wellspring
    expect(receipt.weekly.used_pct).toBe(100)
    expect(receipt.session.used_pct).toBe(0.12)
    for (let i = 0; i < 2; i++) {
      const r = await expectRejected(await chat(gw, a, { model: "ws-pool", messages: hi }), 429, "weekly_exhausted", "quota_exceeded")
      expect(r.body.error.resets_at).toBe(receipt.weekly.resets_at)
      expectInstant(r.body.error.resets_at, before + WEEK_MS, 5_000)
      expect(r.retryAfter).toBeGreaterThan(7 * 86400 - 10)
    }
    expect(await currentRpm(gw, a)).toBe(1)
    expect((await standing(gw, a)).weekly.used).toBe(1200)
  })

  it("model_quota_exceeded: the shared daily cap refuses every account until the next 00:00 UTC (09:00 KST)", async () => {
    const { gw } = q
    const a = await account(gw)
    const b = await account(gw)
    // raw tokens 300 + 300 = 600 >= cap 500
    mock.script(completion(300, 300))
    expect((await chat(gw, a, { model: "ws-capped", messages: hi })).status).toBe(200)
    expect(await dailyUsage(gw, "ws-capped")).toBe(600)
    const sessionBefore = await standing(gw, b)
    for (const who of [b, a, b]) {
      const r = await expectRejected(await chat(gw, who, { model: "ws-capped", messages: hi }), 429, "model_quota_exceeded", "quota_exceeded")
      const reset = nextUtcMidnight(Date.now())
      expect(Date.parse(r.body.error.resets_at)).toBe(reset)
      expect(new Date(reset).getUTCHours()).toBe(0) // = 09:00 in Asia/Seoul (UTC+9, no DST)
      expect(Math.abs(r.retryAfter! - (reset - Date.now()) / 1000)).toBeLessThanOrEqual(2)
    }
    // Rejected by the 5th check: no RPM slot (rpm is 2; b made 2 attempts and a 1 after its success), no pool.
    expect(await currentRpm(gw, b)).toBe(0)
    expect(await currentRpm(gw, a)).toBe(1)
    expect(await standing(gw, b)).toEqual(sessionBefore)
    expect(await dailyUsage(gw, "ws-capped")).toBe(600)
    // Other models are unaffected.
    expect((await chat(gw, b, { model: "ws-open", messages: hi })).status).toBe(200)
  })

  it("model_overloaded: 529 while a stream holds the only slot; message and Retry-After agree; the slot returns on disconnect and on completion", async () => {
    const { gw } = q
    const a = await account(gw)
    const b = await account(gw)
    mock.script(Behaviour.hangAfter([Chunks.role(), Chunks.content("holding the slot")]))
    const holder = new AbortController()
    const held = await chat(gw, a, { model: "ws-single", messages: hi, stream: true }, { signal: holder.signal })
    expect(held.status).toBe(200)
    const reader = held.body!.getReader()
    await reader.read()

    const sessionBefore = await standing(gw, b)
    // rpm is 2 on this model: two 529s for b, then a success, prove the 529s took no RPM slot.
    for (const who of [b, b, a]) {
      const r = await expectRejected(await chat(gw, who, { model: "ws-single", messages: hi }), 529, "model_overloaded", "overloaded_error")
      const seconds = r.body.error.message.match(/(\d+)\s*초/)
      expect(seconds, r.body.error.message).not.toBeNull()
      expect(r.retryAfter).toBe(Number(seconds![1]))
      expect(r.retryAfter).toBeGreaterThan(0)
    }
    expect(await standing(gw, b)).toEqual(sessionBefore)
    expect(await currentRpm(gw, b)).toBe(0)

    // The client goes away: the slot comes back.
    holder.abort()
    await mock.waitForClientAborts(1)
    mock.script(completion(3, 1))
    await eventually(async () => {
      const res = await chat(gw, b, { model: "ws-single", messages: hi })
      await res.text()
      expect(res.status).toBe(200)
    })

    // A slow non-streaming answer holds the slot until it completes, then gives it back.
    mock.script(Behaviour.json(Chunks.completion({ content: "slow", usage: { prompt: 3, completion: 1 } }), { delayMs: 400 }), completion(3, 1))
    const seen = mock.requests.length
    const slow = chat(gw, a, { model: "ws-single", messages: hi })
    await eventually(() => expect(mock.requests.length).toBe(seen + 1))
    await expectRejected(await chat(gw, b, { model: "ws-single", messages: hi }), 529, "model_overloaded", "overloaded_error")
    expect((await slow).status).toBe(200)
    const next = await chat(gw, b, { model: "ws-single", messages: hi })
    expect(next.status).toBe(200)
    await readBody(next)
  })
})

describe.skipIf(!postgresUp).each(MODES)("abuse cooldown over HTTP (%s admission)", (mode) => {
  let q: QuotaGateway
  let mock: MockUpstream
  const COOLDOWN = 60

  beforeAll(async () => {
    mock = await startMockUpstream()
    q = await startQuotaGateway(mode, (doc) => {
      quotaConfig(doc, { burst: 3, window_seconds: 10, cooldown_seconds: COOLDOWN })
      for (const id of ["ws-a", "ws-b", "ws-c"]) addQuotaModel(doc, { id, rpm: 1_000, baseUrl: mock.url })
      addQuotaModel(doc, { id: "ws-rpm1", rpm: 1, baseUrl: mock.url })
    }, "abuse")
    mock.script(completion(3, 1))
  })
  afterAll(async () => {
    await q?.stop()
    await mock?.close()
  })

  it("burst 3 in 10 s: the 4th admission starts the cooldown; every model rejects until resets_at; rejected attempts do not count", async () => {
    const { gw } = q
    const a = await account(gw)
    expect((await chat(gw, a, { model: "ws-rpm1", messages: hi })).status).toBe(200)
    // Rate-limited attempts are rejections: they add nothing to the burst window.
    for (let i = 0; i < 3; i++) {
      await expectRejected(await chat(gw, a, { model: "ws-rpm1", messages: hi }), 429, "rate_limited", "rate_limit_error")
    }
    expect((await chat(gw, a, { model: "ws-a", messages: hi })).status).toBe(200)
    expect((await chat(gw, a, { model: "ws-b", messages: hi })).status).toBe(200)
    const before = await standing(gw, a)

    const started = Date.now()
    const first = await expectRejected(await chat(gw, a, { model: "ws-c", messages: hi }), 429, "abuse_cooldown", "rate_limit_error")
    const resetsAt = expectInstant(first.body.error.resets_at, started + COOLDOWN * 1000, 3_000)
    expect(Math.abs(first.retryAfter! - (resetsAt - Date.now()) / 1000)).toBeLessThanOrEqual(2)
    for (const model of ["ws-a", "ws-b", "ws-c", "ws-rpm1"]) {
      const r = await expectRejected(await chat(gw, a, { model, messages: hi }), 429, "abuse_cooldown", "rate_limit_error")
      expect(r.body.error.resets_at).toBe(first.body.error.resets_at)
      expect(r.retryAfter).toBeGreaterThan(COOLDOWN - 5)
    }
    // Nothing reserved by the rejections; other accounts are not affected.
    expect(withoutCountdowns(await standing(gw, a))).toEqual(withoutCountdowns(before))
    expect((await chat(gw, await account(gw), { model: "ws-c", messages: hi })).status).toBe(200)

    // The cooldown survives a restart (in Redis mode even with Redis' keys lost: rebuilt from PostgreSQL).
    const again = await q.restart({ loseRedis: true })
    const r = await expectRejected(await chat(again, a, { model: "ws-a", messages: hi }), 429, "abuse_cooldown", "rate_limit_error")
    expect(r.body.error.resets_at).toBe(first.body.error.resets_at)
  })
})
