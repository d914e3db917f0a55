/**
 * The busy gate, below the routes so that every one inherits it: while the process is saturated (its event loop
 * busy for at least `busy_utilization` of the last 100 ms), at most `busy_concurrency` requests that do work (any
 * method but GET, HEAD and OPTIONS) run between their start and their answer's end; later ones wait, oldest
 * first, at most `busy_max_wait_ms`, before anything of theirs is read or decoded. A kept-alive connection whose
 * answer ends while others wait is not read again until there is room: its next request waits in the kernel's
 * buffers, costing the process nothing.
 *
 * On a saturated core, starting more requests does not serve more of them: every started request waits its turn
 * for the CPU holding its body, its decoded request, its fiber and its upstream call, so each one lives longer,
 * is carried out of the young generation and costs a full collection later. A held request holds only Node's
 * request and response objects. A request stops counting once it has worked `busy_max_wait_ms`, so long streams
 * and slow upstreams never hold the gate; a process that is not saturated starts everything at once, whatever is
 * open.
 */
import * as Http from "node:http"
import type * as Net from "node:net"
import { performance } from "node:perf_hooks"
import { semiSpaceMb } from "../runtime/HeapBound.js"

export interface BusyLimits {
  /**
   * Working requests past which new ones wait while saturated, per listener; 0 turns the gate off; undefined:
   * `defaultConcurrency` of the young generation in effect.
   */
  readonly busy_concurrency?: number | undefined
  /** Event-loop utilization over the last sample (0 to 1) at or above which the process counts as saturated. */
  readonly busy_utilization: number
  /** Longest a request waits at the gate. */
  readonly busy_max_wait_ms: number
  /**
   * Idle time of a kept-alive connection before Node closes it: a paused connection is read again within half of
   * it, so that a request sent on it is never lost to the idle timeout.
   */
  readonly keep_alive_seconds?: number | undefined
}

/**
 * The default of `busy_concurrency`: 8 per MB of semi-space (32 in embedded mode's 4 MB, 256 in production's 32
 * MB), so that what the working requests keep alive (~27 KB each, measured) stays a fifth of one semi-space and
 * most of it dies young; 64 when V8 sizes the young generation itself.
 */
export const defaultConcurrency = (semiSpace: number | undefined = semiSpaceMb()): number =>
  semiSpace === undefined ? 64 : 8 * semiSpace

/** How often the event loop's utilization is sampled (and held requests checked against their longest wait). */
export const SAMPLE_MS = 100

/** Methods that only read: never held, never counted. */
const reads = (method: string | undefined) => method === "GET" || method === "HEAD" || method === "OPTIONS"

/** A first-in first-out queue that drops what it hands out (no reference kept), amortized O(1). */
class Fifo<A> {
  #items: Array<A | undefined> = []
  #head = 0
  get size(): number {
    return this.#items.length - this.#head
  }
  push(item: A): void {
    this.#items.push(item)
  }
  peek(): A | undefined {
    return this.#items[this.#head]
  }
  shift(): A {
    const item = this.#items[this.#head]!
    this.#items[this.#head] = undefined
    this.#head += 1
    if (this.#head === this.#items.length) {
      this.#items = []
      this.#head = 0
    } else if (this.#head >= 1024 && this.#head * 2 >= this.#items.length) {
      this.#items = this.#items.slice(this.#head)
      this.#head = 0
    }
    return item
  }
}

interface Held {
  readonly request: Http.IncomingMessage
  readonly response: Http.ServerResponse
  readonly since: number
}

interface Paused {
  readonly socket: Net.Socket
  readonly since: number
}

type Start = (request: Http.IncomingMessage, response: Http.ServerResponse) => void

/** The gate's state, driven by the listener (`offer`), the responses (`release`) and the sampler (`sample`). */
export class BusyGate {
  #working = 0
  #saturated = false
  /** Requests read and waiting, oldest first. */
  readonly #held = new Fifo<Held>()
  /**
   * Kept-alive connections whose answer ended while the gate was full: not read until there is room, so that
   * their next request waits in the kernel's buffers instead of in memory.
   */
  readonly #paused = new Fifo<Paused>()
  /** Connections resumed since the last sample whose next request has not come yet. */
  #resuming = 0
  readonly #concurrency: number
  /**
   * Samples since start. A request counts in the slot of the sample it started in, for `#window` samples: past
   * that it has worked `busy_max_wait_ms` (a long stream, a slow upstream) and no longer counts, without the gate
   * keeping a reference to it.
   */
  #epoch = 0
  readonly #window: number
  readonly #started: Int32Array
  /** Longest a connection stays paused. */
  readonly #pauseMs: number
  /** The listener is draining: nothing is held or paused any more. */
  #draining = false

  constructor(
    private readonly limits: BusyLimits,
    private readonly start: Start,
    /** Milliseconds on a monotonic clock (tests pass their own). */
    private readonly now: () => number = () => performance.now()
  ) {
    this.#concurrency = limits.busy_concurrency ?? defaultConcurrency()
    this.#window = Math.ceil(limits.busy_max_wait_ms / SAMPLE_MS)
    this.#started = new Int32Array(this.#window)
    this.#pauseMs = Math.min(limits.busy_max_wait_ms, (limits.keep_alive_seconds ?? Infinity) * 500)
  }

  /** The working requests past which new ones wait while saturated (0: never). */
  get concurrency(): number {
    return this.#concurrency
  }
  /** Requests started within `busy_max_wait_ms` and not yet answered. */
  get working(): number {
    return this.#working
  }
  /** Requests waiting at the gate. */
  get held(): number {
    return this.#held.size
  }
  /** Kept-alive connections not read until there is room. */
  get paused(): number {
    return this.#paused.size
  }
  get saturated(): boolean {
    return this.#saturated
  }

  /** A request Node has read the head of: started now, or held. */
  offer(request: Http.IncomingMessage, response: Http.ServerResponse): void {
    if (this.#concurrency === 0 || this.#draining || reads(request.method)) return this.start(request, response)
    if (this.#resuming > 0) this.#resuming -= 1
    if (this.#held.size === 0 && !this.#full()) return this.#begin(request, response)
    this.#held.push({ request, response, since: this.now() })
    this.#admit()
  }

  /**
   * A request started at sample `epoch` was answered (its response closed); once per started request. `socket`:
   * its connection, when it stays open for a next request; paused while the gate is full or others wait.
   */
  release(epoch: number, socket: Net.Socket | null): void {
    if (this.#epoch - epoch < this.#window) {
      this.#started[epoch % this.#window]! -= 1
      this.#working -= 1
    }
    if (socket !== null && !this.#draining && (this.#held.size > 0 || this.#full())) {
      socket.pause()
      this.#paused.push({ socket, since: this.now() })
    }
    this.#admit()
  }

  /**
   * A utilization sample, every `SAMPLE_MS`: saturated or not. Requests that started `busy_max_wait_ms` ago stop
   * counting; requests and connections that waited that long go on regardless.
   */
  sample(saturated: boolean): void {
    this.#saturated = saturated
    this.#resuming = 0
    this.#epoch += 1
    const slot = this.#epoch % this.#window
    this.#working -= this.#started[slot]!
    this.#started[slot] = 0
    const oldest = this.now() - this.limits.busy_max_wait_ms
    while (this.#held.size > 0 && this.#held.peek()!.since <= oldest) this.#startHeld()
    const pausedSince = this.now() - this.#pauseMs
    while (this.#paused.size > 0 && this.#paused.peek()!.since <= pausedSince) this.#resumeOne()
    this.#admit()
  }

  /**
   * The listener is draining: every held request starts and every paused connection is read now, and from here on
   * nothing waits (a connection paused during the drain could not see its client's close, and the drain would last
   * its whole grace period).
   */
  releaseAll(): void {
    this.#draining = true
    while (this.#held.size > 0) this.#startHeld()
    while (this.#paused.size > 0) this.#resumeOne()
  }

  #full(): boolean {
    return this.#saturated && this.#working >= this.#concurrency
  }

  /** Held requests first (they were read); then paused connections, counting the requests on their way. */
  #admit(): void {
    while (this.#held.size > 0 && !this.#full()) this.#startHeld()
    while (
      this.#paused.size > 0 && this.#held.size === 0 &&
      (!this.#saturated || this.#working + this.#resuming < this.#concurrency)
    ) this.#resumeOne()
  }

  #startHeld(): void {
    const held = this.#held.shift()
    this.#begin(held.request, held.response)
  }

  #resumeOne(): void {
    const { socket } = this.#paused.shift()
    if (socket.destroyed) return
    this.#resuming += 1
    socket.resume()
  }

  #begin(request: Http.IncomingMessage, response: Http.ServerResponse): void {
    // A client that went away while held has nothing to answer: its request never started (no row, no charge).
    if (request.destroyed || !request.socket.writable) return
    this.#working += 1
    this.#started[this.#epoch % this.#window]! += 1
    const gated = response as GatedResponse
    gated.gate = this
    gated.gateEpoch = this.#epoch
    gated.gateSocket = request.socket
    // One shared listener: no closure per request.
    response.on("close", releaseOnClose)
    this.start(request, response)
  }
}

/** The listener's responses, with the place their request holds in the gate (released once, at close). */
export class GatedResponse<Request extends Http.IncomingMessage = Http.IncomingMessage>
  extends Http.ServerResponse<Request>
{
  gate: BusyGate | null = null
  gateEpoch = 0
  gateSocket: Net.Socket | null = null
}

function releaseOnClose(this: GatedResponse) {
  const gate = this.gate
  if (gate === null) return
  const socket = this.gateSocket
  this.gate = null
  this.gateSocket = null
  // The connection stays for a next request unless the answer closed it (or the client left).
  const reusable = socket !== null && !socket.destroyed && socket.writable && this.shouldKeepAlive &&
    (this as GatedResponse & { readonly _last?: boolean })._last !== true
  gate.release(this.gateEpoch, reusable ? socket : null)
}

/**
 * The gate of one listener in front of `handler`: its responses are `GatedResponse`s (pass `serverOptions`
 * to `Http.createServer`), its sampler runs until the server closes. A concurrency of 0: the handler as is.
 */
export const busyGate = (limits: BusyLimits, handler: Start) => {
  const gate = new BusyGate(limits, handler)
  const serverOptions: Pick<Http.ServerOptions, "ServerResponse"> = {
    ServerResponse: GatedResponse as unknown as typeof Http.ServerResponse
  }
  if (gate.concurrency === 0) return { gate, handler, serverOptions, watch: (_server: Http.Server) => {} }
  return {
    gate,
    handler: (request: Http.IncomingMessage, response: Http.ServerResponse) => gate.offer(request, response),
    serverOptions,
    /** Samples the event loop's utilization every `SAMPLE_MS` while `server` is open. */
    watch: (server: Http.Server) => {
      let last = performance.eventLoopUtilization()
      // Until the first sample, the process's utilization since it started.
      gate.sample(last.utilization >= limits.busy_utilization)
      const timer = setInterval(() => {
        const now = performance.eventLoopUtilization()
        const busy = performance.eventLoopUtilization(now, last).utilization
        last = now
        gate.sample(busy >= limits.busy_utilization)
      }, SAMPLE_MS)
      timer.unref()
      server.once("close", () => clearInterval(timer))
    }
  }
}
