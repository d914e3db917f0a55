/**
 * Connection bounds of one listener, below the request handlers so that every route inherits them:
 * - `limits.connections`: open connections in all, over every listening socket of the listener; further ones are
 *   closed on accept;
 * - `limits.connections_per_address`: open connections from one client address (the TCP peer; trusted proxies
 *   are exempt, their clients are counted per request by the address rule); further ones are closed on accept;
 * - `limits.pending_connections`: connections that have not yet sent a complete request head. Past it the oldest
 *   such connection of the address holding the most of them is closed to make room (the oldest of all when
 *   addresses hold as many): a flood of silent or slow sockets evicts itself, also while a real client's
 *   connection waits to be read behind the flood's, and a real client, which sends its request at once, gets
 *   through;
 * - `limits.first_byte_timeout_seconds`: a connection that sent no byte by then is closed without an answer
 *   (the headers timeout then covers a head that trickles).
 * It also knows which connections have a request in flight, for the drain at shutdown.
 */
import type * as Http from "node:http"
import type { Socket } from "node:net"
import type { ClientAddresses } from "./ClientAddress.js"

export interface ConnectionGuard {
  /** Stops accepting work: idle connections are closed now, busy ones after their response. */
  readonly drain: () => void
  /** Connections not yet past their first request head (tests, metrics). */
  readonly pending: () => number
  /** Open connections counted against one client address. */
  readonly openFrom: (address: string) => number
  /** Requests received and not yet answered (shutdown messages). */
  readonly inFlight: () => number
}

/** How long a connection closing after its answer stays open for the answer to be read. */
export const ANSWER_LINGER_MS = 1000

/** The response ends its connection: the request or the response said `Connection: close`. */
const closesAfter = (response: Http.ServerResponse) =>
  !response.shouldKeepAlive || (response as Http.ServerResponse & { readonly _last?: boolean })._last === true

/** How often pending connections are checked for their first byte. */
const SWEEP_MS = 250

/** The connection bounds (the config's `limits` has them all). */
export interface ConnectionLimits {
  readonly connections: number
  readonly connections_per_address: number
  readonly pending_connections: number
  readonly first_byte_timeout_seconds: number
}

export const guardConnections = (
  server: Http.Server,
  limits: ConnectionLimits,
  addresses: ClientAddresses,
  warn: (message: string) => void
): ConnectionGuard => {
  const firstByteMs = limits.first_byte_timeout_seconds * 1000

  // A warning per kind at most once a minute while connections are refused.
  const lastWarning = new Map<string, number>()
  const warnAtMostEveryMinute = (kind: string, message: string) => {
    const now = Date.now()
    if (now - (lastWarning.get(kind) ?? 0) < 60_000) return
    lastWarning.set(kind, now)
    warn(message)
  }
  const sockets = new Set<Socket>()
  const inFlight = new Map<Socket, number>()
  /** Accepted, no request head yet; insertion order is age order. Value: when accepted, and from where. */
  const pending = new Map<Socket, { readonly at: number; readonly address: string }>()
  /** How many of `pending` each address holds (trusted proxies by their own address). */
  const pendingFrom = new Map<string, number>()
  const perAddress = new Map<string, number>()
  let draining = false

  const unpend = (socket: Socket) => {
    const entry = pending.get(socket)
    if (entry === undefined) return
    pending.delete(socket)
    const left = (pendingFrom.get(entry.address) ?? 1) - 1
    if (left > 0) pendingFrom.set(entry.address, left)
    else pendingFrom.delete(entry.address)
  }
  /** The oldest pending connection of the address holding the most (a scan of at most the pending cap). */
  const evictee = (): Socket => {
    let most = 0
    for (const n of pendingFrom.values()) if (n > most) most = n
    for (const [socket, entry] of pending) if (pendingFrom.get(entry.address) === most) return socket
    return pending.keys().next().value!
  }

  const sweep = setInterval(() => {
    const now = Date.now()
    for (const [socket, entry] of pending) {
      if (now - entry.at < firstByteMs) break
      if (socket.bytesRead === 0) socket.destroy()
    }
  }, SWEEP_MS)
  sweep.unref()
  server.once("close", () => clearInterval(sweep))

  /** Sockets counted against an address, and which address; released once (closed, or closing after an answer). */
  const counted = new Map<Socket, string>()
  const release = (socket: Socket) => {
    const address = counted.get(socket)
    if (address === undefined) return
    counted.delete(socket)
    const left = (perAddress.get(address) ?? 1) - 1
    if (left > 0) perAddress.set(address, left)
    else perAddress.delete(address)
  }

  // Every connection of the listener, whichever of its listening sockets accepted it (http/Server.ts).
  server.on("connection", (socket: Socket) => {
    if (sockets.size >= limits.connections) {
      warnAtMostEveryMinute("cap", `connection cap of ${limits.connections} reached; refusing new connections`)
      return void socket.destroy()
    }
    let address = socket.remoteAddress ?? ""
    if (!addresses.isTrustedProxy(socket.remoteAddress)) {
      address = addresses.of(socket.remoteAddress, undefined)
      const open = perAddress.get(address) ?? 0
      if (open >= limits.connections_per_address) {
        warnAtMostEveryMinute(
          "address",
          `connections from one address reached ${limits.connections_per_address}; refusing its new connections`
        )
        return void socket.destroy()
      }
      perAddress.set(address, open + 1)
      counted.set(socket, address)
    }
    if (pending.size >= limits.pending_connections) {
      const evicted = evictee()
      unpend(evicted)
      evicted.destroy()
      warnAtMostEveryMinute(
        "pending",
        `${limits.pending_connections} connections without a request; closing the oldest of the address holding the most to make room`
      )
    }
    pending.set(socket, { at: Date.now(), address })
    pendingFrom.set(address, (pendingFrom.get(address) ?? 0) + 1)
    sockets.add(socket)
    socket.once("close", () => {
      release(socket)
      unpend(socket)
      sockets.delete(socket)
      inFlight.delete(socket)
    })
  })

  server.on("request", (request: Http.IncomingMessage, response: Http.ServerResponse) => {
    const socket = request.socket
    unpend(socket)
    inFlight.set(socket, (inFlight.get(socket) ?? 0) + 1)
    response.once("finish", () => {
      if (!closesAfter(response)) return
      // The server is done with this connection: it no longer counts against its client, and it is destroyed
      // shortly, also when the client never closes its side or stops reading (a refused body left unread
      // fills the socket's buffers, and the client's FIN waits behind them forever).
      release(socket)
      setTimeout(() => socket.destroy(), ANSWER_LINGER_MS).unref()
    })
    response.once("close", () => {
      const left = (inFlight.get(socket) ?? 1) - 1
      if (left > 0) return void inFlight.set(socket, left)
      inFlight.delete(socket)
      // The response is complete: end the connection after it, gracefully.
      if (draining) socket.end()
    })
  })

  return {
    // Node's `closeIdleConnections` misses connections that never sent a request (clients and load balancers
    // open spare ones) and connections whose response ends after the drain started; this closes both.
    drain: () => {
      draining = true
      for (const socket of sockets) if (!inFlight.has(socket)) socket.destroy()
    },
    pending: () => pending.size,
    openFrom: (address) => perAddress.get(address) ?? 0,
    inFlight: () => {
      let open = 0
      for (const n of inFlight.values()) open += n
      return open
    }
  }
}
