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

/** One-shot `crypto.hash`: half the cost of a `Hash` object, on every authenticated request. */
export const hashKey = (key: string): string => Crypto.hash("sha256", key, "hex")

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
