import { Redacted } from "effect"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import * as Yaml from "yaml"
import {
  ConfigLoadError,
  decodeCatalog,
  decodeGatewayConfig,
  loadConfig,
  parseFlags
} from "../../src/config/GatewayConfig.js"
import { type ConfigDoc, defaultConfigDoc } from "../support/Gateway.js"

const tmp = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-config-"))
afterAll(() => Fs.rmSync(tmp, { recursive: true, force: true }))

let n = 0
const writeConfig = (doc: unknown): string => {
  const file = Path.join(tmp, `gateway-${++n}.yaml`)
  Fs.writeFileSync(file, typeof doc === "string" ? doc : Yaml.stringify(doc))
  return file
}

const edited = (edit: (doc: ConfigDoc) => void): string => {
  const doc = defaultConfigDoc()
  edit(doc)
  return writeConfig(doc)
}

/** The ConfigLoadError message of a failing load. */
const loadError = (run: () => unknown): string => {
  try {
    run()
  } catch (error) {
    expect(error).toBeInstanceOf(ConfigLoadError)
    return (error as Error).message
  }
  throw new Error("expected a ConfigLoadError")
}

/** The smallest valid document: everything else comes from defaults. */
const minimal = () => ({
  plans: { default: { session_limit: 1000, weekly_limit: 10000 } },
  abuse: { burst: 10, window_seconds: 10, cooldown_seconds: 60 },
  catalog: {
    providers: { sim: { kind: "simulated" } },
    models: [{
      id: "m1",
      owned_by: "maker",
      max_input_tokens: 100,
      max_output_tokens: 50,
      rate_limit_rpm: 5,
      concurrency: 2,
      route: { provider: "sim", model: "x" }
    }]
  }
})

describe("config schema", () => {
  it("fills every default from a minimal document", () => {
    const config = decodeGatewayConfig(minimal(), "minimal")
    expect(config.listeners).toEqual([{ host: "127.0.0.1", port: 8080, origins: ["inference", "account", "status"] }])
    expect(config.data_dir).toBe("./data")
    expect(config.key_prefix).toBe("sk-ws-")
    expect(config.catalog_reload_seconds).toBe(5)
    expect(config.default_plan).toBe("default")
    expect(config.dev_account).toBe(true)
    expect(config.database_url).toBeUndefined()
    expect(config.redis_url).toBeUndefined()
    expect(config.encryption_key).toBeUndefined()
    expect(config.access).toEqual({
      email_enforcement: false,
      region_lock: { enabled: false, header: "cf-ipcountry", allowed_countries: [] }
    })
    expect(config.plans.default).toEqual({
      session_limit: 1000,
      weekly_limit: 10000,
      session_hours: 5,
      hide_absolutes: false,
      show_request_pct: false
    })
    const model = config.catalog.models[0]!
    expect(model).toMatchObject({
      supports_tools: false,
      supports_reasoning: false,
      supports_images: false,
      supports_embeddings: false,
      supports_chat: true,
      reasoning_efforts: [],
      daily_cap: null,
      weights: { input: 1, output: 1 },
      disabled: false
    })
    expect(Number.isInteger(model.created)).toBe(true)
    expect(config.catalog.providers.sim).toEqual({ kind: "simulated", first_token_ms: 0, tokens_per_second: 0 })
  })

  it("decodes the shipped config/gateway.yaml and it covers every capability gate", () => {
    const { config } = loadConfig({ path: "config/gateway.yaml", env: {} })
    const models = config.catalog.models.filter((m) => !m.disabled)
    const full = models.find((m) => m.supports_tools && m.supports_reasoning && m.supports_images)
    expect(full).toBeDefined()
    expect(full!.reasoning_efforts.length).toBeGreaterThan(0)
    expect(full!.reasoning_efforts.every((e) => ["none", "low", "high", "max"].includes(e))).toBe(true)
    expect(models.some((m) =>
      m.supports_chat && !m.supports_tools && !m.supports_reasoning && !m.supports_images && !m.supports_embeddings
    )).toBe(true)
    expect(models.some((m) => m.supports_embeddings && !m.supports_chat)).toBe(true)
    expect(config.catalog.models.some((m) => m.disabled)).toBe(true)
  })

  const rejects: ReadonlyArray<[string, (doc: ConfigDoc) => void, string]> = [
    ["a negative rate_limit_rpm", (d) => (d.catalog.models[0].rate_limit_rpm = -5), "catalog.models.0.rate_limit_rpm"],
    ["a fractional max_input_tokens", (d) => (d.catalog.models[1].max_input_tokens = 1.5), "catalog.models.1.max_input_tokens"],
    ["a missing concurrency", (d) => delete d.catalog.models[2].concurrency, "catalog.models.2.concurrency"],
    ["an unknown reasoning effort", (d) => (d.catalog.models[0].reasoning_efforts = ["extreme"]), "catalog.models.0.reasoning_efforts.0"],
    ["an unknown key (typo)", (d) => (d.catalog.models[0].rate_limit_rmp = 5), "catalog.models.0.rate_limit_rmp"],
    ["an unknown provider", (d) => (d.catalog.models[0].route.provider = "nope"), "catalog.models.0.route.provider"],
    ["a duplicate model id", (d) => (d.catalog.models[1].id = d.catalog.models[0].id), "catalog.models.1.id"],
    ["a reasoning model without efforts", (d) => (d.catalog.models[1].reasoning_efforts = []), "catalog.models.1.reasoning_efforts"],
    ["an unknown default plan", (d) => (d.default_plan = "gold"), "default_plan"],
    ["a bad key prefix", (d) => (d.key_prefix = "SK_"), "key_prefix"],
    ["a bad listener port", (d) => (d.listeners[0].port = "eighty"), "listeners.0.port"],
    ["a missing abuse section", (d) => delete d.abuse, "abuse"],
    [
      "an api_key_env naming another secret",
      (d) => (d.catalog.providers.up = { kind: "openai-compatible", base_url: "https://x.example", api_key_env: "DATABASE_URL" }),
      "catalog.providers.up.api_key_env"
    ],
    ["a body limit of zero", (d) => (d.limits = { body_bytes: 0 }), "limits.body_bytes"],
    ["a malformed dashboard origin", (d) => (d.dashboard_origins = ["evil.example/path"]), "dashboard_origins.0"]
  ]
  for (const [what, edit, field] of rejects) {
    it(`stops the boot on ${what}, naming ${field}`, () => {
      const path = edited(edit)
      const message = loadError(() => loadConfig({ path, env: {} }))
      expect(message).toContain(path)
      expect(message).toContain(field)
    })
  }

  it("reports every bad field at once", () => {
    const path = edited((d) => {
      d.catalog.models[0].rate_limit_rpm = 0
      d.catalog.models[2].max_output_tokens = -1
    })
    const message = loadError(() => loadConfig({ path, env: {} }))
    expect(message).toContain("catalog.models.0.rate_limit_rpm")
    expect(message).toContain("catalog.models.2.max_output_tokens")
  })

  it("rejects invalid YAML, a non-mapping and a missing file with a clear message", () => {
    expect(loadError(() => loadConfig({ path: writeConfig("listeners: [\n  - port: 1\n bad"), env: {} })))
      .toMatch(/not valid YAML/)
    expect(loadError(() => loadConfig({ path: writeConfig("- just\n- a list\n"), env: {} })))
      .toMatch(/expected a mapping/)
    expect(loadError(() => loadConfig({ path: Path.join(tmp, "missing.yaml"), env: {} })))
      .toMatch(/cannot read config file .*missing\.yaml/)
  })

  it("decodeCatalog (the live reload path) names fields under catalog.", () => {
    const doc = defaultConfigDoc()
    doc.catalog.models[3].max_input_tokens = 0
    expect(() => decodeCatalog(doc, "x.yaml")).toThrow(/catalog\.models\.3\.max_input_tokens/)
  })

  it("a live catalog edit cannot point api_key_env at a variable outside WELLSPRING_UPSTREAM_*", () => {
    const doc = defaultConfigDoc()
    for (const name of ["WELLSPRING_ENCRYPTION_KEY", "DATABASE_URL", "HOME", "WELLSPRING_UPSTREAM_", "wellspring_upstream_x"]) {
      doc.catalog.providers.up = { kind: "openai-compatible", base_url: "https://x.example", api_key_env: name }
      expect(() => decodeCatalog(doc, "x.yaml"), name).toThrow(/catalog\.providers\.up\.api_key_env/)
    }
    doc.catalog.providers.up.api_key_env = "WELLSPRING_UPSTREAM_OPENAI"
    expect(decodeCatalog(doc, "x.yaml").providers.up).toMatchObject({ api_key_env: "WELLSPRING_UPSTREAM_OPENAI" })
  })
})

describe("config layers: file, then env, then flags", () => {
  const file = edited((d) => {
    d.listeners = [{ host: "127.0.0.1", port: 7001 }, { host: "127.0.0.1", port: 7002, origins: ["status"] }]
    d.data_dir = "./from-file"
  })

  it("takes the file as is without overrides", () => {
    const { config, path } = loadConfig({ path: file, env: {} })
    expect(path).toBe(Path.resolve(file))
    expect(config.listeners.map((l) => l.port)).toEqual([7001, 7002])
    expect(config.data_dir).toBe("./from-file")
    expect(config.database_url).toBeUndefined()
  })

  it("env overrides the file", () => {
    const { config } = loadConfig({
      path: file,
      env: {
        WELLSPRING_PORT: "9123",
        WELLSPRING_HOST: "0.0.0.0",
        WELLSPRING_DATA_DIR: "/tmp/ws-env",
        DATABASE_URL: "postgres://u:secret@db.example:5432/ws",
        REDIS_URL: "redis://cache:6379",
        WELLSPRING_ENCRYPTION_KEY: Buffer.alloc(32, 7).toString("base64"),
        WELLSPRING_KEY_PREFIX: "sk-test-"
      }
    })
    // The port and host apply to the first listener only; the others keep theirs.
    expect(config.listeners.map((l) => [l.host, l.port])).toEqual([["0.0.0.0", 9123], ["127.0.0.1", 7002]])
    expect(config.data_dir).toBe("/tmp/ws-env")
    expect(Redacted.value(config.database_url!)).toBe("postgres://u:secret@db.example:5432/ws")
    expect(String(config.database_url)).not.toContain("secret")
    expect(Redacted.value(config.redis_url!)).toBe("redis://cache:6379")
    expect(Redacted.value(config.encryption_key!)).toBe(Buffer.alloc(32, 7).toString("base64"))
    expect(config.key_prefix).toBe("sk-test-")
  })

  it("WELLSPRING_CONFIG picks the file; an explicit path wins over it", () => {
    expect(loadConfig({ env: { WELLSPRING_CONFIG: file } }).config.listeners[0]!.port).toBe(7001)
    const other = edited((d) => (d.listeners[0].port = 7500))
    expect(loadConfig({ env: { WELLSPRING_CONFIG: file }, flags: { configPath: other } }).config.listeners[0]!.port)
      .toBe(7500)
  })

  it("CLI flags override env", () => {
    const flags = parseFlags(["--port", "9555", "--data-dir=/tmp/ws-flag", "--database-url", "postgres://flag/db"])
    const { config } = loadConfig({
      path: file,
      env: { WELLSPRING_PORT: "9123", WELLSPRING_DATA_DIR: "/tmp/ws-env", DATABASE_URL: "postgres://env/db" },
      flags
    })
    expect(config.listeners[0]!.port).toBe(9555)
    expect(config.data_dir).toBe("/tmp/ws-flag")
    expect(Redacted.value(config.database_url!)).toBe("postgres://flag/db")
  })

  it("an empty DATABASE_URL means embedded mode", () => {
    expect(loadConfig({ path: file, env: { DATABASE_URL: "" } }).config.database_url).toBeUndefined()
  })

  it("rejects a non-numeric WELLSPRING_PORT and a bad env key prefix", () => {
    expect(loadError(() => loadConfig({ path: file, env: { WELLSPRING_PORT: "80a" } }))).toMatch(/WELLSPRING_PORT/)
    expect(loadError(() => loadConfig({ path: file, env: { WELLSPRING_KEY_PREFIX: "BAD" } }))).toMatch(/key_prefix/)
  })

  it("parseFlags: unknown flag, missing value, bad port, stray argument", () => {
    expect(parseFlags([])).toEqual({
      configPath: undefined,
      port: undefined,
      host: undefined,
      dataDir: undefined,
      databaseUrl: undefined,
      redisUrl: undefined
    })
    expect(parseFlags(["--config", "a.yaml", "--host=::1", "--redis-url", "redis://x"])).toMatchObject({
      configPath: "a.yaml",
      host: "::1",
      redisUrl: "redis://x"
    })
    expect(loadError(() => parseFlags(["--prot", "80"]))).toBe("unknown flag --prot")
    expect(loadError(() => parseFlags(["--port"]))).toMatch(/--port needs a value/)
    expect(loadError(() => parseFlags(["--port", "70000"]))).toMatch(/--port must be an integer/)
    expect(loadError(() => parseFlags(["serve"]))).toMatch(/unexpected argument serve/)
  })
})
