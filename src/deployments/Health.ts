/**
 * Passive health of deployments: one circuit per deployment key (`<model>/<deployment>`), fed by the outcomes of
 * real requests, read synchronously by the balancer.
 *
 * - closed: requests go. A failure streak of `consecutive_failures`, or a failure share of at least `failure_rate`
 *   over the last `window_seconds` (with `min_requests` outcomes), opens it.
 * - open: skipped until `open_seconds` have passed, doubled for each opening since the circuit last closed (at
 *   most `max_open_seconds`).
 * - half-open: one trial request goes; its success closes the circuit, its failure opens it again for longer.
 *   A trial that ends without an outcome (the client left) frees the slot for the next one.
 * - cooling: an upstream 429 with `Retry-After` keeps the deployment out that long (at most
 *   `max_retry_after_seconds`), whatever the circuit says; the 429 also counts as a failure.
 *
 * Only failures that say something about the deployment are recorded (`upstream/Failure.ts` `health`); the
 * client's own faults never are. Times are passed in (the Effect clock of the caller), so a TestClock drives
 * ejection and re-admission.
 *
 * Replicas: every change of what the balancer sees (opened, closed, cooling) is handed to `share`, and changes made
 * by other replicas arrive through `apply`; times travel as durations, so replicas' clocks need not agree.
 */
import type { HealthPolicy } from "../config/GatewayConfig.js"

export type CircuitState = "closed" | "open" | "half_open"

/** A change another replica must see. `forMs`: how long from the moment it was made. */
export type HealthEvent =
  | { readonly _tag: "Opened"; readonly key: string; readonly forMs: number; readonly openings: number }
  | { readonly _tag: "Closed"; readonly key: string }
  | { readonly _tag: "Cooling"; readonly key: string; readonly forMs: number }

/** What the balancer may do with a deployment now. */
export type Availability = "go" | "trial" | "no"

export interface HealthView {
  readonly key: string
  readonly state: CircuitState
  /** Epoch ms the circuit stays open until (open only). */
  readonly openUntil: number | null
  /** Epoch ms a `Retry-After` keeps the deployment out until, when later than now. */
  readonly coolUntil: number | null
  readonly streak: number
  readonly openings: number
  /** Outcomes and failures in the current window. */
  readonly recent: number
  readonly recentFailures: number
}

/** Circuits another replica may create here (a bound on what the channel can make this replica keep). */
const MAX_REMOTE_CIRCUITS = 10_000

/** Outcomes kept per deployment for the failure rate (older ones leave the window first). */
const MAX_WINDOW = 1_024

interface Circuit {
  state: CircuitState
  streak: number
  openUntil: number
  openings: number
  coolUntil: number
  trial: boolean
  /** Outcome times (epoch ms) and results, oldest first, from `head`. */
  times: Array<number>
  failed: Array<boolean>
  head: number
  failures: number
}

const newCircuit = (): Circuit => ({
  state: "closed",
  streak: 0,
  openUntil: 0,
  openings: 0,
  coolUntil: 0,
  trial: false,
  times: [],
  failed: [],
  head: 0,
  failures: 0
})

export class HealthBook {
  readonly #circuits = new Map<string, Circuit>()

  constructor(
    private readonly policy: () => HealthPolicy,
    private readonly share: (event: HealthEvent) => void = () => {}
  ) {}

  #circuit(key: string): Circuit {
    let circuit = this.#circuits.get(key)
    if (circuit === undefined) {
      circuit = newCircuit()
      this.#circuits.set(key, circuit)
    }
    return circuit
  }

  /** Whether a request may go to `key` at `now`; "trial" means it would be the half-open trial. */
  availability(key: string, now: number): Availability {
    const circuit = this.#circuits.get(key)
    if (circuit === undefined) return "go"
    if (circuit.coolUntil > now) return "no"
    if (circuit.state === "closed") return "go"
    if (circuit.state === "open" && now < circuit.openUntil) return "no"
    return circuit.trial ? "no" : "trial"
  }

  /** A request is sent to `key`: when it is the trial, the half-open slot is taken. */
  begin(key: string, now: number): void {
    const circuit = this.#circuits.get(key)
    if (circuit === undefined || circuit.state === "closed") return
    if (circuit.state === "open" && now >= circuit.openUntil) circuit.state = "half_open"
    if (circuit.state === "half_open") circuit.trial = true
  }

  /** The deployment answered completely. */
  success(key: string, now: number): void {
    const circuit = this.#circuits.get(key)
    if (circuit === undefined) return
    this.#record(circuit, now, false)
    circuit.streak = 0
    if (circuit.state !== "closed") {
      circuit.state = "closed"
      circuit.trial = false
      circuit.openings = 0
      this.share({ _tag: "Closed", key })
    }
  }

  /** The deployment failed (a failure that counts for health); `retryAfterMs` from a 429. */
  failure(key: string, now: number, retryAfterMs: number | null): void {
    const circuit = this.#circuit(key)
    const policy = this.policy()
    this.#record(circuit, now, true)
    circuit.streak += 1
    if (retryAfterMs !== null && retryAfterMs > 0) {
      const forMs = Math.min(retryAfterMs, policy.max_retry_after_seconds * 1000)
      if (now + forMs > circuit.coolUntil) {
        circuit.coolUntil = now + forMs
        this.share({ _tag: "Cooling", key, forMs })
      }
    }
    const trialFailed = circuit.state !== "closed"
    const tripped = circuit.streak >= policy.consecutive_failures ||
      (circuit.times.length - circuit.head >= policy.min_requests &&
        circuit.failures / (circuit.times.length - circuit.head) >= policy.failure_rate)
    if (trialFailed || tripped) this.#open(circuit, key, now, policy)
  }

  /** The request ended without an outcome for the deployment (the client left, a client-caused failure). */
  neutral(key: string): void {
    const circuit = this.#circuits.get(key)
    if (circuit !== undefined && circuit.state === "half_open") circuit.trial = false
  }

  /** A change made by another replica. */
  apply(event: HealthEvent, now: number): void {
    if (!this.#circuits.has(event.key) && this.#circuits.size >= MAX_REMOTE_CIRCUITS) return
    const circuit = this.#circuit(event.key)
    switch (event._tag) {
      case "Opened":
        circuit.state = "open"
        circuit.trial = false
        circuit.openUntil = Math.max(circuit.openUntil, now + event.forMs)
        circuit.openings = Math.max(circuit.openings, event.openings)
        return
      case "Closed":
        circuit.state = "closed"
        circuit.trial = false
        circuit.streak = 0
        circuit.openings = 0
        return
      case "Cooling":
        circuit.coolUntil = Math.max(circuit.coolUntil, now + event.forMs)
        return
    }
  }

  /** Every deployment with a circuit (those never failed have none: they are closed). */
  view(key: string, now: number): HealthView {
    const circuit = this.#circuits.get(key)
    if (circuit === undefined) {
      return { key, state: "closed", openUntil: null, coolUntil: null, streak: 0, openings: 0, recent: 0, recentFailures: 0 }
    }
    this.#prune(circuit, now)
    const state = circuit.state === "open" && now >= circuit.openUntil ? "half_open" : circuit.state
    return {
      key,
      state,
      openUntil: state === "open" ? circuit.openUntil : null,
      coolUntil: circuit.coolUntil > now ? circuit.coolUntil : null,
      streak: circuit.streak,
      openings: circuit.openings,
      recent: circuit.times.length - circuit.head,
      recentFailures: circuit.failures
    }
  }

  #open(circuit: Circuit, key: string, now: number, policy: HealthPolicy): void {
    circuit.openings += 1
    const forMs = Math.min(policy.open_seconds * 1000 * 2 ** (circuit.openings - 1), policy.max_open_seconds * 1000)
    circuit.state = "open"
    circuit.trial = false
    circuit.openUntil = now + forMs
    // A fresh start once it comes back: the window that tripped it does not trip it again.
    circuit.streak = 0
    circuit.times = []
    circuit.failed = []
    circuit.head = 0
    circuit.failures = 0
    this.share({ _tag: "Opened", key, forMs, openings: circuit.openings })
  }

  #record(circuit: Circuit, now: number, failed: boolean): void {
    this.#prune(circuit, now)
    if (circuit.times.length - circuit.head >= MAX_WINDOW) this.#drop(circuit)
    circuit.times.push(now)
    circuit.failed.push(failed)
    if (failed) circuit.failures += 1
  }

  /** Drops the outcomes older than the window. */
  #prune(circuit: Circuit, now: number): void {
    const from = now - this.policy().window_seconds * 1000
    while (circuit.head < circuit.times.length && circuit.times[circuit.head]! < from) this.#drop(circuit)
    if (circuit.head > 256 && circuit.head * 2 > circuit.times.length) {
      circuit.times = circuit.times.slice(circuit.head)
      circuit.failed = circuit.failed.slice(circuit.head)
      circuit.head = 0
    }
  }

  #drop(circuit: Circuit): void {
    if (circuit.failed[circuit.head]) circuit.failures -= 1
    circuit.head += 1
  }
}
