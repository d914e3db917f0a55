/** The catalog's message variants (src/errors/Catalog.ts): Korean, and naming the figures they are given. */
import { describe, expect, it } from "vitest"
import { AccountMessages, InferenceMessages } from "../../src/errors/Catalog.js"
import { HANGUL } from "./helpers.js"

describe("message variants", () => {
  it("every variant is Korean text", () => {
    // Builders whose first argument is a list of allowed values; the others take (text | number, number).
    const lists = new Set(["reasoningEffortNotAllowed", "invalidRange"])
    for (const [name, variant] of Object.entries({ ...InferenceMessages, ...AccountMessages })) {
      const build = variant as string | ((...args: Array<unknown>) => string)
      const text = typeof build === "string" ? build : lists.has(name) ? build(["a", "b"]) : build("x", 7)
      expect(text, name).toMatch(HANGUL)
    }
  })

  it("variants with figures name them", () => {
    expect(InferenceMessages.inputTooLong(8192, 9001)).toBe("입력이 모델의 최대 입력 토큰 수(8192)를 초과했습니다. (추정 9001)")
    expect(InferenceMessages.reasoningEffortNotAllowed(["low", "high"])).toBe(
      "이 모델에서 허용되지 않는 reasoning_effort 값입니다. 허용 값: low, high"
    )
    expect(InferenceMessages.reasoningEffortNotAllowed([])).toBe("이 모델은 reasoning_effort 를 지원하지 않습니다. 허용 값: 없음")
    expect(InferenceMessages.textTooLong("messages[0].content", 100)).toBe("messages[0].content 이(가) 너무 깁니다. 최대 100자까지 허용됩니다.")
    expect(AccountMessages.invalidRange(["1h", "24h"])).toBe("range 값이 올바르지 않습니다. 허용되는 값: 1h, 24h")
  })
})
