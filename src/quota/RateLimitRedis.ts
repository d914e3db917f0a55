/**
 * `RateLimiter` over Redis: the window arithmetic of `runtime/RateWindow.ts` in one Lua script per call, so every replica
 * on the same Redis and key prefix shares the counts. Key: `<prefix>l:<key>`, a hash `s` (window start), `c`
 * (this window's count), `p` (previous window's count, sliding only), expiring when the key is forgotten.
 *
 * The fixed-window `take` is exactly the script `Admission.limit` always ran (writes only an allowed hit).
 */
import { Effect, Layer } from "effect"
import type { Redis } from "ioredis"
import { unavailable } from "../errors/Catalog.js"
import { RedisClient } from "../store/Redis.js"
import * as StoreRedis from "../store/Redis.js"
import type { RateRule, Verdict } from "../runtime/RateWindow.js"
import { RateLimiter } from "./RateLimit.js"

/** One Redis command; no answer is 503 `service_unavailable`. */
const command = <A>(what: string, f: () => Promise<A>) => Effect.mapError(StoreRedis.command(what, f), unavailable)

/**
 * KEYS: 1 window hash. ARGV: 1 now|'' (Redis TIME), 2 op (take | record | wait), 3 rule (fixed | sliding), 4 max,
 * 5 window ms. Returns take: {allowed, remaining, reset seconds}; record: 1; wait: seconds until a hit is allowed.
 */
const WINDOW = `
${StoreRedis.LUA_NOW}local op, sliding, max, win = ARGV[2], ARGV[3] == 'sliding', tonumber(ARGV[4]), tonumber(ARGV[5])
local keep = win
if sliding then keep = 2 * win end
local f = redis.call('HMGET', KEYS[1], 's', 'c', 'p')
local s, c, p = tonumber(f[1]), tonumber(f[2]) or 0, tonumber(f[3]) or 0
if not s or now >= s + keep then
  s = now; c = 0; p = 0
elseif sliding then
  local e = math.floor((now - s) / win)
  if e > 0 then
    if e == 1 then p = c else p = 0 end
    c = 0; s = s + e * win
  end
end
local function estimate()
  if sliding then return p * (1 - (now - s) / win) + c end
  return c
end
local function wait()
  if estimate() < max then return 0 end
  if not sliding then return math.max(0, math.ceil((s + win - now) / 1000)) end
  local untilT
  if c < max then untilT = s + win * (1 - (max - c) / p) else untilT = s + win + win * (1 - max / c) end
  return math.floor((untilT - now) / 1000) + 1
end
local function save()
  if sliding then redis.call('HSET', KEYS[1], 's', s, 'c', c, 'p', p) else redis.call('HSET', KEYS[1], 's', s, 'c', c) end
  redis.call('PEXPIRE', KEYS[1], s + keep - now)
end
if op == 'wait' then return wait() end
if op == 'record' then
  c = c + 1
  save()
  return 1
end
local allowed = 0
if estimate() < max then
  c = c + 1
  allowed = 1
  save()
end
if sliding then return {allowed, math.max(0, math.floor(max - estimate())), wait()} end
return {allowed, math.max(0, max - c), math.max(0, math.ceil((s + win - now) / 1000))}
`

interface Commands {
  wsWindow(key: string, now: string, op: string, rule: string, max: number, windowMs: number): Promise<unknown>
}

export interface RedisLimiterOptions {
  /** Prefix of every key (the admission's prefix: `<prefix>l:<key>`). */
  readonly keyPrefix: string
  /** `redis`: server time (production); `clock`: the Effect clock passes `now` (TestClock in tests). */
  readonly time: "redis" | "clock"
}

export const make = (client: Redis, options: RedisLimiterOptions): RateLimiter["Service"] => {
  if (!("wsWindow" in client)) client.defineCommand("wsWindow", { numberOfKeys: 1, lua: WINDOW })
  const redis = client as Redis & Commands
  const run = <A>(key: string | number, rule: RateRule, op: "take" | "record" | "wait", decode: (r: unknown) => A) =>
    Effect.clockWith((clock) =>
      command("limit", () =>
        redis.wsWindow(
          `${options.keyPrefix}l:${key}`,
          options.time === "clock" ? String(clock.currentTimeMillisUnsafe()) : "",
          op,
          rule.window,
          rule.max,
          rule.windowMs
        )).pipe(Effect.map(decode))
    )
  return RateLimiter.of({
    take: (key, rule) =>
      run(key, rule, "take", (r): Verdict => {
        const reply = r as ReadonlyArray<unknown>
        return { allowed: Number(reply[0]) === 1, remaining: Number(reply[1]), reset_seconds: Number(reply[2]) }
      }),
    record: (key, rule) => run(key, rule, "record", () => undefined),
    retryAfter: (key, rule) => run(key, rule, "wait", Number)
  })
}

/** The shared limiter on the context's Redis client. */
export const layer = (options: RedisLimiterOptions): Layer.Layer<RateLimiter, never, RedisClient> =>
  Layer.effect(RateLimiter, Effect.map(RedisClient, ({ client }) => make(client, options)))
