/** The catalog's `deployments`: the single-`route` form as one deployment, defaults, ids, and what is refused. */
import { describe, expect, it } from "vitest"
import { decodeCatalog, deploymentsOf } from "../../src/config/GatewayConfig.js"

const catalog = (model: Record<string, unknown>) => ({
  catalog: {
    providers: { sim: { kind: "simulated" }, a: { kind: "openai-compatible", base_url: "http://127.0.0.1:1/v1" } },
    models: [{
      id: "m",
      owned_by: "t",
      max_input_tokens: 100,
      max_output_tokens: 50,
      rate_limit_rpm: 5,
      concurrency: 2,
      ...model
    }]
  }
})

describe("catalog deployments", () => {
  it("reads `route` as one deployment named after its provider", () => {
    const decoded = decodeCatalog(catalog({ route: { provider: "sim", model: "x" } }), "t.yaml")
    expect(deploymentsOf(decoded.models[0]!)).toEqual([
      { id: "sim", provider: "sim", model: "x", weight: 1, priority: 0, concurrency: null, rate_limit_rpm: null }
    ])
  })

  it("fills defaults and numbers a provider listed twice", () => {
    const decoded = decodeCatalog(
      catalog({
        deployments: [
          { provider: "a", model: "x" },
          { provider: "a", model: "y", weight: 3, priority: 1, concurrency: 4, rate_limit_rpm: 60 },
          { id: "local", provider: "sim", model: "z" }
        ]
      }),
      "t.yaml"
    )
    expect(deploymentsOf(decoded.models[0]!).map((d) => [d.id, d.weight, d.priority, d.concurrency, d.rate_limit_rpm]))
      .toEqual([["a", 1, 0, null, null], ["a#2", 3, 1, 4, 60], ["local", 1, 0, null, null]])
  })

  it.each([
    ["neither route nor deployments", {}, /exactly one of route and deployments/],
    ["both", { route: { provider: "sim", model: "x" }, deployments: [{ provider: "a", model: "x" }] }, /exactly one/],
    ["an empty list", { deployments: [] }, /must not be empty/],
    ["an unknown provider", { deployments: [{ provider: "nope", model: "x" }] }, /deployments\.0\.provider.*unknown provider/s],
    ["a duplicate id", { deployments: [{ id: "d", provider: "a", model: "x" }, { id: "d", provider: "sim", model: "y" }] }, /duplicate deployment id d/],
    ["a zero weight", { deployments: [{ provider: "a", model: "x", weight: 0 }] }, /weight/],
    ["a bad id", { deployments: [{ id: "no spaces", provider: "a", model: "x" }] }, /id/]
  ])("refuses %s", (_what, model, message) => {
    expect(() => decodeCatalog(catalog(model), "t.yaml")).toThrow(message)
  })
})
