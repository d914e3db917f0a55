/**
 * BYOK credential secrets at rest: the provider secret and the `meta` object of a credential are sealed with
 * AES-256-GCM under the BYOK key, each with associated data naming the credential row and the field
 * (`byok_credential:<id>:secret` / `:meta`), so a ciphertext copied to another row, or swapped between the two
 * fields, fails to open.
 *
 * The sealing itself is `store/Sealer.ts` (encoding `v1.` + base64url(iv | ciphertext | tag)); a credential field
 * accepts only that encoding.
 *
 * The key: 32 bytes from config (base64 or hex); in embedded mode generated once into `<data_dir>/byok.key`
 * (0600), next to the key-encryption key `encryption.key`, created the same way (complete or not at all; a
 * process that loses the race to create it takes the winner's key). No key: BYOK is off.
 */
import { createKeyFile, decodeKey32OrThrow, loadOrCreateKeyFile, open as openSealed, seal as sealText } from "../store/Sealer.js"

export type SealedField = "secret" | "meta"

const associated = (rowId: number | string, field: SealedField): string => `byok_credential:${rowId}:${field}`

/** Seals one field of credential `rowId`. */
export const seal = (key: Buffer, rowId: number | string, field: SealedField, plaintext: string): string =>
  sealText(key, plaintext, associated(rowId, field))

/** Opens one field of credential `rowId`; null when damaged, moved to another row or field, or another key's. */
export const open = (key: Buffer, rowId: number | string, field: SealedField, sealed: string): string | null =>
  sealed.startsWith("v1.") ? openSealed(key, sealed, associated(rowId, field)) : null

export type Meta = Readonly<Record<string, string>>

export const sealSecret = (key: Buffer, rowId: number | string, secret: string): string =>
  seal(key, rowId, "secret", secret)

export const openSecret = (key: Buffer, rowId: number | string, sealed: string): string | null =>
  open(key, rowId, "secret", sealed)

/** The whole `meta` object as one sealed JSON document (keys sorted, so equal objects seal equal plaintexts). */
export const sealMeta = (key: Buffer, rowId: number | string, meta: Meta): string => {
  const sorted: Record<string, string> = {}
  for (const name of Object.keys(meta).sort()) sorted[name] = meta[name]!
  return seal(key, rowId, "meta", JSON.stringify(sorted))
}

export const openMeta = (key: Buffer, rowId: number | string, sealed: string): Meta | null => {
  const text = open(key, rowId, "meta", sealed)
  if (text === null) return null
  try {
    const parsed: unknown = JSON.parse(text)
    if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) return null
    const out: Record<string, string> = {}
    for (const [name, value] of Object.entries(parsed)) {
      if (typeof value !== "string") return null
      out[name] = value
    }
    return out
  } catch {
    return null
  }
}

/** Characters of the secret shown in `masked_hint`. */
export const HINT_CHARS = 5

/**
 * `masked_hint`: the first 5 characters of the secret plus "…" (spec). A secret shorter than 10 characters shows
 * at most half of itself, so the hint never gives most of a short secret away.
 */
export const maskedHint = (secret: string): string => {
  const chars = Array.from(secret)
  return chars.slice(0, Math.min(HINT_CHARS, Math.floor(chars.length / 2))).join("") + "…"
}

const KEY_NAME = "byok.encryption_key"

/** The BYOK key from its configured text: 64 hex digits, or base64 / base64url of exactly 32 bytes. */
export const decodeByokKey = (text: string): Buffer => decodeKey32OrThrow(text, KEY_NAME)

export const BYOK_KEY_FILE = "byok.key"

/** Creates `<data_dir>/byok.key` (0600) unless it exists (then its key wins); see `store/Sealer.ts`. */
export const createByokKeyFile = (dataDir: string): Buffer => createKeyFile(dataDir, BYOK_KEY_FILE, KEY_NAME)

/** The embedded BYOK key: read from `<data_dir>/byok.key`, or created there on the first start. */
export const loadOrCreateByokKeyFile = (dataDir: string): Buffer => loadOrCreateKeyFile(dataDir, BYOK_KEY_FILE, KEY_NAME)
