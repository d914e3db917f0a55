/**
 * Operator CLI: `npm run cli -- <command> [flags]`.
 *
 * Loads the config with the gateway's layers (file, env, `--config` / `--data-dir` / `--database-url`) and
 * talks to the same storage. Exit codes: 0 done, 2 bad arguments (usage, unknown account or key, bad
 * config, no embedded database without `--create`), 1 anything else (database down, ...). Errors are one line on
 * stderr, never a stack trace; every outcome names the database it used.
 */
import { Cause, Data, Effect, Exit, Layer, Option, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import * as Fs from "node:fs"
import * as Path from "node:path"
import * as Url from "node:url"
import { ACCOUNT_STATUSES, type AccountRow, type AccountStatus, AccountsRepo, DEFAULT_KEY_LABEL, type KeyRow } from "./accounts/AccountsRepo.js"
import * as Accounts from "./accounts/AccountsRepo.js"
import * as Invalidation from "./auth/Invalidation.js"
import { ConfigLoadError, type GatewayConfig, loadConfig } from "./config/GatewayConfig.js"
import { makeSettings, Settings } from "./config/Live.js"
import * as WorkerTokens from "./images/WorkerTokens.js"
import * as EmbeddedLock from "./store/EmbeddedLock.js"
import * as Incidents from "./status/Incidents.js"
import type { DeploymentStatus } from "./deployments/Router.js"
import * as Sql from "./store/Sql.js"

/** Bad arguments: exit code 2. */
export class UsageError extends Data.TaggedError("UsageError")<{ readonly message: string }> {}

type FlagKind = "value" | "boolean"

interface CommandSpec {
  readonly usage: string
  readonly summary: string
  readonly flags: Readonly<Record<string, FlagKind>>
  readonly run: (flags: Flags, env: CommandEnv) => Effect.Effect<void, UsageError, AccountsRepo | SqlClient.SqlClient>
}

type Flags = Readonly<Record<string, string | true>>

interface CommandEnv {
  readonly config: GatewayConfig
  /** Drops a key or an account from every gateway replica's key cache (no-op in embedded mode). */
  readonly announce: (invalidation: Invalidation.Invalidation) => Effect.Effect<void, never, SqlClient.SqlClient>
  /** Printed after changes a running embedded gateway cannot be told about. */
  readonly cacheNote: string | null
  readonly out: (line: string) => Effect.Effect<void>
}

const GLOBAL_FLAGS: Readonly<Record<string, FlagKind>> = {
  config: "value",
  "data-dir": "value",
  "database-url": "value",
  create: "boolean"
}

// ---------------------------------------------------------------------------------------------------------
// Argument helpers

const usage = (message: string) => new UsageError({ message })

const text = (flags: Flags, name: string): string | undefined => {
  const value = flags[name]
  return typeof value === "string" ? value : undefined
}

const required = (flags: Flags, name: string): Effect.Effect<string, UsageError> => {
  const value = text(flags, name)
  return value === undefined || value.trim() === ""
    ? Effect.fail(usage(`missing required flag --${name}`))
    : Effect.succeed(value)
}

const parseStatus = (value: string): Effect.Effect<AccountStatus, UsageError> =>
  (ACCOUNT_STATUSES as ReadonlyArray<string>).includes(value)
    ? Effect.succeed(value as AccountStatus)
    : Effect.fail(usage(`--status must be one of ${ACCOUNT_STATUSES.join(", ")}, got "${value}"`))

const parsePositiveInt = (name: string, value: string): Effect.Effect<number, UsageError> =>
  /^[1-9]\d{0,15}$/.test(value) && Number.isSafeInteger(Number(value))
    ? Effect.succeed(Number(value))
    : Effect.fail(usage(`--${name} must be a positive integer, got "${value}"`))

/** `--account ID` or `--username U`, exactly one; an unknown account is a usage error. */
const resolveAccount = (flags: Flags, idFlag: string) =>
  Effect.gen(function*() {
    const repo = yield* AccountsRepo
    const id = text(flags, idFlag)
    const username = text(flags, "username")
    if (id !== undefined && username !== undefined) {
      return yield* Effect.fail(usage(`give either --${idFlag} or --username, not both`))
    }
    if (id !== undefined) {
      const account = yield* repo.findAccount(id)
      return account ?? (yield* Effect.fail(usage(`no account with id "${id}"`)))
    }
    if (username !== undefined) {
      const account = yield* repo.findAccountByUsername(username)
      return account ?? (yield* Effect.fail(usage(`no account with username "${username}"`)))
    }
    return yield* Effect.fail(usage(`missing --${idFlag} ID or --username U`))
  })

const iso = (date: Date | null): string => (date ? date.toISOString().replace(/\.\d{3}Z$/, "Z") : "never")

const describe = (account: AccountRow) => `${account.username} (${account.id})`

/** Terminal columns of a string: Hangul and other wide characters take two. */
const width = (s: string): number => {
  let w = 0
  for (const ch of s) {
    const c = ch.codePointAt(0)!
    w += (c >= 0x1100 && c <= 0x115f) || (c >= 0x2e80 && c <= 0xa4cf) || (c >= 0xac00 && c <= 0xd7a3) ||
        (c >= 0xf900 && c <= 0xfaff) || (c >= 0xff00 && c <= 0xff60) || (c >= 0xffe0 && c <= 0xffe6)
      ? 2
      : 1
  }
  return w
}

export const formatTable = (header: ReadonlyArray<string>, rows: ReadonlyArray<ReadonlyArray<string>>): string => {
  const widths = header.map((h, i) => Math.max(width(h), ...rows.map((r) => width(r[i] ?? ""))))
  const line = (cells: ReadonlyArray<string>) =>
    cells.map((cell, i) => (i === cells.length - 1 ? cell : cell + " ".repeat(widths[i]! - width(cell)))).join("  ")
      .trimEnd()
  return [line(header), ...rows.map(line)].join("\n")
}

// ---------------------------------------------------------------------------------------------------------
// Commands

const accountCreate: CommandSpec = {
  usage:
    "account:create --username U --display-name D [--community-id X] [--community-type T] [--email E]\n" +
    "               [--status active|unlinked|revoked] [--legacy] [--needs-migration] [--admin]\n" +
    "               [--guest-expires ISO] [--plan NAME]",
  summary: "create an account; prints its id",
  flags: {
    username: "value",
    "display-name": "value",
    "community-id": "value",
    "community-type": "value",
    email: "value",
    status: "value",
    legacy: "boolean",
    "needs-migration": "boolean",
    admin: "boolean",
    "guest-expires": "value",
    plan: "value"
  },
  run: (flags, env) =>
    Effect.gen(function*() {
      const repo = yield* AccountsRepo
      const username = yield* required(flags, "username")
      const displayName = yield* required(flags, "display-name")
      const status = text(flags, "status") === undefined ? "active" : yield* parseStatus(text(flags, "status")!)
      const plan = text(flags, "plan")
      if (plan !== undefined && !(plan in env.config.plans)) {
        return yield* Effect.fail(
          usage(`--plan: no plan named "${plan}" (configured: ${Object.keys(env.config.plans).join(", ")})`)
        )
      }
      const guest = text(flags, "guest-expires")
      let guestExpiresAt: Date | undefined
      if (guest !== undefined) {
        guestExpiresAt = new Date(guest)
        if (!/^\d{4}-\d{2}-\d{2}/.test(guest) || Number.isNaN(guestExpiresAt.getTime())) {
          return yield* Effect.fail(usage(`--guest-expires must be an ISO date-time, got "${guest}"`))
        }
      }
      const email = text(flags, "email")
      if (email !== undefined && !/^[^\s@]+@[^\s@]+$/.test(email)) {
        return yield* Effect.fail(usage(`--email is not an email address: "${email}"`))
      }
      if (yield* repo.findAccountByUsername(username)) {
        return yield* Effect.fail(usage(`username "${username}" is taken`))
      }
      const account = yield* repo.createAccount({
        username,
        displayName,
        communityId: text(flags, "community-id"),
        communityType: text(flags, "community-type"),
        email,
        status,
        isLegacy: flags.legacy === true,
        needsMigration: flags["needs-migration"] === true,
        isAdmin: flags.admin === true,
        isGuest: guestExpiresAt !== undefined,
        guestExpiresAt,
        plan
      })
      yield* repo.audit(account.id, "account.create", account.id, { via: "cli" })
      yield* env.out(account.id)
    })
}

const accountStatus: CommandSpec = {
  usage: "account:status (--id ID | --username U) --status active|unlinked|revoked",
  summary: "set an account's status",
  flags: { id: "value", username: "value", status: "value" },
  run: (flags, env) =>
    Effect.gen(function*() {
      const repo = yield* AccountsRepo
      const status = yield* parseStatus(yield* required(flags, "status"))
      const account = yield* resolveAccount(flags, "id")
      yield* repo.setStatus(account.id, status)
      yield* repo.audit(account.id, "account.status", account.id, { via: "cli", from: account.status, to: status })
      yield* env.announce(Invalidation.account(account.id))
      yield* env.out(`${describe(account)}: status ${account.status} -> ${status}`)
      if (env.cacheNote) yield* env.out(env.cacheNote)
    })
}

const keyCreate: CommandSpec = {
  usage: "key:create (--account ID | --username U) [--label L] [--legacy]",
  summary: "issue a key; prints the plaintext once",
  flags: { account: "value", username: "value", label: "value", legacy: "boolean" },
  run: (flags, env) =>
    Effect.gen(function*() {
      const repo = yield* AccountsRepo
      const account = yield* resolveAccount(flags, "account")
      const label = (text(flags, "label") ?? DEFAULT_KEY_LABEL).trim()
      if (label === "") return yield* Effect.fail(usage("--label must not be empty"))
      const capReached = usage(
        `${describe(account)} already holds ${Accounts.MAX_ACTIVE_KEYS} active keys (the maximum); revoke one first`
      )
      // Current-prefix keys go through the account API's capped insert (row lock, no overshoot).
      const issued = flags.legacy === true
        ? (yield* repo.countActiveKeys(account.id)) >= Accounts.MAX_ACTIVE_KEYS
          ? null
          : yield* repo.createKey(account.id, label, { legacy: true })
        : yield* repo.createKeyCapped(account.id, label, Accounts.MAX_ACTIVE_KEYS)
      if (issued === null) return yield* Effect.fail(capReached)
      const { key, row } = issued
      yield* repo.audit(account.id, "key.create", String(row.id), { via: "cli", label: row.label })
      yield* env.out(`Key ${row.id} ("${row.label}") created for ${describe(account)}; it is shown only this once:`)
      yield* env.out(`API key: ${key}`)
    })
}

const keyList: CommandSpec = {
  usage: "key:list (--account ID | --username U)",
  summary: "list an account's active keys",
  flags: { account: "value", username: "value" },
  run: (flags, env) =>
    Effect.gen(function*() {
      const repo = yield* AccountsRepo
      const account = yield* resolveAccount(flags, "account")
      const keys = yield* repo.listActiveKeys(account.id)
      if (keys.length === 0) return yield* env.out(`${describe(account)} has no active keys`)
      const rows = keys.map((k: KeyRow) => [
        String(k.id),
        k.label,
        k.key_prefix ?? "-",
        iso(k.created_at),
        iso(k.last_used_at),
        repo.reveal(k) !== null ? "yes" : "no",
        k.legacy || k.key_prefix === null ? "yes" : "no"
      ])
      yield* env.out(formatTable(["ID", "LABEL", "PREFIX", "CREATED", "LAST USED", "REVEALABLE", "LEGACY"], rows))
    })
}

const keyRevoke: CommandSpec = {
  usage: "key:revoke --id N",
  summary: "revoke a key (every gateway rejects it on its next request)",
  flags: { id: "value" },
  run: (flags, env) =>
    Effect.gen(function*() {
      const repo = yield* AccountsRepo
      const id = yield* parsePositiveInt("id", yield* required(flags, "id"))
      const row = yield* repo.revokeKeyById(id)
      if (row === null) return yield* Effect.fail(usage(`no active key with id ${id}`))
      yield* repo.audit(row.account_id, "key.delete", String(row.id), { via: "cli" })
      yield* env.announce(Invalidation.key(row.key_hash))
      yield* env.out(`Key ${row.id} ("${row.label}") of ${row.account_id} revoked`)
      if (env.cacheNote) yield* env.out(env.cacheNote)
    })
}

const sessionCreate: CommandSpec = {
  usage: "session:create (--account ID | --username U) [--hours 24]",
  summary: "open a dashboard session; prints the ws-session cookie",
  flags: { account: "value", username: "value", hours: "value" },
  run: (flags, env) =>
    Effect.gen(function*() {
      const repo = yield* AccountsRepo
      const account = yield* resolveAccount(flags, "account")
      const raw = text(flags, "hours") ?? "24"
      const hours = Number(raw)
      if (!/^\d+(\.\d+)?$/.test(raw) || !(hours > 0 && hours <= 24 * 365)) {
        return yield* Effect.fail(usage(`--hours must be a number of hours between 0 and 8760, got "${raw}"`))
      }
      const token = yield* repo.createSession(account.id, hours)
      yield* env.out(`Session for ${describe(account)}, valid for ${hours} h:`)
      yield* env.out(`ws-session=${token}`)
    })
}

/** A text flag within `max` characters (trimmed, not empty). */
const boundedText = (flags: Flags, name: string, max: number): Effect.Effect<string | undefined, UsageError> => {
  const value = text(flags, name)
  if (value === undefined) return Effect.succeed(undefined)
  const trimmed = value.trim()
  if (trimmed === "") return Effect.fail(usage(`--${name} must not be empty`))
  if (trimmed.length > max) return Effect.fail(usage(`--${name} is longer than ${max} characters`))
  return Effect.succeed(trimmed)
}

const parseIncidentStatus = (value: string): Effect.Effect<Incidents.IncidentStatus, UsageError> =>
  Incidents.isIncidentStatus(value)
    ? Effect.succeed(value)
    : Effect.fail(usage(`--status must be one of ${Incidents.INCIDENT_STATUSES.join(", ")}, got "${value}"`))

const incidentStatusFlag = (flags: Flags) =>
  text(flags, "status") === undefined ? Effect.succeed(undefined) : parseIncidentStatus(text(flags, "status")!)

const describeIncident = (incident: Incidents.Incident) => `incident ${incident.id} "${incident.title}" (${incident.status})`

/** The running gateways read incidents in their background refresh: no cache to invalidate. */
const INCIDENT_NOTE = "the status page and /api/incidents show it within one refresh period (status.refresh_seconds)"

const incidentCreate: CommandSpec = {
  usage: "incident:create --title T [--message M] [--status investigating|identified|monitoring]",
  summary: "open an incident on the status page; prints its id",
  flags: { title: "value", message: "value", status: "value" },
  run: (flags, env) =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const title = yield* boundedText(flags, "title", Incidents.TITLE_MAX)
      if (title === undefined) return yield* Effect.fail(usage("missing required flag --title"))
      const message = yield* boundedText(flags, "message", Incidents.MESSAGE_MAX)
      const status = (yield* incidentStatusFlag(flags)) ?? "investigating"
      if (status === "resolved") return yield* Effect.fail(usage("a new incident cannot be resolved; use incident:resolve"))
      const incident = yield* Incidents.createIncident(sql, { title, status, message })
      yield* env.out(String(incident.id))
      yield* env.out(`${describeIncident(incident)} created; ${INCIDENT_NOTE}`)
    })
}

const incidentUpdate: CommandSpec = {
  usage: "incident:update --id N --message M [--status investigating|identified|monitoring|resolved]",
  summary: "post an update on an incident (optionally changing its status)",
  flags: { id: "value", message: "value", status: "value" },
  run: (flags, env) =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const id = yield* parsePositiveInt("id", yield* required(flags, "id"))
      const message = yield* boundedText(flags, "message", Incidents.MESSAGE_MAX)
      if (message === undefined) return yield* Effect.fail(usage("missing required flag --message"))
      const status = yield* incidentStatusFlag(flags)
      const incident = yield* Incidents.updateIncident(sql, id, { message, status })
      if (incident === null) return yield* Effect.fail(usage(`no incident with id ${id}`))
      yield* env.out(`${describeIncident(incident)} updated; ${INCIDENT_NOTE}`)
    })
}

/** Posted when `incident:resolve` is given no message. */
export const RESOLVED_MESSAGE = "문제가 해결되었습니다."

const incidentResolve: CommandSpec = {
  usage: "incident:resolve --id N [--message M]",
  summary: "resolve an incident",
  flags: { id: "value", message: "value" },
  run: (flags, env) =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const id = yield* parsePositiveInt("id", yield* required(flags, "id"))
      const message = (yield* boundedText(flags, "message", Incidents.MESSAGE_MAX)) ?? RESOLVED_MESSAGE
      const open = yield* Incidents.incidentById(sql, id)
      if (open === null) return yield* Effect.fail(usage(`no incident with id ${id}`))
      if (open.status === "resolved") return yield* Effect.fail(usage(`incident ${id} is already resolved`))
      const incident = yield* Incidents.updateIncident(sql, id, { message, status: "resolved" })
      yield* env.out(`${describeIncident(incident!)} resolved; ${INCIDENT_NOTE}`)
    })
}

const incidentList: CommandSpec = {
  usage: "incident:list [--limit N]",
  summary: "list the newest incidents (default 20)",
  flags: { limit: "value" },
  run: (flags, env) =>
    Effect.gen(function*() {
      const sql = yield* SqlClient.SqlClient
      const limit = text(flags, "limit") === undefined ? 20 : yield* parsePositiveInt("limit", text(flags, "limit")!)
      const { incidents, active } = yield* Incidents.recentIncidents(sql, Math.min(limit, 1000))
      if (incidents.length === 0) return yield* env.out("no incidents")
      const rows = incidents.map((i) => [
        String(i.id),
        i.status,
        iso(new Date(i.created_at)),
        iso(new Date(i.updated_at)),
        String(i.updates.length),
        i.title
      ])
      yield* env.out(formatTable(["ID", "STATUS", "CREATED", "UPDATED", "UPDATES", "TITLE"], rows))
      yield* env.out(`${active} not resolved`)
    })
}

const workerTokenCreate: CommandSpec = {
  usage: "worker:token:create --name N",
  summary: "issue an image worker token; prints it once",
  flags: { name: "value" },
  run: (flags, env) =>
    Effect.gen(function*() {
      const name = yield* required(flags, "name")
      if (!WorkerTokens.validName(name)) {
        return yield* Effect.fail(usage("--name must be 1 to 64 characters without control characters"))
      }
      const { token, row } = yield* WorkerTokens.insertToken(name)
      yield* env.out(`Worker token ${row.id} ("${row.name}") created; it is shown only this once:`)
      yield* env.out(`Worker token: ${token}`)
    })
}

const workerTokenList: CommandSpec = {
  usage: "worker:token:list",
  summary: "list image worker tokens",
  flags: {},
  run: (_flags, env) =>
    Effect.gen(function*() {
      const rows = yield* WorkerTokens.listTokens
      if (rows.length === 0) return yield* env.out("no worker tokens")
      yield* env.out(formatTable(
        ["ID", "NAME", "CREATED", "REVOKED"],
        rows.map((row) => [String(row.id), row.name, iso(row.created_at), row.revoked_at ? iso(row.revoked_at) : "-"])
      ))
    })
}

const workerTokenRevoke: CommandSpec = {
  usage: "worker:token:revoke --id N",
  summary: "revoke an image worker token (its workers get 401 on their next call)",
  flags: { id: "value" },
  run: (flags, env) =>
    Effect.gen(function*() {
      const id = yield* parsePositiveInt("id", yield* required(flags, "id"))
      const row = yield* WorkerTokens.revokeToken(id)
      if (row === null) return yield* Effect.fail(usage(`no active worker token with id ${id}`))
      // Worker tokens are cached by hash like keys: the same announcement drops them.
      yield* env.announce(Invalidation.key(row.token_hash))
      yield* env.out(`Worker token ${row.id} ("${row.name}") revoked`)
      if (env.cacheNote) {
        yield* env.out(
          `note: the running embedded gateway accepts this token for up to ${WorkerTokens.SNAPSHOT_TTL_MS / 1000} s more`
        )
      }
    })
}

export const commands: Readonly<Record<string, CommandSpec>> = {
  "account:create": accountCreate,
  "account:status": accountStatus,
  "key:create": keyCreate,
  "key:list": keyList,
  "key:revoke": keyRevoke,
  "session:create": sessionCreate,
  "incident:create": incidentCreate,
  "incident:update": incidentUpdate,
  "incident:resolve": incidentResolve,
  "incident:list": incidentList,
  "worker:token:create": workerTokenCreate,
  "worker:token:list": workerTokenList,
  "worker:token:revoke": workerTokenRevoke
}

const DEPLOYMENTS_LIST = "deployments:list"

/** Commands that ask a running gateway rather than the database. */
const gatewayCommands: Readonly<Record<string, Omit<CommandSpec, "run">>> = {
  [DEPLOYMENTS_LIST]: {
    usage: "deployments:list [--url http://HOST:PORT] [--json]",
    summary: "list every model's deployments with their health and load, as a running gateway (replica) sees them; " +
      "asks the `operator` listener of the config (or --url)",
    flags: { url: "value", json: "boolean" }
  }
}


const table = (rows: ReadonlyArray<ReadonlyArray<string>>): string => {
  const widths = rows[0]!.map((_, i) => Math.max(...rows.map((r) => r[i]!.length)))
  return rows.map((r) => r.map((cell, i) => cell.padEnd(widths[i]!)).join("  ").trimEnd()).join("\n") + "\n"
}

/** `deployments:list`: GET /deployments from the operator listener. */
const listDeployments = async (
  flags: Flags,
  io: Io,
  processEnv: NodeJS.ProcessEnv,
  fatal: (message: string, code: number) => number
): Promise<number> => {
  let url = text(flags, "url")
  if (url === undefined) {
    try {
      const { config } = loadConfig({ env: processEnv, flags: { configPath: text(flags, "config") } })
      const listener = config.listeners.find((l) => l.origins.includes("operator"))
      if (listener === undefined) {
        return fatal("no listener serves the operator origin; add one (README: Metrics) or pass --url", 2)
      }
      const host = listener.host === "0.0.0.0" || listener.host === "::" ? "127.0.0.1" : listener.host
      url = `http://${host.includes(":") ? `[${host}]` : host}:${listener.port}`
    } catch (error) {
      return fatal((error as Error).message, 2)
    }
  }
  if (!/^https?:\/\/[^/\s]+\/?$/.test(url)) return fatal(`--url must be http(s)://host:port, got "${url}"`, 2)
  let rows: ReadonlyArray<DeploymentStatus>
  try {
    const response = await fetch(`${url.replace(/\/$/, "")}/deployments`, { signal: AbortSignal.timeout(5_000) })
    if (!response.ok) return fatal(`${url}/deployments answered ${response.status}`, 1)
    rows = ((await response.json()) as { data: ReadonlyArray<DeploymentStatus> }).data
  } catch (error) {
    return fatal(`cannot reach the gateway at ${url}: ${(error as Error).message}`, 1)
  }
  if (flags.json === true) {
    io.out(JSON.stringify(rows, null, 2) + "\n")
    return 0
  }
  io.out(table([
    ["MODEL", "DEPLOYMENT", "PROVIDER", "UPSTREAM MODEL", "WEIGHT", "PRIO", "STATE", "RETRY IN", "IN FLIGHT", "STARTS/60S", "FAILURES"],
    ...rows.map((r) => [
      r.model,
      r.deployment,
      r.provider,
      r.upstreamModel,
      String(r.weight),
      String(r.priority),
      r.cooling ? `${r.state}, cooling` : r.state,
      r.retryInSeconds > 0 ? `${r.retryInSeconds}s` : "-",
      r.fleetInFlight === null ? String(r.inFlight) : `${r.inFlight} (fleet ${r.fleetInFlight})`,
      r.startsLastMinute === null ? "-" : String(r.startsLastMinute),
      String(r.recentFailures)
    ])
  ]))
  return 0
}

export const helpText = (command?: string): string => {
  const spec = command ? commands[command] ?? gatewayCommands[command] : undefined
  if (spec) {
    return `Usage: npm run cli -- ${spec.usage}\n\n${spec.summary}.\n\n` +
      "Global flags: --config PATH  --data-dir DIR  --database-url URL (override config/gateway.yaml and env)\n" +
      "              --create (make a new embedded database when the data folder has none)\n"
  }
  const lines = [...Object.entries(commands), ...Object.entries(gatewayCommands)].map(([name, c]) =>
    `  ${name.padEnd(20)} ${c.summary}`
  )
  return [
    "Usage: npm run cli -- <command> [flags]",
    "",
    "Commands:",
    ...lines,
    "",
    "Global flags (same layers as the gateway: config file, then env, then these):",
    "  --config PATH        config file (default config/gateway.yaml, env WELLSPRING_CONFIG)",
    "  --data-dir DIR       embedded data folder (env WELLSPRING_DATA_DIR)",
    "  --database-url URL   PostgreSQL (env DATABASE_URL); unset means the embedded database",
    "  --create             make a new embedded database if the data folder has none (refused otherwise)",
    "",
    "Run `npm run cli -- <command> --help` for a command's flags.",
    ""
  ].join("\n")
}

// ---------------------------------------------------------------------------------------------------------
// Parsing

export type Parsed =
  | { readonly _tag: "help"; readonly command?: string }
  | { readonly _tag: "run"; readonly command: string; readonly flags: Flags }

/** Splits argv into a command and its flags; throws UsageError. */
export const parseArgs = (argv: ReadonlyArray<string>): Parsed => {
  let command: string | undefined
  let help = false
  const tokens: Array<string> = []
  for (const arg of argv) {
    if (arg === "--help" || arg === "-h" || (arg === "help" && command === undefined)) help = true
    else if (!arg.startsWith("-") && command === undefined && (tokens.length === 0 || !expectsValue(tokens))) {
      command = arg
    } else tokens.push(arg)
  }
  if (command !== undefined && !(command in commands) && !(command in gatewayCommands)) {
    throw usage(
      `unknown command "${command}" (commands: ${[...Object.keys(commands), ...Object.keys(gatewayCommands)].join(", ")})`
    )
  }
  if (help) return command === undefined ? { _tag: "help" } : { _tag: "help", command }
  if (command === undefined) throw usage("missing command")
  const spec = { ...GLOBAL_FLAGS, ...(commands[command] ?? gatewayCommands[command])!.flags }
  const flags: Record<string, string | true> = {}
  for (let i = 0; i < tokens.length; i++) {
    const arg = tokens[i]!
    if (!arg.startsWith("--") || arg === "--") throw usage(`unexpected argument "${arg}"`)
    const eq = arg.indexOf("=")
    const name = eq > 0 ? arg.slice(2, eq) : arg.slice(2)
    const kind = spec[name]
    if (kind === undefined) throw usage(`unknown flag --${name} for ${command}`)
    if (name in flags) throw usage(`flag --${name} given twice`)
    if (kind === "boolean") {
      if (eq > 0) throw usage(`flag --${name} takes no value`)
      flags[name] = true
      continue
    }
    const value = eq > 0 ? arg.slice(eq + 1) : tokens[++i]
    if (value === undefined || (eq < 0 && value.startsWith("--"))) throw usage(`flag --${name} needs a value`)
    flags[name] = value
  }
  return { _tag: "run", command, flags }
}

/** True when the last token is a global flag still waiting for its value (`--config PATH`). */
const expectsValue = (tokens: ReadonlyArray<string>): boolean => {
  const last = tokens[tokens.length - 1]!
  return last.startsWith("--") && !last.includes("=") && GLOBAL_FLAGS[last.slice(2)] === "value"
}

// ---------------------------------------------------------------------------------------------------------
// Running

/** Whether an embedded database exists in `dataDir` (PGlite's folder with its version file). */
const embeddedExists = (dataDir: string) => Fs.existsSync(Path.resolve(dataDir, "pglite", "PG_VERSION"))

/** The database a command uses, for the operator (never credentials). */
const describeDatabase = (config: GatewayConfig, owner: EmbeddedLock.EmbeddedOwner | null): string =>
  config.database_url
    ? `PostgreSQL at ${Sql.describeDatabaseUrl(Redacted.value(config.database_url))}`
    : `embedded database in ${Path.resolve(config.data_dir)}` +
      (owner ? ` (through the running gateway, process ${owner.pid})` : "")

const storage = (config: GatewayConfig, path: string, create: boolean) => {
  const owner = config.database_url ? null : EmbeddedLock.currentOwner(config.data_dir)
  if (owner && owner.socket === null) {
    throw new CliFailure(`the gateway (process ${owner.pid}) is still opening ${config.data_dir}; try again`)
  }
  // A mistyped --data-dir must not quietly create an empty database (and a key file) somewhere else.
  if (!config.database_url && !owner && !create && !embeddedExists(config.data_dir)) {
    throw usage(
      `no embedded database in ${Path.resolve(config.data_dir)}; point --data-dir (or WELLSPRING_DATA_DIR) at the ` +
        "gateway's data folder, use --database-url for PostgreSQL, or pass --create to make a new one"
    )
  }
  const settings = Layer.succeed(Settings, makeSettings(config, path))
  // Embedded mode with a running gateway: attach to its pglite-socket (a Unix socket in the private data
  // folder) instead of opening the folder twice.
  const sql = owner
    ? Layer.provideMerge(
      Layer.effectDiscard(Effect.orDie(Sql.runMigrations)),
      Sql.layerSocket(owner.socket!).pipe(mapLayerError((cause) =>
        new Sql.StoreError({
          message: `cannot reach the running gateway's embedded database (process ${owner.pid}, socket ${owner.socket}): ${
            Sql.rootMessage(cause)
          }`,
          cause
        })
      ))
    )
    : Sql.layerSql({ databaseUrl: config.database_url, dataDir: config.data_dir })
  return { layer: Layer.provideMerge(Accounts.layer, Layer.merge(settings, sql)), owner }
}

/** v3's `Layer.mapError`: the same layer, its construction error replaced by `f(error)`. */
const mapLayerError = <E, E2>(f: (error: E) => E2) => <ROut, RIn>(layer: Layer.Layer<ROut, E, RIn>) =>
  Layer.catch(layer, (error) => Layer.effectContext<ROut, E2, never>(Effect.fail(f(error))))

class CliFailure extends Error {}

/** One line for any failure: the tagged error's message and its root cause. */
export const describeFailure = (cause: Cause.Cause<unknown>): string => {
  const error = Cause.squash(cause)
  const message = (error as { message?: unknown })?.message
  const head = typeof message === "string" && message ? message : String(error)
  const root = Sql.rootMessage(error)
  return (head.includes(root) ? head : `${head}: ${root}`).replace(/\s*\n\s*/g, " ")
}

export interface Io {
  readonly out: (s: string) => void
  readonly err: (s: string) => void
}

/** Runs the CLI; resolves to the exit code. Output goes through `io` (stdout / stderr by default). */
export const run = async (
  argv: ReadonlyArray<string>,
  io: Io = { out: (s) => process.stdout.write(s), err: (s) => process.stderr.write(s) },
  processEnv: NodeJS.ProcessEnv = process.env
): Promise<number> => {
  const fatal = (message: string, code: number) => {
    io.err(`wellspring-cli: ${message}\n`)
    if (code === 2) io.err("Run `npm run cli -- --help` for usage.\n")
    return code
  }
  let parsed: Parsed
  try {
    parsed = parseArgs(argv)
  } catch (error) {
    if (error instanceof UsageError) return fatal(error.message, 2)
    throw error
  }
  if (parsed._tag === "help") {
    io.out(helpText(parsed.command))
    return 0
  }
  const { command, flags } = parsed
  if (command === DEPLOYMENTS_LIST) return listDeployments(flags, io, processEnv, fatal)
  let config: GatewayConfig
  let layer: ReturnType<typeof storage>["layer"]
  let owner: EmbeddedLock.EmbeddedOwner | null
  let creating = false
  try {
    const loaded = loadConfig({
      env: processEnv,
      flags: { configPath: text(flags, "config"), dataDir: text(flags, "data-dir"), databaseUrl: text(flags, "database-url") }
    })
    config = loaded.config
    // `account:create` bootstraps a deployment: it may make the database (and says so); other commands need
    // `--create` for that.
    creating = !config.database_url && !embeddedExists(config.data_dir) && (flags.create === true || command === "account:create")
    ;({ layer, owner } = storage(config, loaded.path, creating))
  } catch (error) {
    if (error instanceof ConfigLoadError || error instanceof UsageError) return fatal(error.message, 2)
    if (error instanceof CliFailure) return fatal(error.message, 1)
    return fatal(`cannot start: ${(error as Error).message}`, 1)
  }
  const database = describeDatabase(config, owner) + (creating ? " (new: created by this command)" : "")
  /** Every outcome names the database (once: a connection failure already does). */
  const naming = (message: string) => message.includes(database) || message.includes("PostgreSQL at") ? message : `${message} (${database})`
  const env: CommandEnv = {
    config,
    announce: (invalidation) =>
      config.database_url
        ? SqlClient.SqlClient.pipe(
          Effect.flatMap((sql) => Invalidation.publish(sql, invalidation)),
          Effect.catch((e) =>
            Effect.sync(() => io.err(`warning: could not notify running gateways: ${Sql.rootMessage(e)}\n`))
          )
        )
        : Effect.void,
    cacheNote: owner
      ? `note: the running embedded gateway (process ${owner.pid}) may keep this key or account in its cache for up to ${
        Invalidation.POSITIVE_TTL_MS / 1000
      } s`
      : null,
    out: (line) => Effect.sync(() => io.out(line + "\n"))
  }
  const program = commands[command]!.run(flags, env).pipe(Effect.provide(layer))
  const exit = await Effect.runPromiseExit(program as Effect.Effect<void, UsageError | Sql.StoreError>)
  if (Exit.isSuccess(exit)) {
    io.err(`wellspring-cli: database: ${database}\n`)
    return 0
  }
  const failure = Cause.findErrorOption(exit.cause)
  if (Option.isSome(failure) && failure.value instanceof UsageError) return fatal(naming(failure.value.message), 2)
  return fatal(naming(describeFailure(exit.cause)), 1)
}

const isMain = process.argv[1] !== undefined && Url.pathToFileURL(process.argv[1]).href === import.meta.url
if (isMain) {
  // Everything the CLI creates (an embedded data folder opened without a gateway, its key file) is owner-only.
  process.umask(0o077)
  run(process.argv.slice(2)).then(
    (code) => process.exit(code),
    (error) => {
      process.stderr.write(`wellspring-cli: ${(error as Error).message}\n`)
      process.exit(1)
    }
  )
}
