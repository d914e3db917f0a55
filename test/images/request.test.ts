/**
 * Image request validation (src/images/Request.ts): every field missing, of the wrong type or out of range gives
 * its exact status, code and Korean message, never echoing the value; unknown fields are ignored.
 */
import { Result } from "effect"
import { describe, expect, it } from "vitest"
import { Catalog, type GatewayError } from "../../src/errors/Catalog.js"
import { imageBody } from "../../src/errors/Render.js"
import { decodeImageRequest, MAX_SEED } from "../../src/images/Request.js"

const HANGUL = /[\uac00-\ud7a3]/
const ok = { input: "1girl, smile" }
const withParams = (parameters: Record<string, unknown>) => ({ ...ok, parameters })

const errorOf = (body: unknown): GatewayError => {
  const result = decodeImageRequest(body)
  if (Result.isSuccess(result)) throw new Error("expected a failure")
  return result.failure
}

describe("decodeImageRequest: refusals", () => {
  const SECRET = "zz-secret-value-zz"
  it.each<[string, unknown, string]>([
    ["an array", [SECRET], "요청 본문은 JSON 객체여야 합니다."],
    ["a string", SECRET, "요청 본문은 JSON 객체여야 합니다."],
    ["null", null, "요청 본문은 JSON 객체여야 합니다."],
    ["absent (empty body)", undefined, "요청 본문은 JSON 객체여야 합니다."],
    ["input missing", { parameters: {} }, "input 필드가 필요합니다. 프롬프트를 문자열로 보내세요."],
    ["input null", { input: null }, "input 필드가 필요합니다. 프롬프트를 문자열로 보내세요."],
    ["input a number", { input: 42 }, "input 은 문자열이어야 합니다."],
    ["input an array", { input: [SECRET] }, "input 은 문자열이어야 합니다."],
    ["input empty", { input: "" }, "input 이 비어 있습니다. 프롬프트를 입력하세요."],
    ["input blank", { input: " \n\t " }, "input 이 비어 있습니다. 프롬프트를 입력하세요."],
    ["input 8001 characters", { input: "a".repeat(8001) }, "input 이(가) 너무 깁니다. 최대 8000자까지 허용됩니다."],
    ["model a number", { ...ok, model: 3 }, "model 은 128자 이하의 문자열이어야 합니다."],
    ["model 129 characters", { ...ok, model: "m".repeat(129) }, "model 은 128자 이하의 문자열이어야 합니다."],
    ["parameters a string", { ...ok, parameters: SECRET }, "parameters 는 객체여야 합니다."],
    ["parameters an array", { ...ok, parameters: [] }, "parameters 는 객체여야 합니다."],
    ["negative_prompt a number", withParams({ negative_prompt: 1 }), "parameters.negative_prompt 은(는) 문자열이어야 합니다."],
    [
      "negative_prompt 8001 characters",
      withParams({ negative_prompt: "n".repeat(8001) }),
      "parameters.negative_prompt 이(가) 너무 깁니다. 최대 8000자까지 허용됩니다."
    ],
    ["width 63", withParams({ width: 63 }), "parameters.width 은(는) 64 이상 4096 이하의 정수여야 합니다."],
    ["width 4097", withParams({ width: 4097 }), "parameters.width 은(는) 64 이상 4096 이하의 정수여야 합니다."],
    ["width 512.5", withParams({ width: 512.5 }), "parameters.width 은(는) 64 이상 4096 이하의 정수여야 합니다."],
    ["width a string", withParams({ width: "512" }), "parameters.width 은(는) 64 이상 4096 이하의 정수여야 합니다."],
    ["height 0", withParams({ width: 512, height: 0 }), "parameters.height 은(는) 64 이상 4096 이하의 정수여야 합니다."],
    ["height true", withParams({ height: true }), "parameters.height 은(는) 64 이상 4096 이하의 정수여야 합니다."],
    ["steps 28.5", withParams({ steps: 28.5 }), "parameters.steps 은(는) 정수여야 합니다."],
    ["steps a string", withParams({ steps: "28" }), "parameters.steps 은(는) 정수여야 합니다."],
    ["steps 1e300", withParams({ steps: 1e300 }), "parameters.steps 은(는) 정수여야 합니다."],
    ["seed -1", withParams({ seed: -1 }), `parameters.seed 은(는) 0 이상 ${MAX_SEED} 이하의 정수여야 합니다.`],
    ["seed 2^32", withParams({ seed: 2 ** 32 }), `parameters.seed 은(는) 0 이상 ${MAX_SEED} 이하의 정수여야 합니다.`],
    ["seed 1.5", withParams({ seed: 1.5 }), `parameters.seed 은(는) 0 이상 ${MAX_SEED} 이하의 정수여야 합니다.`],
    ["scale -0.1", withParams({ scale: -0.1 }), "parameters.scale 은(는) 0 이상 30 이하의 숫자여야 합니다."],
    ["scale 30.01", withParams({ scale: 30.01 }), "parameters.scale 은(는) 0 이상 30 이하의 숫자여야 합니다."],
    ["scale a string", withParams({ scale: "7" }), "parameters.scale 은(는) 0 이상 30 이하의 숫자여야 합니다."]
  ])("%s → 400 image_invalid", (_name, body, message) => {
    const error = errorOf(body)
    expect(error.code).toBe("image_invalid")
    expect(imageBody(error)).toEqual({ statusCode: 400, message })
    expect(message).toMatch(HANGUL)
    expect(JSON.stringify(imageBody(error))).not.toContain(SECRET)
  })

  it.each<[string, unknown]>([
    ["img2img", "img2img"],
    ["infill", "infill"],
    ["a number", 1],
    ["an object", { action: "generate" }],
    ["upper case", "GENERATE"]
  ])("action %s → 400 image_unsupported_action", (_name, action) => {
    const error = errorOf({ ...ok, action })
    expect(error.code).toBe("image_unsupported_action")
    expect(imageBody(error)).toEqual({ statusCode: 400, message: Catalog.image_unsupported_action.message })
  })

  it("checks the action before the rest of the body", () => {
    expect(errorOf({ action: "img2img" }).code).toBe("image_unsupported_action")
  })
})

describe("decodeImageRequest: lengths are counted in characters (code points)", () => {
  it("8000 astral characters are taken, 8001 are not", () => {
    expect(Result.isSuccess(decodeImageRequest({ input: "😀".repeat(8000) }))).toBe(true)
    expect(errorOf({ input: "😀".repeat(8001) }).status).toBe(400)
    expect(Result.isSuccess(decodeImageRequest({ ...ok, parameters: { negative_prompt: "한".repeat(8000) } }))).toBe(true)
    expect(errorOf({ ...ok, parameters: { negative_prompt: "😀".repeat(8001) } }).status).toBe(400)
  })
})

describe("decodeImageRequest: accepted", () => {
  it("takes the minimal body", () => {
    expect(decodeImageRequest(ok)).toEqual(Result.succeed({
      input: "1girl, smile",
      model: undefined,
      negative_prompt: undefined,
      width: undefined,
      height: undefined,
      steps: undefined,
      seed: undefined,
      scale: undefined
    }))
  })

  it("takes every field at its bounds and ignores unknown ones", () => {
    const body = {
      input: "x".repeat(8000),
      model: "m".repeat(128),
      action: "generate",
      extra: { anything: true },
      parameters: {
        negative_prompt: "n".repeat(8000),
        width: 4096,
        height: 64,
        steps: 500,
        seed: MAX_SEED,
        scale: 30,
        n_samples: 4,
        sampler: "k_euler",
        qualityToggle: true
      }
    }
    const result = decodeImageRequest(body)
    expect(Result.isSuccess(result)).toBe(true)
    if (Result.isSuccess(result)) {
      expect(result.success).toMatchObject({ width: 4096, height: 64, steps: 500, seed: MAX_SEED, scale: 30 })
      expect(Object.keys(result.success).sort()).toEqual(
        ["height", "input", "model", "negative_prompt", "scale", "seed", "steps", "width"]
      )
    }
  })

  it("treats null children as absent, and steps out of 1–60 as valid (clamped later)", () => {
    const result = decodeImageRequest({ ...ok, model: null, action: null, parameters: { seed: null, width: null, steps: -5 } })
    expect(Result.isSuccess(result) && result.success).toMatchObject({ seed: undefined, width: undefined, steps: -5 })
    expect(Result.isSuccess(decodeImageRequest({ ...ok, parameters: null }))).toBe(true)
    expect(Result.isSuccess(decodeImageRequest({ ...ok, parameters: { seed: 0, scale: 0 } }))).toBe(true)
  })

  it("reads own keys only", () => {
    const body = JSON.parse("{\"__proto__\": {\"input\": \"x\"}}") as unknown
    expect(errorOf(body).userMessage).toBe("input 필드가 필요합니다. 프롬프트를 문자열로 보내세요.")
  })
})
