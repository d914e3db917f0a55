/**
 * BYOK credential secrets at rest: the provider secret and the `meta` object of a credential are sealed with
 * AES-256-GCM under the BYOK key, each with associated data naming the credential row and the field
 * (`byok_credential:<id>:secret` / `:meta`), so a ciphertext copied to another row, or swapped between the two
 * fields, fails to open.
 *
 * Encoding (versioned, compact, ASCII): `v1.` + base64url(iv(12) | ciphertext | tag(16)). A later version (a key
 * id for rotation, another cipher) gets a new prefix; `open` refuses versions it does not know.
 *
 * The key: 32 bytes from config (base64 or hex); in embedded mode generated once into `<data_dir>/byok.key`
 * (0600), next to the key-encryption key `encryption.key`, created the same way (complete or not at all; a
 * process that loses the race to create it takes the winner's key). No key: BYOK is off.
 */
import * as Crypto from "node:crypto"
import * as Fs from "node:fs"
import * as Path from "node:path"

export const SEALED_VERSION = "v1"
const PREFIX = `${SEALED_VERSION}.`
const IV_BYTES = 12
const TAG_BYTES = 16

export type SealedField = "secret" | "meta"

const associated = (rowId: number | string, field: SealedField): Buffer =>
  Buffer.from(`byok_credential:${rowId}:${field}`, "utf8")

const checkKey = (key: Buffer): void => {
  if (key.length !== 32) throw new Error("the BYOK key must be exactly 32 bytes")
}

/** Seals one field of credential `rowId`. */
export const seal = (key: Buffer, rowId: number | string, field: SealedField, plaintext: string): string => {
  checkKey(key)
  const iv = Crypto.randomBytes(IV_BYTES)
  const cipher = Crypto.createCipheriv("aes-256-gcm", key, iv, { authTagLength: TAG_BYTES })
  cipher.setAAD(associated(rowId, field))
  const body = Buffer.concat([cipher.update(plaintext, "utf8"), cipher.final()])
  return PREFIX + Buffer.concat([iv, body, cipher.getAuthTag()]).toString("base64url")
}

/** Opens one field of credential `rowId`; null when damaged, moved to another row or field, or another key's. */
export const open = (key: Buffer, rowId: number | string, field: SealedField, sealed: string): string | null => {
  if (key.length !== 32 || !sealed.startsWith(PREFIX)) return null
  const raw = Buffer.from(sealed.slice(PREFIX.length), "base64url")
  if (raw.length < IV_BYTES + TAG_BYTES) return null
  try {
    const decipher = Crypto.createDecipheriv("aes-256-gcm", key, raw.subarray(0, IV_BYTES), { authTagLength: TAG_BYTES })
    decipher.setAAD(associated(rowId, field))
    decipher.setAuthTag(raw.subarray(raw.length - TAG_BYTES))
    return Buffer.concat([decipher.update(raw.subarray(IV_BYTES, raw.length - TAG_BYTES)), decipher.final()])
      .toString("utf8")
  } catch {
    return null
  }
}

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

/** The BYOK key from its configured text: 64 hex digits, or base64 / base64url of exactly 32 bytes. */
export const decodeByokKey = (text: string): Buffer => {
  const trimmed = text.trim()
  if (/^[0-9a-fA-F]{64}$/.test(trimmed)) return Buffer.from(trimmed, "hex")
  if (/^[A-Za-z0-9+/_-]{43}={0,1}$/.test(trimmed)) {
    const key = Buffer.from(trimmed.replace(/-/g, "+").replace(/_/g, "/"), "base64")
    if (key.length === 32) return key
  }
  throw new Error("byok.encryption_key must be 32 bytes, as 64 hex digits or base64")
}

export const BYOK_KEY_FILE = "byok.key"

const readKeyFile = (file: string): Buffer | null => {
  try {
    return decodeByokKey(Fs.readFileSync(file, "utf8"))
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return null
    throw error
  }
}

const readExisting = (file: string): Buffer => {
  const key = readKeyFile(file)
  if (key === null) throw new Error(`${file} was removed while being created`)
  return key
}

/**
 * Creates `<data_dir>/byok.key` (0600) with a new key unless it exists (then its key wins, never overwritten).
 * Written to a private temporary file and hard-linked into place, so the file appears complete or not at all and
 * two processes starting together end with the same key (the pattern of `config/Live.ts` `createKeyFile`).
 */
export const createByokKeyFile = (dataDir: string): Buffer => {
  const file = Path.resolve(dataDir, BYOK_KEY_FILE)
  Fs.mkdirSync(dataDir, { recursive: true, mode: 0o700 })
  const key = Crypto.randomBytes(32)
  const body = key.toString("base64") + "\n"
  const tmp = `${file}.${process.pid}.${Crypto.randomBytes(6).toString("hex")}.tmp`
  Fs.writeFileSync(tmp, body, { flag: "wx", mode: 0o600 })
  try {
    Fs.linkSync(tmp, file)
    return key
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code
    if (code === "EEXIST") return readExisting(file)
    if (code !== "EPERM" && code !== "ENOTSUP" && code !== "EOPNOTSUPP") throw error
  } finally {
    Fs.rmSync(tmp, { force: true })
  }
  try {
    Fs.writeFileSync(file, body, { flag: "wx", mode: 0o600 })
    return key
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "EEXIST") return readExisting(file)
    throw error
  }
}

/** The embedded BYOK key: read from `<data_dir>/byok.key`, or created there on the first start. */
export const loadOrCreateByokKeyFile = (dataDir: string): Buffer =>
  readKeyFile(Path.resolve(dataDir, BYOK_KEY_FILE)) ?? createByokKeyFile(dataDir)
