/**
 * The account-state transitions without actors or an Effect runtime: plain state, an explicit `now`.
 * Table-driven around every edge: window ends, the 09:00 KST (00:00 UTC) daily reset, RPM and abuse windows,
 * cooldown end, settle after a roll-over.
 */
import { describe, expect, it } from "vitest"
import { dayIndex, dayLabel, nextDailyReset } from "../../src/quota/Policy.js"
import {
  type AbuseRule,
  type AccountState,
  admit,
  type AdmitDecision,
  type AdmitRequest,
  copyAccount,
  dailyUsage,
  emptyAccount,
  type GateState,
  isIdle,
  pruneUpTo,
  rollDay,
  rollWindows,
  rpmCount,
  settle,
  standingOf
} from "../../src/quota/Transitions.js"
import { DAY, HOUR, model, plan, T0 } from "./fixtures.js"

const MIN = 60_000
const WEEK = 7 * DAY
const LAX: AbuseRule = { burst: 1_000_000, windowMs: 10_000, cooldownMs: 60_000 }

const account = (over: Partial<AccountState> = {}): AccountState => ({ ...emptyAccount(), ...over })
const gateAt = (now: number, over: Partial<GateState> = {}): GateState => ({
  inFlight: 0,
  day: dayIndex(now),
  tokens: 0,
  ...over
})
const request = (over: Partial<AdmitRequest> = {}): AdmitRequest => ({
  model: model({ id: "m" }),
  plan: plan({ session_limit: 1000, weekly_limit: 5000, session_hours: 5 }),
  estimatedInputTokens: 10,
  byok: false,
  ...over
})

/** The decision's code: "admitted" or the rejection's code and its time or wait. */
const outcome = (d: AdmitDecision) =>
  d._tag === "Admitted" ? "admitted" : d.rejection.code

const rejectionOf = (d: AdmitDecision) => {
  if (d._tag !== "Rejected") throw new Error(`expected a rejection, got ${JSON.stringify(d)}`)
  return d.rejection
}

describe("quota day: 09:00 KST = 00:00 UTC", () => {
  const cases: ReadonlyArray<readonly [string, number, string, number]> = [
    ["08:59:59.999 KST on Jan 6 is still Jan 5's quota day", Date.UTC(2026, 0, 5, 23, 59, 59, 999), "2026-01-05", Date.UTC(2026, 0, 6)],
    ["09:00:00.000 KST on Jan 6 starts Jan 6's quota day", Date.UTC(2026, 0, 6, 0, 0, 0, 0), "2026-01-06", Date.UTC(2026, 0, 7)],
    ["00:00 KST (15:00 UTC) is mid quota day", Date.UTC(2026, 0, 5, 15, 0, 0), "2026-01-05", Date.UTC(2026, 0, 6)],
    ["23:59 KST is mid quota day too", Date.UTC(2026, 0, 5, 14, 59, 0), "2026-01-05", Date.UTC(2026, 0, 6)],
    ["year boundary: 09:00 KST Jan 1", Date.UTC(2027, 0, 1, 0, 0, 0), "2027-01-01", Date.UTC(2027, 0, 2)]
  ]
  it.each(cases)("%s", (_, now, label, next) => {
    expect(dayLabel(dayIndex(now))).toBe(label)
    expect(nextDailyReset(now)).toBe(next)
  })

  it("a gate's total resets exactly at the boundary and reports the day it left", () => {
    const before = Date.UTC(2026, 0, 5, 23, 59, 59, 999)
    const gate = gateAt(before, { tokens: 700, inFlight: 2 })
    expect(rollDay(gate, before)).toBeUndefined()
    expect(dailyUsage(gate, before)).toBe(700)
    const at = before + 1
    expect(dailyUsage(gate, at)).toBe(0) // reading does not need the roll
    expect(rollDay(gate, at)).toEqual({ day: dayIndex(before), tokens: 700 })
    expect(gate).toEqual({ day: dayIndex(at), tokens: 0, inFlight: 2 }) // slots are not per day
    expect(rollDay(gate, at + HOUR)).toBeUndefined()
  })
})

describe("admit: each check at its edge", () => {
  const m = model({ id: "m", rate_limit_rpm: 2, daily_cap: 100, concurrency: 1 })
  const p = plan({ session_limit: 1000, weekly_limit: 5000, session_hours: 5 })
  const req = request({ model: m, plan: p })
  const midnightUtc = Date.UTC(2026, 0, 6) // 09:00 KST

  interface Case {
    readonly name: string
    readonly state: () => AccountState
    readonly gate?: (now: number) => GateState
    readonly now: number
    readonly abuse?: AbuseRule
    readonly expected: string
    /** resetsAt or retryAfter of the rejection. */
    readonly at?: number
  }
  const cases: ReadonlyArray<Case> = [
    // session window: ends at start + session_hours
    { name: "session full, 1 ms before its end", state: () => account({ sessionStart: T0, sessionUsed: 1000 }), now: T0 + 5 * HOUR - 1, expected: "session_exhausted", at: T0 + 5 * HOUR },
    { name: "session full, at its end: a new window", state: () => account({ sessionStart: T0, sessionUsed: 1000 }), now: T0 + 5 * HOUR, expected: "admitted" },
    { name: "session at limit − 1: admitted (may overrun)", state: () => account({ sessionStart: T0, sessionUsed: 999 }), now: T0 + HOUR, expected: "admitted" },
    // weekly window: ends 7 days after its anchor
    { name: "weekly full, 1 ms before its end", state: () => account({ weeklyAnchor: T0, weeklyUsed: 5000 }), now: T0 + WEEK - 1, expected: "weekly_exhausted", at: T0 + WEEK },
    { name: "weekly full, at its end", state: () => account({ weeklyAnchor: T0, weeklyUsed: 5000 }), now: T0 + WEEK, expected: "admitted" },
    // daily cap: the next 09:00 KST
    { name: "daily cap reached at 08:59:59.999 KST", state: account, gate: (now) => gateAt(now, { tokens: 100 }), now: midnightUtc - 1, expected: "model_quota_exceeded", at: midnightUtc },
    { name: "daily cap reached, rolled at 09:00 KST", state: account, gate: (now) => { const g = gateAt(now - 1, { tokens: 100 }); rollDay(g, now); return g }, now: midnightUtc, expected: "admitted" },
    { name: "daily cap one token short", state: account, gate: (now) => gateAt(now, { tokens: 99 }), now: T0, expected: "admitted" },
    // in-flight
    { name: "in-flight at the concurrency", state: account, gate: (now) => gateAt(now, { inFlight: 1 }), now: T0, expected: "model_overloaded" },
    // RPM: sliding 60 s per model, entry at t leaves at t + 60 s
    { name: "RPM full, 1 ms before the oldest leaves", state: () => account({ rpm: new Map([["m", [T0, T0 + 10_000]]]) }), now: T0 + MIN - 1, expected: "rate_limited", at: 1 },
    { name: "RPM full, retry counts to the oldest entry", state: () => account({ rpm: new Map([["m", [T0, T0 + 10_000]]]) }), now: T0 + 20_000, expected: "rate_limited", at: 40 },
    { name: "RPM full, the oldest leaves at exactly 60 s", state: () => account({ rpm: new Map([["m", [T0, T0 + 10_000]]]) }), now: T0 + MIN, expected: "admitted" },
    { name: "RPM of another model does not count", state: () => account({ rpm: new Map([["other", [T0, T0 + 1]]]) }), now: T0 + 2, expected: "admitted" },
    // abuse cooldown: blocks until cooldownUntil
    { name: "cooldown, 1 ms before its end", state: () => account({ cooldownUntil: T0 + MIN }), now: T0 + MIN - 1, expected: "abuse_cooldown", at: T0 + MIN },
    { name: "cooldown, at its end", state: () => account({ cooldownUntil: T0 + MIN }), now: T0 + MIN, expected: "admitted" },
    // abuse burst: the attempt after `burst` admissions within the window starts the cooldown
    { name: "burst reached within the window: cooldown starts now", state: () => account({ abuse: [T0, T0 + 1_000, T0 + 2_000] }), now: T0 + 9_999, abuse: { burst: 3, windowMs: 10_000, cooldownMs: MIN }, expected: "abuse_cooldown", at: T0 + 9_999 + MIN },
    { name: "burst: the first entry left the window at exactly window_seconds", state: () => account({ abuse: [T0, T0 + 1_000, T0 + 2_000] }), now: T0 + 10_000, abuse: { burst: 3, windowMs: 10_000, cooldownMs: MIN }, expected: "admitted" },
    // order: the first failing check wins
    { name: "order: cooldown before a full RPM window", state: () => account({ cooldownUntil: T0 + 5, rpm: new Map([["m", [T0, T0]]]) }), now: T0 + 1, expected: "abuse_cooldown", at: T0 + 5 },
    { name: "order: RPM before session", state: () => account({ sessionStart: T0, sessionUsed: 1000, rpm: new Map([["m", [T0, T0]]]) }), now: T0 + 1, expected: "rate_limited", at: 60 },
    { name: "order: session before weekly", state: () => account({ sessionStart: T0, sessionUsed: 1000, weeklyAnchor: T0, weeklyUsed: 5000 }), now: T0 + 1, expected: "session_exhausted", at: T0 + 5 * HOUR },
    { name: "order: weekly before the daily cap", state: () => account({ weeklyAnchor: T0, weeklyUsed: 5000 }), gate: (now) => gateAt(now, { tokens: 100 }), now: T0 + 1, expected: "weekly_exhausted", at: T0 + WEEK },
    { name: "order: daily cap before in-flight", state: account, gate: (now) => gateAt(now, { tokens: 100, inFlight: 1 }), now: T0, expected: "model_quota_exceeded", at: midnightUtc }
  ]

  it.each(cases)("$name", (c) => {
    const s = c.state()
    const gate = c.gate?.(c.now) ?? gateAt(c.now)
    const d = admit(s, gate, req, c.abuse ?? LAX, c.now)
    expect(outcome(d)).toBe(c.expected)
    if (c.at !== undefined) {
      const r = rejectionOf(d)
      expect("resetsAt" in r ? r.resetsAt : "retryAfter" in r ? r.retryAfter : undefined).toBe(c.at)
    }
  })

  it.each(cases.filter((c) => c.expected !== "admitted" && c.abuse === undefined))(
    "a rejection writes nothing: $name",
    (c) => {
      const s = c.state()
      const gate = c.gate?.(c.now) ?? gateAt(c.now)
      const before = { s: copyAccount(s), gate: { ...gate } }
      admit(s, gate, req, c.abuse ?? LAX, c.now)
      // windows may be pruned of entries already outside them, nothing else changes
      expect(s.sessionUsed).toBe(before.s.sessionUsed)
      expect(s.weeklyUsed).toBe(before.s.weeklyUsed)
      expect(s.cooldownUntil).toBe(before.s.cooldownUntil)
      expect(s.abuse.length).toBeLessThanOrEqual(before.s.abuse.length)
      expect(s.rpm.get("m")?.length ?? 0).toBeLessThanOrEqual(before.s.rpm.get("m")?.length ?? 0)
      expect(gate).toEqual(before.gate)
    }
  )

  it("the rejection that starts a cooldown clears the burst window", () => {
    const s = account({ abuse: [T0, T0 + 1, T0 + 2] })
    const d = admit(s, gateAt(T0), req, { burst: 3, windowMs: 10_000, cooldownMs: MIN }, T0 + 3)
    expect(rejectionOf(d)).toEqual({ code: "abuse_cooldown", resetsAt: T0 + 3 + MIN })
    expect(s.cooldownUntil).toBe(T0 + 3 + MIN)
    expect(s.abuse).toEqual([])
  })
})

describe("admit: what an admission commits", () => {
  it("starts both windows at the first request and reserves input × weights.input (raw on the gate)", () => {
    const s = emptyAccount()
    const gate = gateAt(T0)
    const m = model({ id: "m", weights: { input: 2, output: 5 }, rate_limit_rpm: 10 })
    const d = admit(s, gate, request({ model: m, estimatedInputTokens: 99.2 }), LAX, T0)
    expect(d).toEqual({
      _tag: "Admitted",
      reserveWeighted: 200,
      reserveRaw: 100,
      sessionStart: T0,
      weeklyAnchor: T0,
      day: dayIndex(T0),
      rpmCount: 1,
      rpmOldest: T0
    })
    expect(s).toMatchObject({ sessionStart: T0, sessionUsed: 200, weeklyAnchor: T0, weeklyUsed: 200, abuse: [T0] })
    expect(s.rpm.get("m")).toEqual([T0])
    expect(gate).toEqual({ day: dayIndex(T0), tokens: 100, inFlight: 1 })
  })

  it("a later request joins the open windows", () => {
    const s = account({ sessionStart: T0, sessionUsed: 50, weeklyAnchor: T0 - DAY, weeklyUsed: 500 })
    const d = admit(s, gateAt(T0), request(), LAX, T0 + HOUR)
    expect(d).toMatchObject({ sessionStart: T0, weeklyAnchor: T0 - DAY, reserveWeighted: 10 })
    expect(s).toMatchObject({ sessionUsed: 60, weeklyUsed: 510 })
  })

  it("BYOK counts for abuse and RPM only: no windows, no gate, no slot", () => {
    const s = emptyAccount()
    const d = admit(s, undefined, request({ byok: true, estimatedInputTokens: 5000 }), LAX, T0)
    expect(d).toMatchObject({ _tag: "Admitted", reserveWeighted: 0, reserveRaw: 0, sessionStart: null, weeklyAnchor: null })
    expect(s).toMatchObject({ sessionStart: null, sessionUsed: 0, weeklyAnchor: null, abuse: [T0] })
    expect(s.rpm.get("m")).toEqual([T0])
    // pools exhausted do not matter to BYOK
    const full = account({ sessionStart: T0, sessionUsed: 1e9, weeklyAnchor: T0, weeklyUsed: 1e9 })
    expect(outcome(admit(full, undefined, request({ byok: true }), LAX, T0 + 1))).toBe("admitted")
  })

  it("a pooled admission without its gate is a defect, not a silent BYOK", () => {
    expect(() => admit(emptyAccount(), undefined, request(), LAX, T0)).toThrow(/gate/)
  })
})

describe("settle and refund", () => {
  const admitted = (s: AccountState, gate: GateState, estimate: number, now: number) => {
    const d = admit(s, gate, request({ estimatedInputTokens: estimate }), LAX, now)
    if (d._tag !== "Admitted") throw new Error("not admitted")
    return d
  }

  const cases: ReadonlyArray<{
    readonly name: string
    /** Time of the settle, relative to the admission at T0. */
    readonly after: number
    readonly weighted: number
    readonly raw: number
    readonly session: number
    readonly weekly: number
    readonly daily: number
  }> = [
    // the second request (10) is in every figure; the first reserved 100 weighted / 100 raw
    { name: "settle replaces the reservation", after: 1_000, weighted: 130, raw: 70, session: 140, weekly: 140, daily: 80 },
    { name: "refund gives it back", after: 1_000, weighted: 0, raw: 0, session: 10, weekly: 10, daily: 10 },
    { name: "1 ms before the session ends: still its window", after: 5 * HOUR - 1, weighted: 130, raw: 70, session: 140, weekly: 140, daily: 80 },
    // the session rolled (the second request opened a new window): the old reservation leaves it alone
    { name: "after the session rolled over", after: 5 * HOUR, weighted: 130, raw: 70, session: 10, weekly: 140, daily: 80 },
    // the quota day rolled at 09:00 KST: the new day's total is left alone
    { name: "after the quota day rolled over", after: Date.UTC(2026, 0, 6) - T0, weighted: 130, raw: 70, session: 10, weekly: 140, daily: 10 }
  ]

  it.each(cases)("$name", (c) => {
    const s = emptyAccount()
    const gate = gateAt(T0)
    const r = admitted(s, gate, 100, T0)
    const at = T0 + c.after
    // another request at `at` (rolls whatever has ended), then the settle of the first
    rollDay(gate, at)
    admitted(s, gate, 10, at)
    settle(s, gate, r, c.weighted, c.raw)
    expect({ session: s.sessionUsed, weekly: s.weeklyUsed, daily: gate.tokens }).toEqual({
      session: c.session,
      weekly: c.weekly,
      daily: c.daily
    })
  })

  it("counters never go below 0", () => {
    const s = account({ sessionStart: T0, sessionUsed: 5, weeklyAnchor: T0, weeklyUsed: 5 })
    const gate = gateAt(T0, { tokens: 3 })
    settle(s, gate, { reserveWeighted: 100, reserveRaw: 100, sessionStart: T0, weeklyAnchor: T0, day: gate.day }, 0, 0)
    expect([s.sessionUsed, s.weeklyUsed, gate.tokens]).toEqual([0, 0, 0])
  })
})

describe("standing, RPM count, idleness", () => {
  it("standing: inactive windows show null and 0; active ones their end", () => {
    const p = plan({ session_limit: 1000, weekly_limit: 5000, session_hours: 5 })
    const s = account({ sessionStart: T0, sessionUsed: 250, weeklyAnchor: T0, weeklyUsed: 250 })
    expect(standingOf(s, p, T0 + HOUR).session).toEqual({
      used: 250,
      limit: 1000,
      used_pct: 25,
      remaining_pct: 75,
      resets_at: T0 + 5 * HOUR,
      resets_in_seconds: 4 * 3600
    })
    const ended = standingOf(s, p, T0 + 5 * HOUR)
    expect(ended.session).toMatchObject({ used: 0, resets_at: null, resets_in_seconds: 0 })
    expect(ended.weekly).toMatchObject({ used: 250, anchor_at: T0, resets_at: T0 + WEEK })
    expect(standingOf(s, p, T0 + WEEK).weekly).toMatchObject({ used: 0, anchor_at: null, resets_at: null })
  })

  it("rollWindows ends exactly the windows whose time is up", () => {
    const p = plan({ session_hours: 5 })
    const s = account({ sessionStart: T0, sessionUsed: 1, weeklyAnchor: T0, weeklyUsed: 1 })
    rollWindows(s, p, T0 + 5 * HOUR - 1)
    expect(s.sessionStart).toBe(T0)
    rollWindows(s, p, T0 + 5 * HOUR)
    expect([s.sessionStart, s.sessionUsed, s.weeklyAnchor]).toEqual([null, 0, T0])
    rollWindows(s, p, T0 + WEEK)
    expect([s.weeklyAnchor, s.weeklyUsed]).toEqual([null, 0])
  })

  it("rpmCount sums models and forgets entries 60 s old", () => {
    const s = account({ rpm: new Map([["a", [T0, T0 + 30_000]], ["b", [T0 + 10_000]]]) })
    expect(rpmCount(s, T0 + MIN - 1)).toBe(3)
    expect(rpmCount(s, T0 + MIN)).toBe(2)
    expect(rpmCount(s, T0 + 90_000)).toBe(0)
    expect(s.rpm.size).toBe(0)
  })

  it("pruneUpTo returns where the window starts; expired entries leave once they are 64 and a quarter of the array", () => {
    const times = Array.from({ length: 400 }, (_, i) => T0 + i)
    expect(pruneUpTo(times, T0 - 1)).toBe(0)
    // 63 expired: fewer than 64, kept.
    expect(pruneUpTo(times, T0 + 62)).toBe(63)
    expect(times).toHaveLength(400)
    // 99 of 400: fewer than a quarter, kept.
    expect(pruneUpTo(times, T0 + 98)).toBe(99)
    expect(times).toHaveLength(400)
    // 100 of 400: dropped at once.
    expect(pruneUpTo(times, T0 + 99)).toBe(0)
    expect(times).toEqual(Array.from({ length: 300 }, (_, i) => T0 + 100 + i))
    // A few expired of a small window stay until all of it has: then the array empties.
    const small = [T0, T0 + 1, T0 + 2]
    expect(pruneUpTo(small, T0)).toBe(1)
    expect(small).toHaveLength(3)
    expect(pruneUpTo(small, T0 + 2)).toBe(0)
    expect(small).toEqual([])
  })

  it("a large RPM window slides exactly, in at most a third more than its size, with expired entries at its front", () => {
    // 300,000 requests, one every 0.5 ms (2,000 a second), under a limit of 150,000 a minute: the window reaches
    // 120,000 entries; every decision sees exactly the admissions of the last 60 s.
    const s = emptyAccount()
    const m = model({ id: "m", rate_limit_rpm: 150_000 })
    const step = 0.5
    let longest = 0
    for (let k = 0; k < 300_000; k++) {
      const now = T0 + k * step
      const d = admit(s, undefined, request({ model: m, byok: true }), LAX, now)
      if (d._tag !== "Admitted") throw new Error(`request ${k} refused`)
      // Admissions in (now - 60 s, now]: this one and the earlier ones less than 60 s old.
      const inWindow = Math.min(k + 1, MIN / step)
      if (d.rpmCount !== inWindow || d.rpmOldest !== now - (inWindow - 1) * step) {
        throw new Error(`request ${k}: ${d.rpmCount} in the window from ${d.rpmOldest}, expected ${inWindow}`)
      }
      longest = Math.max(longest, s.rpm.get("m")!.length)
    }
    expect(longest).toBeLessThanOrEqual(Math.ceil((4 / 3) * (MIN / step)) + 64)
    expect(rpmCount(s, T0 + 300_000 * step)).toBe(MIN / step - 1)
  })

  it("a full window with expired entries at its front refuses with the wait for the entry that must leave", () => {
    const s = emptyAccount()
    const m = model({ id: "m", rate_limit_rpm: 100 })
    // 130 admissions 0.5 s apart from T0.
    const times = Array.from({ length: 130 }, (_, i) => T0 + i * 500)
    s.rpm.set("m", times)
    // 1 ms after the last: the first 10 have left the window (they stay in the array), 120 remain: full.
    const refused = admit(s, undefined, request({ model: m, byok: true }), LAX, T0 + 64_501)
    // One more fits once the entry 100 from the end (T0 + 15 s) leaves, at T0 + 75 s: 10.499 s → 11.
    expect(rejectionOf(refused)).toEqual({ code: "rate_limited", retryAfter: 11 })
    expect(times).toHaveLength(130)
    // 1 ms after that entry left: 31 have left, 99 remain; admitted as the 100th, the oldest being T0 + 15.5 s.
    const d = admit(s, undefined, request({ model: m, byok: true }), LAX, T0 + 75_001)
    expect(d).toMatchObject({ _tag: "Admitted", rpmCount: 100, rpmOldest: T0 + 15_500 })
    expect(times).toHaveLength(131)
    expect(rpmCount(s, T0 + 75_001)).toBe(100)
  })

  it("a wall clock stepped back keeps the windows ascending (the later admission is recorded at the last time)", () => {
    const s = emptyAccount()
    const m = model({ id: "m", rate_limit_rpm: 10 })
    admit(s, undefined, request({ model: m, byok: true }), LAX, T0 + 10_000)
    const d = admit(s, undefined, request({ model: m, byok: true }), LAX, T0 + 5_000)
    expect(d).toMatchObject({ _tag: "Admitted", rpmCount: 2, rpmOldest: T0 + 10_000 })
    expect(s.rpm.get("m")).toEqual([T0 + 10_000, T0 + 10_000])
    expect(s.abuse).toEqual([T0 + 10_000, T0 + 10_000])
    expect(rpmCount(s, T0 + 70_000)).toBe(0)
  })

  it("isIdle only once nothing can affect a decision", () => {
    expect(isIdle(emptyAccount(), T0)).toBe(true)
    expect(isIdle(account({ cooldownUntil: T0 + 1 }), T0)).toBe(false)
    expect(isIdle(account({ cooldownUntil: T0 + 1 }), T0 + 1)).toBe(true)
    expect(isIdle(account({ weeklyAnchor: T0 }), T0 + WEEK - 1)).toBe(false)
    expect(isIdle(account({ weeklyAnchor: T0 }), T0 + WEEK)).toBe(true)
    expect(isIdle(account({ rpm: new Map([["m", [T0]]]) }), T0 + MIN)).toBe(false)
    expect(isIdle(account({ rpm: new Map([["m", [T0]]]) }), T0 + MIN + 1)).toBe(true)
  })

  it("copyAccount validates: non-finite numbers dropped, pools clamped, windows sorted", () => {
    const copy = copyAccount(account({
      sessionStart: Number.NaN,
      sessionUsed: -5,
      weeklyAnchor: T0,
      weeklyUsed: Number.POSITIVE_INFINITY,
      abuse: [3, 1, Number.NaN, 2],
      rpm: new Map([["m", [2, 1]], ["empty", []]])
    }))
    expect(copy).toMatchObject({ sessionStart: null, sessionUsed: 0, weeklyAnchor: T0, weeklyUsed: 0, abuse: [1, 2, 3] })
    expect([...copy.rpm]).toEqual([["m", [1, 2]]])
  })
})
