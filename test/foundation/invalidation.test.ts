/**
 * Key-cache invalidation messages (src/auth/Invalidation.ts): the wire format every replica and the CLI share.
 * The format is a contract between versions running side by side, so it is spelled out literally here.
 */
import { describe, expect, it } from "vitest"
import * as Invalidation from "../../src/auth/Invalidation.js"

const HASH = "a".repeat(64)

describe("key-cache invalidation messages", () => {
  it("are `key:<hash>` / `account:<id>` on channel wellspring_auth, tagged `|<tag>` by a replica", () => {
    expect(Invalidation.CHANNEL).toBe("wellspring_auth")
    expect(Invalidation.encode(Invalidation.key(HASH))).toBe(`key:${HASH}`)
    expect(Invalidation.encode(Invalidation.account("acc_0123"), "t1")).toBe("account:acc_0123|t1")
  })

  it("decode what encode writes, with or without a tag", () => {
    for (const invalidation of [Invalidation.key(HASH), Invalidation.account("acc_0123")]) {
      expect(Invalidation.decode(Invalidation.encode(invalidation))).toEqual({ invalidation, tag: null })
      expect(Invalidation.decode(Invalidation.encode(invalidation, "abcd1234"))).toEqual({ invalidation, tag: "abcd1234" })
    }
    // What an operator (or an older CLI) sends by hand.
    expect(Invalidation.decode(`key:${HASH}`)).toEqual({ invalidation: { _tag: "Key", hash: HASH }, tag: null })
  })

  it("a message this version does not know is kept as Unknown (Auth then drops its whole cache)", () => {
    expect(Invalidation.decode("everything")).toEqual({ invalidation: { _tag: "Unknown", message: "everything" }, tag: null })
    expect(Invalidation.decode("plan:pro|t2")).toEqual({ invalidation: { _tag: "Unknown", message: "plan:pro" }, tag: "t2" })
  })

  it("a cached key is served for at most a minute, an unknown key remembered for 5 s", () => {
    expect(Invalidation.POSITIVE_TTL_MS).toBe(60_000)
    expect(Invalidation.NEGATIVE_TTL_MS).toBe(5_000)
  })
})
