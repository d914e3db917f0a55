/**
 * Rate-window arithmetic: "at most `max` hits per window, per key", as plain functions over `{ start, current,
 * previous }` with an explicit `now`, and an in-process store of windows bounded in keys. No clock, no errors: the
 * limiter service (`quota/RateLimit.ts`), the failed-request and failed-authentication limits, and the Lua script
 * of the Redis variant (`quota/RateLimitRedis.ts`, held to the same arithmetic by a shared table test) build on it.
 *
 * Two window rules, because two observable behaviours exist and are specified:
 * - `fixed`: a window starts at the first hit after the previous window ended and lasts `windowMs`; `take` counts
 *   a hit only when it is allowed (`count < max`). Account endpoints (`accounts/Limits.ts`, `Admission.limit`).
 * - `sliding`: the sliding-window counter: this window's count plus the previous window's, weighted by the part
 *   of it still inside the sliding window; windows follow each other on a grid from the first hit. Constant
 *   memory per key. Failed requests (`http/FailedRequests.ts`): `record` counts every failure, `retryAfter` asks.
 *
 * A key idle for the window's memory (fixed: one window, sliding: two) is forgotten and its next hit starts a new
 * window; the memory store may sweep such keys at any time, Redis expires them.
 */
export interface RateRule {
  readonly window: "fixed" | "sliding"
  readonly max: number
  readonly windowMs: number
}

export const fixedWindow = (max: number, windowSeconds: number): RateRule => ({
  window: "fixed",
  max,
  windowMs: windowSeconds * 1000
})

export const slidingWindow = (max: number, windowSeconds: number): RateRule => ({
  window: "sliding",
  max,
  windowMs: windowSeconds * 1000
})

/** The answer to `take` (the shape `Admission.limit` has always returned). */
export interface Verdict {
  readonly allowed: boolean
  /** Hits left in the window after this one. */
  readonly remaining: number
  /**
   * fixed: seconds until the window ends (when its count is forgiven); sliding: seconds until a hit would be
   * allowed again (0 while it is).
   */
  readonly reset_seconds: number
}

// ---------------------------------------------------------------------------------------------------------------
// Window arithmetic (plain functions, explicit now)

export interface Window {
  /** Start of the current window (ms). */
  start: number
  current: number
  previous: number
}

/** How long a key is remembered after its window started. */
export const memoryMs = (rule: RateRule): number => rule.window === "fixed" ? rule.windowMs : 2 * rule.windowMs

/** A new window starting at `now`. */
export const openWindow = (now: number): Window => ({ start: now, current: 0, previous: 0 })

/** True when the key has been idle long enough to be forgotten (its next hit opens a new window). */
export const forgotten = (w: Window, rule: RateRule, now: number): boolean => now >= w.start + memoryMs(rule)

/** Moves the window to `now`: fixed restarts at `now` after its end; sliding steps on its grid. */
export const advance = (w: Window, rule: RateRule, now: number): void => {
  if (rule.window === "fixed") {
    if (now >= w.start + rule.windowMs) {
      w.start = now
      w.current = 0
      w.previous = 0
    }
    return
  }
  const elapsed = Math.floor((now - w.start) / rule.windowMs)
  if (elapsed <= 0) return
  w.previous = elapsed === 1 ? w.current : 0
  w.current = 0
  w.start += elapsed * rule.windowMs
}

/** Hits counted against the limit at `now` (the window must be advanced to `now`). */
export const estimate = (w: Window, rule: RateRule, now: number): number =>
  rule.window === "fixed" ? w.current : w.previous * (1 - (now - w.start) / rule.windowMs) + w.current

/** Seconds until a hit would be allowed; 0 when it would be now (the window must be advanced to `now`). */
export const waitSeconds = (w: Window, rule: RateRule, now: number): number => {
  const { max, windowMs } = rule
  if (estimate(w, rule, now) < max) return 0
  if (rule.window === "fixed") return Math.max(0, Math.ceil((w.start + windowMs - now) / 1000))
  // The moment the estimate falls to the limit (it is below it right after): later in this window while the
  // previous window's weight fades, or in the next window while this one's does.
  const until = w.current < max
    ? w.start + windowMs * (1 - (max - w.current) / w.previous)
    : w.start + windowMs + windowMs * (1 - max / w.current)
  return Math.floor((until - now) / 1000) + 1
}

/** Counts a hit if allowed (the window must be advanced to `now`). */
export const takeHit = (w: Window, rule: RateRule, now: number): Verdict => {
  const allowed = estimate(w, rule, now) < rule.max
  if (allowed) w.current++
  return rule.window === "fixed"
    ? {
      allowed,
      remaining: Math.max(0, rule.max - w.current),
      reset_seconds: Math.max(0, Math.ceil((w.start + rule.windowMs - now) / 1000))
    }
    : {
      allowed,
      remaining: Math.max(0, Math.floor(rule.max - estimate(w, rule, now))),
      reset_seconds: waitSeconds(w, rule, now)
    }
}

// ---------------------------------------------------------------------------------------------------------------
// In-process store

export const MAX_TRACKED_KEYS = 100_000

interface Entry extends Window {
  /** When the key is forgotten. */
  until: number
}

/** The in-process windows, clock-free: bounded by `maxKeys` (idle keys swept, then the least recently hit). */
export interface WindowStore {
  readonly take: (key: string | number, rule: RateRule, now: number) => Verdict
  readonly record: (key: string | number, rule: RateRule, now: number) => void
  readonly retryAfter: (key: string | number, rule: RateRule, now: number) => number
  /** Hits counted against the limit at `now` (sliding: the weighted estimate); 0 for an unknown key. */
  readonly count: (key: string | number, rule: RateRule, now: number) => number
  readonly size: () => number
}

export const makeWindowStore = (maxKeys = MAX_TRACKED_KEYS): WindowStore => {
  const windows = new Map<string | number, Entry>()
  let inserts = 0

  const sweep = (now: number) => {
    for (const [key, w] of windows) if (now >= w.until) windows.delete(key)
  }

  const makeRoom = (now: number) => {
    sweep(now)
    // Still full: drop the least recently hit keys (Map order is insertion order; a hit re-inserts its key).
    const excess = windows.size - maxKeys + 1
    if (excess <= 0) return
    let dropped = 0
    for (const key of windows.keys()) {
      if (dropped++ >= Math.max(excess, Math.ceil(maxKeys / 10))) break
      windows.delete(key)
    }
  }

  /** The key's window advanced to `now`, moved to the most recent end; a new one if the key was forgotten. */
  const touch = (key: string | number, rule: RateRule, now: number): Entry => {
    let w = windows.get(key)
    if (w !== undefined) windows.delete(key)
    if (w === undefined || now >= w.until) {
      if (w === undefined) {
        if (windows.size >= maxKeys) makeRoom(now)
        else if (++inserts >= 1024 && inserts >= windows.size) {
          inserts = 0
          sweep(now)
        }
      }
      w = { start: now, current: 0, previous: 0, until: 0 }
    } else {
      advance(w, rule, now)
    }
    w.until = w.start + memoryMs(rule)
    windows.set(key, w)
    return w
  }

  return {
    take: (key, rule, now) => takeHit(touch(key, rule, now), rule, now),
    record: (key, rule, now) => {
      touch(key, rule, now).current++
    },
    retryAfter: (key, rule, now) => {
      const w = windows.get(key)
      if (w === undefined || now >= w.until) return 0
      advance(w, rule, now)
      w.until = w.start + memoryMs(rule)
      return waitSeconds(w, rule, now)
    },
    count: (key, rule, now) => {
      const w = windows.get(key)
      if (w === undefined || now >= w.until) return 0
      advance(w, rule, now)
      w.until = w.start + memoryMs(rule)
      return estimate(w, rule, now)
    },
    size: () => windows.size
  }
}
