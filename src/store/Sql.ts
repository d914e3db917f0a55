import { PgClient, PgTypes } from "@effect/sql-pg"
import { Data, Duration, Effect, Layer, Redacted, Result } from "effect"
import { Migrator, SqlClient } from "effect/sql"
import * as Fs from "node:fs"
import * as Net from "node:net"
import * as Os from "node:os"
import * as Path from "node:path"
import * as EmbeddedLock from "./EmbeddedLock.js"
import { EmbeddedServerError, startEmbeddedServer } from "./EmbeddedWorker.js"
import migration0001 from "./migrations/0001_init.js"
import migration0002 from "./migrations/0002_account_api.js"
import migration0003 from "./migrations/0003_byok.js"
import migration0004 from "./migrations/0004_images.js"
import migration0005 from "./migrations/0005_incidents.js"
import migration0006 from "./migrations/0006_request_routing.js"
import migration0007 from "./migrations/0007_responses.js"
import migration0008 from "./migrations/0008_sessions_by_account.js"
import migration0009 from "./migrations/0009_request_minutes.js"

export class StoreError extends Data.TaggedError("StoreError")<{ readonly message: string; readonly cause?: unknown }> {}

export const migrations = Migrator.fromRecord({
  "0001_init": migration0001,
  "0002_account_api": migration0002,
  "0003_byok": migration0003,
  "0004_images": migration0004,
  "0005_incidents": migration0005,
  "0006_request_routing": migration0006,
  "0007_responses": migration0007,
  "0008_sessions_by_account": migration0008,
  "0009_request_minutes": migration0009
})

export const runMigrations = Migrator.make({})({ loader: migrations, table: "wellspring_migrations" })

/**
 * 8 MB of shared buffers: the row inserts touch the right edges of the heap and its indexes, and reads of recent
 * rows past the buffers come from the OS page cache; against 16 MB, 8 MB left the inserts' and the status refresh's
 * CPU unchanged and 9 MB less WebAssembly memory resident (docs/decisions.md, "Embedded memory").
 *
 * `plan_cache_mode`: PGlite runs no autovacuum, so no ANALYZE ever invalidates a cached plan. sql-pg prepares
 * every statement, and after five executions PostgreSQL may keep a generic plan chosen while the tables were
 * nearly empty: the status page's idle probe then read every request row of the last day through the time index
 * instead of one step down the model index (docs/decisions.md, "Embedded statements planned with their values").
 */
const EMBEDDED_POSTGRES_CONF = [
  "shared_buffers=8MB",
  "work_mem=4MB",
  "maintenance_work_mem=16MB",
  "wal_buffers=1MB",
  "plan_cache_mode=force_custom_plan",
  // PGlite is one backend in single-user mode; this only sizes shared memory (PGPROC, lock tables).
  "max_connections=8"
]

/**
 * `int8` and `numeric` come back as JS numbers; our counters stay far below 2^53. sql-pg reads results in binary
 * format and would otherwise give `bigint` and `string`. Installed in every client layer, so no row mixes the two.
 */
export const numberTypes = (): PgTypes.Registry => {
  const registry = PgTypes.makeRegistry()
  registry.register<number>(PgTypes.OID.int8, {
    decode: (bytes) => Result.succeed(Number(new DataView(bytes.buffer, bytes.byteOffset, 8).getBigInt64(0))),
    encode: (value) => PgTypes.encode(BigInt(value), PgTypes.OID.int8)
  })
  registry.register<number>(PgTypes.OID.numeric, {
    decode: (bytes) => Result.map(PgTypes.decode(bytes, PgTypes.OID.numeric, 1), Number),
    encode: (value) => PgTypes.encode(String(value), PgTypes.OID.numeric)
  })
  return registry
}

/** `host:port/database` of a connection URL, without credentials (for messages). */
export const describeDatabaseUrl = (url: string): string => {
  try {
    const parsed = new URL(url)
    return `${parsed.hostname}:${parsed.port || "5432"}${parsed.pathname}`
  } catch {
    return "(unparseable DATABASE_URL)"
  }
}

/** The innermost message of an error's `cause` chain, e.g. `connect ECONNREFUSED 127.0.0.1:5432`. */
export const rootMessage = (error: unknown): string => {
  let current = error
  for (let depth = 0; depth < 8; depth++) {
    const next = (current as { cause?: unknown } | null)?.cause
    if (next === undefined || next === null) break
    current = next
  }
  const message = (current as { message?: unknown } | null)?.message
  return typeof message === "string" && message ? message : String(current)
}

/**
 * The pool, checked with one query: sql-pg opens connections lazily, so without it an unreachable server would
 * only show up at the first request (sql-pg 0.53 ran the same check when the client was made).
 */
const makeChecked = (config: PgClient.PgPoolConfig) =>
  Effect.tap(PgClient.make(config), (client) => client`SELECT 1`)

/**
 * Sees every connection the client opens to the database (tests count the statements sent on them). Absent in
 * production: sql-pg then opens its sockets itself.
 */
export type WireTap = (socket: Net.Socket) => void

/** sql-pg's `stream` option: the socket sql-pg would open, shown to `tap` first. */
const tappedStream = (tap: WireTap | undefined, open: () => Net.Socket) =>
  tap === undefined ? {} : {
    stream: () => {
      const socket = open()
      tap(socket)
      return socket
    }
  }

/** Connects to a real PostgreSQL server; an unreachable server fails with one clear StoreError. */
export const layerPostgres = (url: Redacted.Redacted<string>, maxConnections = 10, tap?: WireTap) =>
  PgClient.layerFrom(
    makeChecked({
      url,
      maxConnections,
      connectTimeout: Duration.seconds(5),
      types: numberTypes(),
      ...tappedStream(tap, () => {
        const parsed = new URL(Redacted.value(url))
        return Net.connect({ host: parsed.hostname, port: Number(parsed.port || 5432), noDelay: true })
      })
    }).pipe(Effect.mapError((cause) =>
      new StoreError({
        message: `cannot connect to PostgreSQL at ${describeDatabaseUrl(Redacted.value(url))}: ${rootMessage(cause)}`,
        cause
      })
    ))
  )

/** Name of the socket file in its folder, as libpq and sql-pg derive it from `host` (a folder) and the port. */
const SOCKET_PORT = 5432
const SOCKET_NAME = `.s.PGSQL.${SOCKET_PORT}`
/** Longest socket path the OS accepts (sun_path: 108 bytes on Linux, 104 on macOS, with the NUL). */
const MAX_SOCKET_PATH = 103

/**
 * Removes group and other permission bits from `root` and everything under it (data folders created by
 * older versions were 0755 with 0644/0666 files). Symbolic links are left alone, never followed.
 */
export const makePrivate = (root: string): void => {
  const walk = (path: string) => {
    const stat = Fs.lstatSync(path, { throwIfNoEntry: false })
    if (!stat || stat.isSymbolicLink()) return
    if ((stat.mode & 0o077) !== 0) Fs.chmodSync(path, stat.mode & 0o700)
    if (stat.isDirectory()) for (const name of Fs.readdirSync(path)) walk(Path.join(path, name))
  }
  walk(root)
}

/**
 * Creates the data folder (0700) if needed and makes it private: the folder itself (which alone keeps other
 * users out of everything in it) and the gateway's files in it. The database folder is walked once it is open
 * (`layerEmbedded`). Anything else an operator put in the folder keeps its modes.
 */
export const ensurePrivateDataDir = (dataDir: string): void => {
  Fs.mkdirSync(dataDir, { recursive: true, mode: 0o700 })
  Fs.chmodSync(dataDir, 0o700)
  for (const name of ["encryption.key", "embedded.lock"]) makePrivate(Path.join(dataDir, name))
}

/**
 * Where the embedded database's Unix socket goes: inside the data folder, or, when that path is too long for
 * a socket address, inside a fresh private (0700) temporary folder.
 */
const socketFolder = (dataDir: string): { readonly dir: string; readonly temporary: boolean } => {
  const dir = Path.resolve(dataDir)
  if (Buffer.byteLength(Path.join(dir, SOCKET_NAME)) <= MAX_SOCKET_PATH) return { dir, temporary: false }
  return { dir: Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-")), temporary: true }
}

/**
 * Embedded mode: PGlite with its data under `dataDir/pglite`, served by pglite-socket (in a worker thread) on a Unix socket in the
 * private data folder (never a TCP port: the server trusts every client) and reached through the same PgClient
 * as production. The data folder and everything in it is owner-only (0700 folders, 0600 files).
 */
export const layerEmbedded = (dataDir: string, tap?: WireTap) =>
  Layer.unwrap(Effect.gen(function*() {
    const dir = Path.resolve(dataDir, "pglite")
    yield* Effect.try({
      try: () => {
        ensurePrivateDataDir(Path.resolve(dataDir))
        Fs.mkdirSync(dir, { recursive: true, mode: 0o700 })
      },
      catch: (cause) => new StoreError({ message: `cannot create data folder ${dir}`, cause })
    })
    // PGlite does not lock its folder; a second process would corrupt it.
    yield* EmbeddedLock.acquire(dataDir).pipe(
      Effect.mapError((cause) => new StoreError({ message: cause.message, cause }))
    )
    const folder = yield* Effect.acquireRelease(
      Effect.try({
        try: () => {
          const folder = socketFolder(dataDir)
          // A socket file left by a process that died: we hold the folder's lock, so it is not in use.
          Fs.rmSync(Path.join(folder.dir, SOCKET_NAME), { force: true })
          return folder
        },
        catch: (cause) => new StoreError({ message: "cannot prepare the embedded database socket", cause })
      }),
      (folder) =>
        Effect.try(() =>
          Fs.rmSync(folder.temporary ? folder.dir : Path.join(folder.dir, SOCKET_NAME), { recursive: true, force: true })
        ).pipe(Effect.ignore)
    )
    const socketPath = Path.join(folder.dir, SOCKET_NAME)
    const runFork = Effect.runForkWith(yield* Effect.context<never>())
    // PGlite and its socket server run in a worker thread: queries and file I/O stay off the request loop.
    yield* Effect.acquireRelease(
      Effect.tryPromise({
        try: () =>
          startEmbeddedServer({
            dir,
            socketPath,
            // Small buffers: the gateway's tables are small and hot rows live in its own caches (~140 MB less RSS).
            postgresqlConf: EMBEDDED_POSTGRES_CONF,
            maxConnections: 8,
            onLost: (reason) =>
              void runFork(
                Effect.logError("embedded database stopped; every query fails until the gateway restarts").pipe(
                  Effect.annotateLogs({ reason, dir })
                )
              )
          }),
        catch: (cause) =>
          new StoreError({
            message: cause instanceof EmbeddedServerError && cause.stage === "listen"
              ? `cannot start embedded database socket ${socketPath}`
              : `cannot open embedded database in ${dir}`,
            cause
          })
      }),
      (server) => Effect.promise(() => server.stop()).pipe(Effect.ignore)
    )
    // Files of older versions, and those PGlite created without a restrictive umask (tests, embedders).
    yield* Effect.sync(() => makePrivate(dir))
    yield* Effect.try({
      try: () => Fs.chmodSync(socketPath, 0o600),
      catch: (cause) => new StoreError({ message: `cannot restrict embedded database socket ${socketPath}`, cause })
    })
    // Lets the operator CLI attach to this process instead of opening the folder itself.
    EmbeddedLock.publishSocket(dataDir, socketPath)
    return layerSocket(socketPath, 1, tap)
  }))

/**
 * PgClient for a pglite-socket on a Unix socket: our own embedded store, or a running gateway's (CLI).
 * sql-pg connects to `<host>/.s.PGSQL.<port>` when `host` is a folder (an absolute path).
 */
export const layerSocket = (socketPath: string, maxConnections = 1, tap?: WireTap) => {
  const match = /^\.s\.PGSQL\.(\d+)$/.exec(Path.basename(socketPath))
  return PgClient.layerFrom(makeChecked({
    ...tappedStream(tap, () => Net.connect({ path: socketPath })),
    host: Path.dirname(Path.resolve(socketPath)),
    port: match ? Number(match[1]) : SOCKET_PORT,
    username: "postgres",
    database: "postgres",
    maxConnections,
    connectTimeout: Duration.seconds(5),
    types: numberTypes()
  }))
}

/** Advisory lock key under which migrations run on PostgreSQL (any constant; "wsmg" in ASCII). */
export const MIGRATION_LOCK_KEY = 0x77736d67

/**
 * Migrations with every other replica kept out: the migrator's own check-then-create of its table is not atomic,
 * so two replicas starting on an empty database could both try to create it. A session-level advisory lock,
 * held on one reserved connection while the migrator runs on others, serializes them; the second replica then
 * finds everything applied. A replica that dies while holding it releases it with its session.
 */
export const runMigrationsLocked = Effect.scoped(Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  const holder = yield* sql.reserve
  yield* Effect.acquireRelease(
    holder.execute("SELECT pg_advisory_lock($1)", [MIGRATION_LOCK_KEY], undefined),
    () => holder.execute("SELECT pg_advisory_unlock($1)", [MIGRATION_LOCK_KEY], undefined).pipe(Effect.ignore)
  )
  return yield* runMigrations
}))

/** SqlClient with migrations applied. */
export const layerSql = (options: {
  readonly databaseUrl?: Redacted.Redacted<string> | undefined
  readonly dataDir: string
  readonly tap?: WireTap | undefined
}) => {
  const client = options.databaseUrl
    ? layerPostgres(options.databaseUrl, 10, options.tap)
    : layerEmbedded(options.dataDir, options.tap)
  // PGlite needs no lock: one process holds its folder (EmbeddedLock).
  const migrate = options.databaseUrl ? runMigrationsLocked : runMigrations
  const migrated = Layer.effectDiscard(
    migrate.pipe(
      Effect.mapError((cause) => new StoreError({ message: `database migration failed: ${String(cause)}`, cause }))
    )
  )
  return Layer.provideMerge(migrated, client)
}

export type Sql = SqlClient.SqlClient
