/**
 * A raw TCP client for the edge tests: writes exactly the bytes a test chooses (partial headers, a body that is
 * never finished, chunks written until the server answers) and records what comes back and when the server
 * closes the connection.
 */
import * as Net from "node:net"

export interface RawResponse {
  readonly status: number
  readonly headers: Readonly<Record<string, string>>
  readonly body: string
}

export interface RawConnection {
  readonly socket: Net.Socket
  /** Everything received so far. */
  readonly received: () => Buffer
  /** Resolves when the server closes (or resets) the connection; with the time it happened. */
  readonly closed: Promise<{ readonly at: number; readonly error: string | null }>
  /** Bytes written by `write`/`writeUntilAnswered` so far. */
  readonly sent: () => number
  readonly write: (data: string | Buffer) => Promise<boolean>
  /** Resolves with the first complete response head (and whatever body bytes came with it), or rejects on timeout. */
  readonly response: (timeoutMs: number) => Promise<RawResponse>
  readonly destroy: () => void
}

export const parseHead = (raw: Buffer): RawResponse | null => {
  const end = raw.indexOf("\r\n\r\n")
  if (end < 0) return null
  const lines = raw.subarray(0, end).toString("latin1").split("\r\n")
  const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(lines[0] ?? "")?.[1])
  const headers: Record<string, string> = {}
  for (const line of lines.slice(1)) {
    const i = line.indexOf(":")
    if (i > 0) headers[line.slice(0, i).trim().toLowerCase()] = line.slice(i + 1).trim()
  }
  return { status, headers, body: raw.subarray(end + 4).toString("utf8") }
}

export interface ConnectOptions {
  /** Source address (any of 127.0.0.0/8 on loopback): another client, as the server sees it. */
  readonly from?: string
  /**
   * Keep our side open after the server ends its side, as a hostile client does: the connection is gone only
   * once the server destroys it.
   */
  readonly holdOpen?: boolean
}

export const connect = (port: number, options: ConnectOptions = {}): Promise<RawConnection> =>
  new Promise((resolve, reject) => {
    const socket = Net.connect({
      host: "127.0.0.1",
      port,
      ...(options.from ? { localAddress: options.from } : {}),
      allowHalfOpen: options.holdOpen === true
    })
    let data = Buffer.alloc(0)
    let sent = 0
    const listeners = new Set<() => void>()
    socket.on("data", (chunk: Buffer) => {
      data = Buffer.concat([data, chunk])
      for (const l of listeners) l()
    })
    const closed = new Promise<{ at: number; error: string | null }>((done) => {
      let error: string | null = null
      socket.on("error", (e: NodeJS.ErrnoException) => {
        error = e.code ?? e.message
      })
      socket.on("close", () => {
        for (const l of listeners) l()
        done({ at: Date.now(), error })
      })
    })
    socket.once("error", reject)
    socket.once("connect", () => {
      socket.off("error", reject)
      resolve({
        socket,
        received: () => data,
        closed,
        sent: () => sent,
        write: (chunk) =>
          new Promise((ok) => {
            if (socket.destroyed || !socket.writable) return ok(false)
            sent += Buffer.byteLength(chunk)
            if (socket.write(chunk)) return ok(true)
            const onDrain = () => {
              socket.off("close", onDrain)
              socket.off("drain", onDrain)
              ok(!socket.destroyed)
            }
            socket.once("drain", onDrain)
            socket.once("close", onDrain)
          }),
        response: (timeoutMs) =>
          new Promise((ok, fail) => {
            const check = () => {
              const head = parseHead(data)
              if (head) {
                cleanup()
                ok(head)
              } else if (socket.destroyed) {
                cleanup()
                fail(new Error(`connection closed without a response (${data.length} bytes received)`))
              }
            }
            const timer = setTimeout(() => {
              cleanup()
              fail(new Error(`no response within ${timeoutMs} ms`))
            }, timeoutMs)
            const cleanup = () => {
              clearTimeout(timer)
              listeners.delete(check)
            }
            listeners.add(check)
            check()
          }),
        destroy: () => socket.destroy()
      })
    })
  })

/** Resolves with the promise's value, or rejects after `ms` (a bounded wait on something the server must do). */
export const within = <A>(promise: Promise<A>, ms: number, what: string): Promise<A> =>
  new Promise((ok, fail) => {
    const timer = setTimeout(() => fail(new Error(`${what}: not within ${ms} ms`)), ms)
    promise.then((value) => {
      clearTimeout(timer)
      ok(value)
    }, (error) => {
      clearTimeout(timer)
      fail(error)
    })
  })

export const head = (method: string, path: string, headers: Record<string, string | number>) =>
  `${method} ${path} HTTP/1.1\r\nHost: 127.0.0.1\r\n${
    Object.entries(headers).map(([k, v]) => `${k}: ${v}\r\n`).join("")
  }\r\n`
