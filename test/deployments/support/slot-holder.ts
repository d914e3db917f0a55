/**
 * A replica that takes deployment slots and keeps them (test/deployments/caps-redis.test.ts): production caps
 * (Redis TIME, default lease), `COUNT` slots on deployment `KEY` with `concurrency: CONCURRENCY`, then `held <n>` on
 * stdout and the heartbeat left running until the process is killed.
 * Env: REDIS_URL, PREFIX, KEY, CONCURRENCY, COUNT.
 */
import { Effect } from "effect"
import * as CapsRedis from "../../../src/deployments/CapsRedis.js"
import * as StoreRedis from "../../../src/store/Redis.js"

const env = (name: string): string => {
  const value = process.env[name]
  if (value === undefined) throw new Error(`${name} is not set`)
  return value
}

const program = Effect.gen(function*() {
  const { client } = yield* StoreRedis.make({ url: env("REDIS_URL") })
  const caps = yield* CapsRedis.make(client, env("PREFIX"))
  const count = Number(env("COUNT"))
  let held = 0
  for (let i = 0; i < count; i++) {
    const taken = yield* caps.take(env("KEY"), { concurrency: Number(env("CONCURRENCY")), rate_limit_rpm: null })
    if (taken._tag === "Taken") held++
  }
  process.stdout.write(`held ${held}\n`)
  return yield* Effect.never
})

Effect.runFork(program.pipe(
  Effect.scoped,
  Effect.tapCause((cause) => Effect.sync(() => process.stderr.write(`${String(cause)}\n`)))
))
