/**
 * A job as a ComfyUI workflow in the API format (`POST /prompt` `{prompt: <this>}`): nodes keyed by id, each
 * `{class_type, inputs}`, an input that takes another node's output written `[nodeId, outputIndex]`.
 *
 * checkpoint → LoRAs (chained, model and CLIP) → positive and negative CLIPTextEncode → EmptyLatentImage at the
 * job's size → KSampler → VAEDecode → (upscale model, when the preset names one) → SaveImage.
 */
import type { JobSpec } from "../Contracts.js"

export type Link = readonly [string, number]

export interface WorkflowNode {
  readonly class_type: string
  readonly inputs: Readonly<Record<string, string | number | boolean | Link>>
}

export type Workflow = Readonly<Record<string, WorkflowNode>>

/** Node ids of the fixed part of the graph; LoRAs take `LORA_BASE + i`. */
export const NODE = {
  checkpoint: "1",
  positive: "2",
  negative: "3",
  latent: "4",
  sampler: "5",
  decode: "6",
  save: "7",
  upscaleLoader: "8",
  upscale: "9"
} as const

export const LORA_BASE = 10

export interface WorkflowOptions {
  /** SaveImage's file name prefix (ComfyUI appends a counter). */
  readonly filenamePrefix?: string
}

export const buildWorkflow = (spec: JobSpec, options: WorkflowOptions = {}): Workflow => {
  const nodes: Record<string, WorkflowNode> = {}
  const { preset } = spec
  nodes[NODE.checkpoint] = { class_type: "CheckpointLoaderSimple", inputs: { ckpt_name: preset.checkpoint } }
  // CheckpointLoaderSimple outputs: MODEL 0, CLIP 1, VAE 2; LoraLoader outputs: MODEL 0, CLIP 1.
  let model: Link = [NODE.checkpoint, 0]
  let clip: Link = [NODE.checkpoint, 1]
  preset.loras.forEach((lora, i) => {
    const id = String(LORA_BASE + i)
    nodes[id] = {
      class_type: "LoraLoader",
      inputs: { model, clip, lora_name: lora.name, strength_model: lora.weight, strength_clip: lora.weight }
    }
    model = [id, 0]
    clip = [id, 1]
  })
  nodes[NODE.positive] = { class_type: "CLIPTextEncode", inputs: { text: spec.prompt, clip } }
  nodes[NODE.negative] = { class_type: "CLIPTextEncode", inputs: { text: spec.negative_prompt, clip } }
  nodes[NODE.latent] = { class_type: "EmptyLatentImage", inputs: { width: spec.width, height: spec.height, batch_size: 1 } }
  nodes[NODE.sampler] = {
    class_type: "KSampler",
    inputs: {
      model,
      positive: [NODE.positive, 0],
      negative: [NODE.negative, 0],
      latent_image: [NODE.latent, 0],
      seed: spec.seed,
      steps: spec.steps,
      cfg: spec.scale,
      sampler_name: preset.sampler,
      scheduler: preset.scheduler,
      denoise: 1
    }
  }
  nodes[NODE.decode] = { class_type: "VAEDecode", inputs: { samples: [NODE.sampler, 0], vae: [NODE.checkpoint, 2] } }
  let image: Link = [NODE.decode, 0]
  if (preset.upscaler !== null && preset.upscaler !== "") {
    nodes[NODE.upscaleLoader] = { class_type: "UpscaleModelLoader", inputs: { model_name: preset.upscaler } }
    nodes[NODE.upscale] = {
      class_type: "ImageUpscaleWithModel",
      inputs: { upscale_model: [NODE.upscaleLoader, 0], image }
    }
    image = [NODE.upscale, 0]
  }
  nodes[NODE.save] = { class_type: "SaveImage", inputs: { images: image, filename_prefix: options.filenamePrefix ?? "wellspring" } }
  return nodes
}
