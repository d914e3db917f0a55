/**
 * Job + preset → ComfyUI API-format workflow: the nodes, their values and their links, case by case.
 */
import { describe, expect, it } from "vitest"
import type { JobSpec } from "../../src/images/Contracts.js"
import { buildWorkflow, LORA_BASE, NODE, type Workflow } from "../../src/images/worker/Workflow.js"
import { sampleSpec } from "./workerSupport.js"

const classes = (workflow: Workflow) => Object.values(workflow).map((n) => n.class_type).sort()

/** Every link points at an existing node. */
const linksResolve = (workflow: Workflow) => {
  for (const [id, node] of Object.entries(workflow)) {
    for (const [input, value] of Object.entries(node.inputs)) {
      if (Array.isArray(value)) expect(workflow[value[0] as string], `${id}.${input} → ${value[0]}`).toBeDefined()
    }
  }
}

interface Case {
  readonly name: string
  readonly spec: JobSpec
  readonly classes: ReadonlyArray<string>
  /** Where the model and CLIP come from (the last LoRA, or the checkpoint). */
  readonly modelFrom: string
  /** What SaveImage saves. */
  readonly savedFrom: string
}

const base = sampleSpec()
const cases: ReadonlyArray<Case> = [
  {
    name: "two LoRAs, no upscaler",
    spec: base,
    classes: ["CLIPTextEncode", "CLIPTextEncode", "CheckpointLoaderSimple", "EmptyLatentImage", "KSampler", "LoraLoader", "LoraLoader", "SaveImage", "VAEDecode"],
    modelFrom: String(LORA_BASE + 1),
    savedFrom: NODE.decode
  },
  {
    name: "no LoRA",
    spec: { ...base, preset: { ...base.preset, loras: [] } },
    classes: ["CLIPTextEncode", "CLIPTextEncode", "CheckpointLoaderSimple", "EmptyLatentImage", "KSampler", "SaveImage", "VAEDecode"],
    modelFrom: NODE.checkpoint,
    savedFrom: NODE.decode
  },
  {
    name: "one LoRA and an upscaler",
    spec: { ...base, preset: { ...base.preset, loras: [{ name: "a.safetensors", weight: 0.25 }], upscaler: "4x-UltraSharp.pth" } },
    classes: [
      "CLIPTextEncode",
      "CLIPTextEncode",
      "CheckpointLoaderSimple",
      "EmptyLatentImage",
      "ImageUpscaleWithModel",
      "KSampler",
      "LoraLoader",
      "SaveImage",
      "UpscaleModelLoader",
      "VAEDecode"
    ],
    modelFrom: String(LORA_BASE),
    savedFrom: NODE.upscale
  },
  {
    name: "an empty upscaler name means none",
    spec: { ...base, preset: { ...base.preset, loras: [], upscaler: "" } },
    classes: ["CLIPTextEncode", "CLIPTextEncode", "CheckpointLoaderSimple", "EmptyLatentImage", "KSampler", "SaveImage", "VAEDecode"],
    modelFrom: NODE.checkpoint,
    savedFrom: NODE.decode
  }
]

describe("buildWorkflow", () => {
  for (const c of cases) {
    it(c.name, () => {
      const w = buildWorkflow(c.spec)
      expect(classes(w)).toEqual([...c.classes].sort())
      linksResolve(w)
      expect(w[NODE.checkpoint]!.inputs).toEqual({ ckpt_name: c.spec.preset.checkpoint })
      // The sampler: the job's numbers, the preset's sampler and scheduler, the model after the LoRAs.
      expect(w[NODE.sampler]!.inputs).toEqual({
        model: [c.modelFrom, 0],
        positive: [NODE.positive, 0],
        negative: [NODE.negative, 0],
        latent_image: [NODE.latent, 0],
        seed: c.spec.seed,
        steps: c.spec.steps,
        cfg: c.spec.scale,
        sampler_name: c.spec.preset.sampler,
        scheduler: c.spec.preset.scheduler,
        denoise: 1
      })
      expect(w[NODE.positive]!.inputs).toEqual({ text: c.spec.prompt, clip: [c.modelFrom, 1] })
      expect(w[NODE.negative]!.inputs).toEqual({ text: c.spec.negative_prompt, clip: [c.modelFrom, 1] })
      expect(w[NODE.latent]!.inputs).toEqual({ width: c.spec.width, height: c.spec.height, batch_size: 1 })
      expect(w[NODE.decode]!.inputs).toEqual({ samples: [NODE.sampler, 0], vae: [NODE.checkpoint, 2] })
      expect(w[NODE.save]!.inputs.images).toEqual([c.savedFrom, 0])
      // The LoRA chain: each takes the previous one's model and CLIP, at its weight for both.
      c.spec.preset.loras.forEach((lora, i) => {
        const previous = i === 0 ? NODE.checkpoint : String(LORA_BASE + i - 1)
        expect(w[String(LORA_BASE + i)]).toEqual({
          class_type: "LoraLoader",
          inputs: {
            model: [previous, 0],
            clip: [previous, 1],
            lora_name: lora.name,
            strength_model: lora.weight,
            strength_clip: lora.weight
          }
        })
      })
      if (c.spec.preset.upscaler) {
        expect(w[NODE.upscaleLoader]!.inputs).toEqual({ model_name: c.spec.preset.upscaler })
        expect(w[NODE.upscale]!.inputs).toEqual({ upscale_model: [NODE.upscaleLoader, 0], image: [NODE.decode, 0] })
      }
      // Plain JSON: what `POST /prompt` sends.
      expect(JSON.parse(JSON.stringify(w))).toEqual(w)
    })
  }

  it("the file name prefix is configurable", () => {
    expect(buildWorkflow(base)[NODE.save]!.inputs.filename_prefix).toBe("wellspring")
    expect(buildWorkflow(base, { filenamePrefix: "gpu1/ws" })[NODE.save]!.inputs.filename_prefix).toBe("gpu1/ws")
  })

  it("prompts pass through verbatim (weights syntax, quotes, Hangul)", () => {
    const prompt = "(best quality:1.2), \"quoted\" \\ backslash, 한글 프롬프트, [faded]"
    const w = buildWorkflow({ ...base, prompt, negative_prompt: "" })
    expect(w[NODE.positive]!.inputs.text).toBe(prompt)
    expect(w[NODE.negative]!.inputs.text).toBe("")
  })
})
