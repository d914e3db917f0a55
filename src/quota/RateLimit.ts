/**
 * The rate-limit service: "at most `max` hits per window, per key", in-process or shared through Redis
 * (`RateLimitRedis.ts`), behind one interface (`RateLimiter`). The window rules and their arithmetic are
 * `runtime/RateWindow.ts`; effect's own `RateLimiter` does not replace this one (docs/decisions.md, "Layers").
 */
import { Context, Effect, Layer } from "effect"
import type { GatewayError } from "../errors/Catalog.js"
import { makeWindowStore, MAX_TRACKED_KEYS, type RateRule, type Verdict } from "../runtime/RateWindow.js"

export class RateLimiter extends Context.Service<RateLimiter, {
  /** Counts one hit if it is allowed, and says whether it was. */
  readonly take: (key: string | number, rule: RateRule) => Effect.Effect<Verdict, GatewayError>
  /** Counts one event, allowed or not (e.g. a failure). */
  readonly record: (key: string | number, rule: RateRule) => Effect.Effect<void, GatewayError>
  /** Seconds until the next hit would be allowed; 0 when it would be now. Counts nothing. */
  readonly retryAfter: (key: string | number, rule: RateRule) => Effect.Effect<number, GatewayError>
}>()("wellspring/quota/RateLimiter") {}

/** The in-process limiter; time from the caller's `Clock` (TestClock in tests). */
export const makeMemory = (maxKeys = MAX_TRACKED_KEYS): RateLimiter["Service"] => {
  const store = makeWindowStore(maxKeys)
  return RateLimiter.of({
    take: (key, rule) => Effect.clockWith((clock) => Effect.sync(() => store.take(key, rule, clock.currentTimeMillisUnsafe()))),
    record: (key, rule) =>
      Effect.clockWith((clock) => Effect.sync(() => store.record(key, rule, clock.currentTimeMillisUnsafe()))),
    retryAfter: (key, rule) =>
      Effect.clockWith((clock) => Effect.sync(() => store.retryAfter(key, rule, clock.currentTimeMillisUnsafe())))
  })
}

export const layerMemory = (maxKeys = MAX_TRACKED_KEYS): Layer.Layer<RateLimiter> =>
  Layer.sync(RateLimiter, () => makeMemory(maxKeys))
