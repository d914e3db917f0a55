import { Effect } from "effect"
import * as Fs from "node:fs"
import * as Path from "node:path"

/**
 * PGlite does not lock its data folder: a second process opening it corrupts it. The embedded store
 * therefore takes `<data_dir>/embedded.lock` (exclusive create) for as long as it runs, and records the
 * Unix socket path of its pglite-socket there, so the operator CLI can attach to a running gateway
 * instead of opening the folder a second time.
 */
export interface EmbeddedOwner {
  readonly pid: number
  /** Unix socket of the pglite-socket server; null while starting. */
  readonly socket: string | null
}

export const lockFile = (dataDir: string): string => Path.resolve(dataDir, "embedded.lock")

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
    return true
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "EPERM"
  }
}

const readLock = (file: string): EmbeddedOwner | null => {
  try {
    const parsed = JSON.parse(Fs.readFileSync(file, "utf8")) as { pid?: unknown; socket?: unknown }
    if (typeof parsed.pid !== "number") return null
    return { pid: parsed.pid, socket: typeof parsed.socket === "string" ? parsed.socket : null }
  } catch {
    return null
  }
}

/** The live process holding the embedded database of `dataDir`, or null (no lock, or a stale one). */
export const currentOwner = (dataDir: string): EmbeddedOwner | null => {
  const owner = readLock(lockFile(dataDir))
  return owner && alive(owner.pid) ? owner : null
}

export class EmbeddedLockError extends Error {
  override readonly name = "EmbeddedLockError"
}

const tryCreate = (file: string, body: string): boolean => {
  try {
    Fs.writeFileSync(file, body, { flag: "wx", mode: 0o600 })
    return true
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "EEXIST") return false
    throw error
  }
}

/** Takes the lock or throws EmbeddedLockError naming the holder. A stale lock (dead pid) is replaced. */
export const acquireSync = (dataDir: string): void => {
  const file = lockFile(dataDir)
  const body = JSON.stringify({ pid: process.pid, socket: null })
  if (tryCreate(file, body)) return
  const owner = readLock(file)
  if (owner && alive(owner.pid)) {
    throw new EmbeddedLockError(
      `the embedded database in ${Path.resolve(dataDir)} is in use by process ${owner.pid}` +
        (owner.pid === process.pid ? " (this process)" : "") +
        `; stop it first (or delete ${file} if that process is not a wellspring gateway)`
    )
  }
  Fs.rmSync(file, { force: true })
  if (!tryCreate(file, body)) throw new EmbeddedLockError(`another process took ${file} at the same time`)
}

export const publishSocket = (dataDir: string, socket: string): void => {
  const file = lockFile(dataDir)
  const tmp = `${file}.${process.pid}.tmp`
  Fs.rmSync(tmp, { force: true })
  Fs.writeFileSync(tmp, JSON.stringify({ pid: process.pid, socket }), { mode: 0o600 })
  Fs.renameSync(tmp, file)
}

export const releaseSync = (dataDir: string): void => {
  const file = lockFile(dataDir)
  if (readLock(file)?.pid === process.pid) Fs.rmSync(file, { force: true })
}

/** Scoped lock: held until the scope closes. */
export const acquire = (dataDir: string) =>
  Effect.acquireRelease(
    Effect.try({ try: () => acquireSync(dataDir), catch: (error) => error as Error }),
    () => Effect.sync(() => releaseSync(dataDir))
  )
