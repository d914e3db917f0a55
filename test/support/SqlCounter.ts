/**
 * Counts the SQL statements a gateway sends, on the wire: every connection its client opens (`AppOptions.sqlTap`)
 * is watched, and the PostgreSQL frontend messages written on it are parsed. A statement is a simple `Query` ('Q')
 * or an extended-protocol `Execute` ('E'); startup, authentication and `Sync` are not statements.
 * Works the same for PostgreSQL (TCP) and the embedded PGlite (its Unix socket).
 */
import type * as Net from "node:net"

const SSL_REQUEST = 80877103
const CANCEL_REQUEST = 80877102

export interface SqlCounter {
  readonly tap: (socket: Net.Socket) => void
  /** Statements sent so far. */
  readonly statements: () => number
  /** The statement texts of simple queries and prepared statements seen so far, in order (for messages). */
  readonly texts: () => ReadonlyArray<string>
  /** Connections whose bytes could not be parsed (TLS): the count would be wrong, so tests fail on them. */
  readonly opaque: () => number
  readonly connections: () => number
}

export const makeSqlCounter = (): SqlCounter => {
  let statements = 0
  let opaque = 0
  let connections = 0
  const texts: Array<string> = []

  const tap = (socket: Net.Socket) => {
    connections++
    let started = false
    let broken = false
    let pending = Buffer.alloc(0)
    const parse = () => {
      while (!broken) {
        if (!started) {
          if (pending.length < 8) return
          const length = pending.readInt32BE(0)
          const code = pending.readInt32BE(4)
          if (length < 8 || length > 1 << 20) return void ((broken = true), opaque++)
          if (pending.length < length) return
          pending = pending.subarray(length)
          if (code !== SSL_REQUEST) started = true
          if (code === CANCEL_REQUEST) return void (broken = true)
          continue
        }
        if (pending.length < 5) return
        const type = String.fromCharCode(pending[0]!)
        const length = pending.readInt32BE(1)
        if (length < 4 || !/[A-Za-z]/.test(type)) return void ((broken = true), opaque++)
        if (pending.length < 1 + length) return
        const body = pending.subarray(5, 1 + length)
        if (type === "Q") {
          statements++
          texts.push(body.subarray(0, body.indexOf(0)).toString("utf8"))
        } else if (type === "E") {
          statements++
        } else if (type === "P") {
          // Parse: name\0 text\0 ...
          const nameEnd = body.indexOf(0)
          texts.push(body.subarray(nameEnd + 1, body.indexOf(0, nameEnd + 1)).toString("utf8"))
        }
        pending = pending.subarray(1 + length)
      }
    }
    const write = socket.write.bind(socket) as (...args: Array<any>) => boolean
    socket.write = ((chunk: unknown, ...rest: Array<any>) => {
      if (!broken) {
        const bytes = typeof chunk === "string" ? Buffer.from(chunk) : Buffer.from(chunk as Uint8Array)
        pending = pending.length === 0 ? bytes : Buffer.concat([pending, bytes])
        parse()
      }
      return write(chunk, ...rest)
    }) as typeof socket.write
  }

  return {
    tap,
    statements: () => statements,
    texts: () => texts,
    opaque: () => opaque,
    connections: () => connections
  }
}

/**
 * Resolves once no statement was sent for `quietMs` (earlier work written behind, e.g. quota totals, is done),
 * so that what is counted next is caused by what the test does next.
 */
export const untilQuiet = async (counter: SqlCounter, quietMs = 1_500, timeoutMs = 30_000): Promise<void> => {
  const deadline = Date.now() + timeoutMs
  let last = counter.statements()
  let since = Date.now()
  while (Date.now() - since < quietMs) {
    if (Date.now() > deadline) throw new Error(`SQL statements kept coming for ${timeoutMs} ms`)
    await new Promise((resolve) => setTimeout(resolve, 100))
    const now = counter.statements()
    if (now !== last) {
      last = now
      since = Date.now()
    }
  }
}
