import type { Writable } from "node:stream"

/**
 * Writes to a socket held until the end of the current turn of the event loop, so that what one turn writes leaves
 * in one `writev`. A socket write on loopback costs about as much CPU as a request's own work in a client, and it is
 * paid per call, not per byte (docs/decisions.md, "Redis on the hot path", "A stream's frames of one turn in one
 * write").
 */

const HELD = Symbol.for("wellspring/store/TurnWrites/held")

type Holdable = Writable & { [HELD]?: boolean }

const release = (socket: Holdable): void => {
  socket[HELD] = false
  // A socket ended in the meantime was uncorked by its `end`; uncorking it again is a no-op.
  socket.uncork()
}

/**
 * Corks `socket` until the check phase of this turn, unless it is already held for this turn. Nothing is held back
 * past the turn that wrote it.
 */
export const holdForTurn = (socket: Writable): void => {
  const holdable = socket as Holdable
  if (holdable[HELD] === true) return
  holdable[HELD] = true
  socket.cork()
  setImmediate(release, holdable)
}

/** Every write to `socket` is held for its turn (`holdForTurn`). */
export const coalesceWrites = (socket: Writable): void => {
  const write = socket.write
  socket.write = function(this: Writable, ...args: Parameters<Writable["write"]>) {
    holdForTurn(this)
    return write.apply(this, args)
  } as Writable["write"]
}
