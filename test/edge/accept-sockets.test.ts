/**
 * A listener's listening sockets (`limits.accept_sockets`, http/Server.ts `listen`): the event loop accepts one
 * connection per listening socket per turn, so a burst of new connections on a busy loop waits one turn per
 * connection behind one socket. Each test queues a burst in the kernel while this process's event loop is blocked
 * (a child process opens the connections, sends a request on each and exits), then counts what the HTTP server
 * accepted in the first turn after, and that every connection and request reaches the one HTTP server.
 */
import { Effect } from "effect"
import { execFileSync } from "node:child_process"
import * as Http from "node:http"
import * as Net from "node:net"
import { describe, expect, it } from "vitest"
import { listen } from "../../src/http/Server.js"
import { eventuallyPasses as eventually } from "../support/Eventually.js"

const BURST = 64

/** Opens `count` connections to `port`, writes a request head on each, waits until all are written, exits. */
const burst = (port: number, count: number) =>
  execFileSync(process.execPath, [
    "-e",
    `const net = require("node:net"); let left = ${count}
     for (let i = 0; i < ${count}; i++) {
       const s = net.connect(${port}, "127.0.0.1", () => s.write("GET /burst HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n", () => {
         if (--left === 0) process.exit(0)
       }))
     }`
  ], { timeout: 20_000 })

const nextTurn = () => new Promise<void>((resolve) => setImmediate(resolve))

const serve = async (sockets: number) => {
  const counts = { connections: 0, requests: 0 }
  const server = Http.createServer((_request, response) => {
    counts.requests += 1
    response.end("ok")
  })
  server.on("connection", () => void (counts.connections += 1))
  const { extra, port } = await Effect.runPromise(listen(server, { host: "127.0.0.1", port: 0, origins: [] }, sockets))
  const close = () => Promise.all([server, ...extra].map((s) => new Promise((resolve) => s.close(resolve))))
  return { counts, port, extra, close }
}

/** Queues a burst in the kernel (this loop blocked meanwhile), then counts the connections of the first turn that accepted any. */
const firstTurn = async (served: Awaited<ReturnType<typeof serve>>) => {
  burst(served.port, BURST)
  for (let turns = 0; served.counts.connections === 0 && turns < 1_000; turns++) await nextTurn()
  return served.counts.connections
}

describe("listening sockets per listener", () => {
  it("one socket accepts one connection of a queued burst per event-loop turn", async () => {
    const served = await serve(1)
    try {
      expect(served.extra).toHaveLength(0)
      expect(await firstTurn(served)).toBe(1)
      await eventually(() => expect(served.counts).toEqual({ connections: BURST, requests: BURST }), 10_000)
    } finally {
      await served.close()
    }
  })

  it("sixteen sockets sharing the port accept up to sixteen per turn, every connection reaching the one server", async () => {
    const served = await serve(16)
    try {
      expect(served.extra).toHaveLength(15)
      // 64 connections spread by the kernel over 16 queues leave almost none of them empty.
      const first = await firstTurn(served)
      expect(first).toBeGreaterThan(8)
      expect(first).toBeLessThanOrEqual(16)
      await eventually(() => expect(served.counts).toEqual({ connections: BURST, requests: BURST }), 10_000)
    } finally {
      await served.close()
    }
    // Closed with the server: nothing listens on the port any more.
    const refused = await new Promise<string>((resolve) => {
      const socket = Net.connect(served.port, "127.0.0.1")
      socket.once("connect", () => { socket.destroy(); resolve("connected") })
      socket.once("error", (error: NodeJS.ErrnoException) => resolve(error.code ?? "error"))
    })
    expect(refused).toBe("ECONNREFUSED")
  })

  it("a port taken by another process's socket fails the whole listen and leaves nothing bound", async () => {
    const taken = Net.createServer()
    await new Promise<void>((resolve) => taken.listen({ port: 0, host: "127.0.0.1" }, resolve))
    const port = (taken.address() as Net.AddressInfo).port
    const server = Http.createServer()
    try {
      const exit = await Effect.runPromiseExit(listen(server, { host: "127.0.0.1", port, origins: [] }, 8))
      expect(exit._tag).toBe("Failure")
      expect(server.listening).toBe(false)
    } finally {
      await new Promise((resolve) => taken.close(resolve))
    }
  })

  it("a second listener on a port a gateway already shares is refused, not let in to share it", async () => {
    const first = await serve(8)
    const second = Http.createServer()
    try {
      const exit = await Effect.runPromiseExit(listen(second, { host: "127.0.0.1", port: first.port, origins: [] }, 8))
      expect(exit._tag === "Failure" && JSON.stringify(exit.cause)).toContain("EADDRINUSE")
      expect(second.listening).toBe(false)
      // The first still gets every connection.
      burst(first.port, 16)
      await eventually(() => expect(first.counts).toEqual({ connections: 16, requests: 16 }), 10_000)
    } finally {
      await first.close()
    }
  })
})
