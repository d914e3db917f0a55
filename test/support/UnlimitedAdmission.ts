import { Effect, Layer } from "effect"
import { Admission, type Standing } from "../../src/quota/Admission.js"

const pool = { used: 0, limit: 1, used_pct: 0, remaining_pct: 100, resets_at: null, resets_in_seconds: 0 }
const standing: Standing = { session: pool, weekly: { ...pool, anchor_at: null } }

/** Admits everything and charges nothing; counts tickets so tests can check release. */
export const makeUnlimitedAdmission = () => {
  const stats = { admitted: 0, open: 0, settled: [] as Array<number>, refunded: 0 }
  const layer = Layer.succeed(Admission, Admission.of({
    admit: (input) =>
      Effect.acquireRelease(
        Effect.sync(() => {
          stats.admitted++
          stats.open++
          let done = false
          return {
            reserved: standing,
            rpm: { limit: input.model.rate_limit_rpm, remaining: input.model.rate_limit_rpm, reset_seconds: 60 },
            settle: (usage: { inputTokens: number; outputTokens: number }) =>
              Effect.sync(() => {
                const weighted = usage.inputTokens * input.model.weights.input + usage.outputTokens * input.model.weights.output
                if (!done) {
                  done = true
                  stats.settled.push(weighted)
                }
                return { standing, weighted }
              }),
            refund: Effect.sync(() => {
              if (!done) {
                done = true
                stats.refunded++
              }
            })
          }
        }),
        () => Effect.sync(() => void stats.open--)
      ),
    standing: () => Effect.succeed(standing),
    currentRpm: () => Effect.succeed(0),
    dailyUsage: () => Effect.succeed(0),
    limit: (_key, max) => Effect.succeed({ allowed: true, remaining: max, reset_seconds: 60 })
  }))
  return { layer, stats }
}
