import { describe, expect, it } from "@effect/vitest"
import { Effect, Fiber, Layer, Logger, References, Stream } from "effect"
import { TestClock } from "effect/testing"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { afterAll, beforeAll } from "vitest"
import * as Yaml from "yaml"
import { decodeCatalog } from "../../src/config/GatewayConfig.js"
import { type FileRead, LiveCatalog, makeConfigFile, makeLiveCatalog, makeLiveCatalogOn } from "../../src/config/Live.js"
import { authed, type ConfigDoc, defaultConfigDoc, startGateway, type TestGateway } from "../support/Gateway.js"

const tmp = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-reload-"))
afterAll(() => Fs.rmSync(tmp, { recursive: true, force: true }))

interface Logged {
  readonly level: string
  readonly message: string
  readonly annotations: Record<string, unknown>
}

/** A config file plus helpers to edit it in place, and a logger that records what the reloader says. */
const fixture = () => {
  const file = Path.join(tmp, `gateway-${Math.random().toString(36).slice(2)}.yaml`)
  let doc = defaultConfigDoc()
  Fs.writeFileSync(file, Yaml.stringify(doc))
  const logs: Array<Logged> = []
  const logger = Logger.make<unknown, void>(({ fiber, logLevel, message }) => {
    logs.push({
      // v3's LogLevel labels ("INFO", "WARN"); v4 levels are "Info", "Warn".
      level: logLevel.toUpperCase(),
      message: Array.isArray(message) ? message.map(String).join(" ") : String(message),
      annotations: { ...fiber.getRef(References.CurrentLogAnnotations) }
    })
  })
  return {
    file,
    logs,
    initial: decodeCatalog(doc, file),
    edit: (f: (doc: ConfigDoc) => void) => {
      doc = structuredClone(doc)
      f(doc)
      Fs.writeFileSync(file, Yaml.stringify(doc))
    },
    writeRaw: (text: string) => Fs.writeFileSync(file, text),
    withLogger: Logger.layer([logger])
  }
}

const model = (view: { byId: ReadonlyMap<string, { rate_limit_rpm: number; max_input_tokens: number }> }, id: string) =>
  view.byId.get(id)!

describe("live catalog reload (TestClock)", () => {
  it.effect("one watcher: each change is parsed once and every listener gets that document, the catalog first", () => {
    const f = fixture()
    return Effect.gen(function*() {
      const file = yield* makeConfigFile(f.file, "5 seconds")
      const order: Array<string> = []
      const live = yield* makeLiveCatalogOn(file, f.initial)
      const seen: Array<FileRead> = []
      yield* file.subscribe((read) => Effect.sync(() => {
        order.push(`listener at catalog version ${live.current().version}`)
        seen.push(read)
      }))
      yield* file.subscribe((read) => Effect.sync(() => void seen.push(read)))
      yield* TestClock.adjust("1 second")
      expect(seen).toHaveLength(0) // unchanged since boot

      f.edit((d) => (d.catalog.models[0].rate_limit_rpm = 5))
      yield* TestClock.adjust("5 seconds")
      expect(seen).toHaveLength(2)
      expect(seen[0]).toBe(seen[1]) // the same parsed document, not two reads
      expect(seen[0]!._tag).toBe("Parsed")
      expect(order).toEqual(["listener at catalog version 2"])

      // Unchanged: nobody is called again, by the background poll or by an explicit one.
      yield* TestClock.adjust("15 seconds")
      yield* file.poll
      expect(seen).toHaveLength(2)

      f.writeRaw("catalog: [unclosed")
      expect(yield* live.reload).toBe(false)
      expect(seen.slice(2).map((r) => r._tag)).toEqual(["Unparsable", "Unparsable"])
      expect(yield* live.reload).toBe(false) // still the current version's verdict
    }).pipe(Effect.provide(f.withLogger))
  })

  it.effect("a changed rate_limit_rpm, max_input_tokens, cap or disabled applies after one period, not before", () => {
    const f = fixture()
    return Effect.gen(function*() {
      const live = yield* makeLiveCatalog(f.file, f.initial, "5 seconds")
      yield* TestClock.adjust("1 second") // the poller ran its first (no-op) check and now sleeps on the clock
      expect(live.current().version).toBe(1)
      expect(model(live.current(), "ws-pro").rate_limit_rpm).toBe(60)

      f.edit((d) => {
        d.catalog.models[0].rate_limit_rpm = 7
        d.catalog.models[0].max_input_tokens = 1234
        d.catalog.models[0].daily_cap = 99
        d.catalog.models[2].disabled = true
      })
      yield* TestClock.adjust("3 seconds") // 4 s since the last check: not yet
      expect(live.current().version).toBe(1)
      expect(model(live.current(), "ws-pro").rate_limit_rpm).toBe(60)

      yield* TestClock.adjust("1 second") // one full period
      const view = live.current()
      expect(view.version).toBe(2)
      expect(view.byId.get("ws-pro")).toMatchObject({ rate_limit_rpm: 7, max_input_tokens: 1234, daily_cap: 99 })
      expect(view.byId.get("ws-lite")!.disabled).toBe(true)
      expect(view.listed.map((m) => m.id)).toEqual(["ws-pro", "ws-reasoner", "ws-embed"])
      expect(f.logs.some((l) => l.level === "INFO" && l.message === "catalog reloaded")).toBe(true)

      // An unchanged file is not a new version.
      yield* TestClock.adjust("10 seconds")
      expect(live.current().version).toBe(2)
    }).pipe(Effect.provide(f.withLogger))
  })

  it.effect("changes emits the current catalog, then each accepted version", () => {
    const f = fixture()
    return Effect.gen(function*() {
      const live = yield* makeLiveCatalog(f.file, f.initial, "5 seconds")
      const seen = yield* live.changes.pipe(Stream.take(2), Stream.runCollect, Effect.forkChild)
      yield* TestClock.adjust("1 second")
      f.edit((d) => (d.catalog.models[1].rate_limit_rpm = 3))
      yield* TestClock.adjust("5 seconds")
      const versions = yield* Fiber.join(seen)
      expect(versions.map((v) => v.version)).toEqual([1, 2])
      expect(model(versions[1]!, "ws-reasoner").rate_limit_rpm).toBe(3)
    }).pipe(Effect.provide(f.withLogger))
  })

  it.effect("an invalid edit keeps the previous catalog and logs why; a later valid edit applies", () => {
    const f = fixture()
    return Effect.gen(function*() {
      const live = yield* makeLiveCatalog(f.file, f.initial, "5 seconds")
      yield* TestClock.adjust("1 second")

      f.edit((d) => (d.catalog.models[0].rate_limit_rpm = -1))
      yield* TestClock.adjust("5 seconds")
      expect(live.current().version).toBe(1)
      expect(model(live.current(), "ws-pro").rate_limit_rpm).toBe(60)
      const warnings = f.logs.filter((l) => l.level === "WARN")
      expect(warnings).toHaveLength(1)
      expect(warnings[0]!.message).toMatch(/rejected; keeping previous catalog/)
      expect(String(warnings[0]!.annotations.why)).toContain("catalog.models.0.rate_limit_rpm")

      // Broken YAML is rejected the same way; the same reason is not logged twice in a row.
      f.writeRaw("catalog: [unclosed")
      yield* TestClock.adjust("5 seconds")
      expect(live.current().version).toBe(1)
      expect(String(f.logs.filter((l) => l.level === "WARN").at(-1)!.annotations.why)).toMatch(/not valid YAML/)

      f.edit((d) => (d.catalog.models[0].rate_limit_rpm = 11))
      yield* TestClock.adjust("5 seconds")
      expect(live.current().version).toBe(2)
      expect(model(live.current(), "ws-pro").rate_limit_rpm).toBe(11)
    }).pipe(Effect.provide(f.withLogger))
  })

  it.effect("a deleted file keeps the catalog (nothing to reload)", () => {
    const f = fixture()
    return Effect.gen(function*() {
      const live = yield* makeLiveCatalog(f.file, f.initial, "5 seconds")
      yield* TestClock.adjust("1 second")
      Fs.rmSync(f.file)
      yield* TestClock.adjust("5 seconds")
      expect(live.current().version).toBe(1)
      expect(live.current().listed.length).toBe(4)
    }).pipe(Effect.provide(Layer.succeed(References.MinimumLogLevel, "None")))
  })
})

describe("live catalog over HTTP", () => {
  let gw: TestGateway
  beforeAll(async () => {
    gw = await startGateway()
  })
  afterAll(() => gw?.stop())

  const models = async () => {
    const res = await fetch(`${gw.url}/v1/models`, { headers: authed(gw.key) })
    expect(res.status).toBe(200)
    return ((await res.json()) as { data: Array<{ id: string; rate_limit_rpm: number; max_input_tokens: number }> }).data
  }
  const reload = () => gw.run(Effect.flatMap(LiveCatalog, (c) => c.reload))

  it("/v1/models reflects a reloaded catalog without restart", async () => {
    expect((await models()).find((m) => m.id === "ws-pro")).toMatchObject({ rate_limit_rpm: 60, max_input_tokens: 128000 })
    gw.rewriteConfig((d) => {
      d.catalog.models[0].rate_limit_rpm = 9
      d.catalog.models[0].max_input_tokens = 4096
      d.catalog.models[4].disabled = false
    })
    expect(await reload()).toBe(true)
    const after = await models()
    expect(after.find((m) => m.id === "ws-pro")).toMatchObject({ rate_limit_rpm: 9, max_input_tokens: 4096 })
    expect(after.map((m) => m.id)).toContain("ws-legacy")
  })

  it("an invalid edit over HTTP keeps serving the previous catalog", async () => {
    const before = await models()
    gw.rewriteConfig((d) => (d.catalog.models[0].max_input_tokens = "lots"))
    expect(await reload()).toBe(false)
    expect(await models()).toEqual(before)
  })

  it("all models disabled gives an empty list", async () => {
    gw.rewriteConfig((d) => {
      d.catalog.models[0].max_input_tokens = 4096
      for (const m of d.catalog.models) m.disabled = true
    })
    expect(await reload()).toBe(true)
    expect(await models()).toEqual([])
  })
})
