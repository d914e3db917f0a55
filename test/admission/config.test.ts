/**
 * The Redis key prefix of the admission engine: `redis_key_prefix` in the config file, overridden by
 * `WELLSPRING_REDIS_PREFIX` (so several deployments, or test runs, can share one Redis), default `ws:q:`.
 */
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import * as Yaml from "yaml"
import { afterAll, describe, expect, it } from "vitest"
import { ConfigLoadError, loadConfig } from "../../src/config/GatewayConfig.js"
import { defaultConfigDoc } from "../support/Gateway.js"

const tmp = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-prefix-"))
afterAll(() => Fs.rmSync(tmp, { recursive: true, force: true }))

const file = (edit: (doc: Record<string, any>) => void = () => {}) => {
  const doc = defaultConfigDoc()
  edit(doc)
  const path = Path.join(tmp, `gateway-${Math.random().toString(36).slice(2)}.yaml`)
  Fs.writeFileSync(path, Yaml.stringify(doc))
  return path
}

describe("redis_key_prefix / WELLSPRING_REDIS_PREFIX", () => {
  it("defaults to ws:q:", () => {
    expect(loadConfig({ path: file(), env: {} }).config.redis_key_prefix).toBe("ws:q:")
  })

  it("is read from the file and overridden by the environment", () => {
    const path = file((doc) => {
      doc.redis_key_prefix = "prod-a:q:"
    })
    expect(loadConfig({ path, env: {} }).config.redis_key_prefix).toBe("prod-a:q:")
    expect(loadConfig({ path, env: { WELLSPRING_REDIS_PREFIX: "run42:" } }).config.redis_key_prefix).toBe("run42:")
    // empty counts as unset
    expect(loadConfig({ path, env: { WELLSPRING_REDIS_PREFIX: "" } }).config.redis_key_prefix).toBe("prod-a:q:")
  })

  it("rejects a prefix with spaces, braces (Redis hash tags) or glob characters, naming the field", () => {
    for (const bad of ["has space:", "{tag}:", "a*b:", ""]) {
      const path = file((doc) => {
        doc.redis_key_prefix = bad
      })
      expect(() => loadConfig({ path, env: {} })).toThrow(ConfigLoadError)
      expect(() => loadConfig({ path, env: {} })).toThrow(/redis_key_prefix/)
    }
  })
})
