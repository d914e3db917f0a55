/**
 * The content policy (src/images/Policy.ts): terms match through case, full-width forms, accents, spacing,
 * underscores, hyphens, braces, brackets and weights; word edges keep `rape` out of `grapes`; scripts that do not
 * space words (Hangul) match inside words; safe mode adds its own categories; work stays bounded.
 */
import { describe, expect, it } from "vitest"
import type { Category } from "../../src/config/Images.js"
import { blockedCategory, compact, compile, fold, matcherFor } from "../../src/images/Policy.js"

const categories: ReadonlyArray<Category> = [
  { name: "폭력", terms: ["gore", "rape", "blood bath"] },
  { name: "미성년", terms: ["loli", "shota", "로리"] }
]
const matcher = compile(categories)

describe("normalization", () => {
  it("folds case, width and accents", () => {
    expect(fold("ＬＯＬＩ")).toBe("loli")
    expect(fold("LóLí")).toBe("loli")
    expect(fold("ＡＢＣ１２３")).toBe("abc123")
    expect(fold("ﾛﾘ")).toBe("ロリ")
    expect(fold("İ")).toBe("i")
  })

  it("keeps letters and digits and marks where separators were", () => {
    const c = compact("1.2::Blue_Hair::, {x}")
    expect(String.fromCodePoint(...c.chars)).toBe("12bluehairx")
    expect(c.separated).toEqual([false, true, true, false, false, false, true, false, false, false, true])
  })

  it("drops zero-width characters without counting them as separators", () => {
    expect(String.fromCodePoint(...compact("lo\u200bli").chars)).toBe("loli")
    expect(compact("lo\u200bli").separated).toEqual([false, false, false, false])
  })
})

describe("matching", () => {
  it.each([
    ["loli", "미성년"],
    ["1girl, loli, smile", "미성년"],
    ["LOLI", "미성년"],
    ["ＬＯＬＩ", "미성년"],
    ["lólì", "미성년"],
    ["l o l i", "미성년"],
    ["l_o_l_i", "미성년"],
    ["l-o-l-i", "미성년"],
    ["{{loli}}", "미성년"],
    ["[[[loli]]]", "미성년"],
    ["1.2::loli::", "미성년"],
    ["-1::x::, 1.5::l{o}l[i]::", "미성년"],
    ["lo\u200bli", "미성년"],
    ["\\{loli\\}", "미성년"],
    ["gore", "폭력"],
    ["{{G_O-R E}}", "폭력"],
    ["blood_bath", "폭력"],
    ["bloodbath", "폭력"],
    ["Blood-Bath!", "폭력"],
    ["로리", "미성년"],
    ["귀여운 로리가", "미성년"],
    ["r a p e", "폭력"]
  ])("%j is blocked as %s", (prompt, category) => {
    expect(matcher.find(prompt)).toBe(category)
  })

  it.each([
    "grapes, fruit bowl",
    "drape, curtains",
    "lolita fashion",
    "shotgun",
    "gorgeous",
    "1girl, solo, smile",
    "bath, bloody",
    ""
  ])("%j passes", (prompt) => {
    expect(matcher.find(prompt)).toBe(null)
  })

  it("separators inside a term's span do not matter, only at its edges", () => {
    // The term `blood bath` is compacted to `bloodbath`, so punctuation between its words hides nothing.
    expect(matcher.find("blood, bath")).toBe("폭력")
    expect(matcher.find("bloodbaths")).toBe(null)
  })

  it("names the category found first in the text", () => {
    expect(matcher.find("loli and gore")).toBe("미성년")
    expect(matcher.find("gore and loli")).toBe("폭력")
  })

  it("ignores terms that normalize to nothing and an empty list", () => {
    expect(compile([{ name: "x", terms: ["!!!", "  "] }]).find("!!! anything")).toBe(null)
    expect(compile([]).find("loli")).toBe(null)
  })

  it("finds overlapping terms through dictionary links", () => {
    const m = compile([{ name: "a", terms: ["abcd"] }, { name: "b", terms: ["bc"] }])
    expect(m.find("xabcx")).toBe(null)
    expect(m.find("a bc x")).toBe("b")
    expect(m.find("abcd")).toBe("a")
  })

  it("stays fast on hostile prompts and long term lists", () => {
    const terms = Array.from({ length: 2000 }, (_, i) => "a".repeat(99) + String.fromCharCode(0x4e00 + i))
    const big = compile([{ name: "big", terms }, { name: "as", terms: Array.from({ length: 100 }, (_, i) => "a".repeat(i + 1)) }])
    const started = performance.now()
    expect(big.find("a".repeat(8000))).toBe(null)
    expect(big.find("a ".repeat(4000))).toBe("as")
    expect(big.find("{a}".repeat(2666))).toBe("as")
    expect(performance.now() - started).toBeLessThan(2000)
  })
})

describe("blockedCategory", () => {
  const policy = {
    blocked: [{ name: "불법", terms: ["gore"] }],
    safe_mode_blocked: [{ name: "성인", terms: ["nsfw", "nude"] }]
  }

  it("blocks the always-blocked list for everyone and the safe-mode list only in safe mode", () => {
    expect(blockedCategory(policy, false, "gore")).toBe("불법")
    expect(blockedCategory(policy, true, "gore")).toBe("불법")
    expect(blockedCategory(policy, false, "nude, 1girl")).toBe(null)
    expect(blockedCategory(policy, true, "nude, 1girl")).toBe("성인")
    expect(blockedCategory(policy, true, "1girl")).toBe(null)
  })

  it("compiles a configured list once", () => {
    expect(matcherFor(policy.blocked)).toBe(matcherFor(policy.blocked))
  })
})
