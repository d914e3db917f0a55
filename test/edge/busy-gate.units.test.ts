/**
 * The busy gate's state machine (http/BusyGate.ts) driven by hand: requests offered, responses closing, samples
 * with the time given, so every wait is decided by the numbers passed in, never by a timer.
 */
import { EventEmitter } from "node:events"
import type * as Http from "node:http"
import { describe, expect, it } from "vitest"
import { BusyGate, defaultConcurrency } from "../../src/http/BusyGate.js"
import { semiSpaceMb } from "../../src/runtime/HeapBound.js"

interface Fake {
  readonly name: string
  readonly request: Http.IncomingMessage
  readonly response: Http.ServerResponse & EventEmitter
  readonly leave: () => void
}

const fake = (name: string, method = "POST"): Fake => {
  const socket = { writable: true }
  const request = { method, socket, destroyed: false } as unknown as Http.IncomingMessage
  const response = new EventEmitter() as Http.ServerResponse & EventEmitter
  return { name, request, response, leave: () => void (socket.writable = false) }
}

const gateOf = (limits: { concurrency: number; maxWaitMs?: number; keepAliveSeconds?: number }) => {
  const started: Array<string> = []
  const names = new Map<Http.IncomingMessage, string>()
  let time = 0
  const gate = new BusyGate(
    {
      busy_concurrency: limits.concurrency,
      busy_utilization: 0.9,
      busy_max_wait_ms: limits.maxWaitMs ?? 1000,
      keep_alive_seconds: limits.keepAliveSeconds
    },
    (request) => started.push(names.get(request)!),
    () => time
  )
  const offer = (f: Fake, now = 0) => {
    names.set(f.request, f.name)
    time = now
    gate.offer(f.request, f.response)
  }
  const sample = (saturated: boolean, now: number) => {
    time = now
    gate.sample(saturated)
  }
  return { gate, started, offer, sample }
}

/** A request on a kept-alive connection: its socket can be paused and resumed. */
const keptAlive = (name: string) => {
  const f = fake(name)
  const socket = f.request.socket as unknown as { paused: boolean; destroyed: boolean; pause(): void; resume(): void }
  Object.assign(socket, { paused: false, destroyed: false })
  socket.pause = () => void (socket.paused = true)
  socket.resume = () => void (socket.paused = false)
  Object.assign(f.response, { shouldKeepAlive: true })
  return { ...f, socket }
}

/** The response's head was written or it closed: what `GatedResponse` reports (here through `close`). */
const answer = (f: Fake) => f.response.emit("close")

describe("busy gate", () => {
  it("starts everything while not saturated, however many are working", () => {
    const { gate, offer, started } = gateOf({ concurrency: 2 })
    const all = ["a", "b", "c", "d"].map((n) => fake(n))
    all.forEach((f) => offer(f))
    expect(started).toEqual(["a", "b", "c", "d"])
    expect([gate.working, gate.held]).toEqual([4, 0])
  })

  it("while saturated holds requests past the limit and starts them oldest first as others answer", () => {
    const { gate, offer, started, sample } = gateOf({ concurrency: 2 })
    sample(true, 0)
    const [a, b, c, d, e] = ["a", "b", "c", "d", "e"].map((n) => fake(n))
    ;[a, b, c, d, e].forEach((f) => offer(f!))
    expect(started).toEqual(["a", "b"])
    expect([gate.working, gate.held]).toEqual([2, 3])
    answer(b!)
    expect(started).toEqual(["a", "b", "c"])
    // A second close of the same response releases nothing more.
    answer(b!)
    expect(started).toEqual(["a", "b", "c"])
    expect([gate.working, gate.held]).toEqual([2, 2])
    answer(a!)
    answer(c!)
    expect(started).toEqual(["a", "b", "c", "d", "e"])
    expect([gate.working, gate.held]).toEqual([2, 0])
  })

  it("never holds reads (GET, HEAD, OPTIONS) nor counts them", () => {
    const { gate, offer, started, sample } = gateOf({ concurrency: 1 })
    sample(true, 0)
    offer(fake("post"))
    offer(fake("held"))
    for (const method of ["GET", "HEAD", "OPTIONS"]) offer(fake(method.toLowerCase(), method))
    expect(started).toEqual(["post", "get", "head", "options"])
    expect([gate.working, gate.held]).toEqual([1, 1])
  })

  it("starts what waited busy_max_wait_ms at the next sample, saturated or not", () => {
    const { gate, offer, started, sample } = gateOf({ concurrency: 1, maxWaitMs: 500 })
    sample(true, 0)
    offer(fake("a"), 0)
    offer(fake("b"), 100)
    offer(fake("c"), 400)
    sample(true, 599)
    expect(started).toEqual(["a"])
    sample(true, 600)
    expect(started).toEqual(["a", "b"])
    expect([gate.working, gate.held]).toEqual([2, 1])
    sample(true, 900)
    expect(started).toEqual(["a", "b", "c"])
  })

  it("a request that has worked busy_max_wait_ms stops counting (a long stream, a slow upstream)", () => {
    const { gate, offer, started, sample } = gateOf({ concurrency: 1, maxWaitMs: 500 })
    sample(true, 0)
    const long = fake("long")
    offer(long, 0)
    for (let t = 100; t < 500; t += 100) sample(true, t)
    offer(fake("waits"), 450)
    expect(started).toEqual(["long"])
    expect([gate.working, gate.held]).toEqual([1, 1])
    // Five samples after it started, the long request no longer counts; the held one starts in its place.
    sample(true, 500)
    expect(started).toEqual(["long", "waits"])
    expect([gate.working, gate.held]).toEqual([1, 0])
    // The long request's end later releases nothing: the place it held is already free.
    answer(long)
    expect(gate.working).toBe(1)
    offer(fake("next"), 510)
    expect(gate.held).toBe(1)
  })

  it("starts everything held once a sample finds the process no longer saturated", () => {
    const { gate, offer, started, sample } = gateOf({ concurrency: 1 })
    sample(true, 0)
    ;["a", "b", "c"].forEach((n) => offer(fake(n)))
    expect(started).toEqual(["a"])
    sample(false, 10)
    expect(started).toEqual(["a", "b", "c"])
    expect(gate.held).toBe(0)
  })

  it("drops a held request whose client left: it never starts and takes no place", () => {
    const { gate, offer, started, sample } = gateOf({ concurrency: 1 })
    sample(true, 0)
    const [a, b, c] = ["a", "b", "c"].map((n) => fake(n))
    ;[a, b, c].forEach((f) => offer(f!))
    b!.leave()
    answer(a!)
    expect(started).toEqual(["a", "c"])
    expect([gate.working, gate.held]).toEqual([1, 0])
  })

  it("releaseAll starts every held request (the drain)", () => {
    const { gate, offer, started, sample } = gateOf({ concurrency: 1 })
    sample(true, 0)
    ;["a", "b", "c"].forEach((n) => offer(fake(n)))
    gate.releaseAll()
    expect(started).toEqual(["a", "b", "c"])
  })

  it("busy_concurrency 0 turns the gate off", () => {
    const { gate, offer, started, sample } = gateOf({ concurrency: 0 })
    sample(true, 0)
    ;["a", "b"].forEach((n) => offer(fake(n)))
    expect(started).toEqual(["a", "b"])
    expect([gate.working, gate.held]).toEqual([0, 0])
  })

  it("keeps its order over many more held requests than its array's compaction step", () => {
    const { gate, offer, started, sample } = gateOf({ concurrency: 1 })
    sample(true, 0)
    const all = Array.from({ length: 5000 }, (_, i) => fake(String(i)))
    all.forEach((f) => offer(f))
    for (const f of all) answer(f)
    expect(started).toEqual(all.map((f) => f.name))
    expect([gate.working, gate.held]).toEqual([0, 0])
  })

  it("defaults to 8 working requests per MB of the semi-space the process runs with", () => {
    expect(semiSpaceMb(["--max-old-space-size=160", "--max-semi-space-size=8"], undefined)).toBe(8)
    expect(semiSpaceMb(["--max-old-space-size=160"], "--max_semi_space_size=32")).toBe(32)
    expect(semiSpaceMb(["--max-old-space-size=160"], undefined)).toBeUndefined()
    expect([defaultConcurrency(8), defaultConcurrency(32), defaultConcurrency(undefined)]).toEqual([64, 256, 64])
    const unset = new BusyGate({ busy_utilization: 0.9, busy_max_wait_ms: 1000 }, () => {})
    expect(unset.concurrency).toBe(defaultConcurrency())
  })

  it("a kept-alive connection whose answer ends while others wait is not read again until there is room", () => {
    const { gate, offer, started, sample } = gateOf({ concurrency: 1 })
    sample(true, 0)
    const a = keptAlive("a")
    const b = fake("b")
    offer(a)
    offer(b)
    answer(a)
    // b was waiting: a's connection is paused (its next request stays unread), b starts in a's place.
    expect(a.socket.paused).toBe(true)
    expect(started).toEqual(["a", "b"])
    expect([gate.working, gate.held, gate.paused]).toEqual([1, 0, 1])
    answer(b)
    // Room again and nobody held: a's connection is read again, its next request counted as on its way.
    expect(a.socket.paused).toBe(false)
    expect(gate.paused).toBe(0)
    const next = keptAlive("a2")
    offer(next)
    expect(started).toEqual(["a", "b", "a2"])
    expect(gate.working).toBe(1)
  })

  it("a connection answered while there is room is never paused, nor one the answer closes", () => {
    const { gate, offer, sample } = gateOf({ concurrency: 2 })
    sample(true, 0)
    const a = keptAlive("a")
    offer(a)
    answer(a)
    expect([a.socket.paused, gate.paused]).toEqual([false, 0])
    const closing = keptAlive("closing")
    Object.assign(closing.response, { shouldKeepAlive: false })
    offer(closing)
    offer(keptAlive("b"))
    offer(fake("held"))
    answer(closing)
    expect([closing.socket.paused, gate.paused]).toEqual([false, 0])
  })

  it("paused connections are read again after busy_max_wait_ms, when no longer saturated, and at the drain", () => {
    const { gate, offer, sample } = gateOf({ concurrency: 1, maxWaitMs: 500 })
    sample(true, 0)
    /** A kept-alive request answered while another waits: its connection paused; the other now works. */
    const pausedAt = (name: string, t: number) => {
      const k = keptAlive(name)
      const other = fake(name + "-held")
      offer(k, t)
      offer(other, t)
      answer(k)
      expect(k.socket.paused).toBe(true)
      return { k, other }
    }
    const first = pausedAt("first", 0)
    // Nothing answers: the connection stays paused until it has waited 500 ms.
    sample(true, 499)
    expect(first.k.socket.paused).toBe(true)
    sample(true, 500)
    expect(first.k.socket.paused).toBe(false)
    answer(first.other)
    const second = pausedAt("second", 600)
    sample(false, 700)
    expect(second.k.socket.paused).toBe(false)
    answer(second.other)
    sample(true, 800)
    const third = pausedAt("third", 800).k
    gate.releaseAll()
    expect([third.socket.paused, gate.paused, gate.held]).toEqual([false, 0, 0])
  })

  it("after releaseAll nothing waits: a full gate starts new requests and pauses no connection", () => {
    const { gate, offer, started, sample } = gateOf({ concurrency: 1 })
    sample(true, 0)
    const a = keptAlive("a")
    offer(a)
    offer(fake("b"))
    gate.releaseAll()
    expect(started).toEqual(["a", "b"])
    // Full (two working, room for one) and saturated: still no wait, and a's connection stays readable, so the
    // drain sees its client close.
    offer(fake("c"))
    expect(started).toEqual(["a", "b", "c"])
    answer(a)
    expect([a.socket.paused, gate.paused, gate.held]).toEqual([false, 0, 0])
  })

  it("a connection stays paused at most half its keep-alive idle time, so Node never closes it under a request", () => {
    const { offer, sample } = gateOf({ concurrency: 1, maxWaitMs: 5000, keepAliveSeconds: 1 })
    sample(true, 0)
    const a = keptAlive("a")
    offer(a, 0)
    offer(fake("held"), 0)
    answer(a)
    expect(a.socket.paused).toBe(true)
    sample(true, 499)
    expect(a.socket.paused).toBe(true)
    sample(true, 500)
    expect(a.socket.paused).toBe(false)
  })
})
