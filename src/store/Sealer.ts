/**
 * Secrets at rest: the one AES-256-GCM sealer, and the one reader and creator of 32-byte key files.
 *
 * Sealing binds each ciphertext to associated data naming where it is stored (a row id and field), so a
 * ciphertext copied to another row or field fails to open. Users: account keys kept for reveal
 * (`accounts/AccountsRepo.ts`, AAD from the key row) and BYOK credentials (`byok/Secrets.ts`).
 *
 * Encoding (versioned, ASCII): `v1.` + base64url(iv(12) | ciphertext | tag(16)). `open` also reads the format
 * account keys were sealed in before there was one sealer, base64(iv(12) | tag(16) | ciphertext) with no prefix,
 * so existing rows stay readable; nothing writes it any more.
 *
 * Key files (`<data_dir>/encryption.key`, `<data_dir>/byok.key`): 0600, base64 of 32 random bytes, created
 * complete or not at all (a private temporary file hard-linked into place, which fails if the file exists), so two
 * processes starting together end up with the same key; an existing file always wins and is never overwritten.
 */
import * as Crypto from "node:crypto"
import * as Fs from "node:fs"
import * as Path from "node:path"

export const SEALED_VERSION = "v1"
const PREFIX = `${SEALED_VERSION}.`
const IV_BYTES = 12
const TAG_BYTES = 16
const KEY_BYTES = 32

/** Seals `plaintext` under `key` (32 bytes, else it throws), bound to `associated`. */
export const seal = (key: Buffer, plaintext: string, associated: string): string => {
  if (key.length !== KEY_BYTES) throw new Error("a sealing key must be exactly 32 bytes")
  const iv = Crypto.randomBytes(IV_BYTES)
  const cipher = Crypto.createCipheriv("aes-256-gcm", key, iv, { authTagLength: TAG_BYTES })
  cipher.setAAD(Buffer.from(associated, "utf8"))
  const body = Buffer.concat([cipher.update(plaintext, "utf8"), cipher.final()])
  return PREFIX + Buffer.concat([iv, body, cipher.getAuthTag()]).toString("base64url")
}

const decipher = (key: Buffer, iv: Buffer, tag: Buffer, body: Buffer, associated: string): string | null => {
  try {
    const d = Crypto.createDecipheriv("aes-256-gcm", key, iv, { authTagLength: TAG_BYTES })
    d.setAAD(Buffer.from(associated, "utf8"))
    d.setAuthTag(tag)
    return Buffer.concat([d.update(body), d.final()]).toString("utf8")
  } catch {
    return null
  }
}

/** The plaintext; null when damaged, bound to other associated data, sealed under another key, or unknown. */
export const open = (key: Buffer, sealed: string, associated: string): string | null => {
  if (key.length !== KEY_BYTES) return null
  if (sealed.startsWith(PREFIX)) {
    const raw = Buffer.from(sealed.slice(PREFIX.length), "base64url")
    if (raw.length < IV_BYTES + TAG_BYTES) return null
    return decipher(
      key,
      raw.subarray(0, IV_BYTES),
      raw.subarray(raw.length - TAG_BYTES),
      raw.subarray(IV_BYTES, raw.length - TAG_BYTES),
      associated
    )
  }
  // The unversioned format of account keys sealed before v1 (read only).
  if (!/^[A-Za-z0-9+/]+={0,2}$/.test(sealed)) return null
  const raw = Buffer.from(sealed, "base64")
  if (raw.length <= IV_BYTES + TAG_BYTES) return null
  return decipher(
    key,
    raw.subarray(0, IV_BYTES),
    raw.subarray(IV_BYTES, IV_BYTES + TAG_BYTES),
    raw.subarray(IV_BYTES + TAG_BYTES),
    associated
  )
}

/** A 32-byte key as written in config or env: 64 hex digits, or base64 / base64url (padding optional). */
export const decodeKey32 = (text: string): Buffer | null => {
  const trimmed = text.trim()
  if (/^[0-9a-fA-F]{64}$/.test(trimmed)) return Buffer.from(trimmed, "hex")
  if (/^[A-Za-z0-9+/_-]{43}=?$/.test(trimmed)) {
    const key = Buffer.from(trimmed.replace(/-/g, "+").replace(/_/g, "/"), "base64")
    if (key.length === KEY_BYTES) return key
  }
  return null
}

/** `decodeKey32`, throwing `<name> must be 32 bytes, ...` for a malformed key (a boot error). */
export const decodeKey32OrThrow = (text: string, name: string): Buffer => {
  const key = decodeKey32(text)
  if (key === null) throw new Error(`${name} must be 32 bytes, as 64 hex digits or base64`)
  return key
}

/** The key in `file`; null when the file does not exist; throws when it holds no valid key. */
const readKeyFile = (file: string, name: string): Buffer | null => {
  try {
    return decodeKey32OrThrow(Fs.readFileSync(file, "utf8"), name)
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return null
    throw error
  }
}

/** The key another process created first. */
const readExisting = (file: string, name: string): Buffer => {
  const key = readKeyFile(file, name)
  if (key === null) throw new Error(`${file} was removed while being created`)
  return key
}

/**
 * Creates `<dataDir>/<fileName>` (0600) with a new key, unless the file exists: then the key in it wins and is
 * returned. `name` names the key in errors (`encryption_key`, `byok.encryption_key`).
 */
export const createKeyFile = (dataDir: string, fileName: string, name: string): Buffer => {
  const file = Path.resolve(dataDir, fileName)
  Fs.mkdirSync(dataDir, { recursive: true, mode: 0o700 })
  const key = Crypto.randomBytes(KEY_BYTES)
  const body = key.toString("base64") + "\n"
  const tmp = `${file}.${process.pid}.${Crypto.randomBytes(6).toString("hex")}.tmp`
  Fs.writeFileSync(tmp, body, { flag: "wx", mode: 0o600 })
  try {
    Fs.linkSync(tmp, file)
    return key
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code
    if (code === "EEXIST") return readExisting(file, name)
    if (code !== "EPERM" && code !== "ENOTSUP" && code !== "EOPNOTSUPP") throw error
  } finally {
    Fs.rmSync(tmp, { force: true })
  }
  // A file system without hard links: exclusive create of the file itself.
  try {
    Fs.writeFileSync(file, body, { flag: "wx", mode: 0o600 })
    return key
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "EEXIST") return readExisting(file, name)
    throw error
  }
}

/** The key in `<dataDir>/<fileName>`, created there on the first start. */
export const loadOrCreateKeyFile = (dataDir: string, fileName: string, name: string): Buffer =>
  readKeyFile(Path.resolve(dataDir, fileName), name) ?? createKeyFile(dataDir, fileName, name)
