/**
 * The busy gate end to end (http/BusyGate.ts): a gateway whose process always counts as saturated
 * (`busy_utilization: 0`) with room for one working request, in front of an upstream that answers only when
 * told. What the gateway holds never reaches the upstream until a request in front answers (or its wait runs
 * out); a long stream stops counting once it has worked the longest wait; reads pass; a client that leaves while
 * held costs nothing.
 */
import { Effect } from "effect"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { BoundListeners } from "../../src/http/Server.js"
import { eventually } from "../support/Eventually.js"
import { authed, type ConfigDoc, startGateway, type TestGateway } from "../support/Gateway.js"
import { afterFlush } from "../support/Rows.js"

/** An upstream that keeps every chat request until the test answers it. */
const startHeldUpstream = async () => {
  const waiting = new Map<string, { body: any; res: Http.ServerResponse }>()
  const arrivals: Array<string> = []
  const server = Http.createServer((req, res) => {
    let text = ""
    req.on("data", (chunk) => (text += chunk))
    req.on("end", () => {
      const body = JSON.parse(text)
      const name = String(body.messages?.at(-1)?.content ?? "")
      arrivals.push(name)
      waiting.set(name, { body, res })
    })
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  const take = (name: string) => {
    const held = waiting.get(name)
    if (held === undefined) throw new Error(`${name} has not arrived`)
    waiting.delete(name)
    return held
  }
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`,
    arrivals,
    answer: (name: string) => {
      const { body, res } = take(name)
      res.writeHead(200, { "content-type": "application/json" })
      res.end(JSON.stringify({
        id: "x",
        object: "chat.completion",
        created: 1,
        model: body.model,
        choices: [{ index: 0, message: { role: "assistant", content: `re ${name}` }, finish_reason: "stop" }],
        usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 }
      }))
    },
    /** A stream's head and first event; the rest when `end` is called. */
    startStream: (name: string) => {
      const { body, res } = take(name)
      res.writeHead(200, { "content-type": "text/event-stream" })
      const frame = (delta: object, finish: string | null) =>
        `data: ${JSON.stringify({ id: "x", object: "chat.completion.chunk", created: 1, model: body.model, choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`
      res.write(frame({ role: "assistant", content: "first" }, null))
      return {
        end: () => {
          res.write(frame({}, "stop"))
          res.end(`data: ${JSON.stringify({ id: "x", object: "chat.completion.chunk", created: 1, model: body.model, choices: [], usage: { prompt_tokens: 3, completion_tokens: 1, total_tokens: 4 } })}\n\ndata: [DONE]\n\n`)
        }
      }
    },
    close: () => {
      server.closeAllConnections()
      return new Promise<void>((resolve) => server.close(() => resolve()))
    }
  }
}

type HeldUpstream = Awaited<ReturnType<typeof startHeldUpstream>>

const configure = (upstream: HeldUpstream, maxWaitMs: number) => (doc: ConfigDoc) => {
  doc.limits = { ...doc.limits, busy_concurrency: 1, busy_utilization: 0, busy_max_wait_ms: maxWaitMs }
  doc.shutdown_delay_seconds = 0
  doc.catalog.providers.held = { kind: "openai-compatible", base_url: upstream.url }
  doc.catalog.models.push({
    id: "held",
    owned_by: "test",
    max_input_tokens: 10_000,
    max_output_tokens: 100,
    rate_limit_rpm: 100_000,
    concurrency: 100,
    weights: { input: 1, output: 1 },
    route: { provider: "held", model: "held-upstream" }
  })
}

const chat = (gw: TestGateway, name: string, options: { stream?: boolean; signal?: AbortSignal } = {}) =>
  fetch(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: authed(gw.key),
    body: JSON.stringify({ model: "held", stream: options.stream === true, messages: [{ role: "user", content: name }] }),
    ...(options.signal ? { signal: options.signal } : {})
  })

/**
 * Chat requests on one kept-alive connection (`agent` with one socket); `sent` settles once the request has been
 * handed to the kernel.
 */
const keptAlive = (gw: TestGateway, agent: Http.Agent) => (name: string) => {
  let sent!: Promise<void>
  const answered = new Promise<{ status: number; socket: unknown }>((resolve, reject) => {
    const req = Http.request(`${gw.url}/v1/chat/completions`, { method: "POST", agent, headers: authed(gw.key) }, (res) => {
      res.resume()
      res.on("end", () => resolve({ status: res.statusCode!, socket: req.socket }))
    })
    req.on("error", reject)
    sent = new Promise((resolve) => req.once("finish", resolve))
    req.end(JSON.stringify({ model: "held", messages: [{ role: "user", content: name }] }))
  })
  return Object.assign(answered, { sent })
}

/**
 * With room for one: `a<tag>` on the kept-alive connection works while `b<tag>` is held; `a<tag>` is answered, so
 * `b<tag>` starts in its place and the connection is paused (the next request on it waits unread).
 */
const pauseConnection = async (gw: TestGateway, post: ReturnType<typeof keptAlive>, tag: string) => {
  const a = post(`a${tag}`)
  await eventually(() => upstream.arrivals.includes(`a${tag}`))
  const b = chat(gw, `b${tag}`)
  await eventually(async () => (await busy(gw)).held === 1)
  upstream.answer(`a${tag}`)
  const first = await a
  expect(first.status).toBe(200)
  await eventually(() => upstream.arrivals.includes(`b${tag}`))
  return { first, b }
}

const busy = (gw: TestGateway) => gw.run(Effect.map(BoundListeners, (b) => b.lifecycle.busy()))

const openRequests = (gw: TestGateway) => gw.run(Effect.map(BoundListeners, (b) => b.lifecycle.openRequests()))

const rowCount = (gw: TestGateway) =>
  afterFlush(gw, (sql) => sql<{ n: number }>`SELECT count(*)::int AS n FROM request_log WHERE model_id = 'held'`)
    .then((rows) => rows[0]!.n)

let upstream: HeldUpstream
let gw: TestGateway

beforeAll(async () => {
  upstream = await startHeldUpstream()
  gw = await startGateway({ configure: configure(upstream, 60_000) })
}, 60_000)
afterAll(async () => {
  await gw?.stop()
  await upstream?.close()
})

describe("busy gate (saturated, room for one)", () => {
  it("holds the second request unread until the first answers, then sends it; reads pass meanwhile", async () => {
    const before = upstream.arrivals.length
    const a = chat(gw, "a1")
    await eventually(() => upstream.arrivals.includes("a1"))
    const b = chat(gw, "b1")
    await eventually(async () => (await busy(gw)).held === 1)
    expect(await busy(gw)).toEqual({ working: 1, held: 1, paused: 0, saturated: true })
    expect(upstream.arrivals.slice(before)).toEqual(["a1"])
    // A read is neither held nor counted.
    const models = await fetch(`${gw.url}/v1/models`, { headers: authed(gw.key) })
    expect(models.status).toBe(200)
    expect(upstream.arrivals.slice(before)).toEqual(["a1"])

    upstream.answer("a1")
    expect((await a).status).toBe(200)
    await eventually(() => upstream.arrivals.includes("b1"))
    upstream.answer("b1")
    const answered = await b
    expect(answered.status).toBe(200)
    expect(((await answered.json()) as { choices: Array<{ message: { content: string } }> }).choices[0]!.message.content).toBe("re b1")
    await eventually(async () => (await busy(gw)).working === 0)
    expect(await busy(gw)).toEqual({ working: 0, held: 0, paused: 0, saturated: true })
  })

  it("a kept-alive connection answered while another request waits is not read again until there is room", async () => {
    const agent = new Http.Agent({ keepAlive: true, maxSockets: 1 })
    const post = keptAlive(gw, agent)
    try {
      const { first, b } = await pauseConnection(gw, post, "7")
      expect(await busy(gw)).toEqual({ working: 1, held: 0, paused: 1, saturated: true })
      const c = post("c7")
      expect(await busy(gw)).toMatchObject({ working: 1, held: 0, paused: 1 })
      expect(upstream.arrivals).not.toContain("c7")
      upstream.answer("b7")
      expect((await b).status).toBe(200)
      // Room again: the connection is read, and c7 comes on the same socket.
      await eventually(() => upstream.arrivals.includes("c7"))
      upstream.answer("c7")
      const third = await c
      expect(third.status).toBe(200)
      expect(third.socket).toBe(first.socket)
      await eventually(async () => (await busy(gw)).working === 0)
      expect(await busy(gw)).toMatchObject({ working: 0, held: 0, paused: 0 })
    } finally {
      agent.destroy()
    }
  })

  it("a held request whose client leaves never starts: no upstream call, no request row", async () => {
    const rowsBefore = await rowCount(gw)
    const a = chat(gw, "a3")
    await eventually(() => upstream.arrivals.includes("a3"))
    const leaving = new AbortController()
    const b = chat(gw, "b3", { signal: leaving.signal }).catch((error: Error) => error.name)
    await eventually(async () => (await busy(gw)).held === 1)
    expect(await openRequests(gw)).toBe(2)
    leaving.abort()
    expect(await b).toBe("AbortError")
    // The gateway has seen the client go (its connection closed) before the request in front answers.
    await eventually(async () => (await openRequests(gw)) === 1)
    upstream.answer("a3")
    expect((await a).status).toBe(200)
    const c = chat(gw, "c3")
    await eventually(() => upstream.arrivals.includes("c3"))
    upstream.answer("c3")
    expect((await c).status).toBe(200)
    expect(upstream.arrivals).not.toContain("b3")
    expect(await rowCount(gw)).toBe(rowsBefore + 2)
    expect(await busy(gw)).toMatchObject({ working: 0, held: 0 })
  })
})

describe("busy gate: the longest wait and the drain", () => {
  let short: TestGateway
  beforeAll(async () => {
    short = await startGateway({ configure: configure(upstream, 300) })
  }, 60_000)
  afterAll(async () => {
    await short?.stop()
  })

  it("a request held busy_max_wait_ms starts although the one in front has not answered", async () => {
    const a = chat(short, "a4")
    await eventually(() => upstream.arrivals.includes("a4"))
    const b = chat(short, "b4")
    await eventually(() => upstream.arrivals.includes("b4"), { timeoutMs: 5_000 })
    expect((await busy(short)).held).toBe(0)
    upstream.answer("b4")
    upstream.answer("a4")
    expect([(await a).status, (await b).status]).toEqual([200, 200])
  })

  it("a stream counts until it has worked busy_max_wait_ms, then no longer holds the gate while it streams", async () => {
    const s = chat(short, "s6", { stream: true })
    await eventually(() => upstream.arrivals.includes("s6"))
    const stream = upstream.startStream("s6")
    const response = await s
    expect(response.status).toBe(200)
    const reader = response.body!.getReader()
    expect(new TextDecoder().decode((await reader.read()).value)).toContain("chat.completion.chunk")
    // Still streaming: it stops counting once its 300 ms are up, and the next request goes straight through.
    await eventually(async () => (await busy(short)).working === 0)
    const b = chat(short, "b6")
    await eventually(() => upstream.arrivals.includes("b6"))
    expect((await busy(short)).held).toBe(0)
    upstream.answer("b6")
    expect((await b).status).toBe(200)
    stream.end()
    let rest = ""
    for (let chunk = await reader.read(); !chunk.done; chunk = await reader.read()) {
      rest += new TextDecoder().decode(chunk.value)
    }
    expect(rest).toContain("data: [DONE]")
    expect(await busy(short)).toMatchObject({ working: 0, held: 0 })
  })

  it("the drain starts every held request, and each gets its answer", async () => {
    const a = chat(short, "a5")
    await eventually(() => upstream.arrivals.includes("a5"))
    const b = chat(short, "b5")
    await eventually(async () => (await busy(short)).held === 1)
    const drained = short.run(Effect.flatMap(BoundListeners, (bound) => bound.drain))
    await eventually(() => upstream.arrivals.includes("b5"))
    upstream.answer("a5")
    upstream.answer("b5")
    expect([(await a).status, (await b).status]).toEqual([200, 200])
    await drained
  })
})

describe("busy gate: a paused connection at the drain", () => {
  let draining: TestGateway
  beforeAll(async () => {
    draining = await startGateway({ configure: configure(upstream, 60_000) })
  }, 60_000)
  afterAll(async () => {
    await draining?.stop()
  })

  it("a request sent on a paused connection just before the drain is read and answered, not cut", async () => {
    const agent = new Http.Agent({ keepAlive: true, maxSockets: 1 })
    const post = keptAlive(draining, agent)
    try {
      const { first, b } = await pauseConnection(draining, post, "8")
      expect(await busy(draining)).toMatchObject({ working: 1, held: 0, paused: 1 })
      // c8 waits in the kernel's buffers of the paused connection when the drain begins.
      const c = post("c8")
      await c.sent
      expect(upstream.arrivals).not.toContain("c8")
      const drained = draining.run(Effect.flatMap(BoundListeners, (bound) => bound.drain))
      await eventually(() => upstream.arrivals.includes("c8"))
      expect(await busy(draining)).toMatchObject({ held: 0, paused: 0 })
      upstream.answer("c8")
      upstream.answer("b8")
      const third = await c
      expect([third.status, (await b).status]).toEqual([200, 200])
      expect(third.socket).toBe(first.socket)
      await drained
    } finally {
      agent.destroy()
    }
  })
})
