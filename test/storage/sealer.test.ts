/**
 * The one sealer (store/Sealer.ts): v1 round trip bound to its associated data, refusals that return null, and
 * account keys sealed in the format used before the sealers were merged still open.
 */
import * as Crypto from "node:crypto"
import { describe, expect, it } from "vitest"
import { decodeKey32, open, seal } from "../../src/store/Sealer.js"

const KEY = Crypto.randomBytes(32)

/** The pre-v1 account-key format: base64(iv | tag | ciphertext), written here as the old code wrote it. */
const sealLegacy = (key: Buffer, plaintext: string, associated: string): string => {
  const iv = Crypto.randomBytes(12)
  const cipher = Crypto.createCipheriv("aes-256-gcm", key, iv)
  cipher.setAAD(Buffer.from(associated))
  const body = Buffer.concat([cipher.update(plaintext, "utf8"), cipher.final()])
  return Buffer.concat([iv, cipher.getAuthTag(), body]).toString("base64")
}

describe("store/Sealer", () => {
  it("seals as v1, opens with the same key and associated data only", () => {
    const sealed = seal(KEY, "sk-ws-CANARY", "api_key:7")
    expect(sealed).toMatch(/^v1\.[A-Za-z0-9_-]+$/)
    expect(sealed).not.toContain("CANARY")
    expect(open(KEY, sealed, "api_key:7")).toBe("sk-ws-CANARY")
    expect(open(KEY, sealed, "api_key:8")).toBeNull()
    expect(open(Crypto.randomBytes(32), sealed, "api_key:7")).toBeNull()
    expect(open(KEY.subarray(0, 16), sealed, "api_key:7")).toBeNull()
    const raw = Buffer.from(sealed.slice(3), "base64url")
    raw[14] = raw[14]! ^ 1
    expect(open(KEY, "v1." + raw.toString("base64url"), "api_key:7")).toBeNull()
    expect(open(KEY, "v2." + sealed.slice(3), "api_key:7")).toBeNull()
    expect(() => seal(KEY.subarray(0, 31), "x", "a")).toThrow(/32 bytes/)
  })

  it("opens the unversioned format account keys were sealed in before, bound the same way", () => {
    const legacy = sealLegacy(KEY, "sk-ws-OLDKEY", "api_key:3")
    expect(open(KEY, legacy, "api_key:3")).toBe("sk-ws-OLDKEY")
    expect(open(KEY, legacy, "api_key:4")).toBeNull()
    expect(open(KEY, legacy.slice(0, 20), "api_key:3")).toBeNull()
    expect(open(KEY, "not base64 at all!", "api_key:3")).toBeNull()
  })

  it("decodes 32-byte keys as hex or base64 and nothing else", () => {
    expect(decodeKey32(KEY.toString("hex"))!.equals(KEY)).toBe(true)
    expect(decodeKey32(KEY.toString("base64url"))!.equals(KEY)).toBe(true)
    expect(decodeKey32(` ${KEY.toString("base64")}\n`)!.equals(KEY)).toBe(true)
    expect(decodeKey32(Crypto.randomBytes(31).toString("base64"))).toBeNull()
  })
})
