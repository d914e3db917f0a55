import { Context, Effect, Schema } from "effect"
import { ModelConfig, PlanConfig } from "../../src/config/GatewayConfig.js"
import type { AdmitInput } from "../../src/quota/Admission.js"
import type { AbuseSettings } from "../../src/quota/Policy.js"

/** Monday 2026-01-05 03:00 UTC = 12:00 KST. */
export const T0 = Date.UTC(2026, 0, 5, 3, 0, 0)
export const HOUR = 3_600_000
export const DAY = 86_400_000

/** Abuse settings that never trigger in tests that are not about abuse. */
export const LAX: AbuseSettings = { burst: 1_000_000, window_seconds: 10, cooldown_seconds: 60 }

const decodeModel = Schema.decodeUnknownSync(ModelConfig)
const decodePlan = Schema.decodeUnknownSync(PlanConfig)

export const model = (overrides: Record<string, unknown> = {}): ModelConfig =>
  decodeModel({
    id: "m-a",
    owned_by: "test",
    max_input_tokens: 100_000,
    max_output_tokens: 10_000,
    rate_limit_rpm: 100_000,
    concurrency: 100_000,
    daily_cap: null,
    weights: { input: 1, output: 3 },
    route: { provider: "sim", model: "sim" },
    ...overrides
  })

export const plan = (overrides: Record<string, unknown> = {}): PlanConfig =>
  decodePlan({ session_limit: 1_000_000, weekly_limit: 10_000_000, session_hours: 5, ...overrides })

export const input = (
  accountId: string,
  m: ModelConfig,
  p: PlanConfig,
  estimatedInputTokens: number,
  byok = false
): AdmitInput => ({ accountId, model: m, plan: p, estimatedInputTokens, byok })

/** Slots held on a model's in-flight gate, as seen by the implementation under test. */
export class InFlightProbe extends Context.Service<
  InFlightProbe,
  (modelId: string) => Effect.Effect<number, unknown>
>()("test/quota/InFlightProbe") {}

/** Seeded PRNG (mulberry32): reproducible random interleavings without fast-check. */
export const prng = (seed: number) => {
  let a = seed >>> 0
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296
  }
  return {
    next,
    int: (lo: number, hi: number) => lo + Math.floor(next() * (hi - lo + 1)),
    pick: <A>(xs: ReadonlyArray<A>): A => xs[Math.floor(next() * xs.length)]!
  }
}
