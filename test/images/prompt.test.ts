/**
 * Prompt conversion (src/images/Prompt.ts): NAI emphasis syntax to the worker's `(text:w)` syntax, on real-world
 * prompts and on the edge cases (escapes, literal parentheses, unbalanced brackets, sections, huge inputs).
 */
import { describe, expect, it } from "vitest"
import { formatWeight, joinPrompts, MAX_WEIGHT, parseNai, toWorkerSyntax } from "../../src/images/Prompt.js"

describe("toWorkerSyntax", () => {
  it.each([
    // plain text passes through
    ["1girl, solo, smile", "1girl, solo, smile"],
    ["", ""],
    // braces ×1.05 per level, brackets ÷1.05
    ["{masterpiece}", "(masterpiece:1.05)"],
    ["{{masterpiece}}", "(masterpiece:1.1025)"],
    ["{{{masterpiece}}}", "(masterpiece:1.1576)"],
    ["[lowres]", "(lowres:0.9524)"],
    ["[[lowres]]", "(lowres:0.907)"],
    // nesting multiplies; a brace and a bracket cancel
    ["{a {b} c}", "(a :1.05)(b:1.1025)( c:1.05)"],
    ["{[neutral]}", "neutral"],
    ["[{neutral}]", "neutral"],
    // adjacent runs of one weight merge
    ["{a}{b}", "(ab:1.05)"],
    ["{a} {b}", "(a:1.05) (b:1.05)"],
    // the real-world prompt
    [
      "{{masterpiece}}, best quality, [[lowres]], 1.2::blue hair::, 1girl",
      "(masterpiece:1.1025), best quality, (lowres:0.907), (blue hair:1.2), 1girl"
    ],
    // weighted sections
    ["1.3::rain::", "(rain:1.3)"],
    ["1.5::text", "(text:1.5)"],
    ["-1::bad hands::, ok", "(bad hands:-1), ok"],
    ["0.5::a:: 2::b::", "(a:0.5) (b:2)"],
    ["1.2::a 0.8::b::", "(a :1.2)(b:0.8)"],
    [".5::half::", "(half:0.5)"],
    ["1::plain::", "plain"],
    ["0::gone::", "(gone:0)"],
    // a reset `::` ends a section; outside one it is dropped
    ["1.2::a:: b", "(a:1.2) b"],
    ["a::b", "ab"],
    // braces inside a section multiply with it
    ["2::{x}::", "(x:2.1)"],
    ["{1.2::x::}", "(x:1.26)"],
    // a number glued to text does not start a section
    ["score_9::x", "score_9x"],
    ["abc1.2::x", "abc1.2x"],
    // escapes stay literal
    ["\\{not emphasis\\}", "{not emphasis}"],
    ["\\[x\\]", "[x]"],
    // parentheses are literal in NAI and escaped for the worker
    ["(smile)", "\\(smile\\)"],
    ["\\(escaped\\)", "\\(escaped\\)"],
    ["{kaomoji (^o^)}", "(kaomoji \\(^o^\\):1.05)"],
    ["ratio 16:9", "ratio 16:9"],
    // unbalanced brackets are literal, never an error
    ["{unclosed", "{unclosed"],
    ["unopened}", "unopened}"],
    ["{{a}", "{(a:1.05)"],
    ["[a]]", "(a:0.9524)]"],
    ["{a]", "{a]"],
    // crossing pairs: braces and brackets pair among themselves
    ["[a{b]c}", "(a:0.9524)b(c:1.05)"],
    // whitespace-only emphasis is plain
    ["a{ }b", "a b"],
    // a literal backslash before a group is kept apart from its `(`
    ["a\\{b}", "a{b}"],
    ["a\\ {b}", "a\\ (b:1.05)"],
    ["x\\{{b}}", "x{(b:1.05)}"],
    ["\\m/", "\\m/"]
  ])("%j → %j", (input, expected) => {
    expect(toWorkerSyntax(input)).toBe(expected)
  })

  it("a plain run ending in a backslash gets a space before the group after it", () => {
    // `q\` then a section: written `q\(x:1.2)` the worker would read `\(` as a literal parenthesis.
    expect(toWorkerSyntax("q\\::1.2::x")).toBe("q\\ (x:1.2)")
    // A backslash before an escapable character is an escape, so this is the only way to get there.
    expect(toWorkerSyntax("q\\{x}")).toBe("q{x}")
  })

  it("clamps runaway weights and stays linear on hostile input", () => {
    expect(toWorkerSyntax("{".repeat(200) + "x" + "}".repeat(200))).toBe(`(x:${MAX_WEIGHT})`)
    expect(toWorkerSyntax("[".repeat(200) + "x" + "]".repeat(200))).toBe("(x:0.0001)")
    expect(toWorkerSyntax("99999::x")).toBe(`(x:${MAX_WEIGHT})`)
    expect(toWorkerSyntax("-99999::x")).toBe(`(x:-${MAX_WEIGHT})`)
    const hostile = [
      "{".repeat(8000),
      "}".repeat(8000),
      "{[".repeat(4000),
      "1".repeat(7998) + "::",
      ", 1".repeat(2666),
      "::".repeat(4000),
      "\\".repeat(8000),
      "{a}".repeat(2666)
    ]
    const started = performance.now()
    for (const input of hostile) expect(typeof toWorkerSyntax(input)).toBe("string")
    expect(performance.now() - started).toBeLessThan(1000)
    expect(toWorkerSyntax("{".repeat(8000))).toBe("{".repeat(8000))
  })
})

describe("parseNai", () => {
  it("gives runs with their weights", () => {
    expect(parseNai("a {b} [c]")).toEqual([
      { text: "a ", weight: 1 },
      { text: "b", weight: 1.05 },
      { text: " ", weight: 1 },
      { text: "c", weight: 1 / 1.05 }
    ])
  })
})

describe("formatWeight", () => {
  it.each([[1, "1"], [1.05, "1.05"], [1.157625, "1.1576"], [-0.00001, "0"], [1e-9, "0"], [123, "10"], [-123, "-10"]])(
    "%s → %s",
    (w, s) => expect(formatWeight(w)).toBe(s)
  )
})

describe("joinPrompts", () => {
  it("joins non-empty parts with a comma", () => {
    expect(joinPrompts("best quality", "1girl")).toBe("best quality, 1girl")
    expect(joinPrompts("", " 1girl ", "  ")).toBe("1girl")
    expect(joinPrompts()).toBe("")
  })
})
