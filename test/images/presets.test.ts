/**
 * Presets (issue 17): the validation of every field, and the repository on embedded PGlite and PostgreSQL:
 * default on first use (one, under concurrency), the cap, exactly one active under concurrent activations,
 * and which preset becomes active when the active one is deleted.
 */
import { Effect, Layer, ManagedRuntime } from "effect"
import { SqlClient } from "effect/sql"
import * as Crypto from "node:crypto"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { AccountsRepo } from "../../src/accounts/AccountsRepo.js"
import { ImagePresets } from "../../src/images/Contracts.js"
import {
  DEFAULT_PRESET,
  MAX_PRESETS,
  PRESET_FIELDS,
  PresetsRepo,
  SAMPLERS,
  SCHEDULERS,
  validateNewPreset,
  validatePresetFields
} from "../../src/images/Presets.js"
import * as Presets from "../../src/images/Presets.js"
import { serviceGate } from "../support/Services.js"
import { backends, type StoreServices } from "../storage/backends.js"

const postgres = await serviceGate("postgres")

describe("preset validation", () => {
  it("a create needs a name; everything else defaults to the default preset", () => {
    const missing = validateNewPreset({ steps: 20 })
    expect(missing).toEqual({ ok: false, message: "name 필드가 필요합니다." })
    const made = validateNewPreset({ name: "  내 프리셋  ", steps: 20 })
    expect(made).toEqual({ ok: true, value: { ...DEFAULT_PRESET, name: "내 프리셋", steps: 20 } })
  })

  it("accepts the boundaries and normalizes (NovelAI sampler names, blank upscaler)", () => {
    const result = validatePresetFields({
      name: "가".repeat(40),
      checkpoint: "c".repeat(200),
      loras: Array.from({ length: 8 }, (_, i) => ({ name: `l${i}`, weight: i % 2 === 0 ? -5 : 5 })),
      sampler: "k_euler",
      scheduler: "karras",
      quality_prompt: "q".repeat(2000),
      negative_prompt: "\n\t".repeat(1000),
      upscaler: "  ",
      steps: 60,
      scale: 0,
      width: 64,
      height: 4096
    })
    expect(result.ok).toBe(true)
    if (!result.ok) return
    expect(result.value.sampler).toBe("euler")
    expect(result.value.upscaler).toBeNull()
    expect(result.value.loras).toHaveLength(8)
    // Emoji are one character each, as PostgreSQL counts them.
    expect(validatePresetFields({ name: "😀".repeat(40) }).ok).toBe(true)
    expect(validatePresetFields({ scale: null, upscaler: null, loras: [] }).ok).toBe(true)
    for (const sampler of SAMPLERS) expect(validatePresetFields({ sampler }).ok).toBe(true)
    for (const scheduler of SCHEDULERS) expect(validatePresetFields({ scheduler }).ok).toBe(true)
  })

  const SECRET = "SECRET-VALUE-9f3a"
  const cases: Array<[string, Record<string, unknown>, string]> = [
    ["name empty", { name: "" }, "name"],
    ["name blank", { name: "   " }, "name"],
    ["name 41", { name: "n".repeat(41) }, "name"],
    ["name number", { name: 5 }, "name"],
    ["name control", { name: `a\u0007${SECRET}` }, "name"],
    ["name NUL", { name: `a\u0000${SECRET}` }, "name"],
    ["name lone surrogate", { name: `\ud800${SECRET}` }, "name"],
    ["name bidi override", { name: `a\u202e${SECRET}` }, "name"],
    ["name zero-width", { name: `a\u200b${SECRET}` }, "name"],
    ["checkpoint C1 control", { checkpoint: `a\u009b${SECRET}` }, "checkpoint"],
    ["checkpoint empty", { checkpoint: "" }, "checkpoint"],
    ["checkpoint 201", { checkpoint: SECRET.repeat(20) + "x".repeat(200) }, "checkpoint"],
    ["checkpoint null", { checkpoint: null }, "checkpoint"],
    ["loras object", { loras: { name: SECRET } }, "loras"],
    ["loras 9", { loras: Array.from({ length: 9 }, () => ({ name: "a", weight: 1 })) }, "loras"],
    ["lora not object", { loras: [SECRET] }, "loras[0]"],
    ["lora extra key", { loras: [{ name: "a", weight: 1, strength: 2 }] }, "loras[0]"],
    ["lora name empty", { loras: [{ name: "", weight: 1 }] }, "loras[0].name"],
    ["lora name 201", { loras: [{ name: "l".repeat(201), weight: 1 }] }, "loras[0].name"],
    ["lora weight 5.01", { loras: [{ name: "a", weight: 1 }, { name: "b", weight: 5.01 }] }, "loras[1].weight"],
    ["lora weight -6", { loras: [{ name: "a", weight: -6 }] }, "loras[0].weight"],
    ["lora weight string", { loras: [{ name: "a", weight: "1" }] }, "loras[0].weight"],
    ["lora weight missing", { loras: [{ name: "a" }] }, "loras[0].weight"],
    ["sampler unknown", { sampler: SECRET }, "sampler"],
    ["sampler number", { sampler: 1 }, "sampler"],
    ["scheduler unknown", { scheduler: SECRET }, "scheduler"],
    ["quality_prompt 2001", { quality_prompt: "q".repeat(2001) }, "quality_prompt"],
    ["quality_prompt NUL", { quality_prompt: `\u0000${SECRET}` }, "quality_prompt"],
    ["negative_prompt 2001", { negative_prompt: "n".repeat(2001) }, "negative_prompt"],
    ["negative_prompt array", { negative_prompt: [SECRET] }, "negative_prompt"],
    ["upscaler 201", { upscaler: "u".repeat(201) }, "upscaler"],
    ["upscaler number", { upscaler: 4 }, "upscaler"],
    ["steps 0", { steps: 0 }, "steps"],
    ["steps 61", { steps: 61 }, "steps"],
    ["steps 1.5", { steps: 1.5 }, "steps"],
    ["steps string", { steps: "20" }, "steps"],
    ["steps null", { steps: null }, "steps"],
    ["scale -0.1", { scale: -0.1 }, "scale"],
    ["scale 30.5", { scale: 30.5 }, "scale"],
    ["scale string", { scale: "5" }, "scale"],
    ["scale infinite", { scale: Number.POSITIVE_INFINITY }, "scale"],
    ["width 63", { width: 63 }, "width"],
    ["width 4104", { width: 4104 }, "width"],
    ["width 100 (not a multiple of 8)", { width: 100 }, "width"],
    ["width float", { width: 832.5 }, "width"],
    ["height 0", { height: 0 }, "height"],
    ["height string", { height: "1216" }, "height"],
    ["unknown field", { colour: "red" }, "colour"],
    ["read-only field", { active: true }, "active"],
    ["id field", { id: 3 }, "id"]
  ]

  it.each(cases)("%s: refused, naming %s, never echoing the value", (_, body, field) => {
    const result = validatePresetFields(body)
    expect(result.ok).toBe(false)
    if (result.ok) return
    expect(result.message.startsWith(`${field} `)).toBe(true)
    expect(result.message).not.toContain(SECRET)
    expect(result.message).not.toContain("qqqq")
  })

  it("an unknown field with a strange name is refused without repeating the name", () => {
    const result = validatePresetFields({ [`<${"A".repeat(50)}>`]: 1 })
    expect(result.ok).toBe(false)
    if (!result.ok) expect(result.message).toBe(`알 수 없는 필드가 있습니다. 허용되는 필드: ${PRESET_FIELDS.join(", ")}`)
    const proto = validatePresetFields(JSON.parse("{\"__proto__\": {\"steps\": 1}}"))
    expect(proto.ok).toBe(false)
  })

  it("a body that is not an object is refused", () => {
    for (const body of [null, undefined, [], "x", 3]) {
      expect(validatePresetFields(body)).toEqual({ ok: false, message: "요청 본문은 JSON 객체여야 합니다." })
    }
  })
})

for (const backend of backends(postgres)) {
  describe(`preset repository (${backend.name})`, () => {
    type R = StoreServices | PresetsRepo | ImagePresets
    let runtime: ManagedRuntime.ManagedRuntime<R, unknown>
    let close: () => Promise<void>
    const run = <A>(effect: Effect.Effect<A, unknown, R>) => runtime.runPromise(effect)
    const repo = <A>(f: (repo: PresetsRepo["Service"]) => Effect.Effect<A>) => run(Effect.flatMap(PresetsRepo, f))
    const newAccount = () =>
      run(Effect.flatMap(AccountsRepo, (accounts) =>
        accounts.createAccount({ username: `u_${Crypto.randomBytes(4).toString("hex")}`, displayName: "테스터" })))
    const activeCount = (accountId: string) =>
      run(Effect.flatMap(SqlClient.SqlClient, (sql) =>
        sql<{ n: number; a: number }>`
          SELECT count(*)::int AS n, (count(*) FILTER (WHERE active))::int AS a
          FROM image_presets WHERE account_id = ${accountId}`)).then((rows) => rows[0]!)

    beforeAll(async () => {
      const opened = await backend.open()
      close = opened.close
      runtime = ManagedRuntime.make(Layer.provideMerge(Presets.layer, opened.layer))
      await runtime.runPromise(Effect.void)
    })
    afterAll(async () => {
      await runtime?.dispose()
      await close?.()
    })

    it("first use creates one active default; 20 concurrent first uses still create one", async () => {
      const account = await newAccount()
      const results = await Promise.all(Array.from({ length: 20 }, (_, i) =>
        i % 2 === 0
          ? run(Effect.flatMap(ImagePresets, (p) => p.active(account.id)))
          : repo((r) => r.list(account.id)).then((list) => list.find((p) => p.active)!)))
      expect(new Set(results.map((p) => p.id)).size).toBe(1)
      expect(results[0]).toMatchObject({ ...DEFAULT_PRESET, active: true })
      expect(await activeCount(account.id)).toEqual({ n: 1, a: 1 })
    })

    it("stores every field as given (scale 4.7 reads back as 4.7; loras as objects)", async () => {
      const account = await newAccount()
      const fields = {
        ...DEFAULT_PRESET,
        name: "정밀",
        loras: [{ name: "detail.safetensors", weight: -1.25 }],
        upscaler: "4x-UltraSharp.pth",
        scale: 4.7,
        steps: 1
      }
      const created = await repo((r) => r.create(account.id, fields, MAX_PRESETS))
      expect(created._tag).toBe("Created")
      if (created._tag !== "Created") return
      // The first preset of an account without any is the active one (no default is made then).
      expect(created.preset).toMatchObject({ ...fields, active: true })
      const updated = await repo((r) => r.update(account.id, created.preset.id, { scale: null, loras: [] }))
      expect(updated).toMatchObject({ scale: null, loras: [], name: "정밀" })
      expect(Date.parse(updated!.updated_at)).toBeGreaterThanOrEqual(Date.parse(created.preset.updated_at))
      expect(await repo((r) => r.list(account.id))).toHaveLength(1)
    })

    it("the cap holds under 15 concurrent creations", async () => {
      const account = await newAccount()
      const outcomes = await Promise.all(Array.from({ length: 15 }, (_, i) =>
        repo((r) => r.create(account.id, { ...DEFAULT_PRESET, name: `p${i}` }, MAX_PRESETS))))
      expect(outcomes.filter((o) => o._tag === "Created")).toHaveLength(10)
      expect(outcomes.filter((o) => o._tag === "Cap")).toHaveLength(5)
      expect(await activeCount(account.id)).toEqual({ n: 10, a: 1 })
    })

    it("10 concurrent activations of different presets leave exactly one active", async () => {
      const account = await newAccount()
      const ids: Array<number> = []
      for (let i = 0; i < 10; i++) {
        const o = await repo((r) => r.create(account.id, { ...DEFAULT_PRESET, name: `p${i}` }, MAX_PRESETS))
        if (o._tag === "Created") ids.push(o.preset.id)
      }
      const activated = await Promise.all(ids.map((id) => repo((r) => r.activate(account.id, id))))
      expect(activated.every((p) => p !== null && p.active)).toBe(true)
      expect(await activeCount(account.id)).toEqual({ n: 10, a: 1 })
    })

    it("deleting the active preset activates the most recently updated one; the last may go too", async () => {
      const account = await newAccount()
      const make = async (name: string) => {
        const o = await repo((r) => r.create(account.id, { ...DEFAULT_PRESET, name }, MAX_PRESETS))
        if (o._tag !== "Created") throw new Error("cap")
        return o.preset.id
      }
      const a = await make("a")
      const b = await make("b")
      const c = await make("c")
      // b is the most recently updated; a is active (the first one).
      await run(Effect.flatMap(SqlClient.SqlClient, (sql) =>
        sql`UPDATE image_presets SET updated_at = now() + interval '1 hour' WHERE id = ${b}`))
      expect((await repo((r) => r.remove(account.id, a)))?.active?.id).toBe(b)
      // Deleting an inactive one leaves the active one.
      expect((await repo((r) => r.remove(account.id, c)))?.active?.id).toBe(b)
      expect(await repo((r) => r.remove(account.id, b))).toEqual({ active: null })
      expect(await activeCount(account.id)).toEqual({ n: 0, a: 0 })
      // Next use: a fresh default.
      const again = await run(Effect.flatMap(ImagePresets, (p) => p.active(account.id)))
      expect(again).toMatchObject({ name: DEFAULT_PRESET.name, active: true })
      expect(again.id).not.toBe(a)
    })

    it("another account's preset is not found by update, remove or activate", async () => {
      const owner = await newAccount()
      const other = await newAccount()
      const mine = await run(Effect.flatMap(ImagePresets, (p) => p.active(owner.id)))
      expect(await repo((r) => r.update(other.id, mine.id, { name: "x" }))).toBeNull()
      expect(await repo((r) => r.update(other.id, mine.id, {}))).toBeNull()
      expect(await repo((r) => r.activate(other.id, mine.id))).toBeNull()
      expect(await repo((r) => r.remove(other.id, mine.id))).toBeNull()
      expect(await repo((r) => r.activate(owner.id, 999_999_999))).toBeNull()
      expect(await activeCount(owner.id)).toEqual({ n: 1, a: 1 })
      expect(await activeCount(other.id)).toEqual({ n: 0, a: 0 })
    })
  })
}
