/** The balancer's choice: priority tiers, least in flight relative to weight, weighted draws, seeded repeatability. */
import { describe, expect, it } from "vitest"
import type { ResolvedDeployment } from "../../src/config/GatewayConfig.js"
import { type Candidate, pick, seeded } from "../../src/deployments/Balancer.js"

const d = (id: string, weight = 1, priority = 0): ResolvedDeployment => ({
  id,
  provider: id,
  model: id,
  weight,
  priority,
  concurrency: null,
  rate_limit_rpm: null
})
const c = (deployment: ResolvedDeployment, inFlight = 0): Candidate => ({ deployment, inFlight })

describe("balancer", () => {
  it("shares idle deployments by weight (within 2 points over 10,000 draws)", () => {
    const random = seeded(1)
    const all = [c(d("a", 1)), c(d("b", 3)), c(d("c", 6))]
    const counts = { a: 0, b: 0, c: 0 } as Record<string, number>
    for (let i = 0; i < 10_000; i++) counts[pick(all, random)!.deployment.id]! += 1
    expect(Math.abs(counts.a! / 10_000 - 0.1)).toBeLessThan(0.02)
    expect(Math.abs(counts.b! / 10_000 - 0.3)).toBeLessThan(0.02)
    expect(Math.abs(counts.c! / 10_000 - 0.6)).toBeLessThan(0.02)
  })

  it("is repeatable with the same seed", () => {
    const all = [c(d("a")), c(d("b")), c(d("c"))]
    const run = (seed: number) => {
      const random = seeded(seed)
      return Array.from({ length: 50 }, () => pick(all, random)!.deployment.id).join("")
    }
    expect(run(42)).toBe(run(42))
    expect(run(42)).not.toBe(run(43))
  })

  it("takes the least loaded relative to weight", () => {
    const random = seeded(3)
    // a: 4 in flight / weight 2 = 2; b: 1 / 1 = 1; c: 3 / 1 = 3.
    for (let i = 0; i < 100; i++) expect(pick([c(d("a", 2), 4), c(d("b"), 1), c(d("c"), 3)], random)!.deployment.id).toBe("b")
  })

  it("uses a higher priority number only when no lower one is a candidate", () => {
    const random = seeded(5)
    const primary = c(d("primary", 1, 0), 50)
    const backup = c(d("backup", 100, 1), 0)
    for (let i = 0; i < 100; i++) expect(pick([backup, primary], random)!.deployment.id).toBe("primary")
    expect(pick([backup], random)!.deployment.id).toBe("backup")
    expect(pick([], random)).toBeNull()
  })
})
