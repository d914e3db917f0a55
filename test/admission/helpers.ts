/**
 * Shared helpers of the end-to-end admission suites (issue [3/4]): gateways running the real admission engine
 * (memory actors persisted to PostgreSQL, or Redis + PostgreSQL), accounts on chosen plans, models routed to the
 * scripted mock upstream, and reads of the engine's internal standing through `gw.run`.
 */
import { Effect } from "effect"
import { expect } from "vitest"
import { Settings } from "../../src/config/Live.js"
import { Admission, type Standing } from "../../src/quota/Admission.js"
import { newAccount, newKey } from "../accounts/support.js"
import { freshDatabase, type FreshDatabase } from "../support/Db.js"
import { afterFlush } from "../support/Rows.js"
import { authed, type ConfigDoc, startGateway, type TestGateway } from "../support/Gateway.js"
import { deleteByPrefix, uniquePrefix } from "../support/Redis.js"
import { REDIS_URL, serviceGate } from "../support/Services.js"
import { addMockModel, chatUrl, user } from "../inference/helpers.js"

export { chatUrl, user }

export const postgresUp = await serviceGate("postgres")
export const redisAvailable = postgresUp && (await serviceGate("redis"))

export type Mode = "memory" | "redis"
/** Both admission implementations, as `App` wires them from config: without and with `REDIS_URL`. */
export const MODES: ReadonlyArray<Mode> = redisAvailable ? ["memory", "redis"] : ["memory"]

/** Plans used by the suites (weighted-token limits small enough to reason about exact percentages). */
export const PLANS = {
  default: { session_limit: 10_000, weekly_limit: 100_000, session_hours: 5, hide_absolutes: false, show_request_pct: true },
  community: { session_limit: 10_000, weekly_limit: 100_000, session_hours: 5, hide_absolutes: true, show_request_pct: false },
  tiny_session: { session_limit: 1_000, weekly_limit: 1_000_000, session_hours: 5, show_request_pct: true },
  tiny_weekly: { session_limit: 1_000_000, weekly_limit: 1_000, session_hours: 5, show_request_pct: true }
} as const
export type PlanName = keyof typeof PLANS

export interface QuotaModel {
  readonly id: string
  readonly rpm?: number
  readonly concurrency?: number
  readonly daily_cap?: number | null
  readonly weights?: { readonly input: number; readonly output: number }
  readonly provider?: string
  readonly baseUrl: string
}

/** A chat model on the mock upstream with the given limits (default weights input 1, output 2). */
export const addQuotaModel = (doc: ConfigDoc, m: QuotaModel) =>
  addMockModel(doc, {
    id: m.id,
    provider: m.provider ?? "mock",
    baseUrl: m.baseUrl,
    timeouts: { first_token_ms: 5_000, idle_ms: 20_000, total_ms: 60_000 },
    model: {
      rate_limit_rpm: m.rpm ?? 1_000,
      concurrency: m.concurrency ?? 1_000,
      daily_cap: m.daily_cap ?? null,
      weights: m.weights ?? { input: 1, output: 2 }
    }
  })

/** Sets the suites' plans (and an abuse setting that never triggers unless a test asks for it). */
export const quotaConfig = (doc: ConfigDoc, abuse = { burst: 10_000, window_seconds: 10, cooldown_seconds: 60 }) => {
  doc.plans = structuredClone(PLANS)
  doc.default_plan = "default"
  doc.abuse = abuse
  doc.request_log = { batch_size: 500, flush_ms: 50 }
}

export interface QuotaGateway {
  /** The running gateway (replaced by `restart`). */
  gw: TestGateway
  readonly mode: Mode
  readonly db: FreshDatabase
  readonly prefix: string | undefined
  /**
   * Stops the gateway and starts a new one on the same database (and Redis prefix). With `loseRedis`, every
   * key under the prefix is deleted in between, as if Redis had lost its data.
   */
  readonly restart: (options?: { readonly loseRedis?: boolean }) => Promise<TestGateway>
  readonly stop: () => Promise<void>
}

/** A gateway on a fresh PostgreSQL database whose admission engine is chosen by config, as in production. */
export const startQuotaGateway = async (
  mode: Mode,
  configure: (doc: ConfigDoc) => void,
  label = "adm"
): Promise<QuotaGateway> => {
  const db = await freshDatabase(label)
  const prefix = mode === "redis" ? uniquePrefix(label) : undefined
  const boot = () =>
    startGateway({
      databaseUrl: db.url,
      ...(prefix ? { redisUrl: REDIS_URL, redisPrefix: prefix } : {}),
      configure
    })
  const q: QuotaGateway = {
    gw: await boot(),
    mode,
    db,
    prefix,
    restart: async (options = {}) => {
      await q.gw.stop()
      if (prefix && options.loseRedis) await deleteByPrefix(REDIS_URL, prefix)
      q.gw = await boot()
      return q.gw
    },
    stop: async () => {
      await q.gw.stop()
      await db.drop()
      if (prefix) await deleteByPrefix(REDIS_URL, prefix)
    }
  }
  return q
}

export interface TestAccount {
  readonly id: string
  readonly key: string
  readonly plan: PlanName
  readonly email: string
}

export const account = async (gw: TestGateway, plan: PlanName = "default", email?: string): Promise<TestAccount> => {
  const row = await newAccount(gw, { plan, ...(email ? { email } : {}) })
  const { key } = await newKey(gw, row.id, "quota-test")
  return { id: row.id, key, plan, email: row.email ?? "" }
}

export const chat = (gw: TestGateway, who: TestAccount, body: Record<string, unknown>, init: RequestInit = {}) =>
  fetch(chatUrl(gw), { method: "POST", headers: authed(who.key), body: JSON.stringify(body), ...init })

export const getJson = async (gw: TestGateway, who: TestAccount, path: string) => {
  const res = await fetch(`${gw.url}${path}`, { headers: authed(who.key) })
  const text = await res.text()
  return { status: res.status, text, body: JSON.parse(text) as any }
}

/** The engine's own view of an account (absolute weighted figures, never on the wire). */
export const standing = (gw: TestGateway, who: TestAccount): Promise<Standing> =>
  gw.run(Effect.gen(function*() {
    const settings = yield* Settings
    const admission = yield* Admission
    return yield* admission.standing(who.id, settings.planFor(who.plan))
  }))

/**
 * A standing without its countdowns (`resets_in_seconds`): two standings read a moment apart on the wall clock
 * are the same state when everything else (used, percentages, resets_at, anchor_at) is equal.
 */
export const withoutCountdowns = (s: Standing) => {
  const strip = ({ resets_in_seconds: _, ...rest }: Standing["session"]) => rest
  return { session: strip(s.session), weekly: strip(s.weekly) }
}

export const dailyUsage = (gw: TestGateway, modelId: string): Promise<number> =>
  gw.run(Effect.flatMap(Admission, (a) => a.dailyUsage(modelId)))

export const currentRpm = (gw: TestGateway, who: TestAccount): Promise<number> =>
  gw.run(Effect.flatMap(Admission, (a) => a.currentRpm(who.id)))

export interface Row {
  readonly id: number
  readonly model_id: string
  readonly status: string
  readonly error_code: string | null
  readonly input_tokens: number
  readonly output_tokens: number
  readonly weighted_cost: number
}

/** Flushes the batch writer, then reads the account's request rows, oldest first. */
export const rowsOf = (gw: TestGateway, who: TestAccount): Promise<Array<Row>> =>
  afterFlush(gw, (sql) =>
    Effect.map(
      sql<Row>`
        SELECT id, model_id, status, error_code, input_tokens, output_tokens, weighted_cost::float8 AS weighted_cost
        FROM request_log WHERE account_id = ${who.id} ORDER BY id`,
      (rows) => [...rows]
    ))

/** Estimated input tokens of a request of one user message (what admission reserves): bytes / 4 rounded up. */
export const estimateOf = (text: string): number => Math.ceil((4 + Buffer.byteLength(text, "utf8")) / 4)

export const round2 = (x: number) => Math.round(x * 100) / 100
export const pct = (used: number, limit: number) => round2(Math.min(100, (used / limit) * 100))

/** The body of a JSON error response, with its status, code and Retry-After. */
export const rejection = async (res: Response) => {
  const text = await res.text()
  const body = JSON.parse(text) as any
  const retryAfter = res.headers.get("retry-after")
  return { status: res.status, code: body.error?.code, type: body.error?.type, body, retryAfter: retryAfter === null ? null : Number(retryAfter), text }
}

/** Asserts `iso` is an ISO-8601 instant within `slackMs` of `expectedMs`; returns it in ms. */
export const expectInstant = (iso: unknown, expectedMs: number, slackMs = 5_000): number => {
  expect(typeof iso, `ISO instant, got ${String(iso)}`).toBe("string")
  expect(iso as string).toMatch(/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z$/)
  const ms = Date.parse(iso as string)
  expect(Math.abs(ms - expectedMs), `${iso as string} vs ${new Date(expectedMs).toISOString()}`).toBeLessThanOrEqual(slackMs)
  return ms
}

export const HOUR_MS = 3_600_000
export const WEEK_MS = 7 * 24 * HOUR_MS

/** Number of Redis keys under `prefix` (SCAN). */
export const countKeys = async (prefix: string): Promise<number> => {
  const { Redis } = await import("ioredis")
  const redis = new Redis(REDIS_URL, { lazyConnect: true, maxRetriesPerRequest: 1 })
  await redis.connect()
  try {
    let cursor = "0"
    let n = 0
    do {
      const [next, keys] = await redis.scan(cursor, "MATCH", `${prefix}*`, "COUNT", 1000)
      cursor = next
      n += keys.length
    } while (cursor !== "0")
    return n
  } finally {
    redis.disconnect()
  }
}
