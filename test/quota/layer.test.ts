import { afterAll, describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import { Redis } from "ioredis"
import { Admission } from "../../src/quota/Admission.js"
import { layerFromConfig } from "../../src/quota/layer.js"
import { deleteByPrefix, uniquePrefix } from "../support/Redis.js"
import { REDIS_URL, serviceGate } from "../support/Services.js"
import { input, LAX, model, plan } from "./fixtures.js"

const redisUp = await serviceGate("redis")
const prefix = uniquePrefix("quota-layer")

const admitOnce = Effect.gen(function*() {
  const adm = yield* Admission
  const t = yield* adm.admit(input("acct", model({ id: "m" }), plan(), 10))
  return yield* t.settle({ inputTokens: 10, outputTokens: 0 })
}).pipe(Effect.scoped)

describe("layerFromConfig", () => {
  afterAll(async () => {
    if (redisUp) await deleteByPrefix(REDIS_URL, prefix)
  })

  it.effect("without a Redis URL: in-process admission", () =>
    Effect.gen(function*() {
      const r = yield* admitOnce
      expect(r.standing.session.used).toBe(10)
    }).pipe(Effect.provide(layerFromConfig({ abuse: LAX }))))

  it.live.skipIf(!redisUp)("with a Redis URL: state lives in Redis under the key prefix", () =>
    Effect.gen(function*() {
      const r = yield* admitOnce
      expect(r.standing.session.used).toBe(10)
      const redis = new Redis(REDIS_URL)
      const used = yield* Effect.promise(() => redis.hget(`${prefix}a:{acct}`, "su"))
      redis.disconnect()
      expect(Number(used)).toBe(10)
    }).pipe(Effect.provide(layerFromConfig({ abuse: LAX, redisUrl: REDIS_URL, keyPrefix: prefix }))))
})
