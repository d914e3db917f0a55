import * as Crypto from "node:crypto"

const BASE62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"

/** 43 base62 characters (~256 bits) from the CSPRNG, without modulo bias. */
export const randomBase62 = (length = 43): string => {
  let out = ""
  while (out.length < length) {
    for (const byte of Crypto.randomBytes(length * 2)) {
      if (byte < 248) out += BASE62[byte % 62]
      if (out.length === length) break
    }
  }
  return out
}

export const LEGACY_PREFIX = "ws-"

export const generateKey = (prefix: string): string => prefix + randomBase62()

export const hashKey = (key: string): string => Crypto.createHash("sha256").update(key).digest("hex")

export const keyPrefixOf = (key: string): string => key.slice(0, 16)

/** Shape check before any lookup: a known prefix followed by base62. */
export const isWellFormed = (key: string, currentPrefix: string): boolean => {
  const prefix = key.startsWith(currentPrefix) ? currentPrefix : key.startsWith(LEGACY_PREFIX) ? LEGACY_PREFIX : null
  if (prefix === null) return false
  const body = key.slice(prefix.length)
  return body.length >= 16 && body.length <= 128 && /^[A-Za-z0-9]+$/.test(body)
}

export const isLegacyKey = (key: string, currentPrefix: string): boolean =>
  !key.startsWith(currentPrefix) && key.startsWith(LEGACY_PREFIX)

/** Constant-time comparison of two hex digests. */
export const sameDigest = (a: string, b: string): boolean =>
  a.length === b.length && Crypto.timingSafeEqual(Buffer.from(a), Buffer.from(b))

/**
 * AES-256-GCM sealing with associated data (e.g. a row id), so a ciphertext moved to another row fails.
 * Output: base64 of iv(12) | tag(16) | ciphertext.
 */
export const seal = (key: Buffer, plaintext: string, associated: string): string => {
  const iv = Crypto.randomBytes(12)
  const cipher = Crypto.createCipheriv("aes-256-gcm", key, iv)
  cipher.setAAD(Buffer.from(associated))
  const body = Buffer.concat([cipher.update(plaintext, "utf8"), cipher.final()])
  return Buffer.concat([iv, cipher.getAuthTag(), body]).toString("base64")
}

/** Returns null when the ciphertext is damaged, moved, or sealed with another key. */
export const open = (key: Buffer, sealed: string, associated: string): string | null => {
  try {
    const raw = Buffer.from(sealed, "base64")
    if (raw.length < 29) return null
    const decipher = Crypto.createDecipheriv("aes-256-gcm", key, raw.subarray(0, 12))
    decipher.setAAD(Buffer.from(associated))
    decipher.setAuthTag(raw.subarray(12, 28))
    return Buffer.concat([decipher.update(raw.subarray(28)), decipher.final()]).toString("utf8")
  } catch {
    return null
  }
}

/** A 32-byte key as written in config or env: 64 hex digits, or base64 / base64url (padding optional). */
export const decodeKey32 = (text: string): Buffer | null => {
  const trimmed = text.trim()
  if (/^[0-9a-fA-F]{64}$/.test(trimmed)) return Buffer.from(trimmed, "hex")
  if (/^[A-Za-z0-9+/_-]{43}=?$/.test(trimmed)) {
    const key = Buffer.from(trimmed.replace(/-/g, "+").replace(/_/g, "/"), "base64")
    if (key.length === 32) return key
  }
  return null
}

/** The key-encryption key (config, env or the embedded key file): hex or base64 of 32 bytes. */
export const decodeEncryptionKey = (text: string): Buffer => {
  const key = decodeKey32(text)
  if (key === null) throw new Error("encryption_key must be 32 bytes, as 64 hex digits or base64")
  return key
}
