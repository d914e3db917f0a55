/**
 * Storage of BYOK credentials (`byok_credentials`, migration 0003) over `effect/sql`; the same statements run on
 * PostgreSQL and embedded PGlite.
 *
 * Every mutation of one account's credentials runs in a transaction that first locks the account row
 * (`SELECT ... FOR UPDATE`), so the cap, the `key-N` choice, primary promotion and label reuse are decided
 * one at a time per account, on every replica; the unique indexes of 0003 are the backstop.
 *
 * The secret and `meta` arrive here already sealed (the caller seals with the row id taken by `nextval` before
 * the INSERT, `Secrets.ts`); nothing in this module ever sees a plaintext secret.
 */
import { Context, Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"

export interface CredentialRow {
  readonly id: number
  readonly account_id: string
  readonly provider: string
  readonly auth_scheme: string
  readonly label: string
  readonly secret_ciphertext: string
  readonly meta_ciphertext: string
  readonly masked_hint: string
  readonly base_url_origin: string | null
  readonly region: string | null
  readonly has_org_id: boolean
  readonly has_project_id: boolean
  readonly status: "active" | "rejected" | "revoked"
  readonly is_primary: boolean
  readonly pinned: boolean
  readonly fallback_model_id: string | null
  readonly last_error_code: string | null
  readonly last_verified_at: Date | null
  readonly last_used_at: Date | null
  readonly created_at: Date
  readonly revoked_at: Date | null
}

export interface NewCredential {
  readonly provider: string
  readonly authScheme: string
  /** Null: the lowest unused `key-N` of this account, provider and scheme. */
  readonly label: string | null
  readonly maskedHint: string
  readonly baseUrlOrigin: string | null
  readonly region: string | null
  readonly hasOrgId: boolean
  readonly hasProjectId: boolean
  /** When the probe passed (the Effect clock). */
  readonly verifiedAt: Date
  /** Seals the secret and meta for the row id taken before the INSERT. */
  readonly seal: (rowId: number) => { readonly secret: string; readonly meta: string }
}

export type InsertOutcome =
  | { readonly _tag: "Inserted"; readonly row: CredentialRow }
  | { readonly _tag: "Cap"; readonly max: number }
  | { readonly _tag: "LabelTaken" }

export interface CredentialPatch {
  readonly pinned?: boolean
  /** Only `true` is ever passed: makes this credential its provider's primary. */
  readonly makePrimary?: boolean
  /** `null` clears. */
  readonly fallbackModelId?: string | null
}

/** Prefix of server-assigned labels: `key-1`, `key-2`, ... */
export const AUTO_LABEL_PREFIX = "key-"

/** The lowest `key-N` (N ≥ 1) not among `used`. */
export const lowestFreeLabel = (used: Iterable<string>): string => {
  const taken = new Set<number>()
  for (const label of used) {
    const match = /^key-([1-9][0-9]{0,5})$/.exec(label)
    if (match) taken.add(Number(match[1]))
  }
  let n = 1
  while (taken.has(n)) n++
  return `${AUTO_LABEL_PREFIX}${n}`
}

export class CredentialsRepo extends Context.Service<CredentialsRepo, {
  /** The account's non-revoked credentials: pinned ones first, then oldest first. */
  readonly list: (accountId: string) => Effect.Effect<ReadonlyArray<CredentialRow>>
  /** One of the account's non-revoked credentials, or null (another account's, revoked, or no such id). */
  readonly findOwn: (accountId: string, id: number) => Effect.Effect<CredentialRow | null>
  /** Stores a verified credential under the cap and label rules (see InsertOutcome). */
  readonly insert: (accountId: string, input: NewCredential, maxPerProvider: number) => Effect.Effect<InsertOutcome>
  /** Applies a patch to one of the account's credentials; null when it is not the account's. */
  readonly patch: (accountId: string, id: number, patch: CredentialPatch) => Effect.Effect<CredentialRow | null>
  /**
   * Soft revoke; when it was its provider's primary, another credential of that provider becomes primary: an
   * active one before a rejected one, a pinned one before an unpinned one, then the oldest. Null when it is not
   * the account's.
   */
  readonly revoke: (accountId: string, id: number) => Effect.Effect<CredentialRow | null>
  /** A successful listing: `rejected` back to `active`, `last_error_code` cleared, `last_verified_at` stamped. */
  readonly markVerified: (accountId: string, id: number) => Effect.Effect<CredentialRow | null>
  /**
   * A dispatch failure that condemns the credential (auth, permission): `active` -> `rejected` with the code.
   * True when it changed (an already rejected or revoked credential stays as it is).
   */
  readonly markRejected: (id: number, code: string) => Effect.Effect<boolean>
  /** Last-used stamps written in one statement per batch. */
  readonly touch: (touches: ReadonlyArray<{ readonly id: number; readonly at: Date }>) => Effect.Effect<void>
  /** `accounts.byok_fallback_override`; false when the account row is gone. */
  readonly setFallbackOverride: (accountId: string, value: boolean | null) => Effect.Effect<boolean>
}>()("wellspring/byok/CredentialsRepo") {}

/** bigserial ids come back as strings from some drivers; the API shows integers. */
const normalize = (row: CredentialRow): CredentialRow => ({ ...row, id: Number(row.id) })

export const make = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const orDie = <A, E, R>(effect: Effect.Effect<A, E, R>) => Effect.orDie(effect)
  const first = (rows: ReadonlyArray<CredentialRow>) => (rows[0] === undefined ? null : normalize(rows[0]))

  /** Serializes the account's BYOK mutations for the rest of the transaction. */
  const lockAccount = (accountId: string) => sql`SELECT id FROM accounts WHERE id = ${accountId} FOR UPDATE`

  const findOwn = (accountId: string, id: number) =>
    sql<CredentialRow>`
      SELECT * FROM byok_credentials
      WHERE id = ${id} AND account_id = ${accountId} AND status <> 'revoked'`.pipe(Effect.map(first))

  return CredentialsRepo.of({
    list: (accountId) =>
      orDie(sql<CredentialRow>`
        SELECT * FROM byok_credentials
        WHERE account_id = ${accountId} AND status <> 'revoked' ORDER BY pinned DESC, id`).pipe(
        Effect.map((rows) => rows.map(normalize))
      ),
    findOwn: (accountId, id) => orDie(findOwn(accountId, id)),
    insert: (accountId, input, maxPerProvider) =>
      orDie(sql.withTransaction(Effect.gen(function*() {
        yield* lockAccount(accountId)
        const same = yield* sql<{ label: string }>`
          SELECT label FROM byok_credentials
          WHERE account_id = ${accountId} AND provider = ${input.provider} AND auth_scheme = ${input.authScheme}
            AND status <> 'revoked'`
        if (same.length >= maxPerProvider) return { _tag: "Cap", max: maxPerProvider } as InsertOutcome
        const labels = same.map((r) => r.label)
        if (input.label !== null && labels.includes(input.label)) return { _tag: "LabelTaken" } as InsertOutcome
        const label = input.label ?? lowestFreeLabel(labels)
        const primaries = yield* sql<{ id: number }>`
          SELECT id FROM byok_credentials
          WHERE account_id = ${accountId} AND provider = ${input.provider} AND is_primary AND status <> 'revoked'`
        const [{ id }] = (yield* sql<{ id: number }>`
          SELECT nextval(pg_get_serial_sequence('byok_credentials', 'id'))::float8 AS id`) as unknown as [
            { id: number }
          ]
        const rowId = Number(id)
        const sealed = input.seal(rowId)
        const rows = yield* sql<CredentialRow>`
          INSERT INTO byok_credentials ${
          sql.insert({
            id: rowId,
            account_id: accountId,
            provider: input.provider,
            auth_scheme: input.authScheme,
            label,
            secret_ciphertext: sealed.secret,
            meta_ciphertext: sealed.meta,
            masked_hint: input.maskedHint,
            base_url_origin: input.baseUrlOrigin,
            region: input.region,
            has_org_id: input.hasOrgId,
            has_project_id: input.hasProjectId,
            status: "active",
            is_primary: primaries.length === 0,
            last_verified_at: input.verifiedAt
          })
        } RETURNING *`
        return { _tag: "Inserted", row: normalize(rows[0]!) } as InsertOutcome
      }))),
    patch: (accountId, id, patch) =>
      orDie(sql.withTransaction(Effect.gen(function*() {
        yield* lockAccount(accountId)
        const row = yield* findOwn(accountId, id)
        if (row === null) return null
        if (patch.makePrimary === true && !row.is_primary) {
          yield* sql`
            UPDATE byok_credentials SET is_primary = false
            WHERE account_id = ${accountId} AND provider = ${row.provider} AND is_primary AND status <> 'revoked'`
          yield* sql`UPDATE byok_credentials SET is_primary = true WHERE id = ${id}`
        }
        if (patch.pinned !== undefined) yield* sql`UPDATE byok_credentials SET pinned = ${patch.pinned} WHERE id = ${id}`
        if (patch.fallbackModelId !== undefined) {
          yield* sql`UPDATE byok_credentials SET fallback_model_id = ${patch.fallbackModelId} WHERE id = ${id}`
        }
        return yield* findOwn(accountId, id)
      }))),
    revoke: (accountId, id) =>
      orDie(sql.withTransaction(Effect.gen(function*() {
        yield* lockAccount(accountId)
        const row = yield* findOwn(accountId, id)
        if (row === null) return null
        const revoked = first(
          yield* sql<CredentialRow>`
            UPDATE byok_credentials SET status = 'revoked', revoked_at = now(), is_primary = false
            WHERE id = ${id} RETURNING *`
        )
        if (row.is_primary) {
          yield* sql`
            UPDATE byok_credentials SET is_primary = true
            WHERE id = (
              SELECT id FROM byok_credentials
              WHERE account_id = ${accountId} AND provider = ${row.provider} AND status <> 'revoked'
              ORDER BY (status = 'active') DESC, pinned DESC, id LIMIT 1)`
        }
        return revoked
      }))),
    markVerified: (accountId, id) =>
      orDie(sql<CredentialRow>`
        UPDATE byok_credentials SET status = 'active', last_error_code = NULL, last_verified_at = now()
        WHERE id = ${id} AND account_id = ${accountId} AND status <> 'revoked' RETURNING *`).pipe(Effect.map(first)),
    markRejected: (id, code) =>
      orDie(sql`
        UPDATE byok_credentials SET status = 'rejected', last_error_code = ${code.slice(0, 64)}
        WHERE id = ${id} AND status = 'active' RETURNING id`).pipe(Effect.map((rows) => rows.length > 0)),
    touch: (touches) =>
      touches.length === 0 ? Effect.void : orDie(Effect.forEach(
        touches,
        (t) => sql`UPDATE byok_credentials SET last_used_at = ${t.at} WHERE id = ${t.id} AND status <> 'revoked'`,
        { discard: true }
      )),
    setFallbackOverride: (accountId, value) =>
      orDie(sql`UPDATE accounts SET byok_fallback_override = ${value} WHERE id = ${accountId} RETURNING id`).pipe(
        Effect.map((rows) => rows.length > 0)
      )
  })
})

export const layer = Layer.effect(CredentialsRepo, make)
