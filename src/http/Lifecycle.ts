import { Context } from "effect"

/**
 * The listeners' state as the routes see it: whether the drain after SIGTERM / SIGINT has begun (readiness probes
 * answer 503 from then on) and how many requests are open. `http/Server.ts` provides it to every request.
 */
export class Lifecycle extends Context.Service<Lifecycle, {
  readonly draining: () => boolean
  /** Requests received and not yet answered (a stream counts until its last byte), over every listener. */
  readonly openRequests: () => number
  /**
   * The busy gate over every listener (http/BusyGate.ts): requests working, requests held, kept-alive connections
   * not read until there is room, saturated now.
   */
  readonly busy: () => {
    readonly working: number
    readonly held: number
    readonly paused: number
    readonly saturated: boolean
  }
}>()("wellspring/http/Lifecycle") {}
