/**
 * The BYOK provider catalog (issue 10, item 2): server data, operator overrides, the `providers[]` rows of the
 * list response, validation of verify/save bodies, assembled base URLs, request targets and headers.
 */
import { describe, expect, it } from "vitest"
import { decodeByokConfig } from "../../src/config/Byok.js"
import {
  derivedColumns,
  describeProviders,
  isOperatorUrl,
  makeProviderCatalog,
  parseModelList,
  type ProviderDef,
  requestHeaders,
  requestUrl,
  resolveBaseUrl,
  validateCredentialInput
} from "../../src/byok/Providers.js"

const catalog = makeProviderCatalog(decodeByokConfig({}))
const provider = (id: string): ProviderDef => catalog.byId.get(id)!

const valid = (body: unknown) => {
  const result = validateCredentialInput(catalog, body)
  if (!result.ok) throw new Error(`expected valid, got ${JSON.stringify(result.error)}`)
  return result.value
}
const errorOf = (body: unknown) => {
  const result = validateCredentialInput(catalog, body)
  return result.ok ? null : result.error
}

describe("providers[] rows", () => {
  it("one row per (provider, auth scheme), spec field names, Azure twice with multi_scheme", () => {
    const rows = describeProviders(catalog)
    expect(rows.map((r) => `${r.id}/${r.auth_scheme}`)).toEqual([
      "openai/bearer",
      "anthropic/x-api-key",
      "openrouter/bearer",
      "gemini/bearer",
      "azure/api-key",
      "azure/bearer",
      "custom/bearer"
    ])
    for (const row of rows) {
      expect(Object.keys(row).sort()).toEqual(
        ["auth_scheme", "id", "label", "multi_scheme", "optional_fields", "required_fields", "supports_models_list"]
      )
      expect(row.multi_scheme).toBe(row.id === "azure")
      expect(row.supports_models_list).toBe(true)
    }
    const openai = rows.find((r) => r.id === "openai")!
    expect(openai.required_fields).toEqual([])
    expect(openai.optional_fields).toEqual(["organization_id", "project_id", "region"])
    const azure = rows.find((r) => r.id === "azure")!
    expect(azure.required_fields).toEqual(["resource"])
    expect(azure.optional_fields).toEqual(["api_version"])
    expect(rows.find((r) => r.id === "custom")!.required_fields).toEqual(["base_url"])
  })

  it("a provider the operator disabled is not listed and not usable", () => {
    const reduced = makeProviderCatalog(decodeByokConfig({ providers: { openrouter: { enabled: false } } }))
    expect(describeProviders(reduced).some((r) => r.id === "openrouter")).toBe(false)
    const result = validateCredentialInput(reduced, { provider: "openrouter", auth_scheme: "bearer", secret: "sk-or-x" })
    expect(result.ok ? null : result.error.code).toBe("byok_credential_missing")
  })

  it("the catalog's wire kinds and default base URLs", () => {
    expect(provider("anthropic").wire).toBe("anthropic")
    for (const id of ["openai", "openrouter", "gemini", "azure", "custom"]) expect(provider(id).wire).toBe("openai-compatible")
    expect(resolveBaseUrl(provider("gemini"), {}).url).toBe("https://generativelanguage.googleapis.com/v1beta/openai")
    expect(resolveBaseUrl(provider("openai"), {}).url).toBe("https://api.openai.com/v1")
    expect(resolveBaseUrl(provider("anthropic"), {}).url).toBe("https://api.anthropic.com/v1")
    expect(resolveBaseUrl(provider("openrouter"), {}).url).toBe("https://openrouter.ai/api/v1")
  })
})

describe("operator overrides", () => {
  it("base URLs move (tests point them at local fakes) and their origins are trusted", () => {
    const overridden = makeProviderCatalog(decodeByokConfig({
      providers: {
        openai: { base_url: "http://127.0.0.1:9001/v1/" },
        azure: { base_url: "http://127.0.0.1:9002/{resource}/openai" },
        gemini: { base_url: "https://{resource}.example.com/x" }
      }
    }))
    const openai = overridden.byId.get("openai")!
    expect(resolveBaseUrl(openai, {}).url).toBe("http://127.0.0.1:9001/v1")
    // Regions move with the base URL unless the operator names them.
    expect(resolveBaseUrl(openai, { region: "eu" }).url).toBe("http://127.0.0.1:9001/v1")
    const azure = overridden.byId.get("azure")!
    expect(resolveBaseUrl(azure, { resource: "res1" })).toEqual({ url: "http://127.0.0.1:9002/res1/openai", userShaped: true })
    expect(openai.operatorOrigins).toEqual(["http://127.0.0.1:9001"])
    expect(isOperatorUrl(openai, "http://127.0.0.1:9001/v1/models")).toBe(true)
    expect(isOperatorUrl(openai, "http://127.0.0.1:9002/v1/models")).toBe(false)
    expect(azure.operatorOrigins).toEqual(["http://127.0.0.1:9002"])
    // A placeholder in the host: not a fixed origin, not trusted.
    expect(overridden.byId.get("gemini")!.operatorOrigins).toEqual([])
    // Defaults are not trusted (they stay under the address checks), and a custom URL never is.
    for (const p of catalog.providers) expect(p.operatorOrigins).toEqual([])
    const custom = makeProviderCatalog(decodeByokConfig({
      providers: { custom: { base_url: "http://127.0.0.1:9004/v1", regions: { x: "http://127.0.0.1:9005" } } }
    })).byId.get("custom")!
    expect(custom.operatorOrigins).toEqual([])
  })

  it("region URLs can be overridden separately", () => {
    const c = makeProviderCatalog(decodeByokConfig({ providers: { openai: { regions: { eu: "http://127.0.0.1:9003/v1" } } } }))
    expect(resolveBaseUrl(c.byId.get("openai")!, { region: "eu" }).url).toBe("http://127.0.0.1:9003/v1")
    expect(resolveBaseUrl(c.byId.get("openai")!, { region: "us" }).url).toBe("https://us.api.openai.com/v1")
    expect(c.byId.get("openai")!.operatorOrigins).toEqual(["http://127.0.0.1:9003"])
  })

  it("max_per_provider comes from config", () => {
    expect(catalog.maxPerProvider).toBe(5)
    expect(makeProviderCatalog(decodeByokConfig({ max_per_provider: 2 })).maxPerProvider).toBe(2)
  })
})

describe("validating a verify/save body", () => {
  it("a full OpenAI body is normalized", () => {
    const input = valid({
      provider: "openai",
      auth_scheme: "bearer",
      label: "  work ",
      secret: "  sk-proj-abc123  ",
      meta: { organization_id: "org-AbC_1", project_id: "proj_9", region: "EU", unused: "" }
    })
    expect(input.provider.id).toBe("openai")
    expect(input.scheme.id).toBe("bearer")
    expect(input.label).toBe("work")
    expect(input.secret).toBe("sk-proj-abc123")
    expect(input.meta).toEqual({ organization_id: "org-AbC_1", project_id: "proj_9", region: "eu" })
  })

  it("auth_scheme may be omitted for a one-scheme provider, not for Azure", () => {
    expect(valid({ provider: "anthropic", secret: "sk-ant-x" }).scheme.id).toBe("x-api-key")
    expect(errorOf({ provider: "azure", secret: "k", meta: { resource: "r" } })).toMatchObject({
      code: "byok_credential_missing",
      field: "auth_scheme"
    })
    expect(valid({ provider: "azure", auth_scheme: "bearer", secret: "eyJ0", meta: { resource: "r" } }).scheme.id).toBe("bearer")
  })

  it("no label: null (the server assigns key-N); labels bounded to 40 characters", () => {
    expect(valid({ provider: "openai", secret: "sk-1" }).label).toBeNull()
    expect(valid({ provider: "openai", secret: "sk-1", label: "   " }).label).toBeNull()
    expect(valid({ provider: "openai", secret: "sk-1", label: "가".repeat(40) }).label).toBe("가".repeat(40))
    expect(valid({ provider: "openai", secret: "sk-1", label: "개인용_키-2.b" }).label).toBe("개인용_키-2.b")
    expect(errorOf({ provider: "openai", secret: "sk-1", label: "a".repeat(41) })).toMatchObject({
      code: "invalid_request",
      field: "label"
    })
  })

  const table: ReadonlyArray<readonly [string, unknown, "invalid_request" | "byok_credential_missing", string]> = [
    ["body not an object", [1], "invalid_request", "body"],
    ["unknown provider", { provider: "nope", secret: "x" }, "byok_credential_missing", "provider"],
    ["provider not a string", { provider: 1, secret: "x" }, "byok_credential_missing", "provider"],
    ["unsupported scheme", { provider: "openai", auth_scheme: "api-key", secret: "x" }, "byok_credential_missing", "auth_scheme"],
    ["empty secret", { provider: "openai", secret: "  " }, "byok_credential_missing", "secret"],
    ["no secret", { provider: "openai" }, "byok_credential_missing", "secret"],
    ["secret not a string", { provider: "openai", secret: 5 }, "invalid_request", "secret"],
    ["secret with a newline (header injection)", { provider: "openai", secret: "sk-1\r\nx-evil: 1" }, "invalid_request", "secret"],
    ["secret too long", { provider: "openai", secret: "s".repeat(9000) }, "invalid_request", "secret"],
    ["label with a slash", { provider: "openai", secret: "x", label: "a/b" }, "invalid_request", "label"],
    ["label with a colon", { provider: "openai", secret: "x", label: "a:b" }, "invalid_request", "label"],
    ["label not a string", { provider: "openai", secret: "x", label: 3 }, "invalid_request", "label"],
    ["meta not an object", { provider: "openai", secret: "x", meta: "eu" }, "invalid_request", "meta"],
    ["meta array", { provider: "openai", secret: "x", meta: [] }, "invalid_request", "meta"],
    ["unknown meta key", { provider: "openai", secret: "x", meta: { base_url: "https://x.example" } }, "invalid_request", "meta.base_url"],
    ["meta value not a string", { provider: "openai", secret: "x", meta: { organization_id: 7 } }, "invalid_request", "meta.organization_id"],
    ["bad organization id", { provider: "openai", secret: "x", meta: { organization_id: "org x" } }, "invalid_request", "meta.organization_id"],
    ["unknown region", { provider: "openai", secret: "x", meta: { region: "mars" } }, "invalid_request", "meta.region"],
    ["azure without resource", { provider: "azure", auth_scheme: "api-key", secret: "x" }, "byok_credential_missing", "meta.resource"],
    ["azure resource with a fragment", { provider: "azure", auth_scheme: "api-key", secret: "x", meta: { resource: "evil#" } }, "invalid_request", "meta.resource"],
    ["azure resource that is a host", { provider: "azure", auth_scheme: "api-key", secret: "x", meta: { resource: "evil.example/x" } }, "invalid_request", "meta.resource"],
    ["azure resource with userinfo", { provider: "azure", auth_scheme: "api-key", secret: "x", meta: { resource: "a@b" } }, "invalid_request", "meta.resource"],
    ["azure bad api version", { provider: "azure", auth_scheme: "api-key", secret: "x", meta: { resource: "r", api_version: "latest&x=1" } }, "invalid_request", "meta.api_version"],
    ["custom without base_url", { provider: "custom", secret: "x" }, "byok_credential_missing", "meta.base_url"],
    ["custom base_url not http(s)", { provider: "custom", secret: "x", meta: { base_url: "file:///etc/passwd" } }, "invalid_request", "meta.base_url"],
    ["custom base_url too long", { provider: "custom", secret: "x", meta: { base_url: "https://a.example/" + "a".repeat(3000) } }, "invalid_request", "meta.base_url"],
    ["too many meta keys", { provider: "openai", secret: "x", meta: Object.fromEntries(Array.from({ length: 17 }, (_, i) => [`k${i}`, ""])) }, "invalid_request", "meta"]
  ]
  for (const [name, body, code, field] of table) {
    it(`${name} → ${code} (${field})`, () => {
      const error = errorOf(body)
      expect(error).toMatchObject({ code, field })
      expect(/[가-힣]/.test(error!.message)).toBe(true)
      // The message names the field, never the value.
      expect(error!.message).not.toContain("evil")
      expect(error!.message).not.toContain("sk-1")
    })
  }
})

describe("base URL, targets, headers, derived columns", () => {
  it("Azure: resource and API version assemble the URL; the deployment is the model id", () => {
    const azure = valid({ provider: "azure", auth_scheme: "api-key", secret: "k", meta: { resource: "My-Res" } })
    expect(resolveBaseUrl(azure.provider, azure.meta)).toEqual({ url: "https://my-res.openai.azure.com/openai", userShaped: true })
    expect(requestUrl(azure.provider, azure.meta, "probe")).toBe("https://my-res.openai.azure.com/openai/models?api-version=2024-10-21")
    expect(requestUrl(azure.provider, { ...azure.meta, api_version: "2025-01-01-preview" }, "chat", "gpt 4o/x")).toBe(
      "https://my-res.openai.azure.com/openai/deployments/gpt%204o%2Fx/chat/completions?api-version=2025-01-01-preview"
    )
    expect(requestHeaders(azure.provider, azure.scheme, "k", azure.meta)).toEqual({ "api-key": "k" })
    const bearer = azure.provider.schemes.find((s) => s.id === "bearer")!
    expect(requestHeaders(azure.provider, bearer, "tok", azure.meta)).toEqual({ authorization: "Bearer tok" })
    expect(derivedColumns(azure.provider, azure.meta)).toEqual({
      base_url_origin: "https://my-res.openai.azure.com",
      region: null,
      has_org_id: false,
      has_project_id: false
    })
  })

  it("custom: the user's base URL, only its origin ever shown", () => {
    const custom = valid({ provider: "custom", secret: "k", meta: { base_url: "https://llm.example.com:8443/v1/" } })
    expect(custom.meta.base_url).toBe("https://llm.example.com:8443/v1")
    expect(resolveBaseUrl(custom.provider, custom.meta)).toEqual({ url: "https://llm.example.com:8443/v1", userShaped: true })
    expect(requestUrl(custom.provider, custom.meta, "models")).toBe("https://llm.example.com:8443/v1/models")
    expect(derivedColumns(custom.provider, custom.meta).base_url_origin).toBe("https://llm.example.com:8443")
  })

  it("OpenAI: organization and project become headers and presence flags; region picks the endpoint", () => {
    const openai = valid({
      provider: "openai",
      secret: "sk-1",
      meta: { organization_id: "org-1", project_id: "proj_1", region: "eu" }
    })
    expect(requestHeaders(openai.provider, openai.scheme, "sk-1", openai.meta)).toEqual({
      authorization: "Bearer sk-1",
      "openai-organization": "org-1",
      "openai-project": "proj_1"
    })
    expect(requestUrl(openai.provider, openai.meta, "chat")).toBe("https://eu.api.openai.com/v1/chat/completions")
    expect(derivedColumns(openai.provider, openai.meta)).toEqual({
      base_url_origin: null,
      region: "eu",
      has_org_id: true,
      has_project_id: true
    })
    const bare = valid({ provider: "openai", secret: "sk-1", meta: { project_id: "proj_1" } })
    expect(derivedColumns(bare.provider, bare.meta)).toMatchObject({ has_org_id: false, has_project_id: true, region: null })
    expect(resolveBaseUrl(bare.provider, bare.meta)).toEqual({ url: "https://api.openai.com/v1", userShaped: false })
  })

  it("Anthropic: x-api-key and anthropic-version; Messages path; no embeddings", () => {
    const a = valid({ provider: "anthropic", secret: "sk-ant-1" })
    expect(requestHeaders(a.provider, a.scheme, "sk-ant-1", a.meta)).toEqual({
      "anthropic-version": "2023-06-01",
      "x-api-key": "sk-ant-1"
    })
    expect(requestUrl(a.provider, a.meta, "probe")).toBe("https://api.anthropic.com/v1/models?limit=1000")
    expect(requestUrl(a.provider, a.meta, "chat")).toBe("https://api.anthropic.com/v1/messages")
    expect(requestUrl(a.provider, a.meta, "embeddings")).toBeNull()
  })

  it("OpenRouter probes the key, lists models separately", () => {
    const o = valid({ provider: "openrouter", secret: "sk-or-1" })
    expect(requestUrl(o.provider, o.meta, "probe")).toBe("https://openrouter.ai/api/v1/key")
    expect(requestUrl(o.provider, o.meta, "models")).toBe("https://openrouter.ai/api/v1/models")
  })
})

describe("model lists", () => {
  it("OpenAI-style and Anthropic-style listings; ids verbatim, bounded, deduplicated", () => {
    expect(parseModelList("openai", {
      object: "list",
      data: [{ id: "gpt-4o", object: "model" }, { id: "models/gemini-2.0-flash" }, { id: "gpt-4o" }, { id: "" }, { id: 5 }, "x",
        { id: "x".repeat(300) }, { id: "anthropic/claude-3.5", name: "Claude 3.5" }]
    })).toEqual([
      { id: "gpt-4o", display_name: null },
      { id: "models/gemini-2.0-flash", display_name: null },
      { id: "anthropic/claude-3.5", display_name: "Claude 3.5" }
    ])
    expect(parseModelList("anthropic", {
      data: [{ id: "claude-sonnet-4-5", display_name: "Claude Sonnet 4.5", type: "model" }],
      has_more: false
    })).toEqual([{ id: "claude-sonnet-4-5", display_name: "Claude Sonnet 4.5" }])
  })

  it("a body that is not a listing is null; huge listings are cut", () => {
    expect(parseModelList("openai", { models: [] })).toBeNull()
    expect(parseModelList("openai", null)).toBeNull()
    const many = { data: Array.from({ length: 5000 }, (_, i) => ({ id: `m${i}` })) }
    expect(parseModelList("openai", many)!.length).toBe(2000)
  })
})
