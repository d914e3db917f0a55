/** The health rules (status/Health.ts) at their boundaries, and the sparkline's buckets, without a database. */
import { Schema } from "effect"
import { describe, expect, it } from "vitest"
import { HealthRules } from "../../src/config/Status.js"
import { classify, fleetHealth, type HealthFigures } from "../../src/status/Health.js"

const rules = Schema.decodeSync(HealthRules)({})
const figures = (over: Partial<HealthFigures>): HealthFigures => ({
  seen: true,
  windowSuccesses: 0,
  windowFailures: 0,
  recentAttempts: 0,
  recentFailures: 0,
  ...over
})

describe("classify (defaults: 15-minute window, 3 requests at least, 10 % degraded, > 50 % of the last 10 down, 24 h idle)", () => {
  it("idle only without any request for 24 h; too little traffic to tell is ok", () => {
    expect(classify(figures({ seen: false }), rules)).toBe("idle")
    expect(classify(figures({}), rules)).toBe("ok")
    expect(classify(figures({ windowFailures: 2, recentAttempts: 2, recentFailures: 2 }), rules)).toBe("ok")
  })
  it("degraded from 10 % of the window's counted requests", () => {
    expect(classify(figures({ windowSuccesses: 91, windowFailures: 9, recentAttempts: 10, recentFailures: 1 }), rules)).toBe("ok")
    expect(classify(figures({ windowSuccesses: 90, windowFailures: 10, recentAttempts: 10, recentFailures: 2 }), rules)).toBe("degraded")
  })
  it("down when more than half of the most recent counted requests failed", () => {
    expect(classify(figures({ windowSuccesses: 40, windowFailures: 5, recentAttempts: 10, recentFailures: 5 }), rules)).toBe("degraded")
    expect(classify(figures({ windowSuccesses: 50, windowFailures: 6, recentAttempts: 10, recentFailures: 6 }), rules)).toBe("down")
    expect(classify(figures({ windowFailures: 3, recentAttempts: 3, recentFailures: 3 }), rules)).toBe("down")
  })
  it("follows the configured thresholds", () => {
    const strict = Schema.decodeSync(HealthRules)({ min_requests: 1, degraded_error_rate: 0.01, down_error_rate: 0.2 })
    expect(classify(figures({ windowSuccesses: 99, windowFailures: 1, recentAttempts: 10 }), strict)).toBe("degraded")
    expect(classify(figures({ windowSuccesses: 7, windowFailures: 3, recentAttempts: 10, recentFailures: 3 }), strict)).toBe("down")
  })
})

describe("fleetHealth", () => {
  it("seven buckets oldest first, tokens per second; unknown models idle with zeros", () => {
    const health = fleetHealth({
      health: [{ model_id: "a", window_successes: 4, window_failures: 0, ttfb_ms: 123.6, tps: 41.234 }],
      recent: [{ model_id: "a", attempts: 4, failures: 0 }],
      buckets: [{ model_id: "a", age: 0, output_tokens: 6000 }, { model_id: "a", age: 6, output_tokens: 600 }],
      seen: ["a"]
    }, ["a", "b"], rules)
    expect(health.a).toEqual({ status: "ok", sparkline: [1, 0, 0, 0, 0, 0, 10], tps: 41.23, ttfb_ms: 124 })
    expect(health.b).toEqual({ status: "idle", sparkline: [0, 0, 0, 0, 0, 0, 0], tps: null, ttfb_ms: null })
  })
})
