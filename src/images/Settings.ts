/**
 * The settings precedence of spec rule 3, as one pure function from a valid request, the account's active preset
 * and the operator's settings to the worker's JobSpec:
 * - prompt: the preset's quality prompt, then the request's `input`; negative prompt: the request's, then the
 *   preset's, then `safe_mode_negative` for accounts in safe mode. All in NAI syntax, converted (Prompt.ts);
 * - steps: the request's, else the preset's, clamped to 1–60;
 * - scale: the preset's first, the request's only when the preset has none (inverted on purpose), else 5;
 * - width and height: the request's when it gives both, else the preset's, then snapped to the allowed resolution
 *   of the nearest aspect ratio;
 * - seed: the request's, else the random one the caller drew.
 */
import type { Resolution } from "../config/Images.js"
import type { JobSpec, Preset } from "./Contracts.js"
import { joinPrompts, toWorkerSyntax } from "./Prompt.js"
import type { ImageRequest } from "./Request.js"

export const MIN_STEPS = 1
export const MAX_STEPS = 60
/** Guidance scale when neither the preset nor the request sets one. */
export const DEFAULT_SCALE = 5

export interface SettingsInput {
  readonly request: ImageRequest
  readonly preset: Preset
  /** `images.resolutions` (never empty). */
  readonly resolutions: ReadonlyArray<Resolution>
  readonly safeMode: boolean
  /** `images.content_policy.safe_mode_negative`. */
  readonly safeModeNegative: string
  /** Used when the request sets no seed (drawn by the caller, so this stays pure). */
  readonly randomSeed: number
}

export const clampSteps = (steps: number): number =>
  Number.isFinite(steps) ? Math.min(MAX_STEPS, Math.max(MIN_STEPS, Math.round(steps))) : MIN_STEPS

/**
 * The allowed resolution whose aspect ratio is nearest (on a log scale, so 2:1 and 1:2 are as far from 1:1);
 * ties go to the one whose area is nearest, then to the first listed.
 */
export const snapResolution = (width: number, height: number, allowed: ReadonlyArray<Resolution>): Resolution => {
  const ratio = Math.log(width / height)
  const area = width * height
  let best = allowed[0]!
  let bestRatio = Infinity
  let bestArea = Infinity
  for (const r of allowed) {
    const d = Math.abs(Math.log(r.width / r.height) - ratio)
    const a = Math.abs(r.width * r.height - area)
    if (d < bestRatio - 1e-12 || (Math.abs(d - bestRatio) <= 1e-12 && a < bestArea)) {
      best = r
      bestRatio = d
      bestArea = a
    }
  }
  return { width: best.width, height: best.height }
}

export const resolveSettings = (input: SettingsInput): JobSpec => {
  const { preset, request } = input
  const useRequestSize = request.width !== undefined && request.height !== undefined
  const size = snapResolution(
    useRequestSize ? request.width! : preset.width,
    useRequestSize ? request.height! : preset.height,
    input.resolutions
  )
  return {
    prompt: joinPrompts(toWorkerSyntax(preset.quality_prompt), toWorkerSyntax(request.input)),
    negative_prompt: joinPrompts(
      toWorkerSyntax(request.negative_prompt ?? ""),
      toWorkerSyntax(preset.negative_prompt),
      input.safeMode ? toWorkerSyntax(input.safeModeNegative) : ""
    ),
    width: size.width,
    height: size.height,
    steps: clampSteps(request.steps ?? preset.steps),
    scale: preset.scale ?? request.scale ?? DEFAULT_SCALE,
    seed: request.seed ?? input.randomSeed,
    preset: {
      name: preset.name,
      checkpoint: preset.checkpoint,
      loras: preset.loras,
      sampler: preset.sampler,
      scheduler: preset.scheduler,
      upscaler: preset.upscaler
    }
  }
}
