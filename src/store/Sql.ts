import { Migrator, SqlClient } from "@effect/sql"
import { PgClient } from "@effect/sql-pg"
import { Data, Duration, Effect, Layer, Redacted } from "effect"
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import * as EmbeddedLock from "./EmbeddedLock.js"
import migration0001 from "./migrations/0001_init.js"
import migration0002 from "./migrations/0002_account_api.js"

export class StoreError extends Data.TaggedError("StoreError")<{ readonly message: string; readonly cause?: unknown }> {}

export const migrations = Migrator.fromRecord({
  "0001_init": migration0001,
  "0002_account_api": migration0002
})

export const runMigrations = Migrator.make({})({ loader: migrations, table: "wellspring_migrations" })

/** `int8` and `numeric` come back as JS numbers; our counters stay far below 2^53. */
const EMBEDDED_POSTGRES_CONF = ["shared_buffers=16MB", "work_mem=4MB", "maintenance_work_mem=16MB", "wal_buffers=1MB"]

const pgTypes = async () => {
  const pg = await import("pg")
  const base = pg.default.types
  return {
    getTypeParser: ((oid: number, format?: "text" | "binary") =>
      oid === 20 || oid === 1700
        ? (value: string) => Number(value)
        : base.getTypeParser(oid, format as "text")) as typeof base.getTypeParser
  }
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

/** Connects to a real PostgreSQL server; an unreachable server fails with one clear StoreError. */
export const layerPostgres = (url: Redacted.Redacted<string>, maxConnections = 10) =>
  Layer.unwrapEffect(
    Effect.promise(pgTypes).pipe(Effect.map((types) =>
      PgClient.layer({
        url,
        maxConnections,
        connectTimeout: Duration.seconds(5),
        types
      })
    ))
  ).pipe(Layer.mapError((cause) =>
    new StoreError({
      message: `cannot connect to PostgreSQL at ${describeDatabaseUrl(Redacted.value(url))}: ${rootMessage(cause)}`,
      cause
    })
  ))

/** Name of the socket file in its folder, as libpq and `pg` derive it from `host` (a folder) and the port. */
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
 * Embedded mode: PGlite with its data under `dataDir/pglite`, served by pglite-socket on a Unix socket in the
 * private data folder (never a TCP port: the server trusts every client) and reached through the same PgClient
 * as production. The data folder and everything in it is owner-only (0700 folders, 0600 files).
 */
export const layerEmbedded = (dataDir: string) =>
  Layer.unwrapScoped(Effect.gen(function*() {
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
    const { PGlite } = yield* Effect.promise(() => import("@electric-sql/pglite"))
    const { PGLiteSocketServer } = yield* Effect.promise(() => import("@electric-sql/pglite-socket"))
    const db = yield* Effect.acquireRelease(
      Effect.tryPromise({
        // Small buffers: the gateway's tables are small and hot rows live in its own caches (~140 MB less RSS).
        try: () => PGlite.create(dir, { postgresqlconf: EMBEDDED_POSTGRES_CONF }),
        catch: (cause) => new StoreError({ message: `cannot open embedded database in ${dir}`, cause })
      }),
      (db) => Effect.promise(() => db.close()).pipe(Effect.ignore)
    )
    // Files of older versions, and those PGlite created without a restrictive umask (tests, embedders).
    yield* Effect.sync(() => makePrivate(dir))
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
    const server = new PGLiteSocketServer({ db, path: socketPath, maxConnections: 8 })
    yield* Effect.acquireRelease(
      Effect.tryPromise({
        try: () => server.start(),
        catch: (cause) => new StoreError({ message: `cannot start embedded database socket ${socketPath}`, cause })
      }),
      () => Effect.promise(() => server.stop()).pipe(Effect.ignore)
    )
    yield* Effect.try({
      try: () => Fs.chmodSync(socketPath, 0o600),
      catch: (cause) => new StoreError({ message: `cannot restrict embedded database socket ${socketPath}`, cause })
    })
    // Lets the operator CLI attach to this process instead of opening the folder itself.
    EmbeddedLock.publishSocket(dataDir, socketPath)
    return layerSocket(socketPath)
  }))

/**
 * PgClient for a pglite-socket on a Unix socket: our own embedded store, or a running gateway's (CLI).
 * `pg` connects to `<host>/.s.PGSQL.<port>` when `host` is a folder.
 */
export const layerSocket = (socketPath: string, maxConnections = 1) => {
  const match = /^\.s\.PGSQL\.(\d+)$/.exec(Path.basename(socketPath))
  return Layer.unwrapEffect(
    Effect.promise(pgTypes).pipe(Effect.map((types) =>
      PgClient.layer({
        host: Path.dirname(Path.resolve(socketPath)),
        port: match ? Number(match[1]) : SOCKET_PORT,
        username: "postgres",
        database: "postgres",
        maxConnections,
        connectTimeout: Duration.seconds(5),
        types
      })
    ))
  )
}

/**
 * `NOTIFY channel, payload` with the payload bound as a parameter. `PgClient.notify` of sql-pg 0.53 sends
 * `NOTIFY "channel", $1`, which PostgreSQL rejects (NOTIFY takes no parameters); `pg_notify` does.
 */
export const notify = (sql: SqlClient.SqlClient, channel: string, payload: string) =>
  sql`SELECT pg_notify(${channel}, ${payload})`.pipe(Effect.asVoid)

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
export const layerSql = (options: { readonly databaseUrl?: Redacted.Redacted<string> | undefined; readonly dataDir: string }) => {
  const client = options.databaseUrl ? layerPostgres(options.databaseUrl) : layerEmbedded(options.dataDir)
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
