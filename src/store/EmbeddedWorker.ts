import { Worker } from "node:worker_threads"

/**
 * The embedded database (PGlite + pglite-socket) runs in a worker thread, so its query execution and file I/O
 * never run on the event loop that serves requests. The gateway reaches it over the Unix socket exactly as it
 * reaches a real PostgreSQL server.
 */
export interface EmbeddedServer {
  readonly stop: () => Promise<void>
  /** Ends the worker at once, as a crash would (no clean shutdown of the database). */
  readonly terminate: () => Promise<void>
}

export interface EmbeddedServerOptions {
  /** PGlite's data folder. */
  readonly dir: string
  /** Unix socket path the server listens on. */
  readonly socketPath: string
  readonly postgresqlConf: ReadonlyArray<string>
  readonly maxConnections: number
  /**
   * Called once if the worker dies after it started (an uncaught error, an exit nobody asked for): every query
   * fails from then on, so the owner must say so.
   */
  readonly onLost?: (reason: string) => void
}

type FromWorker =
  | { readonly type: "ready" }
  | { readonly type: "stopped" }
  | { readonly type: "failed"; readonly stage: "open" | "listen"; readonly message: string }

/** Module specifiers resolved here, so the worker finds the same installed packages whatever its base URL. */
const modules = () => ({
  pglite: import.meta.resolve("@electric-sql/pglite"),
  socket: import.meta.resolve("@electric-sql/pglite-socket")
})

// Plain JavaScript loaded as an ES module (a data: URL) in the worker: no loader or build step is involved.
//
// groupMessages replaces the socket server's queue loop. Its loop runs one wire message at a time and takes the
// next from whichever connection sent it, except inside a transaction. The extended protocol's unnamed statement
// and portal live from Parse to Sync in the one PGlite session all connections share, so another connection's
// message in between (the operator CLI attached to a running gateway) replaced them: a query answered with
// another's rows, or "portal does not exist". Here a connection that has begun a group of messages keeps the
// session until the group ends (Sync, a simple Query, CopyDone or CopyFail, Terminate), as a transaction keeps it
// until it ends; a failed message no longer stops the loop for good.
const WORKER_SOURCE = `
import { parentPort, workerData } from "node:worker_threads"
const groupMessages = (queue, db) => {
  // S Sync, Q Query, c CopyDone, f CopyFail, X Terminate; 0: a startup packet (its length's first byte).
  const ENDS_GROUP = new Set([0x53, 0x51, 0x63, 0x66, 0x58, 0x00])
  let groupOf = null
  queue.processQueue = async function() {
    if (this.processing || this.queue.length === 0) return
    this.processing = true
    try {
      while (this.queue.length > 0) {
        const owner = groupOf ?? (db.isInTransaction() ? this.lastHandlerId : null)
        let item
        if (owner === null || owner === undefined) item = this.queue.shift()
        else {
          const at = this.queue.findIndex((queued) => queued.handlerId === owner)
          if (at === -1) break
          item = this.queue.splice(at, 1)[0]
        }
        try {
          const size = await db.runExclusive(() => db.execProtocolRawStream(item.message, { onRawData: item.onData }))
          this.lastHandlerId = item.handlerId
          groupOf = ENDS_GROUP.has(item.message[0]) ? null : item.handlerId
          item.resolve(size ?? 0)
        } catch (error) {
          groupOf = null
          item.reject(error)
        }
      }
    } finally {
      this.processing = false
    }
  }
  const clearTransaction = queue.clearTransactionIfNeeded.bind(queue)
  // A connection gone in the middle of a group gives the session back.
  queue.clearTransactionIfNeeded = async function(handlerId) {
    if (groupOf === handlerId) groupOf = null
    await clearTransaction(handlerId)
    await this.processQueue()
  }
}
const { PGlite } = await import(workerData.modules.pglite)
const { PGLiteSocketServer } = await import(workerData.modules.socket)
let db
try {
  db = await PGlite.create(workerData.dir, { postgresqlconf: workerData.postgresqlConf })
} catch (error) {
  parentPort.postMessage({ type: "failed", stage: "open", message: String(error && error.message || error) })
  process.exit(1)
}
const server = new PGLiteSocketServer({ db, path: workerData.socketPath, maxConnections: workerData.maxConnections })
groupMessages(server.queryQueue, db)
try {
  await server.start()
} catch (error) {
  await db.close().catch(() => {})
  parentPort.postMessage({ type: "failed", stage: "listen", message: String(error && error.message || error) })
  process.exit(1)
}
parentPort.on("message", async (message) => {
  if (message !== "stop") return
  await server.stop().catch(() => {})
  await db.close().catch(() => {})
  parentPort.postMessage({ type: "stopped" })
})
parentPort.postMessage({ type: "ready" })
`

export class EmbeddedServerError extends Error {
  constructor(readonly stage: "open" | "listen" | "exit", message: string) {
    super(message)
  }
}

/** Starts the embedded database server in a worker; resolves once it accepts connections on `socketPath`. */
export const startEmbeddedServer = (options: EmbeddedServerOptions): Promise<EmbeddedServer> =>
  new Promise((resolve, reject) => {
    const worker = new Worker(new URL(`data:text/javascript,${encodeURIComponent(WORKER_SOURCE)}`), {
      // The worker inherits no loader flags it does not need (tsx's hooks are irrelevant to plain JavaScript).
      execArgv: [],
      // The worker's own V8 heap holds only PGlite's JavaScript side (wire buffers, its file system tables); the
      // database itself lives in WebAssembly memory outside these limits. Node 24 would otherwise size its young
      // generation from the machine's memory (up to 3 x 64 MB).
      resourceLimits: { maxYoungGenerationSizeMb: 8, maxOldGenerationSizeMb: 128 },
      workerData: {
        modules: modules(),
        dir: options.dir,
        socketPath: options.socketPath,
        postgresqlConf: [...options.postgresqlConf],
        maxConnections: options.maxConnections
      }
    })
    let stopped: (() => void) | null = null
    let ready = false
    let lost = false
    let exited = false
    const loseOnce = (reason: string) => {
      if (!ready || stopped !== null || lost) return
      lost = true
      options.onLost?.(reason)
    }
    worker.on("message", (message: FromWorker) => {
      if (message.type === "ready") {
        ready = true
        resolve({
          // A worker that already died has nothing to stop (and would never answer).
          stop: () =>
            exited ? Promise.resolve() : new Promise<void>((done) => {
              stopped = done
              worker.postMessage("stop")
            }).then(() => worker.terminate()).then(() => undefined),
          terminate: () => worker.terminate().then(() => undefined)
        })
      } else if (message.type === "stopped") {
        stopped?.()
      } else if (message.type === "failed") {
        reject(new EmbeddedServerError(message.stage, message.message))
      }
    })
    worker.on("error", (error) => {
      if (!ready) reject(new EmbeddedServerError("open", error.message))
      loseOnce(`worker error: ${error.message}`)
    })
    worker.on("exit", (code) => {
      exited = true
      if (!ready) reject(new EmbeddedServerError("exit", `embedded database worker exited with code ${code}`))
      loseOnce(`worker exited with code ${code}`)
      stopped?.()
    })
  })
