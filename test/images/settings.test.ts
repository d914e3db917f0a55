/**
 * Settings precedence (spec "Image endpoint rules" 3, src/images/Settings.ts) as a table, and the snapping of
 * resolutions to the allowed list by aspect ratio.
 */
import { describe, expect, it } from "vitest"
import { DEFAULT_RESOLUTIONS } from "../../src/config/Images.js"
import type { Preset } from "../../src/images/Contracts.js"
import type { ImageRequest } from "../../src/images/Request.js"
import { clampSteps, DEFAULT_SCALE, resolveSettings, type SettingsInput, snapResolution } from "../../src/images/Settings.js"

const preset: Preset = {
  id: 1,
  name: "기본",
  checkpoint: "model.safetensors",
  loras: [{ name: "detail", weight: 0.6 }],
  sampler: "euler_ancestral",
  scheduler: "karras",
  quality_prompt: "",
  negative_prompt: "",
  upscaler: null,
  steps: 28,
  scale: null,
  width: 832,
  height: 1216,
  active: true,
  created_at: "2026-01-01T00:00:00.000Z",
  updated_at: "2026-01-01T00:00:00.000Z"
}

const request = (fields: Partial<ImageRequest> = {}): ImageRequest => ({
  input: "1girl",
  model: undefined,
  negative_prompt: undefined,
  width: undefined,
  height: undefined,
  steps: undefined,
  seed: undefined,
  scale: undefined,
  ...fields
})

const resolve = (req: Partial<ImageRequest>, p: Partial<Preset> = {}, extra: Partial<SettingsInput> = {}) =>
  resolveSettings({
    request: request(req),
    preset: { ...preset, ...p },
    resolutions: DEFAULT_RESOLUTIONS,
    safeMode: false,
    safeModeNegative: "nsfw, nude",
    randomSeed: 777,
    ...extra
  })

describe("resolveSettings", () => {
  it.each<[string, Partial<ImageRequest>, Partial<Preset>, number]>([
    ["request steps win", { steps: 40 }, {}, 40],
    ["preset steps when the request has none", {}, { steps: 20 }, 20],
    ["request steps clamped up to 1", { steps: 0 }, {}, 1],
    ["request steps clamped down to 60", { steps: 500 }, {}, 60],
    ["negative request steps clamp to 1", { steps: -3 }, {}, 1],
    ["preset steps are clamped too", {}, { steps: 90 }, 60]
  ])("steps: %s", (_name, req, p, steps) => {
    expect(resolve(req, p).steps).toBe(steps)
  })

  it.each<[string, Partial<ImageRequest>, Partial<Preset>, number]>([
    ["the preset's scale wins over the request's (inverted on purpose)", { scale: 11 }, { scale: 6.5 }, 6.5],
    ["the request's scale when the preset has none", { scale: 11 }, { scale: null }, 11],
    ["the default when neither has one", {}, { scale: null }, DEFAULT_SCALE],
    ["a preset scale of 0 is a scale", { scale: 11 }, { scale: 0 }, 0],
    ["a request scale of 0 is a scale", { scale: 0 }, { scale: null }, 0]
  ])("scale: %s", (_name, req, p, scale) => {
    expect(resolve(req, p).scale).toBe(scale)
  })

  it.each<[string, Partial<ImageRequest>, Partial<Preset>, [number, number]]>([
    ["both request sides, snapped", { width: 1024, height: 1536 }, {}, [832, 1216]],
    ["request square", { width: 512, height: 512 }, {}, [1024, 1024]],
    ["only the width: the preset's size", { width: 2048 }, {}, [832, 1216]],
    ["only the height: the preset's size", { height: 2048 }, {}, [832, 1216]],
    ["preset landscape", {}, { width: 1216, height: 832 }, [1216, 832]],
    ["preset off the list, snapped", {}, { width: 1920, height: 1080 }, [1344, 768]],
    ["very tall request", { width: 64, height: 4096 }, {}, [640, 1536]],
    ["very wide request", { width: 4096, height: 64 }, {}, [1536, 640]]
  ])("size: %s", (_name, req, p, [width, height]) => {
    const spec = resolve(req, p)
    expect([spec.width, spec.height]).toEqual([width, height])
  })

  it("seed: the request's, else the drawn one", () => {
    expect(resolve({ seed: 0 }).seed).toBe(0)
    expect(resolve({ seed: 4294967295 }).seed).toBe(4294967295)
    expect(resolve({}).seed).toBe(777)
  })

  it.each<[string, Partial<ImageRequest>, Partial<Preset>, boolean, string, string]>([
    ["request only", { input: "1girl" }, {}, false, "1girl", ""],
    ["quality prompt first", { input: "1girl" }, { quality_prompt: "masterpiece, best quality" }, false, "masterpiece, best quality, 1girl", ""],
    [
      "both converted",
      { input: "{{1girl}}", negative_prompt: "[[lowres]]" },
      { quality_prompt: "{masterpiece}", negative_prompt: "bad hands" },
      false,
      "(masterpiece:1.05), (1girl:1.1025)",
      "(lowres:0.907), bad hands"
    ],
    ["request negative, then preset's", { negative_prompt: "blurry" }, { negative_prompt: "lowres" }, false, "1girl", "blurry, lowres"],
    ["safe mode appends its negative", { negative_prompt: "blurry" }, { negative_prompt: "lowres" }, true, "1girl", "blurry, lowres, nsfw, nude"],
    ["safe mode alone", {}, {}, true, "1girl", "nsfw, nude"],
    ["parentheses escaped", { input: "smile (happy)" }, {}, false, "smile \\(happy\\)", ""]
  ])("prompts: %s", (_name, req, p, safeMode, prompt, negative) => {
    const spec = resolve(req, p, { safeMode })
    expect(spec.prompt).toBe(prompt)
    expect(spec.negative_prompt).toBe(negative)
  })

  it("copies the preset's generation fields", () => {
    expect(resolve({}, { upscaler: "4x" }).preset).toEqual({
      name: "기본",
      checkpoint: "model.safetensors",
      loras: [{ name: "detail", weight: 0.6 }],
      sampler: "euler_ancestral",
      scheduler: "karras",
      upscaler: "4x"
    })
  })
})

describe("snapResolution", () => {
  it.each<[number, number, [number, number]]>([
    [832, 1216, [832, 1216]],
    [1024, 1024, [1024, 1024]],
    [1216, 832, [1216, 832]],
    [64, 64, [1024, 1024]],
    [4096, 4096, [1024, 1024]],
    [1080, 1920, [768, 1344]],
    [1000, 1500, [832, 1216]],
    [900, 1100, [896, 1152]]
  ])("%i×%i → %j", (w, h, expected) => {
    const r = snapResolution(w, h, DEFAULT_RESOLUTIONS)
    expect([r.width, r.height]).toEqual(expected)
  })

  it("breaks a ratio tie by the nearest area, then by list order", () => {
    const list = [{ width: 512, height: 512 }, { width: 1024, height: 1024 }, { width: 2048, height: 2048 }]
    expect(snapResolution(900, 900, list)).toEqual({ width: 1024, height: 1024 })
    expect(snapResolution(100, 100, list)).toEqual({ width: 512, height: 512 })
    expect(snapResolution(768, 768, [{ width: 512, height: 512 }, { width: 1024, height: 1024 }])).toEqual({ width: 512, height: 512 })
  })
})

describe("clampSteps", () => {
  it.each([[1, 1], [60, 60], [0, 1], [61, 60], [-100, 1], [Number.NaN, 1]])("%s → %s", (n, expected) => {
    expect(clampSteps(n)).toBe(expected)
  })
})
