/**
 * Which deployment takes the next attempt, among those that may (healthy, under their own caps, not tried yet by
 * this request): the lowest `priority` number present; within it the least loaded relative to weight (in flight
 * divided by weight); among those equally loaded, one drawn by weight. Idle deployments thus share requests in
 * proportion to their weights, and a slow one, whose requests pile up, is passed over until it catches up.
 * `random` (in [0, 1)) is the only source of chance: a seeded one makes the choice deterministic.
 */
import type { ResolvedDeployment } from "../config/GatewayConfig.js"

export interface Candidate {
  readonly deployment: ResolvedDeployment
  /** Requests this replica has in flight on it. */
  readonly inFlight: number
}

export const pick = <C extends Candidate>(candidates: ReadonlyArray<C>, random: () => number): C | null => {
  if (candidates.length === 0) return null
  let priority = Infinity
  for (const c of candidates) if (c.deployment.priority < priority) priority = c.deployment.priority
  let least = Infinity
  for (const c of candidates) {
    if (c.deployment.priority !== priority) continue
    const load = c.inFlight / c.deployment.weight
    if (load < least) least = load
  }
  let total = 0
  const eligible: Array<C> = []
  for (const c of candidates) {
    if (c.deployment.priority !== priority || c.inFlight / c.deployment.weight !== least) continue
    eligible.push(c)
    total += c.deployment.weight
  }
  if (eligible.length === 1) return eligible[0]!
  let draw = random() * total
  for (const c of eligible) {
    draw -= c.deployment.weight
    if (draw < 0) return c
  }
  return eligible[eligible.length - 1]!
}

/** A small seeded generator (mulberry32) for deterministic tests and benchmarks. */
export const seeded = (seed: number): () => number => {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296
  }
}
