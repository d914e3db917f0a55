/**
 * Issue #8 finding 9: a connection cap, and headers and bodies that trickle are cut within the configured bounds
 * (real sockets, small bounds so the waits stay short). Responses that stream longer than the request timeout
 * are not cut: it only covers receiving the request.
 */
import { Agent, fetch as fetchVia } from "undici"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { startGateway, type TestGateway } from "../support/Gateway.js"
import { Behaviour, Chunks, type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"
import { addMockModel, eventually, parseSse } from "../inference/helpers.js"
import { connect, head, parseHead, type RawConnection, within } from "./raw.js"

const CAP = 4
const HEADERS_S = 1
const BODY_S = 2

let gw: TestGateway
let mock: MockUpstream

beforeAll(async () => {
  mock = await startMockUpstream()
  gw = await startGateway({
    configure: (doc) => {
      Object.assign(doc.limits, {
        connections: CAP,
        headers_timeout_seconds: HEADERS_S,
        body_timeout_seconds: BODY_S,
        keep_alive_seconds: 30
      })
      addMockModel(doc, { baseUrl: mock.url })
    }
  })
})
afterAll(async () => {
  await gw?.stop()
  await mock?.close()
})

const bearer = () => ({ authorization: `Bearer ${gw.key}` })

/** No keep-alive: the connection cap test below must not find idle sockets of these requests. */
const oneShot = new Agent({ pipelining: 0 })
const post = (body: unknown) =>
  fetchVia(`${gw.url}/v1/chat/completions`, {
    method: "POST",
    headers: { ...bearer(), "content-type": "application/json" },
    body: JSON.stringify(body),
    dispatcher: oneShot
  })

/** A connection that completed one request and now idles in keep-alive. */
const servedConnection = async (): Promise<RawConnection> => {
  const conn = await connect(gw.port)
  await conn.write(head("GET", "/v1/models", bearer()))
  const res = await conn.response(5_000)
  expect(res.status).toBe(200)
  return conn
}

/** Writes `piece` every `everyMs` until the server closes the connection; resolves with when it closed. */
const trickle = (conn: RawConnection, piece: string, everyMs: number) => {
  const timer = setInterval(() => void conn.write(piece), everyMs)
  return conn.closed.finally(() => clearInterval(timer))
}

describe("timeouts", () => {
  it("headers trickled one line at a time are cut after headers_timeout_seconds", async () => {
    const conn = await connect(gw.port)
    const started = Date.now()
    await conn.write("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    const { at } = await within(trickle(conn, "x-slow: 1\r\n", 100), 5_000, "slow headers cut")
    expect(at - started).toBeGreaterThanOrEqual(HEADERS_S * 1000 - 50)
    const res = parseHead(conn.received())
    expect(res?.status).toBe(408)
    expect(JSON.parse(res!.body).error).toMatchObject({ code: "request_timeout", type: "invalid_request_error" })
    expect(JSON.parse(res!.body).error.message).toMatch(/[가-힣]/)
    expect(res?.headers.connection).toBe("close")
  })

  it("malformed HTTP and oversized headers get the error envelope, not a bare status line", async () => {
    const garbage = await connect(gw.port)
    await garbage.write("NOT HTTP AT ALL\r\n\r\n")
    await within(garbage.closed, 5_000, "malformed request closed")
    const bad = parseHead(garbage.received())
    expect(bad?.status).toBe(400)
    expect(JSON.parse(bad!.body).error.code).toBe("malformed_http")

    const huge = await connect(gw.port)
    await huge.write(`GET /v1/models?${"a".repeat(20_000)} HTTP/1.1\r\nHost: x\r\n\r\n`)
    await within(huge.closed, 5_000, "oversized header closed")
    const big = parseHead(huge.received())
    expect(big?.status).toBe(431)
    expect(JSON.parse(big!.body).error.code).toBe("headers_too_large")
    expect(big!.body.length).toBeLessThan(1024)
  })

  it("a connection that sends nothing is cut after headers_timeout_seconds", async () => {
    const conn = await connect(gw.port)
    const started = Date.now()
    const { at } = await within(conn.closed, 5_000, "silent connection cut")
    expect(at - started).toBeGreaterThanOrEqual(HEADERS_S * 1000 - 50)
  })

  it("a body trickled one byte at a time is cut after body_timeout_seconds", async () => {
    const conn = await connect(gw.port)
    const started = Date.now()
    await conn.write(head("POST", "/v1/chat/completions", { ...bearer(), "content-type": "application/json", "content-length": 10_000 }))
    const { at } = await within(trickle(conn, " ", 100), 7_000, "slow body cut")
    expect(at - started).toBeGreaterThanOrEqual(BODY_S * 1000 - 50)
    expect(parseHead(conn.received())?.status).toBe(408)
  })

  it("a stream that lasts longer than body_timeout_seconds is delivered whole", async () => {
    const frames = [Chunks.role(), ...Array.from({ length: 7 }, (_, i) => Chunks.content(`t${i}`)), Chunks.finish("stop")]
    mock.script(Behaviour.slow(frames, 400))
    const started = Date.now()
    const res = await post({ model: "ws-mock", stream: true, messages: [{ role: "user", content: "hi" }] })
    expect(res.status, await res.clone().text()).toBe(200)
    const sse = parseSse(await res.text())
    expect(Date.now() - started).toBeGreaterThan(BODY_S * 1000)
    expect(sse.doneLast).toBe(true)
    expect(sse.chunks.map((c) => c.choices?.[0]?.delta?.content ?? "").join("")).toBe("t0t1t2t3t4t5t6")
  })

  it("a slow non-streaming answer is not cut either", async () => {
    mock.script(Behaviour.json(Chunks.completion({ content: "late", usage: { prompt: 3, completion: 1 } }), { delayMs: (BODY_S + 1) * 1000 }))
    const res = await post({ model: "ws-mock", messages: [{ role: "user", content: "hi" }] })
    expect(res.status, await res.clone().text()).toBe(200)
    expect(((await res.json()) as any).choices[0].message.content).toBe("late")
  })
})

describe("connection cap", () => {
  it("refuses connections beyond the cap and accepts again once one closes", async () => {
    // Earlier sockets of this process may still be closing on the server side: retry until CAP are served.
    let open: Array<RawConnection> = []
    await eventually(async () => {
      open.forEach((c) => c.destroy())
      open = []
      for (let i = 0; i < CAP; i++) open.push(await servedConnection())
    }, 10_000)

    const extra = await connect(gw.port)
    const closed = await within(extra.closed, 3_000, "extra connection closed by the server")
    expect(extra.received().length).toBe(0)
    expect(closed.at).toBeGreaterThan(0)
    // The served connections still work.
    const before = open[0]!.received().length
    await open[0]!.write(head("GET", "/v1/models", bearer()))
    await eventually(() => expect(parseHead(open[0]!.received().subarray(before))?.status).toBe(200))

    open.pop()!.destroy()
    await eventually(async () => {
      const conn = await servedConnection()
      conn.destroy()
    }, 5_000)
    open.forEach((c) => c.destroy())
  })
})
