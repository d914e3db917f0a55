/**
 * Issue #16 finding 1: silent or slow sockets cannot hold the listener. A client that opens the cap's worth of
 * sockets and never sends (or never finishes) a request head, and never closes its side, is cut down by the
 * per-address cap, the pending-connection cap (oldest evicted) and the first-byte timeout; a socket answered
 * 408 is destroyed shortly after the answer instead of staying half-open. Other clients (other loopback source
 * addresses) are answered meanwhile. Small bounds keep the waits short.
 */
import { execFileSync } from "node:child_process"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { startGateway, type TestGateway } from "../support/Gateway.js"
import { eventuallyPasses as eventually } from "../support/Eventually.js"
import { connect, head, parseHead, type RawConnection, within } from "./raw.js"

const HEADERS_S = 2
const FIRST_BYTE_S = 1
const CAP = 60
const PER_ADDRESS = 20
const PENDING = 10
const PROXY = "127.0.0.9"

let guarded: TestGateway
/** Only Node's timeouts and the destroy after an error answer: the new caps are out of reach. */
let bare: TestGateway

beforeAll(async () => {
  guarded = await startGateway({
    configure: (doc) => {
      Object.assign(doc.limits, {
        connections: CAP,
        connections_per_address: PER_ADDRESS,
        pending_connections: PENDING,
        first_byte_timeout_seconds: FIRST_BYTE_S,
        headers_timeout_seconds: HEADERS_S,
        body_timeout_seconds: 4
      })
      doc.trusted_proxies = [PROXY]
    }
  })
  bare = await startGateway({
    configure: (doc) => {
      Object.assign(doc.limits, {
        connections: 1000,
        connections_per_address: 1000,
        pending_connections: 1000,
        first_byte_timeout_seconds: 600,
        headers_timeout_seconds: HEADERS_S,
        body_timeout_seconds: 4
      })
    }
  })
}, 120_000)
afterAll(async () => {
  await guarded?.stop()
  await bare?.stop()
})

/**
 * Connections the gateway (this process) still holds from `from`: its sockets on `port` that have a file
 * descriptor. A socket the server destroyed while the client keeps its side open lingers in the kernel
 * (FIN-WAIT-2) without one; it holds nothing of the gateway's.
 */
const serverSockets = (port: number, from: string): number =>
  execFileSync("ss", ["-tnpH", `( sport = :${port} and dst ${from} )`]).toString().split("\n")
    .filter((line) => line.includes(`pid=${process.pid},`)).length

/** One request from `from` on a fresh connection; its status and how long it took. */
const legitimate = async (gw: TestGateway, from: string) => {
  const started = Date.now()
  const conn = await connect(gw.port, { from })
  await conn.write(head("GET", "/v1/models", { authorization: `Bearer ${gw.key}` }))
  const res = await conn.response(10_000)
  conn.destroy()
  return { status: res.status, ms: Date.now() - started }
}

const holdSilent = (gw: TestGateway, count: number, from: (i: number) => string) =>
  Promise.all(Array.from({ length: count }, (_, i) =>
    connect(gw.port, { from: from(i), holdOpen: true }).catch(() => null)
  )).then((all) => all.filter((c): c is RawConnection => c !== null))

/**
 * Like `holdSilent`, one connection at a time, each from its own address and accepted by the gateway before the
 * next is opened: the order the gateway accepted them in is then theirs (its listening sockets share the port,
 * and connections waiting on different ones are accepted in no set order).
 */
const holdSilentInOrder = async (gw: TestGateway, count: number, from: (i: number) => string) => {
  const conns: Array<RawConnection> = []
  for (let i = 0; i < count; i++) {
    conns.push(await connect(gw.port, { from: from(i), holdOpen: true }))
    await eventually(() => expect(serverSockets(gw.port, from(i))).toBe(1), 2_000)
  }
  return conns
}

/** Sends a header line every 200 ms and never ends the head. */
const holdSlowHeaders = async (gw: TestGateway, count: number, from: string) => {
  const conns = await holdSilent(gw, count, () => from)
  const timers = conns.map((conn) => {
    void conn.write("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n")
    return setInterval(() => void conn.write("x-slow: 1\r\n"), 200)
  })
  return { conns, stop: () => timers.forEach(clearInterval) }
}

describe("connections that never complete a request", () => {
  it("the cap's worth of silent and slow sockets from one address does not lock out another address", async () => {
    const silent = await holdSilent(guarded, CAP, () => "127.0.0.1")
    const slow = await holdSlowHeaders(guarded, 10, "127.0.0.1")
    try {
      const answer = await legitimate(guarded, "127.0.0.2")
      expect(answer.status).toBe(200)
      expect(answer.ms).toBeLessThan((HEADERS_S + 1) * 1000)
      // None of the attacker's sockets outlives the header timeout by more than the answer's linger: the
      // server destroys them although the client never closes its side.
      await eventually(() => expect(serverSockets(guarded.port, "127.0.0.1")).toBe(0), (HEADERS_S + 4) * 1000)
      expect((await legitimate(guarded, "127.0.0.1")).status).toBe(200)
    } finally {
      slow.stop()
      for (const c of [...silent, ...slow.conns]) c.destroy()
    }
  })

  it("past the pending cap the oldest pending connection is closed, whatever its address", async () => {
    const first = await holdSilentInOrder(guarded, PENDING, (i) => `127.0.1.${i + 1}`)
    const later = await holdSilent(guarded, 5, (i) => `127.0.2.${i + 1}`)
    try {
      // The five oldest were evicted at once, long before the first-byte timeout.
      await eventually(() => {
        const gone = [...first, ...later].map((c) => c.received().length === 0 && c.socket.readableEnded)
        expect(gone.slice(0, 5)).toEqual([true, true, true, true, true])
        expect(gone.slice(5).every((g) => !g)).toBe(true)
      }, 900)
      expect((await legitimate(guarded, "127.0.3.1")).status).toBe(200)
    } finally {
      for (const c of [...first, ...later]) c.destroy()
    }
  })

  it("past the pending cap a flood from one address evicts its own connections, not another address's older one", async () => {
    // A client whose head the gateway has not finished reading (here: sent in two parts) when a flood arrives.
    const client = await connect(guarded.port, { from: "127.0.5.1" })
    await client.write("GET /v1/models HTTP/1.1\r\nHost: x\r\n")
    await eventually(() => expect(serverSockets(guarded.port, "127.0.5.1")).toBe(1), 2_000)
    const flood = await holdSilent(guarded, PENDING + 5, () => "127.0.5.2")
    try {
      await eventually(() => {
        // The cap holds the client and PENDING - 1 of the flood.
        const evicted = flood.filter((c) => c.received().length === 0 && c.socket.readableEnded).length
        expect(evicted).toBe(6)
      }, 1_500)
      expect(client.socket.readableEnded).toBe(false)
      await client.write(`authorization: Bearer ${guarded.key}\r\n\r\n`)
      expect((await client.response(5_000)).status).toBe(200)
    } finally {
      client.destroy()
      for (const c of flood) c.destroy()
    }
  })

  it("a connection that sends no byte is closed after first_byte_timeout_seconds, without an answer", async () => {
    const conn = await connect(guarded.port, { from: "127.0.4.1" })
    const started = Date.now()
    const { at } = await within(conn.closed, (FIRST_BYTE_S + 2) * 1000, "silent connection closed")
    expect(at - started).toBeGreaterThanOrEqual(FIRST_BYTE_S * 1000 - 50)
    expect(at - started).toBeLessThan(HEADERS_S * 1000)
    expect(conn.received().length).toBe(0)
  })
})

describe("connections per address", () => {
  it("refuses an address's connections past its cap, others and trusted proxies unaffected", async () => {
    const served = async (from: string) => {
      const conn = await connect(guarded.port, { from })
      await conn.write(head("GET", "/v1/models", { authorization: `Bearer ${guarded.key}` }))
      expect((await conn.response(5_000)).status).toBe(200)
      return conn
    }
    const mine: Array<RawConnection> = []
    const proxied: Array<RawConnection> = []
    try {
      for (let i = 0; i < PER_ADDRESS; i++) mine.push(await served("127.0.5.1"))
      const extra = await connect(guarded.port, { from: "127.0.5.1" })
      await within(extra.closed, 3_000, "connection past the per-address cap closed")
      expect(extra.received().length).toBe(0)
      expect((await legitimate(guarded, "127.0.5.2")).status).toBe(200)
      // A trusted proxy carries many clients: it may hold more.
      for (let i = 0; i < PER_ADDRESS + 5; i++) proxied.push(await served(PROXY))
      // One of the address's connections closes: it may open another.
      mine.pop()!.destroy()
      await eventually(async () => {
        const again = await served("127.0.5.1")
        mine.push(again)
      }, 5_000)
    } finally {
      for (const c of [...mine, ...proxied]) c.destroy()
    }
  })
})

describe("error answers", () => {
  it("a socket answered 408 is destroyed shortly after, although the client keeps its side open", async () => {
    const conn = await connect(bare.port, { from: "127.0.6.1", holdOpen: true })
    await conn.write("GET /v1/models HTTP/1.1\r\nHost: x\r\n")
    await eventually(() => expect(parseHead(conn.received())?.status).toBe(408), (HEADERS_S + 3) * 1000)
    const answeredAt = Date.now()
    await eventually(() => expect(serverSockets(bare.port, "127.0.6.1")).toBe(0), 4_000)
    expect(Date.now() - answeredAt).toBeLessThan(3_000)
    conn.destroy()
  })

  it("a socket answered 400 for malformed HTTP is destroyed too", async () => {
    const conn = await connect(bare.port, { from: "127.0.6.2", holdOpen: true })
    await conn.write("NOT HTTP AT ALL\r\n\r\n")
    await eventually(() => expect(parseHead(conn.received())?.status).toBe(400), 3_000)
    await eventually(() => expect(serverSockets(bare.port, "127.0.6.2")).toBe(0), 4_000)
    conn.destroy()
  })

  it("a refusal that leaves a body unread (413) does not keep the socket either", async () => {
    const conn = await connect(bare.port, { from: "127.0.6.3", holdOpen: true })
    await conn.write(head("POST", "/v1/chat/completions", {
      authorization: `Bearer ${bare.key}`,
      "content-type": "application/json",
      "content-length": 50_000_000
    }))
    await conn.write(Buffer.alloc(512 * 1024, "a"))
    await eventually(() => expect(parseHead(conn.received())?.status).toBe(413), 3_000)
    await eventually(() => expect(serverSockets(bare.port, "127.0.6.3")).toBe(0), 4_000)
    conn.destroy()
  })
})
