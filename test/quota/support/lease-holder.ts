/**
 * A replica that takes in-flight slots and keeps them (test/quota/dead-replica.test.ts): production admission
 * (Redis, Redis TIME, default lease), `COUNT` slots on model `MODEL` taken in a scope that is never closed, then
 * `held <n>` on stdout and the heartbeat left running until the process is killed.
 * Env: REDIS_URL, PREFIX, MODEL, CONCURRENCY, COUNT.
 */
import { Effect, Scope } from "effect"
import { Admission } from "../../../src/quota/Admission.js"
import { layerRedis } from "../../../src/quota/AdmissionRedis.js"
import { input, LAX, model, plan } from "../fixtures.js"

const env = (name: string): string => {
  const value = process.env[name]
  if (value === undefined) throw new Error(`${name} is not set`)
  return value
}

const m = model({ id: env("MODEL"), concurrency: Number(env("CONCURRENCY")) })
const count = Number(env("COUNT"))

const program = Effect.gen(function*() {
  const admission = yield* Admission
  const held = yield* Scope.make()
  for (let i = 0; i < count; i++) yield* admission.admit(input(`holder-${i}`, m, plan(), 1)).pipe(Scope.provide(held))
  process.stdout.write(`held ${count}\n`)
  return yield* Effect.never
})

Effect.runFork(program.pipe(
  Effect.provide(layerRedis({ url: env("REDIS_URL"), keyPrefix: env("PREFIX"), abuse: LAX })),
  Effect.tapCause((cause) => Effect.sync(() => process.stderr.write(`${String(cause)}\n`)))
))
