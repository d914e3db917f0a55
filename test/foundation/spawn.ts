import * as ChildProcess from "node:child_process"
import * as Net from "node:net"

export interface Finished {
  readonly code: number | null
  readonly stdout: string
  readonly stderr: string
}

/** Environment of the test process without any gateway settings, plus `extra`. */
export const cleanEnv = (extra: Record<string, string> = {}): NodeJS.ProcessEnv => {
  const env: NodeJS.ProcessEnv = {}
  for (const [k, v] of Object.entries(process.env)) {
    if (!k.startsWith("WELLSPRING_") && k !== "DATABASE_URL" && k !== "REDIS_URL") env[k] = v
  }
  return { ...env, ...extra }
}

/** Runs `node --import tsx <script> ...args` (what `npm start` / `npm run cli` run) to completion. */
export const runTs = (script: string, args: ReadonlyArray<string>, env: NodeJS.ProcessEnv, timeoutMs = 60_000) =>
  new Promise<Finished>((resolve, reject) => {
    const child = ChildProcess.spawn(process.execPath, ["--import", "tsx", script, ...args], {
      env,
      stdio: ["ignore", "pipe", "pipe"]
    })
    let stdout = ""
    let stderr = ""
    child.stdout.on("data", (d: Buffer) => (stdout += d.toString()))
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString()))
    const timer = setTimeout(() => {
      child.kill("SIGKILL")
      reject(new Error(`${script} ${args.join(" ")} did not finish in ${timeoutMs} ms\n${stdout}\n${stderr}`))
    }, timeoutMs)
    child.on("error", reject)
    child.on("close", (code) => {
      clearTimeout(timer)
      resolve({ code, stdout, stderr })
    })
  })

/**
 * Production mode creates no account at boot: this makes one with the operator CLI (as an operator would) and
 * returns a fresh key of it. `env` is the gateway's environment (config file, DATABASE_URL).
 */
export const operatorKey = async (env: NodeJS.ProcessEnv, username = "operator"): Promise<string> => {
  const created = await runTs("src/cli.ts", ["account:create", "--username", username, "--display-name", "Operator"], env)
  if (created.code !== 0) throw new Error(`account:create failed: ${created.stderr}`)
  const issued = await runTs("src/cli.ts", ["key:create", "--username", username], env)
  const key = /API key: (\S+)/.exec(issued.stdout)?.[1]
  if (issued.code !== 0 || key === undefined) throw new Error(`key:create failed: ${issued.stderr}`)
  return key
}

/** A loopback port that nothing listens on (bound, then released). */
export const closedPort = () =>
  new Promise<number>((resolve, reject) => {
    const server = Net.createServer()
    server.once("error", reject)
    server.listen(0, "127.0.0.1", () => {
      const port = (server.address() as Net.AddressInfo).port
      server.close(() => resolve(port))
    })
  })

export interface Running {
  readonly pid: number
  /** stdout and stderr so far, interleaved as received. */
  readonly output: () => string
  readonly stdout: () => string
  readonly stderr: () => string
  /** Resolves with the match once `pattern` shows up in the output; rejects on exit or timeout. */
  readonly waitFor: (pattern: RegExp, timeoutMs?: number) => Promise<RegExpMatchArray>
  readonly exited: Promise<number | null>
  /** SIGTERM, then the exit code (SIGKILL after `graceMs`). */
  readonly stop: (graceMs?: number) => Promise<number | null>
}

/** Starts `node --import tsx <script>` and keeps it running. */
export const startTs = (script: string, args: ReadonlyArray<string>, env: NodeJS.ProcessEnv): Running =>
  startNode(["--import", "tsx", script, ...args], env)

/** Starts `node <nodeArgs>` (a compiled script, no loader) and keeps it running. */
export const startNode = (nodeArgs: ReadonlyArray<string>, env: NodeJS.ProcessEnv): Running => {
  const child = ChildProcess.spawn(process.execPath, nodeArgs, {
    env,
    stdio: ["ignore", "pipe", "pipe"]
  })
  let all = ""
  let out = ""
  let err = ""
  const waiters = new Set<() => void>()
  const notify = () => waiters.forEach((w) => w())
  child.stdout.on("data", (d: Buffer) => {
    out += d.toString()
    all += d.toString()
    notify()
  })
  child.stderr.on("data", (d: Buffer) => {
    err += d.toString()
    all += d.toString()
    notify()
  })
  let done = false
  const exited = new Promise<number | null>((resolve) =>
    child.on("close", (code) => {
      done = true
      notify()
      resolve(code)
    })
  )
  const waitFor = (pattern: RegExp, timeoutMs = 60_000) =>
    new Promise<RegExpMatchArray>((resolve, reject) => {
      const check = () => {
        const match = all.match(pattern)
        if (match) return finish(() => resolve(match))
        if (done) return finish(() => reject(new Error(`process exited before ${pattern}:\n${all}`)))
      }
      const timer = setTimeout(() => finish(() => reject(new Error(`no ${pattern} within ${timeoutMs} ms:\n${all}`))), timeoutMs)
      const finish = (f: () => void) => {
        clearTimeout(timer)
        waiters.delete(check)
        f()
      }
      waiters.add(check)
      check()
    })
  const stop = async (graceMs = 30_000) => {
    if (!done) child.kill("SIGTERM")
    const timer = setTimeout(() => child.kill("SIGKILL"), graceMs)
    const code = await exited
    clearTimeout(timer)
    return code
  }
  return { pid: child.pid!, output: () => all, stdout: () => out, stderr: () => err, waitFor, exited, stop }
}
