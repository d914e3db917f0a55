/**
 * BYOK secrets at rest (issue 10, item 3): AES-256-GCM with the credential row (and field) as associated data,
 * versioned encoding, `masked_hint`, the BYOK key from config or the embedded key file, and the BYOK switch.
 */
import { Redacted } from "effect"
import * as Crypto from "node:crypto"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { resolveByok } from "../../src/byok/Switch.js"
import { decodeByokConfig } from "../../src/config/Byok.js"
import {
  BYOK_KEY_FILE,
  createByokKeyFile,
  decodeByokKey,
  loadOrCreateByokKeyFile,
  maskedHint,
  open,
  openMeta,
  openSecret,
  seal,
  sealMeta,
  sealSecret
} from "../../src/byok/Secrets.js"

const KEY = Crypto.randomBytes(32)
const SECRET = "sk-proj-CANARY-3f9a0c1b2d4e5f60718293a4b5c6d7e8"

const tmp = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-byok-secrets-"))
afterAll(() => Fs.rmSync(tmp, { recursive: true, force: true }))

/** Flips one bit of the decoded payload at `index` (negative counts from the end) and re-encodes. */
const flip = (sealed: string, index: number): string => {
  const raw = Buffer.from(sealed.slice(3), "base64url")
  const at = index < 0 ? raw.length + index : index
  raw[at] = raw[at]! ^ 0x01
  return "v1." + raw.toString("base64url")
}

describe("sealing", () => {
  it("round trip of the secret and of the meta object", () => {
    const sealed = sealSecret(KEY, 41, SECRET)
    expect(openSecret(KEY, 41, sealed)).toBe(SECRET)
    const meta = { resource: "my-res", api_version: "2024-10-21", organization_id: "org-ÄÖ" }
    const sealedMeta = sealMeta(KEY, 41, meta)
    expect(openMeta(KEY, 41, sealedMeta)).toEqual(meta)
    expect(openMeta(KEY, 41, sealMeta(KEY, 41, {}))).toEqual({})
  })

  it("versioned compact encoding; neither plaintext nor row id readable in it", () => {
    const sealed = sealSecret(KEY, 41, SECRET)
    expect(sealed).toMatch(/^v1\.[A-Za-z0-9_-]+$/)
    // iv 12 + ciphertext (same length as the UTF-8 plaintext) + tag 16
    expect(Buffer.from(sealed.slice(3), "base64url").length).toBe(12 + Buffer.byteLength(SECRET) + 16)
    expect(sealed).not.toContain("CANARY")
    expect(Buffer.from(sealed.slice(3), "base64url").toString("latin1")).not.toContain("CANARY")
  })

  it("a fresh random IV per seal: equal plaintexts give different ciphertexts", () => {
    const a = sealSecret(KEY, 41, SECRET)
    const b = sealSecret(KEY, 41, SECRET)
    expect(a).not.toBe(b)
    expect(a.slice(3, 19)).not.toBe(b.slice(3, 19))
  })

  it("a ciphertext copied to another row id fails to open", () => {
    const sealed = sealSecret(KEY, 41, SECRET)
    expect(openSecret(KEY, 42, sealed)).toBeNull()
    expect(openSecret(KEY, "41 ", sealed)).toBeNull()
    const sealedMeta = sealMeta(KEY, 41, { resource: "a" })
    expect(openMeta(KEY, 42, sealedMeta)).toBeNull()
  })

  it("the secret and meta ciphertexts of one row cannot be swapped", () => {
    const sealed = seal(KEY, 41, "secret", JSON.stringify({ resource: "x" }))
    expect(openMeta(KEY, 41, sealed)).toBeNull()
    expect(open(KEY, 41, "meta", sealSecret(KEY, 41, SECRET))).toBeNull()
  })

  it("a tampered ciphertext fails (iv, body, tag, truncation, version)", () => {
    const sealed = sealSecret(KEY, 41, SECRET)
    expect(openSecret(KEY, 41, flip(sealed, 0))).toBeNull() // iv
    expect(openSecret(KEY, 41, flip(sealed, 14))).toBeNull() // ciphertext
    expect(openSecret(KEY, 41, flip(sealed, -1))).toBeNull() // tag
    expect(openSecret(KEY, 41, sealed.slice(0, -4))).toBeNull()
    expect(openSecret(KEY, 41, "v2." + sealed.slice(3))).toBeNull()
    expect(openSecret(KEY, 41, sealed.slice(3))).toBeNull()
    expect(openSecret(KEY, 41, "v1.")).toBeNull()
    expect(openSecret(KEY, 41, "v1.!!!")).toBeNull()
  })

  it("another key fails", () => {
    const sealed = sealSecret(KEY, 41, SECRET)
    expect(openSecret(Crypto.randomBytes(32), 41, sealed)).toBeNull()
    expect(openSecret(Buffer.alloc(16), 41, sealed)).toBeNull()
  })

  it("meta that is not an object of strings is refused on open", () => {
    expect(openMeta(KEY, 1, seal(KEY, 1, "meta", "[1,2]"))).toBeNull()
    expect(openMeta(KEY, 1, seal(KEY, 1, "meta", "{\"a\":1}"))).toBeNull()
    expect(openMeta(KEY, 1, seal(KEY, 1, "meta", "not json"))).toBeNull()
  })
})

describe("masked_hint", () => {
  it("first 5 characters plus an ellipsis", () => {
    expect(maskedHint(SECRET)).toBe("sk-pr…")
    expect(maskedHint("sk-ant-api03-abcdef")).toBe("sk-an…")
    expect(maskedHint("AIzaSyA1234567890")).toBe("AIzaS…")
    expect(maskedHint("0123456789")).toBe("01234…")
  })

  it("a short secret shows at most half of itself", () => {
    expect(maskedHint("012345678")).toBe("0123…")
    expect(maskedHint("abcd")).toBe("ab…")
    expect(maskedHint("a")).toBe("…")
  })

  it("counts characters, not UTF-16 units", () => {
    expect(maskedHint("🔑🔑🔑🔑🔑🔑🔑🔑🔑🔑🔑")).toBe("🔑🔑🔑🔑🔑…")
  })
})

describe("the BYOK key", () => {
  it("from config: 64 hex digits, base64 or base64url of 32 bytes", () => {
    const key = Crypto.randomBytes(32)
    expect(decodeByokKey(key.toString("hex")).equals(key)).toBe(true)
    expect(decodeByokKey(key.toString("hex").toUpperCase()).equals(key)).toBe(true)
    expect(decodeByokKey(key.toString("base64")).equals(key)).toBe(true)
    expect(decodeByokKey(key.toString("base64url")).equals(key)).toBe(true)
    expect(decodeByokKey(` ${key.toString("base64")}\n`).equals(key)).toBe(true)
  })

  it("anything else is refused, and the message does not repeat it", () => {
    for (const bad of ["", "short", Crypto.randomBytes(16).toString("hex"), Crypto.randomBytes(31).toString("base64"), "z".repeat(64)]) {
      expect(() => decodeByokKey(bad)).toThrow(/32 bytes/)
      try {
        decodeByokKey(bad)
      } catch (error) {
        if (bad.length > 0) expect((error as Error).message).not.toContain(bad)
      }
    }
  })

  it("embedded key file: created 0600 (folder 0700), read back unchanged, never overwritten", () => {
    const dir = Path.join(tmp, "fresh")
    const key = loadOrCreateByokKeyFile(dir)
    expect(key).toHaveLength(32)
    const file = Path.join(dir, BYOK_KEY_FILE)
    expect(Fs.statSync(file).mode & 0o777).toBe(0o600)
    expect(Fs.statSync(dir).mode & 0o777).toBe(0o700)
    expect(loadOrCreateByokKeyFile(dir).equals(key)).toBe(true)
    expect(Fs.readdirSync(dir)).toEqual([BYOK_KEY_FILE])
  })

  it("a process losing the race to create the file takes the winner's key", () => {
    const dir = Path.join(tmp, "race")
    Fs.mkdirSync(dir)
    const first = Crypto.randomBytes(32)
    Fs.writeFileSync(Path.join(dir, BYOK_KEY_FILE), first.toString("base64") + "\n", { mode: 0o600 })
    expect(createByokKeyFile(dir).equals(first)).toBe(true)
    expect(Fs.readdirSync(dir)).toEqual([BYOK_KEY_FILE])
  })

  it("a damaged key file stops the start instead of being replaced", () => {
    const dir = Path.join(tmp, "damaged")
    Fs.mkdirSync(dir)
    Fs.writeFileSync(Path.join(dir, BYOK_KEY_FILE), "nope\n")
    expect(() => loadOrCreateByokKeyFile(dir)).toThrow(/32 bytes/)
    expect(Fs.readFileSync(Path.join(dir, BYOK_KEY_FILE), "utf8")).toBe("nope\n")
  })

  it("sits beside the key-encryption key file and is a different key", async () => {
    const { loadOrCreateKeyFile } = await import("../../src/config/Live.js")
    const dir = Path.join(tmp, "beside")
    const kek = loadOrCreateKeyFile(dir)
    const byok = loadOrCreateByokKeyFile(dir)
    expect(Fs.readdirSync(dir).sort()).toEqual([BYOK_KEY_FILE, "encryption.key"])
    expect(byok.equals(kek)).toBe(false)
  })
})

describe("the BYOK switch (spec: enabled by the operator, with encryption configured)", () => {
  const key = Crypto.randomBytes(32)

  it("production without a key: off, even when enabled", () => {
    const dir = Path.join(tmp, "prod")
    expect(resolveByok(decodeByokConfig({ enabled: true }), { embedded: false, dataDir: dir })).toEqual({
      enabled: false,
      reason: "no_encryption_key"
    })
    expect(resolveByok(decodeByokConfig({}), { embedded: false, dataDir: dir })).toEqual({
      enabled: false,
      reason: "disabled_by_operator"
    })
    expect(Fs.existsSync(dir)).toBe(false)
  })

  it("production with a key: on only when enabled", () => {
    const config = decodeByokConfig({ enabled: true, encryption_key: key.toString("hex") })
    const on = resolveByok(config, { embedded: false, dataDir: Path.join(tmp, "unused") })
    expect(on.enabled && on.key.equals(key)).toBe(true)
    const off = resolveByok(decodeByokConfig({ encryption_key: key.toString("hex") }), { embedded: false, dataDir: "x" })
    expect(off.enabled).toBe(false)
  })

  it("embedded: on by default with a generated key file; a configured key wins; `enabled: false` creates nothing", () => {
    const dir = Path.join(tmp, "embedded")
    const on = resolveByok(decodeByokConfig({}), { embedded: true, dataDir: dir })
    expect(on.enabled).toBe(true)
    expect(Fs.statSync(Path.join(dir, BYOK_KEY_FILE)).mode & 0o777).toBe(0o600)

    const dir2 = Path.join(tmp, "embedded-configured")
    const configured = resolveByok(
      decodeByokConfig({ encryption_key: key.toString("base64") }),
      { embedded: true, dataDir: dir2 }
    )
    expect(configured.enabled && configured.key.equals(key)).toBe(true)
    expect(Fs.existsSync(dir2)).toBe(false)

    const dir3 = Path.join(tmp, "embedded-off")
    expect(resolveByok(decodeByokConfig({ enabled: false }), { embedded: true, dataDir: dir3 }).enabled).toBe(false)
    expect(Fs.existsSync(dir3)).toBe(false)
  })

  it("the configured key stays redacted in the decoded config", () => {
    const config = decodeByokConfig({ encryption_key: key.toString("hex") })
    expect(Redacted.isRedacted(config.encryption_key)).toBe(true)
    expect(String(config.encryption_key)).not.toContain(key.toString("hex"))
    expect(JSON.stringify(config)).not.toContain(key.toString("hex"))
  })
})
