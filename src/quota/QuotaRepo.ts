/**
 * PostgreSQL persistence of quota state (tables of `src/store/migrations/0001_init.ts`):
 * `quota_windows` (one row per account: session and weekly windows, cooldown) and
 * `model_daily_usage` (raw tokens per model per quota day).
 *
 * Column aliases have no underscore so the statements work whether or not the SqlClient was built with
 * name transforms (snakeToCamel / camelToSnake).
 */
import { Effect } from "effect"
import type { SqlClient, SqlError } from "effect/sql"
import { dayLabel } from "./Policy.js"

export interface AccountWindows {
  readonly accountId: string
  /** Epoch ms; null while no session window is active. */
  readonly sessionStart: number | null
  readonly sessionUsed: number
  /** Epoch ms; null while no weekly window is active. */
  readonly weeklyAnchor: number | null
  readonly weeklyUsed: number
  /** Epoch ms; null when no cooldown was ever set. */
  readonly cooldownUntil: number | null
}

export interface DailyUsageRow {
  readonly modelId: string
  /** Quota day number (see Policy.dayIndex). */
  readonly day: number
  readonly tokens: number
}

export interface QuotaRepo {
  readonly loadAccount: (accountId: string) => Effect.Effect<AccountWindows | undefined, SqlError.SqlError>
  readonly saveAccounts: (rows: ReadonlyArray<AccountWindows>) => Effect.Effect<void, SqlError.SqlError>
  readonly loadDaily: (day: number) => Effect.Effect<ReadonlyArray<DailyUsageRow>, SqlError.SqlError>
  readonly loadDailyModel: (modelId: string, day: number) => Effect.Effect<number | undefined, SqlError.SqlError>
  readonly saveDaily: (rows: ReadonlyArray<DailyUsageRow>) => Effect.Effect<void, SqlError.SqlError>
}

const ts = (ms: number | null): Date | null => (ms === null ? null : new Date(ms))
const num = (v: unknown): number | null => (v === null || v === undefined ? null : Number(v))

/** Rows per INSERT statement (7 parameters each; far below PostgreSQL's 65535 parameter limit). */
const CHUNK = 500

const chunks = <A>(rows: ReadonlyArray<A>): Array<ReadonlyArray<A>> => {
  const out: Array<ReadonlyArray<A>> = []
  for (let i = 0; i < rows.length; i += CHUNK) out.push(rows.slice(i, i + CHUNK))
  return out
}

export const makeQuotaRepo = (sql: SqlClient.SqlClient): QuotaRepo => ({
  loadAccount: (accountId) =>
    sql<Record<string, unknown>>`
      SELECT (extract(epoch from session_started_at) * 1000)::float8 AS ss,
             session_used::float8 AS su,
             (extract(epoch from weekly_anchor_at) * 1000)::float8 AS wa,
             weekly_used::float8 AS wu,
             (extract(epoch from cooldown_until) * 1000)::float8 AS cd
        FROM quota_windows WHERE account_id = ${accountId}`.pipe(
      Effect.map((rows) => {
        const row = rows[0]
        if (row === undefined) return undefined
        return {
          accountId,
          sessionStart: num(row.ss),
          sessionUsed: num(row.su) ?? 0,
          weeklyAnchor: num(row.wa),
          weeklyUsed: num(row.wu) ?? 0,
          cooldownUntil: num(row.cd)
        }
      })
    ),

  saveAccounts: (rows) =>
    Effect.forEach(
      chunks(rows),
      (chunk) =>
        sql`
          INSERT INTO quota_windows (account_id, session_started_at, session_used, weekly_anchor_at, weekly_used,
                                     cooldown_until, updated_at)
          VALUES ${
          sql.csv(chunk.map((r) =>
            sql`(${r.accountId}, ${ts(r.sessionStart)}, ${r.sessionUsed}, ${ts(r.weeklyAnchor)}, ${r.weeklyUsed},
                 ${ts(r.cooldownUntil)}, now())`
          ))
        }
          ON CONFLICT (account_id) DO UPDATE SET
            session_started_at = EXCLUDED.session_started_at,
            session_used = EXCLUDED.session_used,
            weekly_anchor_at = EXCLUDED.weekly_anchor_at,
            weekly_used = EXCLUDED.weekly_used,
            cooldown_until = EXCLUDED.cooldown_until,
            updated_at = EXCLUDED.updated_at`,
      { discard: true }
    ),

  loadDaily: (day) =>
    sql<Record<string, unknown>>`
      SELECT model_id AS m, tokens::float8 AS t FROM model_daily_usage WHERE day = ${dayLabel(day)}::date`.pipe(
      Effect.map((rows) => rows.map((row) => ({ modelId: String(row.m), day, tokens: Number(row.t) })))
    ),

  loadDailyModel: (modelId, day) =>
    sql<Record<string, unknown>>`
      SELECT tokens::float8 AS t FROM model_daily_usage
       WHERE model_id = ${modelId} AND day = ${dayLabel(day)}::date`.pipe(
      Effect.map((rows) => (rows[0] === undefined ? undefined : Number(rows[0].t)))
    ),

  saveDaily: (rows) =>
    Effect.forEach(
      chunks(rows),
      (chunk) =>
        sql`
          INSERT INTO model_daily_usage (model_id, day, tokens)
          VALUES ${sql.csv(chunk.map((r) => sql`(${r.modelId}, ${dayLabel(r.day)}::date, ${Math.round(r.tokens)})`))}
          ON CONFLICT (model_id, day) DO UPDATE SET tokens = EXCLUDED.tokens`,
      { discard: true }
    )
})
