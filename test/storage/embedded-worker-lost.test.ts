/**
 * The embedded database's worker dying after it started is reported once (the owner logs it), a clean stop is not,
 * and stopping after a crash does not wait for an answer that cannot come.
 */
import * as Fs from "node:fs"
import * as Os from "node:os"
import * as Path from "node:path"
import { afterEach, describe, expect, it } from "vitest"
import { startEmbeddedServer } from "../../src/store/EmbeddedWorker.js"

const dirs: Array<string> = []
const fresh = () => {
  const dir = Fs.mkdtempSync(Path.join(Os.tmpdir(), "wellspring-worker-"))
  dirs.push(dir)
  return dir
}
afterEach(() => {
  for (const dir of dirs.splice(0)) Fs.rmSync(dir, { recursive: true, force: true })
})

const start = (onLost: (reason: string) => void) => {
  const dir = fresh()
  return startEmbeddedServer({
    dir: Path.join(dir, "pglite"),
    socketPath: Path.join(dir, ".s.PGSQL.5432"),
    postgresqlConf: ["shared_buffers=16MB"],
    maxConnections: 2,
    onLost
  })
}

describe("embedded database worker", () => {
  it("a crash after start is reported once; stop then returns at once", async () => {
    const lost: Array<string> = []
    const server = await start((reason) => lost.push(reason))
    expect(lost).toEqual([])
    await server.terminate()
    await new Promise<void>((resolve) => setImmediate(resolve))
    expect(lost).toHaveLength(1)
    expect(lost[0]).toMatch(/exited with code/)
    await server.stop()
    expect(lost).toHaveLength(1)
  }, 60_000)

  it("a clean stop is not a loss", async () => {
    const lost: Array<string> = []
    const server = await start((reason) => lost.push(reason))
    await server.stop()
    expect(lost).toEqual([])
  }, 60_000)
})
