import { Clock, Effect } from "effect"
import { Auth, type Caller } from "../auth/Auth.js"
import { Settings } from "../config/Live.js"
import { fail, type GatewayError } from "../errors/Catalog.js"
import type { Admission } from "../quota/Admission.js"
import { type AccountRow, AccountsRepo, DEFAULT_KEY_LABEL, type KeyRow, MAX_ACTIVE_KEYS, truncateLabel } from "./AccountsRepo.js"
import { enforce, REVEAL_LIMIT, ROTATE_COOLDOWN_MS } from "./Limits.js"

/** The spec's API key record: never plaintext, never a hash. */
export interface KeyRecord {
  readonly id: number
  readonly label: string
  readonly key_prefix: string | null
  readonly created_at: number
  readonly last_used_at: number | null
  readonly revealable: boolean
  readonly legacy: boolean
}

/** Legacy `ws-` keys and rows without a stored prefix. */
export const isLegacyRow = (row: KeyRow): boolean => row.legacy || row.key_prefix === null

/** Only current-prefix keys sealed with a key-encryption key that is still configured. */
export const isRevealable = (row: KeyRow, encryptionConfigured: boolean): boolean =>
  encryptionConfigured && !isLegacyRow(row) && row.ciphertext !== null

export const keyRecord = (row: KeyRow, encryptionConfigured: boolean): KeyRecord => ({
  id: row.id,
  label: row.label,
  key_prefix: row.key_prefix,
  created_at: row.created_at.getTime(),
  last_used_at: row.last_used_at === null ? null : row.last_used_at.getTime(),
  revealable: isRevealable(row, encryptionConfigured),
  legacy: isLegacyRow(row)
})

/** `:id` must be a positive integer (decimal digits, no sign, no leading zero), else 400 without a code. */
export const parseKeyId = (raw: string | undefined): Effect.Effect<number, GatewayError> => {
  if (raw === undefined || !/^[1-9][0-9]{0,15}$/.test(raw)) return Effect.fail(fail("invalid_id"))
  const id = Number(raw)
  return Number.isSafeInteger(id) ? Effect.succeed(id) : Effect.fail(fail("invalid_id"))
}

/** Label of a create request: optional; a missing, non-string or blank value gives the default. */
export const labelFrom = (body: unknown): string => {
  const label = typeof body === "object" && body !== null ? (body as Record<string, unknown>).label : undefined
  if (typeof label !== "string" || label.trim() === "") return DEFAULT_KEY_LABEL
  return truncateLabel(label.trim())
}

const via = (caller: Caller) => (caller.key === null ? "session" : "key")

const requireActive = (account: AccountRow): Effect.Effect<void, GatewayError> =>
  account.status === "active" ? Effect.void : Effect.fail(fail("account_unlinked"))

/** `GET /api/user/me/keys`: active keys, oldest first. */
export const listKeys = (caller: Caller) =>
  Effect.gen(function*() {
    const repo = yield* AccountsRepo
    const settings = yield* Settings
    const rows = yield* repo.listActiveKeys(caller.account.id)
    return { keys: rows.map((row) => keyRecord(row, settings.encryptionKey !== null)), max: MAX_ACTIVE_KEYS }
  })

/**
 * `POST /api/user/me/keys`: active account, fewer than `max` keys; the plaintext is returned once. The body is
 * read only once the account is known to be active.
 */
export const createKey = <R>(
  caller: Caller,
  readBody: Effect.Effect<unknown, GatewayError, R>
): Effect.Effect<{ readonly apiKey: string }, GatewayError, AccountsRepo | R> =>
  Effect.gen(function*() {
    const repo = yield* AccountsRepo
    yield* requireActive(caller.account)
    const body = yield* readBody
    const created = yield* repo.createKeyCapped(caller.account.id, labelFrom(body), MAX_ACTIVE_KEYS)
    if (created === null) return yield* Effect.fail(fail("key_cap_reached"))
    yield* repo.audit(caller.account.id, "key.create", String(created.row.id), { key_id: created.row.id, via: via(caller) })
    return { apiKey: created.key }
  })

/**
 * `DELETE /api/user/me/keys/:id`: revokes, then drops the key from every replica's auth cache
 * (locally and through PG NOTIFY), so its very next `/v1` request is 401.
 */
export const deleteKey = (caller: Caller, rawId: string | undefined): Effect.Effect<void, GatewayError, AccountsRepo | Auth> =>
  Effect.gen(function*() {
    const repo = yield* AccountsRepo
    const auth = yield* Auth
    const id = yield* parseKeyId(rawId)
    const revoked = yield* repo.revokeKey(caller.account.id, id)
    if (revoked === null) return yield* Effect.fail(fail("key_not_found"))
    yield* auth.invalidateKeys([revoked.key_hash])
    yield* repo.audit(caller.account.id, "key.delete", String(id), { key_id: id, via: via(caller) })
  })

/** `GET /api/user/me/keys/:id/reveal`: 30 per minute; revealable keys only; audited without the plaintext. */
export const revealKey = (
  caller: Caller,
  rawId: string | undefined
): Effect.Effect<{ readonly key: string }, GatewayError, AccountsRepo | Settings | Admission> =>
  Effect.gen(function*() {
    const repo = yield* AccountsRepo
    const settings = yield* Settings
    const id = yield* parseKeyId(rawId)
    yield* enforce(REVEAL_LIMIT, caller.account.id)
    const row = yield* repo.findOwnActiveKey(caller.account.id, id)
    if (row === null) return yield* Effect.fail(fail("key_not_found"))
    if (!isRevealable(row, settings.encryptionKey !== null)) return yield* Effect.fail(fail("key_not_revealable"))
    const plaintext = repo.reveal(row)
    if (plaintext === null) return yield* Effect.fail(fail("key_not_revealable", { detail: "ciphertext did not open" }))
    yield* repo.audit(caller.account.id, "key.reveal", String(id), { key_id: id, via: via(caller) })
    return { key: plaintext }
  })

/**
 * `POST /api/user/me/rotate-key`: active account; at most once per 60 s (checked and stamped atomically in
 * PostgreSQL, so it holds across replicas; the time comes from the Effect clock). Revokes every active key,
 * issues one labelled `기본`, invalidates the revoked keys everywhere, audits. Sessions are untouched.
 */
export const rotateKey = (caller: Caller): Effect.Effect<{ readonly apiKey: string }, GatewayError, AccountsRepo | Auth> =>
  Effect.gen(function*() {
    const repo = yield* AccountsRepo
    const auth = yield* Auth
    yield* requireActive(caller.account)
    const now = yield* Clock.currentTimeMillis
    const rotated = yield* repo.rotateGuarded(caller.account.id, new Date(now), new Date(now - ROTATE_COOLDOWN_MS))
    if (rotated === null) return yield* Effect.fail(fail("rotate_cooldown"))
    yield* auth.invalidateKeys(rotated.revoked.map((row) => row.key_hash))
    yield* repo.audit(caller.account.id, "key.rotate", String(rotated.row.id), {
      key_id: rotated.row.id,
      revoked: rotated.revoked.map((row) => row.id),
      via: via(caller)
    })
    return { apiKey: rotated.key }
  })
