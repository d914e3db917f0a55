/**
 * Issue #8 findings 2 and 9: the body limit is enforced while reading (413 before the whole body arrives),
 * refusals that leave a body unread close the connection instead of draining it, and invalid UTF-8 is a 400.
 * Raw sockets, so the test decides exactly how much of a body is ever sent.
 */
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { startGateway, type TestGateway } from "../support/Gateway.js"
import { HANGUL, rowById } from "../inference/helpers.js"
import { connect, head, parseHead, type RawConnection, within } from "./raw.js"

const LIMIT = 64 * 1024
const HUGE = 50_000_000

let gw: TestGateway

beforeAll(async () => {
  gw = await startGateway({ configure: (doc) => void (doc.limits.body_bytes = LIMIT) })
})
afterAll(() => gw?.stop())

const bearer = () => ({ authorization: `Bearer ${gw.key}`, "content-type": "application/json" })
const chatBody = (content = "hi") => JSON.stringify({ model: "ws-lite", messages: [{ role: "user", content }] })

/** Headers promising `HUGE` bytes plus `prefix` bytes of the body; nothing more is ever sent. */
const promiseHugeBody = async (path: string, headers: Record<string, string>, prefix: number) => {
  const conn = await connect(gw.port)
  await conn.write(head("POST", path, { ...headers, "content-length": HUGE }))
  if (prefix > 0) await conn.write(Buffer.alloc(prefix, "a"))
  return conn
}

const expectClosedSoon = async (conn: RawConnection) => {
  // Without `Connection: close` Node would keep reading (draining) the promised body; the server must hang up.
  await within(conn.closed, 5_000, "server closes the connection")
}

describe("body limit", () => {
  it("a declared Content-Length over the limit gets 413 before the body is sent, and the connection is closed", async () => {
    const conn = await promiseHugeBody("/v1/chat/completions", bearer(), 1024)
    const res = await conn.response(5_000)
    expect(res.status).toBe(413)
    expect(res.headers.connection).toBe("close")
    const body = JSON.parse(res.body)
    expect(body.error.code).toBe("payload_too_large")
    expect(body.error.message).toMatch(HANGUL)
    expect(body.error.message).toContain("64 KB")
    // The server answered while the client still held all but 1 KB of the 50 MB.
    expect(conn.sent()).toBeLessThan(4096)
    await expectClosedSoon(conn)
    // The refusal is a request of its own: one row with the code.
    const row = await rowById(gw, Number(res.headers["x-request-id"]))
    expect([row.status, row.error_code, row.http_status]).toEqual(["error", "payload_too_large", 413])
  })

  it("with Expect: 100-continue an oversized body gets 413 instead of 100 Continue", async () => {
    const conn = await connect(gw.port)
    await conn.write(head("POST", "/v1/embeddings", { ...bearer(), "content-length": HUGE, expect: "100-continue" }))
    const res = await conn.response(5_000)
    expect(res.status).toBe(413)
    expect(res.headers.connection).toBe("close")
    expect(JSON.parse(res.body).error.code).toBe("payload_too_large")
    await expectClosedSoon(conn)
  })

  it("a chunked body is counted while it streams and cut at the limit", async () => {
    const conn = await connect(gw.port)
    await conn.write(head("POST", "/v1/chat/completions", { ...bearer(), "transfer-encoding": "chunked" }))
    const chunk = Buffer.alloc(16 * 1024, "b")
    const frame = Buffer.concat([Buffer.from(`${chunk.length.toString(16)}\r\n`), chunk, Buffer.from("\r\n")])
    const budget = 256 * 1024 * 1024
    // Keep sending until the server answers (or stops reading and closes); never finish the body.
    while (parseHead(conn.received()) === null && conn.sent() < budget) {
      if (!(await conn.write(frame))) break
    }
    const res = await conn.response(5_000)
    expect(res.status).toBe(413)
    expect(res.headers.connection).toBe("close")
    expect(JSON.parse(res.body).error.code).toBe("payload_too_large")
    // Answered long before the body could have been read whole: only socket buffers' worth was sent.
    expect(conn.sent()).toBeLessThan(32 * 1024 * 1024)
    await expectClosedSoon(conn)
  })

  it("the account API reads through the same bound", async () => {
    const conn = await promiseHugeBody("/api/user/me/keys", bearer(), 0)
    const res = await conn.response(5_000)
    expect(res.status).toBe(413)
    expect(res.headers.connection).toBe("close")
    const body = JSON.parse(res.body)
    expect([body.success, body.error.code]).toEqual([false, "payload_too_large"])
    await expectClosedSoon(conn)
  })

  it("a body at the limit is read", async () => {
    // A valid request padded with spaces to exactly the limit.
    const json = chatBody()
    const padded = json + " ".repeat(LIMIT - Buffer.byteLength(json))
    const res = await fetch(`${gw.url}/v1/chat/completions`, { method: "POST", headers: bearer(), body: padded })
    expect(res.status, await res.clone().text()).toBe(200)
    const over = await fetch(`${gw.url}/v1/chat/completions`, { method: "POST", headers: bearer(), body: padded + " " })
    expect(over.status).toBe(413)
  })
})

describe("refusing without reading", () => {
  it("401 before the body closes the connection instead of draining 50 MB", async () => {
    for (const path of ["/v1/chat/completions", "/api/user/me/keys"]) {
      const conn = await promiseHugeBody(path, { authorization: "Bearer sk-ws-not-a-real-key", "content-type": "application/json" }, 256 * 1024)
      const res = await conn.response(5_000)
      expect(res.status, path).toBe(401)
      expect(res.headers.connection, path).toBe("close")
      await expectClosedSoon(conn)
      expect(conn.sent()).toBeLessThan(1024 * 1024)
    }
  })

  it("a complete body keeps the connection alive, also after a refusal", async () => {
    const conn = await connect(gw.port)
    const bad = '{"model": 1}'
    await conn.write(head("POST", "/v1/chat/completions", { authorization: "Bearer nope", "content-length": bad.length }) + bad)
    const first = await conn.response(5_000)
    expect(first.status).toBe(401)
    expect(first.headers.connection).toBe("keep-alive")
    // A second request on the same connection is answered.
    const body = chatBody()
    const before = conn.received().length
    await conn.write(head("POST", "/v1/chat/completions", { ...bearer(), "content-length": Buffer.byteLength(body) }) + body)
    const second = await new Promise<ReturnType<typeof parseHead>>((ok, fail) => {
      const started = Date.now()
      const poll = setInterval(() => {
        const h = parseHead(conn.received().subarray(before))
        if (h || Date.now() - started > 5_000) {
          clearInterval(poll)
          h ? ok(h) : fail(new Error("no second response"))
        }
      }, 10)
    })
    expect(second!.status).toBe(200)
    conn.destroy()
  })
})

describe("invalid UTF-8", () => {
  const withBadBytes = (json: string) => {
    const [a, b] = json.split("hi")
    return Buffer.concat([Buffer.from(a!), Buffer.from([0xff, 0xfe, 0xc3, 0x28, 0xed, 0xa0, 0x80]), Buffer.from(b!)])
  }

  it("is 400 invalid_json for chat and embeddings, lenient for the account API, and nothing breaks", async () => {
    const chat = await fetch(`${gw.url}/v1/chat/completions`, { method: "POST", headers: bearer(), body: withBadBytes(chatBody()) })
    expect(chat.status).toBe(400)
    const chatError = (await chat.json()) as any
    expect(chatError.error.code).toBe("invalid_json")
    expect(chatError.error.message).toMatch(HANGUL)

    const embed = await fetch(`${gw.url}/v1/embeddings`, {
      method: "POST",
      headers: bearer(),
      body: withBadBytes(JSON.stringify({ model: "ws-embed", input: "hi" }))
    })
    expect(embed.status).toBe(400)
    expect(((await embed.json()) as any).error.code).toBe("invalid_json")

    const sfw = await fetch(`${gw.url}/api/user/sfw`, {
      method: "POST",
      headers: bearer(),
      body: withBadBytes(JSON.stringify({ sfw_mode: "hi" }))
    })
    expect(sfw.status).toBe(200)
    expect(await sfw.json()).toEqual({ success: true, sfw_mode: false })

    const ok = await fetch(`${gw.url}/v1/chat/completions`, { method: "POST", headers: bearer(), body: chatBody() })
    expect(ok.status).toBe(200)
  })
})

describe("a whole chunked body in one write, under a small limit", () => {
  const SMALL = 1024
  let small: TestGateway
  beforeAll(async () => {
    small = await startGateway({ configure: (doc) => void (doc.limits.body_bytes = SMALL) })
  })
  afterAll(() => small?.stop())

  /** One write: headers and a whole chunked body (no Content-Length, so only the read can bound it). */
  const chunkedRequest = (key: string, parts: ReadonlyArray<Buffer>) =>
    Buffer.concat([
      Buffer.from(head("POST", "/v1/chat/completions", {
        authorization: `Bearer ${key}`,
        "content-type": "application/json",
        "transfer-encoding": "chunked"
      })),
      ...parts.flatMap((p) => [Buffer.from(`${p.length.toString(16)}\r\n`), p, Buffer.from("\r\n")]),
      Buffer.from("0\r\n\r\n")
    ])

  const send = async (parts: ReadonlyArray<Buffer>) => {
    const conn = await connect(small.port)
    await conn.write(chunkedRequest(small.key, parts))
    const res = await conn.response(5_000)
    conn.destroy()
    return res
  }

  it("is counted against the limit: 413 one byte over it, 200 at it", async () => {
    const json = JSON.stringify({ model: "ws-lite", messages: [{ role: "user", content: "hi" }] })
    const atLimit = Buffer.from(json + " ".repeat(SMALL - Buffer.byteLength(json)))
    const half = atLimit.length >> 1
    const ok = await send([atLimit.subarray(0, half), atLimit.subarray(half)])
    expect(ok.status, ok.body).toBe(200)
    const over = await send([atLimit.subarray(0, half), atLimit.subarray(half), Buffer.from(" ")])
    expect(over.status).toBe(413)
    expect(JSON.parse(over.body).error.code).toBe("payload_too_large")
  })

  it("is checked for depth and UTF-8 like a body read piece by piece", async () => {
    const deep = await send([Buffer.from(`{"model":"ws-lite","messages":${"[".repeat(200)}`), Buffer.from("]".repeat(200) + "}")])
    expect(deep.status).toBe(400)
    expect(JSON.parse(deep.body).error.code).toBe("invalid_request")
    // A UTF-8 sequence split across the two chunks is still one character; a broken one is refused.
    const content = Buffer.from(JSON.stringify({ model: "ws-lite", messages: [{ role: "user", content: "한" }] }))
    const at = content.indexOf(Buffer.from("한")) + 1
    const split = await send([content.subarray(0, at), content.subarray(at)])
    expect(split.status, split.body).toBe(200)
    const broken = await send([content.subarray(0, at), content.subarray(at + 1)])
    expect(broken.status).toBe(400)
    expect(JSON.parse(broken.body).error.code).toBe("invalid_json")
  })
})
