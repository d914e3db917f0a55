import { Context, Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { hashKey } from "./KeyMaterial.js"
import type { AccountRow, KeyRow } from "./Rows.js"

/** An active key and its account: what the key cache holds for a key hash. */
export interface KeyOwner {
  readonly key: KeyRow
  readonly account: AccountRow
}

/**
 * The reads and writes authentication needs: key lookup by hash, session lookup, last-used stamps.
 * Everything else about accounts and keys (issuing, revoking, auditing) is `accounts/AccountsRepo.ts`.
 */
export class KeyStore extends Context.Service<KeyStore, {
  /** The active (not revoked) key with this SHA-256 hash and its account, or null. */
  readonly findActiveKeyByHash: (hash: string) => Effect.Effect<KeyOwner | null>
  /** The account of an unexpired, unrevoked `ws-session` token, or null. */
  readonly findSession: (token: string) => Effect.Effect<AccountRow | null>
  /** Stamps `last_used_at` of each key, and of its account with the latest of its keys' stamps. */
  readonly touchKeys: (touches: ReadonlyArray<{ readonly keyId: number; readonly at: Date }>) => Effect.Effect<void>
}>()("wellspring/auth/KeyStore") {}

export const make = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  return KeyStore.of({
    findActiveKeyByHash: (hash) =>
      Effect.orDie(Effect.gen(function*() {
        const keys = yield* sql<KeyRow>`SELECT * FROM api_keys WHERE key_hash = ${hash} AND revoked_at IS NULL`
        const key = keys[0]
        if (!key) return null
        const accounts = yield* sql<AccountRow>`SELECT * FROM accounts WHERE id = ${key.account_id}`
        const account = accounts[0]
        return account ? { key, account } : null
      })),
    // Session expiry is the database's clock on both sides (stamped by `createSession` with `now()`).
    findSession: (token) =>
      Effect.orDie(sql<AccountRow>`
        SELECT a.* FROM sessions s JOIN accounts a ON a.id = s.account_id
        WHERE s.token_hash = ${hashKey(token)} AND s.revoked_at IS NULL AND s.expires_at > now()`).pipe(
        Effect.map((rows) => rows[0] ?? null)
      ),
    touchKeys: (touches) =>
      touches.length === 0 ? Effect.void : Effect.orDie(Effect.gen(function*() {
        yield* Effect.forEach(touches, (t) => sql`UPDATE api_keys SET last_used_at = ${t.at} WHERE id = ${t.keyId}`, {
          discard: true
        })
        // The account's stamp comes from the same (Effect) clock as its keys', not from the database's.
        const ids = touches.map((t) => t.keyId)
        yield* sql`
          UPDATE accounts a SET last_used_at = k.at
          FROM (SELECT account_id, max(last_used_at) AS at FROM api_keys WHERE id IN ${sql.in(ids)} GROUP BY account_id) k
          WHERE a.id = k.account_id`
      }))
  })
})

export const layer = Layer.effect(KeyStore, make)
