import { Clock, Context, Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import * as Crypto from "node:crypto"
import { generateKey, hashKey, keyPrefixOf, LEGACY_PREFIX, randomBase62 } from "../auth/KeyMaterial.js"
import type { AccountRow, KeyRow } from "../auth/Rows.js"
import { Settings } from "../config/Live.js"
import { open, seal } from "../store/Sealer.js"

export const ACCOUNT_STATUSES = ["active", "unlinked", "revoked"] as const
export type AccountStatus = (typeof ACCOUNT_STATUSES)[number]

/** The row types live with auth (which resolves keys to them); re-exported for the account module's users. */
export type { AccountRow, KeyRow } from "../auth/Rows.js"

export interface NewAccount {
  readonly username: string
  readonly displayName: string
  readonly communityId?: string | undefined
  readonly communityType?: string | undefined
  readonly email?: string | undefined
  readonly emailVerified?: boolean | undefined
  readonly status?: AccountStatus | undefined
  readonly isLegacy?: boolean | undefined
  readonly isAdmin?: boolean | undefined
  readonly isGuest?: boolean | undefined
  readonly guestExpiresAt?: Date | undefined
  readonly needsMigration?: boolean | undefined
  readonly plan?: string | undefined
}

export const DEFAULT_KEY_LABEL = "새 키"
export const ROTATED_KEY_LABEL = "기본"
export const MAX_ACTIVE_KEYS = 5
export const truncateLabel = (label: string): string => Array.from(label).slice(0, 40).join("")

const keyAad = (id: number) => `api_key:${id}`

export class AccountsRepo extends Context.Service<AccountsRepo, {
  readonly createAccount: (input: NewAccount) => Effect.Effect<AccountRow>
  readonly findAccount: (id: string) => Effect.Effect<AccountRow | null>
  readonly findAccountByUsername: (username: string) => Effect.Effect<AccountRow | null>
  readonly setStatus: (id: string, status: AccountStatus) => Effect.Effect<boolean>
  readonly setSfw: (id: string, on: boolean) => Effect.Effect<boolean>
  /** Issues a key; `legacy` issues a `ws-` key (operator use). Returns the plaintext once. */
  readonly createKey: (accountId: string, label: string, options?: { readonly legacy?: boolean }) => Effect.Effect<{
    readonly key: string
    readonly row: KeyRow
  }>
  readonly listActiveKeys: (accountId: string) => Effect.Effect<ReadonlyArray<KeyRow>>
  readonly countActiveKeys: (accountId: string) => Effect.Effect<number>
  /** Revokes one of the account's active keys; returns the revoked row or null. */
  readonly revokeKey: (accountId: string, keyId: number) => Effect.Effect<KeyRow | null>
  readonly revokeKeyById: (keyId: number) => Effect.Effect<KeyRow | null>
  /** Revokes every active key, issues one labelled `기본`, stamps last_rotated_at. One transaction. */
  readonly rotate: (accountId: string) => Effect.Effect<{ readonly key: string; readonly revoked: ReadonlyArray<KeyRow> }>
  /** Plaintext of a revealable key, or null. */
  readonly reveal: (row: KeyRow) => string | null
  readonly audit: (accountId: string, action: string, target: string | null, meta?: Record<string, unknown>) => Effect.Effect<void>
  readonly createSession: (accountId: string, ttlHours: number) => Effect.Effect<string>
  /**
   * Issues a key unless the account already holds `max` active keys (null then). The account row is locked
   * for the transaction, so concurrent creations cannot overshoot the cap.
   */
  readonly createKeyCapped: (accountId: string, label: string, max: number) => Effect.Effect<{
    readonly key: string
    readonly row: KeyRow
  } | null>
  /** One of the account's active keys, or null (not the account's, revoked, or no such id). */
  readonly findOwnActiveKey: (accountId: string, keyId: number) => Effect.Effect<KeyRow | null>
  /**
   * `rotate` behind a cooldown shared by every replica: stamps `last_rotated_at = at` only when the previous
   * rotation is at or before `notAfter`, in the same transaction that revokes and issues. Null: cooldown.
   */
  readonly rotateGuarded: (accountId: string, at: Date, notAfter: Date) => Effect.Effect<{
    readonly key: string
    readonly row: KeyRow
    readonly revoked: ReadonlyArray<KeyRow>
  } | null>
}>()("wellspring/accounts/AccountsRepo") {}

export const make = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const settings = yield* Settings
  const prefix = settings.config.key_prefix
  const kek = settings.encryptionKey

  const orDie = <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.orDie(effect)
  /**
   * Times the gateway writes (revocations, rotations, verification) come from the Effect clock, the clock its
   * cooldowns and caches use. Session expiry alone stays with the database's `now()`, on both sides.
   */
  const clockDate = Effect.map(Clock.currentTimeMillis, (ms) => new Date(ms))

  const findAccount = (id: string) =>
    orDie(sql<AccountRow>`SELECT * FROM accounts WHERE id = ${id}`).pipe(Effect.map((rows) => rows[0] ?? null))

  const insertKey = (accountId: string, label: string, legacy: boolean) =>
    Effect.gen(function*() {
      const key = legacy ? LEGACY_PREFIX + randomBase62() : generateKey(prefix)
      const [{ id }] = (yield* sql<{ id: number }>`SELECT nextval('api_keys_id_seq')::int AS id`) as unknown as [
        { id: number }
      ]
      // Legacy keys are never revealable; current-prefix keys only when a key-encryption key exists.
      const ciphertext = !legacy && kek ? seal(kek, key, keyAad(id)) : null
      const rows = yield* sql<KeyRow>`
        INSERT INTO api_keys (id, account_id, label, key_hash, key_prefix, ciphertext, legacy)
        VALUES (${id}, ${accountId}, ${truncateLabel(label)}, ${hashKey(key)}, ${keyPrefixOf(key)}, ${ciphertext}, ${legacy})
        RETURNING *`
      return { key, row: rows[0]! }
    })

  return AccountsRepo.of({
    createAccount: (input) =>
      clockDate.pipe(Effect.flatMap((now) =>
        orDie(sql<AccountRow>`
        INSERT INTO accounts ${
          sql.insert({
            id: `acc_${Crypto.randomBytes(10).toString("hex")}`,
            username: input.username,
            display_name: input.displayName,
            community_id: input.communityId ?? null,
            community_type: input.communityType ?? null,
            email: input.email ?? null,
            email_verified_at: input.email && input.emailVerified !== false ? now : null,
            status: input.status ?? "active",
            is_legacy: input.isLegacy ?? false,
            is_admin: input.isAdmin ?? false,
            is_guest: input.isGuest ?? false,
            guest_expires_at: input.guestExpiresAt ?? null,
            needs_migration: input.needsMigration ?? false,
            plan: input.plan ?? null
          })
        } RETURNING *`)
      ), Effect.map((rows) => rows[0]!)),
    findAccount,
    findAccountByUsername: (username) =>
      orDie(sql<AccountRow>`SELECT * FROM accounts WHERE username = ${username}`).pipe(
        Effect.map((rows) => rows[0] ?? null)
      ),
    setStatus: (id, status) =>
      orDie(sql`UPDATE accounts SET status = ${status} WHERE id = ${id} RETURNING id`).pipe(
        Effect.map((rows) => rows.length > 0)
      ),
    setSfw: (id, on) =>
      orDie(sql`UPDATE accounts SET sfw_mode = ${on} WHERE id = ${id} RETURNING id`).pipe(
        Effect.map((rows) => rows.length > 0)
      ),
    createKey: (accountId, label, options) => orDie(insertKey(accountId, label, options?.legacy ?? false)),
    listActiveKeys: (accountId) =>
      orDie(sql<KeyRow>`
        SELECT * FROM api_keys WHERE account_id = ${accountId} AND revoked_at IS NULL ORDER BY created_at, id`),
    countActiveKeys: (accountId) =>
      orDie(sql<{ n: number }>`
        SELECT count(*)::int AS n FROM api_keys WHERE account_id = ${accountId} AND revoked_at IS NULL`).pipe(
        Effect.map((rows) => rows[0]?.n ?? 0)
      ),
    revokeKey: (accountId, keyId) =>
      orDie(Effect.flatMap(clockDate, (now) => sql<KeyRow>`
        UPDATE api_keys SET revoked_at = ${now}
        WHERE id = ${keyId} AND account_id = ${accountId} AND revoked_at IS NULL RETURNING *`)).pipe(
        Effect.map((rows) => rows[0] ?? null)
      ),
    revokeKeyById: (keyId) =>
      orDie(Effect.flatMap(clockDate, (now) => sql<KeyRow>`
        UPDATE api_keys SET revoked_at = ${now} WHERE id = ${keyId} AND revoked_at IS NULL RETURNING *`)).pipe(
        Effect.map((rows) => rows[0] ?? null)
      ),
    rotate: (accountId) =>
      orDie(sql.withTransaction(Effect.gen(function*() {
        // Same clock as the cooldown check of `rotateGuarded`.
        const now = yield* clockDate
        const revoked = yield* sql<KeyRow>`
          UPDATE api_keys SET revoked_at = ${now}
          WHERE account_id = ${accountId} AND revoked_at IS NULL RETURNING *`
        const { key } = yield* insertKey(accountId, ROTATED_KEY_LABEL, false)
        yield* sql`UPDATE accounts SET last_rotated_at = ${now} WHERE id = ${accountId}`
        return { key, revoked }
      }))),
    reveal: (row) => (row.ciphertext && kek ? open(kek, row.ciphertext, keyAad(row.id)) : null),
    audit: (accountId, action, target, meta) =>
      orDie(sql`
        INSERT INTO audit_log (account_id, action, target, meta)
        VALUES (${accountId}, ${action}, ${target}, ${meta ? JSON.stringify(meta) : null}::jsonb)`).pipe(
        Effect.asVoid
      ),
    createSession: (accountId, ttlHours) =>
      orDie(Effect.gen(function*() {
        const token = randomBase62(48)
        yield* sql`
          INSERT INTO sessions (token_hash, account_id, expires_at)
          VALUES (${hashKey(token)}, ${accountId}, now() + ${`${ttlHours} hours`}::interval)`
        return token
      })),
    createKeyCapped: (accountId, label, max) =>
      orDie(sql.withTransaction(Effect.gen(function*() {
        yield* sql`SELECT id FROM accounts WHERE id = ${accountId} FOR UPDATE`
        const [{ n }] = (yield* sql<{ n: number }>`
          SELECT count(*)::int AS n FROM api_keys WHERE account_id = ${accountId} AND revoked_at IS NULL`) as unknown as [
            { n: number }
          ]
        if (n >= max) return null
        return yield* insertKey(accountId, label, false)
      }))),
    findOwnActiveKey: (accountId, keyId) =>
      orDie(sql<KeyRow>`
        SELECT * FROM api_keys WHERE id = ${keyId} AND account_id = ${accountId} AND revoked_at IS NULL`).pipe(
        Effect.map((rows) => rows[0] ?? null)
      ),
    rotateGuarded: (accountId, at, notAfter) =>
      orDie(sql.withTransaction(Effect.gen(function*() {
        // The conditional update takes the row lock: a concurrent rotation waits, then sees the new stamp.
        const stamped = yield* sql`
          UPDATE accounts SET last_rotated_at = ${at}
          WHERE id = ${accountId} AND (last_rotated_at IS NULL OR last_rotated_at <= ${notAfter})
          RETURNING id`
        if (stamped.length === 0) return null
        const revoked = yield* sql<KeyRow>`
          UPDATE api_keys SET revoked_at = ${at}
          WHERE account_id = ${accountId} AND revoked_at IS NULL RETURNING *`
        const { key, row } = yield* insertKey(accountId, ROTATED_KEY_LABEL, false)
        return { key, row, revoked }
      })))
  })
})

export const layer = Layer.effect(AccountsRepo, make)
