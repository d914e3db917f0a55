/**
 * The image request body (spec "Image request"), validated by hand in a fixed order so each failure names its
 * field and bound in Korean, never echoing the value: the body is an object; `action` absent or `generate`
 * (else 400 `image_unsupported_action`); `input` a non-empty string of at most 8000 characters; `model` absent or
 * a string of at most 128 characters (accepted and ignored); `parameters` absent or an object whose known children
 * are checked in the order `negative_prompt`, `width`, `height`, `steps`, `seed`, `scale`. Unknown fields at either
 * level are ignored; a known child that is `null` counts as absent (NovelAI clients send nulls). Everything else is
 * 400 `image_invalid`.
 */
import { Result } from "effect"
import { fail, type GatewayError, ImageMessages } from "../errors/Catalog.js"
import { overCodePoints } from "./Text.js"

export const MAX_PROMPT_CHARS = 8000
export const MAX_NEGATIVE_PROMPT_CHARS = 8000
export const MAX_MODEL_CHARS = 128
export const MIN_SIDE = 64
export const MAX_SIDE = 4096
export const MAX_SEED = 2 ** 32 - 1
export const MAX_SCALE = 30
/** Largest body the endpoint reads: two 8000-character prompts fully `\u` escaped, and room for unknown fields. */
export const IMAGE_BODY_BYTES = 256 * 1024

/** A valid request. Absent parameters are undefined; `steps` is not clamped yet (Settings.ts does it). */
export interface ImageRequest {
  readonly input: string
  readonly model: string | undefined
  readonly negative_prompt: string | undefined
  readonly width: number | undefined
  readonly height: number | undefined
  readonly steps: number | undefined
  readonly seed: number | undefined
  readonly scale: number | undefined
}

const invalid = (message: string) => Result.fail(fail("image_invalid", { message }))

const isObject = (value: unknown): value is Record<string, unknown> =>
  typeof value === "object" && value !== null && !Array.isArray(value)

/** Own, non-null values only (a `__proto__` key of a parsed body is an own key too). */
const field = (object: Record<string, unknown>, key: string): unknown =>
  Object.prototype.hasOwnProperty.call(object, key) ? (object[key] ?? undefined) : undefined

const intIn = (value: unknown, min: number, max: number): value is number =>
  typeof value === "number" && Number.isInteger(value) && value >= min && value <= max

export const decodeImageRequest = (body: unknown): Result.Result<ImageRequest, GatewayError> => {
  if (!isObject(body)) return invalid(ImageMessages.notAnObject)
  const action = field(body, "action")
  if (action !== undefined && action !== "generate") return Result.fail(fail("image_unsupported_action"))

  const input = field(body, "input")
  if (input === undefined) return invalid(ImageMessages.inputRequired)
  if (typeof input !== "string") return invalid(ImageMessages.inputType)
  if (overCodePoints(input, MAX_PROMPT_CHARS)) return invalid(ImageMessages.tooLong("input", MAX_PROMPT_CHARS))
  if (input.trim().length === 0) return invalid(ImageMessages.inputEmpty)

  const model = field(body, "model")
  if (model !== undefined && (typeof model !== "string" || model.length > MAX_MODEL_CHARS)) {
    return invalid(ImageMessages.model(MAX_MODEL_CHARS))
  }

  const parameters = field(body, "parameters")
  if (parameters !== undefined && !isObject(parameters)) return invalid(ImageMessages.parametersType)
  const p = parameters ?? {}

  const negative = field(p, "negative_prompt")
  if (negative !== undefined) {
    if (typeof negative !== "string") return invalid(ImageMessages.stringField("parameters.negative_prompt"))
    if (overCodePoints(negative, MAX_NEGATIVE_PROMPT_CHARS)) {
      return invalid(ImageMessages.tooLong("parameters.negative_prompt", MAX_NEGATIVE_PROMPT_CHARS))
    }
  }
  const width = field(p, "width")
  if (width !== undefined && !intIn(width, MIN_SIDE, MAX_SIDE)) {
    return invalid(ImageMessages.intRange("parameters.width", MIN_SIDE, MAX_SIDE))
  }
  const height = field(p, "height")
  if (height !== undefined && !intIn(height, MIN_SIDE, MAX_SIDE)) {
    return invalid(ImageMessages.intRange("parameters.height", MIN_SIDE, MAX_SIDE))
  }
  // Any safe integer: out of 1–60 it is clamped, as the spec says.
  const steps = field(p, "steps")
  if (steps !== undefined && !(typeof steps === "number" && Number.isSafeInteger(steps))) {
    return invalid(ImageMessages.integer("parameters.steps"))
  }
  const seed = field(p, "seed")
  if (seed !== undefined && !intIn(seed, 0, MAX_SEED)) return invalid(ImageMessages.intRange("parameters.seed", 0, MAX_SEED))
  const scale = field(p, "scale")
  if (scale !== undefined && !(typeof scale === "number" && Number.isFinite(scale) && scale >= 0 && scale <= MAX_SCALE)) {
    return invalid(ImageMessages.numberRange("parameters.scale", 0, MAX_SCALE))
  }

  return Result.succeed({
    input,
    model: model as string | undefined,
    negative_prompt: negative as string | undefined,
    width: width as number | undefined,
    height: height as number | undefined,
    steps: steps as number | undefined,
    seed: seed as number | undefined,
    scale: scale as number | undefined
  })
}
