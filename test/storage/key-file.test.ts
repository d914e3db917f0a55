/**
 * The embedded key-encryption key file (issue #8, finding 12): created exclusively and private (0600); an
 * existing file is read, never replaced; a process that loses the race to create it takes the winner's key.
 */
import * as Crypto from "node:crypto"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { createKeyFile, loadOrCreateKeyFile } from "../../src/config/Live.js"

const tmp = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-keyfile-"))
afterAll(() => Fs.rmSync(tmp, { recursive: true, force: true }))

describe("encryption key file", () => {
  it("is created 0600 in a 0700 folder, and read back unchanged on the next start", () => {
    const dir = Path.join(tmp, "fresh")
    const key = loadOrCreateKeyFile(dir)
    expect(key).toHaveLength(32)
    const file = Path.join(dir, "encryption.key")
    expect(Fs.statSync(file).mode & 0o777).toBe(0o600)
    expect(Fs.statSync(dir).mode & 0o777).toBe(0o700)
    expect(Fs.readFileSync(file, "utf8")).toBe(key.toString("base64") + "\n")
    expect(loadOrCreateKeyFile(dir).equals(key)).toBe(true)
    // No temporary file is left behind.
    expect(Fs.readdirSync(dir)).toEqual(["encryption.key"])
  })

  it("an existing key is used, never overwritten", () => {
    const dir = Path.join(tmp, "existing")
    Fs.mkdirSync(dir)
    const mine = Crypto.randomBytes(32)
    Fs.writeFileSync(Path.join(dir, "encryption.key"), mine.toString("base64") + "\n", { mode: 0o600 })
    expect(loadOrCreateKeyFile(dir).equals(mine)).toBe(true)
    expect(Fs.readFileSync(Path.join(dir, "encryption.key"), "utf8").trim()).toBe(mine.toString("base64"))
  })

  it("a damaged key file stops the start instead of being replaced", () => {
    const dir = Path.join(tmp, "damaged")
    Fs.mkdirSync(dir)
    Fs.writeFileSync(Path.join(dir, "encryption.key"), "not a key\n")
    expect(() => loadOrCreateKeyFile(dir)).toThrow(/32 bytes/)
    expect(Fs.readFileSync(Path.join(dir, "encryption.key"), "utf8")).toBe("not a key\n")
  })

  it("creating loses to a file that appeared meanwhile: the other process's key is returned, not replaced", () => {
    // What the second of two processes starting together sees: the file was created after its existence check.
    const dir = Path.join(tmp, "race")
    Fs.mkdirSync(dir)
    const first = Crypto.randomBytes(32)
    Fs.writeFileSync(Path.join(dir, "encryption.key"), first.toString("base64") + "\n", { mode: 0o600 })
    expect(createKeyFile(dir).equals(first)).toBe(true)
    expect(Fs.readFileSync(Path.join(dir, "encryption.key"), "utf8")).toBe(first.toString("base64") + "\n")
    expect(Fs.readdirSync(dir)).toEqual(["encryption.key"])
  })
})
