/**
 * Nothing lost across a restart (issue [3/4] §6), through the gateway as `App` wires it:
 * - embedded mode (PGlite in the data folder, memory actors with write-behind): stop, start a new gateway on the
 *   same folder;
 * - production memory mode (PostgreSQL, no Redis): stop, start on the same database;
 * - Redis mode: stop, delete every key under this run's prefix (as if Redis lost its data), start: the pools and
 *   the model daily totals are rebuilt from PostgreSQL instead of starting again at zero.
 * In every case /v1/usage after the restart equals /v1/usage before it, the engine's absolute figures are equal,
 * an exhausted daily cap stays exhausted, and the next request's receipt continues from there.
 */
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { type GatewayOptions, startGateway, type TestGateway } from "../support/Gateway.js"
import { Behaviour, Chunks, type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"
import { deleteByPrefix, uniquePrefix } from "../support/Redis.js"
import { REDIS_URL } from "../support/Services.js"
import {
  account,
  addQuotaModel,
  chat,
  dailyUsage,
  getJson,
  postgresUp,
  quotaConfig,
  redisAvailable,
  rejection,
  rowsOf,
  standing,
  type TestAccount,
  user
} from "./helpers.js"

const completion = (prompt: number, completionTokens: number) =>
  Behaviour.json(Chunks.completion({ content: "answer", usage: { prompt, completion: completionTokens } }))
const hi = [user("hello")]

/** /v1/usage without the part that moves with the clock. */
const stable = (usage: any) => {
  const strip = ({ resets_in_seconds: _, ...rest }: any) => rest
  return { ...usage, session: strip(usage.session), weekly: strip(usage.weekly) }
}

interface Scenario {
  readonly name: string
  readonly enabled: boolean
  /** Options of both gateways (the second starts where the first stopped). */
  readonly setup: () => Promise<{ options: GatewayOptions; between?: () => Promise<void>; cleanup: () => Promise<void> }>
}

const scenarios: ReadonlyArray<Scenario> = [
  {
    name: "embedded mode (same data folder)",
    enabled: true,
    setup: async () => {
      const dataDir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-restart-"))
      return { options: { dataDir }, cleanup: async () => Fs.rmSync(dataDir, { recursive: true, force: true }) }
    }
  },
  {
    name: "PostgreSQL, memory admission (same database)",
    enabled: postgresUp,
    setup: async () => {
      const db: FreshDatabase = await freshDatabase("restart")
      return { options: { databaseUrl: db.url }, cleanup: db.drop }
    }
  },
  {
    name: "Redis admission, Redis keys deleted while stopped (rebuilt from PostgreSQL)",
    enabled: redisAvailable,
    setup: async () => {
      const db = await freshDatabase("restart_redis")
      const prefix = uniquePrefix("restart")
      return {
        options: { databaseUrl: db.url, redisUrl: REDIS_URL, redisPrefix: prefix },
        between: async () => {
          expect(await deleteByPrefix(REDIS_URL, prefix)).toBeGreaterThan(0)
        },
        cleanup: async () => {
          await db.drop()
          await deleteByPrefix(REDIS_URL, prefix)
        }
      }
    }
  }
]

describe.each(scenarios)("restart: $name", ({ enabled, setup }) => {
  let mock: MockUpstream
  let gw: TestGateway | undefined
  let env: Awaited<ReturnType<Scenario["setup"]>>

  beforeAll(async () => {
    if (!enabled) return
    mock = await startMockUpstream()
    env = await setup()
  })
  afterAll(async () => {
    await gw?.stop()
    await mock?.close()
    await env?.cleanup()
  })

  const boot = () =>
    startGateway({
      ...env.options,
      configure: (doc) => {
        quotaConfig(doc)
        addQuotaModel(doc, { id: "ws-p", baseUrl: mock.url }) // no daily cap: its total is still kept
        addQuotaModel(doc, { id: "ws-p2", baseUrl: mock.url, daily_cap: 1_000_000 })
        addQuotaModel(doc, { id: "ws-cap", baseUrl: mock.url, daily_cap: 500 })
      }
    })

  it.skipIf(!enabled)("session and weekly used_pct, resets_at and daily totals are the same after the restart", async () => {
    gw = await boot()
    const a: TestAccount = await account(gw)
    mock.script(completion(100, 250), completion(37, 11), completion(300, 300))
    expect((await chat(gw, a, { model: "ws-p", messages: hi })).status).toBe(200)
    expect((await chat(gw, a, { model: "ws-p2", messages: hi })).status).toBe(200)
    expect((await chat(gw, a, { model: "ws-cap", messages: hi })).status).toBe(200)
    expect((await rejection(await chat(gw, a, { model: "ws-cap", messages: hi }))).code).toBe("model_quota_exceeded")
    await rowsOf(gw, a)
    const before = await getJson(gw, a, "/v1/usage")
    expect(before.body.session.used_pct).toBe(15.59) // 600 + 59 + 900 of 10 000
    const engineBefore = await standing(gw, a)
    const dailyBefore = [await dailyUsage(gw, "ws-p"), await dailyUsage(gw, "ws-p2"), await dailyUsage(gw, "ws-cap")]
    expect(dailyBefore).toEqual([350, 48, 600])

    await gw.stop()
    gw = undefined
    await env.between?.()
    gw = await boot()

    const after = await getJson(gw, a, "/v1/usage")
    expect(after.status).toBe(200)
    expect(stable(after.body)).toEqual(stable(before.body))
    const engineAfter = await standing(gw, a)
    expect(engineAfter.session.used).toBe(engineBefore.session.used)
    expect(engineAfter.weekly.used).toBe(engineBefore.weekly.used)
    expect(engineAfter.session.resets_at).toBe(engineBefore.session.resets_at)
    expect(engineAfter.weekly.anchor_at).toBe(engineBefore.weekly.anchor_at)
    // The daily cap is still spent, and the pools continue where they were.
    expect((await rejection(await chat(gw, a, { model: "ws-cap", messages: hi }))).code).toBe("model_quota_exceeded")
    mock.script(completion(100, 250))
    // The first thing after the restart is an admission: its daily total continues too (cap or no cap).
    const next = await chat(gw, a, { model: "ws-p", messages: hi })
    expect(next.status).toBe(200)
    const receipt = ((await next.json()) as any).wellspring
    expect(receipt.session.used_pct).toBe(21.59) // + 600
    expect(receipt.session.resets_at).toBe(before.body.session.resets_at)
    expect([await dailyUsage(gw, "ws-p"), await dailyUsage(gw, "ws-p2"), await dailyUsage(gw, "ws-cap")]).toEqual([
      350 + 350,
      48,
      600
    ])
  })
})
