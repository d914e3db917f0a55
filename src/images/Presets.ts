/**
 * Illustration presets (issue 17, spec: "up to 10 per account, exactly one active"): validation of the account
 * API's input, the repository over `image_presets` (migration 0004), and `ImagePresets` for the image endpoint.
 *
 * Invariant: an account with presets has exactly one active. Every mutation runs in one transaction that first
 * locks the account row (`FOR NO KEY UPDATE`: mutations of one account run one at a time on every replica, while
 * other tables' foreign-key checks on the account are not blocked); the partial unique index
 * `image_presets_one_active` is the backstop. An account without presets gets the default preset (active) on
 * first use: the list route or `ImagePresets.active`. Deleting the active preset activates the most recently
 * updated remaining one; deleting the last is allowed.
 */
import { Clock, Context, Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { ImageAccountMessages as M } from "../errors/Catalog.js"
import { ImagePresets, type Lora, type Preset } from "./Contracts.js"
import { codePoints } from "./Text.js"

/** Spec Limits: presets per account. */
export const MAX_PRESETS = 10
export const MAX_LORAS = 8
export const LORA_WEIGHT_MAX = 5
export const STEPS_MIN = 1
export const STEPS_MAX = 60
export const SCALE_MAX = 30
export const DIMENSION_MIN = 64
export const DIMENSION_MAX = 4096
/** Latent-space models work in blocks of 8 pixels; the endpoint snaps to the allowed resolutions anyway. */
export const DIMENSION_MULTIPLE = 8

/** ComfyUI's `KSampler` sampler names. */
export const SAMPLERS: ReadonlyArray<string> = [
  "euler", "euler_cfg_pp", "euler_ancestral", "euler_ancestral_cfg_pp", "heun", "heunpp2", "dpm_2", "dpm_2_ancestral",
  "lms", "dpm_fast", "dpm_adaptive", "dpmpp_2s_ancestral", "dpmpp_2s_ancestral_cfg_pp", "dpmpp_sde", "dpmpp_sde_gpu",
  "dpmpp_2m", "dpmpp_2m_cfg_pp", "dpmpp_2m_sde", "dpmpp_2m_sde_gpu", "dpmpp_3m_sde", "dpmpp_3m_sde_gpu", "ddpm", "lcm",
  "ipndm", "ipndm_v", "deis", "res_multistep", "res_multistep_cfg_pp", "res_multistep_ancestral",
  "res_multistep_ancestral_cfg_pp", "gradient_estimation", "er_sde", "seeds_2", "seeds_3", "ddim", "uni_pc",
  "uni_pc_bh2"
]

/** The NovelAI names a client of the image protocol may know (`k_euler`, ...), stored as ComfyUI's. */
const SAMPLER_ALIASES: ReadonlyMap<string, string> = new Map([
  ["k_euler", "euler"],
  ["k_euler_ancestral", "euler_ancestral"],
  ["k_dpmpp_2s_ancestral", "dpmpp_2s_ancestral"],
  ["k_dpmpp_2m", "dpmpp_2m"],
  ["k_dpmpp_sde", "dpmpp_sde"],
  ["k_dpmpp_2m_sde", "dpmpp_2m_sde"],
  ["ddim_v3", "ddim"]
])

/** ComfyUI's `KSampler` scheduler names. */
export const SCHEDULERS: ReadonlyArray<string> = [
  "normal", "karras", "exponential", "sgm_uniform", "simple", "ddim_uniform", "beta", "linear_quadratic", "kl_optimal"
]

/** The fields a client sets; the rest (`id`, `active`, timestamps) are the server's. */
export const PRESET_FIELDS = [
  "name", "checkpoint", "loras", "sampler", "scheduler", "quality_prompt", "negative_prompt", "upscaler", "steps",
  "scale", "width", "height"
] as const
export type PresetFields = Pick<Preset, (typeof PRESET_FIELDS)[number]>

/** The preset an account gets on first use. */
export const DEFAULT_PRESET: PresetFields = {
  name: "기본",
  checkpoint: "default.safetensors",
  loras: [],
  sampler: "euler_ancestral",
  scheduler: "normal",
  quality_prompt: "masterpiece, best quality",
  negative_prompt: "lowres, worst quality, low quality",
  upscaler: null,
  steps: 28,
  scale: 5,
  width: 832,
  height: 1216
}

// ---------------------------------------------------------------------------------------------------------
// Validation

export type Validation<A> = { readonly ok: true; readonly value: A } | { readonly ok: false; readonly message: string }

const ok = <A>(value: A): Validation<A> => ({ ok: true, value })
const bad = (message: string): Validation<never> => ({ ok: false, message })

const isRecord = (u: unknown): u is Record<string, unknown> => typeof u === "object" && u !== null && !Array.isArray(u)

/**
 * C0 and C1 controls, DEL and invisible format characters (bidi overrides, zero-width: they let a name show as
 * something else); in prompts, tab and line breaks are allowed.
 */
const CONTROL = /[\u0000-\u001f\u007f-\u009f\p{Cf}]/u
const PROMPT_CONTROL = /[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f]/
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/


interface TextRule {
  readonly min: number
  readonly max: number
  readonly prompt?: boolean
}

/** A bounded string; names and file names are trimmed, prompts are kept as written. */
const text = (field: string, value: unknown, rule: TextRule): Validation<string> => {
  if (typeof value !== "string") return bad(M.text(field, rule.min, rule.max))
  const v = rule.prompt === true ? value : value.trim()
  // The UTF-16 length bounds the code points from above: huge strings are refused before they are walked.
  if (v.length > rule.max * 2) return bad(M.text(field, rule.min, rule.max))
  const n = codePoints(v)
  if (n < rule.min || n > rule.max) return bad(M.text(field, rule.min, rule.max))
  if ((rule.prompt === true ? PROMPT_CONTROL : CONTROL).test(v) || LONE_SURROGATE.test(v)) return bad(M.badCharacters(field))
  return ok(v)
}

const integer = (field: string, value: unknown, min: number, max: number): Validation<number> =>
  typeof value === "number" && Number.isInteger(value) && value >= min && value <= max
    ? ok(value)
    : bad(M.integer(field, min, max))

const dimension = (field: string, value: unknown): Validation<number> =>
  typeof value === "number" && Number.isInteger(value) && value >= DIMENSION_MIN && value <= DIMENSION_MAX &&
    value % DIMENSION_MULTIPLE === 0
    ? ok(value)
    : bad(M.dimension(field, DIMENSION_MIN, DIMENSION_MAX, DIMENSION_MULTIPLE))

const oneOf = (field: string, value: unknown, allowed: ReadonlyArray<string>, aliases?: ReadonlyMap<string, string>) => {
  if (typeof value === "string") {
    if (allowed.includes(value)) return ok(value)
    const alias = aliases?.get(value)
    if (alias !== undefined) return ok(alias)
  }
  return bad(M.oneOf(field, allowed))
}

const loras = (value: unknown): Validation<ReadonlyArray<Lora>> => {
  if (!Array.isArray(value) || value.length > MAX_LORAS) return bad(M.loras(MAX_LORAS))
  const out: Array<Lora> = []
  for (let i = 0; i < value.length; i++) {
    const item: unknown = value[i]
    if (!isRecord(item) || Object.keys(item).some((k) => k !== "name" && k !== "weight")) return bad(M.loraItem(i))
    const name = text(`loras[${i}].name`, item.name, { min: 1, max: 200 })
    if (!name.ok) return name
    const weight = item.weight
    if (typeof weight !== "number" || !Number.isFinite(weight) || Math.abs(weight) > LORA_WEIGHT_MAX) {
      return bad(M.number(`loras[${i}].weight`, -LORA_WEIGHT_MAX, LORA_WEIGHT_MAX))
    }
    out.push({ name: name.value, weight })
  }
  return ok(out)
}

/** One field's value, validated and normalized. */
const field = (name: (typeof PRESET_FIELDS)[number], value: unknown): Validation<unknown> => {
  switch (name) {
    case "name":
      return text(name, value, { min: 1, max: 40 })
    case "checkpoint":
      return text(name, value, { min: 1, max: 200 })
    case "loras":
      return loras(value)
    case "sampler":
      return oneOf(name, value, SAMPLERS, SAMPLER_ALIASES)
    case "scheduler":
      return oneOf(name, value, SCHEDULERS)
    case "quality_prompt":
    case "negative_prompt":
      return text(name, value, { min: 0, max: 2000, prompt: true })
    case "upscaler": {
      if (value === null) return ok(null)
      const v = text(name, value, { min: 0, max: 200 })
      if (!v.ok) return bad(M.nullableText(name, 200))
      return ok(v.value === "" ? null : v.value)
    }
    case "steps":
      return integer(name, value, STEPS_MIN, STEPS_MAX)
    case "scale":
      return value === null || (typeof value === "number" && Number.isFinite(value) && value >= 0 && value <= SCALE_MAX)
        ? ok(value)
        : bad(M.nullableNumber(name, 0, SCALE_MAX))
    case "width":
    case "height":
      return dimension(name, value)
  }
}

/** A field name safe to repeat in a message; anything else is reported without its name. */
const NAMEABLE = /^[A-Za-z0-9_.-]{1,40}$/

/** The body's fields, each validated: unknown fields are refused (400 naming the field). */
export const validatePresetFields = (body: unknown): Validation<Partial<PresetFields>> => {
  if (!isRecord(body)) return bad(M.notAnObject)
  const out: Record<string, unknown> = {}
  for (const key of Object.keys(body)) {
    if (!(PRESET_FIELDS as ReadonlyArray<string>).includes(key)) {
      return bad(NAMEABLE.test(key) ? M.unknownField(key, PRESET_FIELDS) : M.unknownFieldUnnamed(PRESET_FIELDS))
    }
  }
  // In the documented order, so the first error reported is always the same one.
  for (const name of PRESET_FIELDS) {
    if (!(name in body) || body[name] === undefined) continue
    const v = field(name, body[name])
    if (!v.ok) return v
    out[name] = v.value
  }
  return ok(out as Partial<PresetFields>)
}

/** A create request: `name` is required; fields left out take the default preset's values. */
export const validateNewPreset = (body: unknown): Validation<PresetFields> => {
  const fields = validatePresetFields(body)
  if (!fields.ok) return fields
  if (fields.value.name === undefined) return bad(M.required("name"))
  return ok({ ...DEFAULT_PRESET, ...fields.value })
}

// ---------------------------------------------------------------------------------------------------------
// Storage

interface PresetRow {
  readonly id: number
  readonly account_id: string
  readonly name: string
  readonly checkpoint: string
  readonly loras: unknown
  readonly sampler: string
  readonly scheduler: string
  readonly quality_prompt: string
  readonly negative_prompt: string
  readonly upscaler: string | null
  readonly steps: number
  readonly scale: number | null
  readonly width: number
  readonly height: number
  readonly active: boolean
  readonly created_at: Date
  readonly updated_at: Date
}

const toPreset = (row: PresetRow): Preset => ({
  id: Number(row.id),
  name: row.name,
  checkpoint: row.checkpoint,
  loras: Array.isArray(row.loras) ? (row.loras as ReadonlyArray<Lora>) : [],
  sampler: row.sampler,
  scheduler: row.scheduler,
  quality_prompt: row.quality_prompt,
  negative_prompt: row.negative_prompt,
  upscaler: row.upscaler,
  steps: row.steps,
  scale: row.scale === null ? null : Number(row.scale),
  width: row.width,
  height: row.height,
  active: row.active,
  created_at: new Date(row.created_at).toISOString(),
  updated_at: new Date(row.updated_at).toISOString()
})

/** Column values of (part of) a preset: `loras` as JSON text, bound untyped into `jsonb`. */
const columns = (fields: Partial<PresetFields>): Record<string, unknown> => {
  const out: Record<string, unknown> = { ...fields }
  if (fields.loras !== undefined) out.loras = JSON.stringify(fields.loras)
  return out
}

export type CreateOutcome =
  | { readonly _tag: "Created"; readonly preset: Preset }
  | { readonly _tag: "Cap"; readonly max: number }

export class PresetsRepo extends Context.Service<PresetsRepo, {
  /** The account's presets, oldest first; the default one is created first when there are none. */
  readonly list: (accountId: string) => Effect.Effect<ReadonlyArray<Preset>>
  /** The active preset; the default one is created (active) when the account has none. */
  readonly active: (accountId: string) => Effect.Effect<Preset>
  /** A new preset under the cap; it is active when the account had none active (no presets yet). */
  readonly create: (accountId: string, fields: PresetFields, max: number) => Effect.Effect<CreateOutcome>
  /** Changes fields of one of the account's presets; null when it is not the account's. */
  readonly update: (accountId: string, id: number, fields: Partial<PresetFields>) => Effect.Effect<Preset | null>
  /**
   * Deletes one of the account's presets; when it was active, the most recently updated remaining preset becomes
   * active. Null when it is not the account's; otherwise the active preset afterwards (null: none left).
   */
  readonly remove: (accountId: string, id: number) => Effect.Effect<{ readonly active: Preset | null } | null>
  /** Makes one of the account's presets the active one (and only it); null when it is not the account's. */
  readonly activate: (accountId: string, id: number) => Effect.Effect<Preset | null>
}>()("wellspring/images/PresetsRepo") {}

export const make = Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const first = (rows: ReadonlyArray<PresetRow>) => (rows[0] === undefined ? null : toPreset(rows[0]))
  const now = Effect.map(Clock.currentTimeMillis, (ms) => new Date(ms))

  /** Serializes the account's preset mutations for the rest of the transaction. */
  const lockAccount = (accountId: string) => sql`SELECT id FROM accounts WHERE id = ${accountId} FOR NO KEY UPDATE`

  const findActive = (accountId: string) =>
    sql<PresetRow>`SELECT * FROM image_presets WHERE account_id = ${accountId} AND active`.pipe(Effect.map(first))

  const listRows = (accountId: string) =>
    sql<PresetRow>`SELECT * FROM image_presets WHERE account_id = ${accountId} ORDER BY id`.pipe(
      Effect.map((rows) => rows.map(toPreset))
    )

  /** Activates the most recently updated preset (none left: nothing). Inside a locked transaction. */
  const activateLatest = (accountId: string) =>
    sql<PresetRow>`
      UPDATE image_presets SET active = true
      WHERE id = (
        SELECT id FROM image_presets WHERE account_id = ${accountId} ORDER BY updated_at DESC, id DESC LIMIT 1)
      RETURNING *`.pipe(Effect.map(first))

  /**
   * The account's active preset, creating the default when it has none (and repairing an account with presets
   * but none active, which the mutations below never leave behind).
   */
  const ensureActive = (accountId: string) =>
    sql.withTransaction(Effect.gen(function*() {
      yield* lockAccount(accountId)
      const active = yield* findActive(accountId)
      if (active !== null) return active
      const repaired = yield* activateLatest(accountId)
      if (repaired !== null) return repaired
      const at = yield* now
      const rows = yield* sql<PresetRow>`
        INSERT INTO image_presets ${
        sql.insert({ ...columns(DEFAULT_PRESET), account_id: accountId, active: true, created_at: at, updated_at: at })
      } RETURNING *`
      return toPreset(rows[0]!)
    }))

  const active = (accountId: string) =>
    Effect.flatMap(findActive(accountId), (found) => (found !== null ? Effect.succeed(found) : ensureActive(accountId)))

  return PresetsRepo.of({
    active: (accountId) => Effect.orDie(active(accountId)),
    list: (accountId) =>
      Effect.orDie(Effect.gen(function*() {
        const rows = yield* listRows(accountId)
        if (rows.some((p) => p.active)) return rows
        yield* ensureActive(accountId)
        return yield* listRows(accountId)
      })),
    create: (accountId, fields, max) =>
      Effect.orDie(sql.withTransaction(Effect.gen(function*() {
        yield* lockAccount(accountId)
        const [counts] = yield* sql<{ n: number; a: number }>`
          SELECT count(*)::int AS n, (count(*) FILTER (WHERE active))::int AS a
          FROM image_presets WHERE account_id = ${accountId}`
        if (counts!.n >= max) return { _tag: "Cap", max } as CreateOutcome
        const at = yield* now
        const rows = yield* sql<PresetRow>`
          INSERT INTO image_presets ${
          sql.insert({ ...columns(fields), account_id: accountId, active: counts!.a === 0, created_at: at, updated_at: at })
        } RETURNING *`
        return { _tag: "Created", preset: toPreset(rows[0]!) } as CreateOutcome
      }))),
    update: (accountId, id, fields) =>
      Effect.orDie(Effect.gen(function*() {
        if (Object.keys(fields).length === 0) {
          return first(yield* sql<PresetRow>`SELECT * FROM image_presets WHERE id = ${id} AND account_id = ${accountId}`)
        }
        const at = yield* now
        return first(
          yield* sql<PresetRow>`
            UPDATE image_presets SET ${sql.update({ ...columns(fields), updated_at: at })}
            WHERE id = ${id} AND account_id = ${accountId} RETURNING *`
        )
      })),
    remove: (accountId, id) =>
      Effect.orDie(sql.withTransaction(Effect.gen(function*() {
        yield* lockAccount(accountId)
        const removed = first(
          yield* sql<PresetRow>`DELETE FROM image_presets WHERE id = ${id} AND account_id = ${accountId} RETURNING *`
        )
        if (removed === null) return null
        return { active: removed.active ? yield* activateLatest(accountId) : yield* findActive(accountId) }
      }))),
    activate: (accountId, id) =>
      Effect.orDie(sql.withTransaction(Effect.gen(function*() {
        yield* lockAccount(accountId)
        const target = first(
          yield* sql<PresetRow>`SELECT * FROM image_presets WHERE id = ${id} AND account_id = ${accountId}`
        )
        if (target === null || target.active) return target
        yield* sql`UPDATE image_presets SET active = false WHERE account_id = ${accountId} AND active`
        return first(yield* sql<PresetRow>`UPDATE image_presets SET active = true WHERE id = ${id} RETURNING *`)
      })))
  })
})

export const repoLayer = Layer.effect(PresetsRepo, make)

/** `PresetsRepo` and the `ImagePresets` seam the image endpoint uses. */
export const layer = Layer.provideMerge(
  Layer.effect(ImagePresets, Effect.map(PresetsRepo, (repo) => ImagePresets.of({ active: repo.active }))),
  repoLayer
)
