/**
 * In-process `Admission` (embedded mode, ARCHITECTURE §4), composed of:
 *
 * - `runtime/Actors.ts`: one actor per account (mailbox, supervision, passivation, inline fast path);
 * - `Transitions.ts`: what the actors compute (window roll, admit decision, settle/refund, standing, RPM, abuse);
 * - `ModelGates.ts`: per model, the in-flight counter and the shared daily total (09:00 KST boundary);
 * - `WriteBehind.ts` (optional, `sql`): write-behind to `quota_windows` / `model_daily_usage`, batched a
 *   `flushInterval` after the first change, on passivation (through the pending buffer) and on scope close;
 *   state is read when an actor starts (pending buffer first, so a passivated but unflushed account is never read
 *   stale) and, for the daily totals, when the layer starts. RPM and abuse windows (at most a minute of history)
 *   stay in process: they survive passivation and actor restarts but not a process restart;
 * - `RateLimit.ts`: the in-process limiter behind `limit`.
 *
 * All time comes from `Clock` (captured once when the layer is built), so `TestClock` drives everything.
 */
import { Clock, Context, Duration, Effect, Exit, Layer, Scope } from "effect"
import { SqlClient } from "effect/sql"
import type { PlanConfig } from "../config/GatewayConfig.js"
import type { GatewayError } from "../errors/Catalog.js"
import * as AccountActors from "../runtime/Actors.js"
import { Admission, type AdmitInput, type SettleUsage, type Standing, type Ticket } from "./Admission.js"
import { type Gate, makeModelGates } from "./ModelGates.js"
import {
  type AbuseSettings,
  dayIndex,
  rawTokens,
  rejectionError,
  rpmStanding,
  unavailable,
  weightedCost
} from "./Policy.js"
import { type AccountWindows, makeQuotaRepo, type QuotaRepo } from "./QuotaRepo.js"
import { fixedWindow } from "../runtime/RateWindow.js"
import * as RateLimit from "./RateLimit.js"
import {
  type AccountState,
  abuseRule,
  admit,
  copyAccount,
  emptyAccount,
  isIdle,
  type Reservation,
  rpmCount,
  settle,
  standingOf
} from "./Transitions.js"
import * as WriteBehind from "./WriteBehind.js"

export interface MemoryOptions {
  readonly abuse: AbuseSettings
  /** Write-behind persistence to PostgreSQL. Without it the state lives in this process only. */
  readonly sql?: SqlClient.SqlClient | undefined
  /** Idle time before an account actor is passivated. Default 10 minutes. */
  readonly idleTimeToLive?: Duration.Input | undefined
  /** Delay between the first unflushed change and the batched write. Default 1 second. */
  readonly flushInterval?: Duration.Input | undefined
  /** Route every command through the mailbox (no inline fast path). Default false. */
  readonly mailboxOnly?: boolean | undefined
}

/** Test and operator view into the memory layer. Not part of `Admission`. */
export class AdmissionMemoryProbe extends Context.Service<AdmissionMemoryProbe, {
  /** Slots currently held on a model's in-flight gate. */
  readonly inFlight: (modelId: string) => number
  /** Account actors currently alive (not passivated). */
  readonly liveActors: Effect.Effect<number>
  /** Number of actor restarts after defects. */
  readonly restarts: () => number
  /** Makes the account's actor fail with a defect while serving a command (supervision test hook). */
  readonly crash: (accountId: string) => Effect.Effect<void, GatewayError>
  /** Writes every pending change to PostgreSQL now (no-op without `sql`). */
  readonly flush: Effect.Effect<void>
}>()("wellspring/quota/AdmissionMemoryProbe") {}

// ---------------------------------------------------------------------------------------------------------------

const fromRow = (row: AccountWindows | undefined): AccountState =>
  row === undefined ? emptyAccount() : copyAccount({
    sessionStart: row.sessionStart,
    sessionUsed: row.sessionUsed,
    weeklyAnchor: row.weeklyAnchor,
    weeklyUsed: row.weeklyUsed,
    cooldownUntil: row.cooldownUntil ?? 0,
    abuse: [],
    rpm: new Map()
  })

const toRow = (accountId: string, s: AccountState): AccountWindows => ({
  accountId,
  sessionStart: s.sessionStart,
  sessionUsed: s.sessionUsed,
  weeklyAnchor: s.weeklyAnchor,
  weeklyUsed: s.weeklyUsed,
  cooldownUntil: s.cooldownUntil > 0 ? s.cooldownUntil : null
})

interface SettleResult {
  readonly standing: Standing
  readonly weighted: number
}

interface MemTicket {
  readonly actor: Actor
  readonly input: AdmitInput
  /** What was reserved, in which windows; a settle after they rolled over leaves the new windows alone. */
  readonly reservation: Reservation
  /** The gate whose slot this ticket holds, until released. */
  slot: Gate | undefined
  /** First settle/refund wins; later calls get the same result. */
  outcome: Outcome | undefined
  ticket: Ticket
}

interface Outcome {
  exit: Exit.Exit<SettleResult> | undefined
  readonly waiters: Array<AccountActors.Reply>
}

type Command =
  | { readonly _tag: "Admit"; readonly input: AdmitInput; readonly reply: AccountActors.Reply }
  | {
    readonly _tag: "Settle"
    readonly ticket: MemTicket
    /** null = refund. */
    readonly usage: SettleUsage | null
    readonly reply: AccountActors.Reply
  }
  | { readonly _tag: "Standing"; readonly plan: PlanConfig; readonly reply: AccountActors.Reply }
  | { readonly _tag: "Rpm"; readonly reply: AccountActors.Reply }
  | { readonly _tag: "Crash"; readonly reply: AccountActors.Reply }

type Actor = AccountActors.Actor<AccountState, Command>

const noReply: AccountActors.Reply = () => {}
type Result = AccountActors.Result

// ---------------------------------------------------------------------------------------------------------------

/** Builds the service and its probe; needs a Scope (actors, write-behind and the final flush live in it). */
export const make = Effect.fnUntraced(function*(options: MemoryOptions) {
  const clock: Clock.Clock = yield* Clock.Clock
  const repo: QuotaRepo | undefined = options.sql === undefined ? undefined : makeQuotaRepo(options.sql)
  const abuse = abuseRule(options.abuse)

  /**
   * Snapshots of passivated (or restarted) actors. With `sql` these wait here until written; without it this
   * map is the store, swept of accounts whose windows have all ended.
   */
  const pending = new Map<string, AccountState>()
  let pendingInserts = 0
  /** Live actors with unwritten changes. */
  const dirtyActors = new Set<Actor>()

  // --- write-behind (only with sql); created before the actors so its final flush runs after passivation ----
  let signal = (): void => {}
  const gates = makeModelGates(repo !== undefined, () => signal())
  const writeBehind = repo === undefined ? undefined : yield* WriteBehind.make({
    repo,
    interval: Duration.fromInputUnsafe(options.flushInterval ?? "1 second"),
    label: "write-behind",
    take: () => {
      const live = [...dirtyActors]
      dirtyActors.clear()
      const taken = [...pending.entries()]
      const rows = new Map<string, AccountWindows>()
      for (const [id, s] of taken) rows.set(id, toRow(id, s))
      for (const a of live) if (a.loaded) rows.set(a.key, toRow(a.key, a.state))
      const daily = gates.takeDirty()
      if (rows.size === 0 && daily.rows.length === 0) return undefined
      return {
        rows: Effect.succeed({ accounts: [...rows.values()], daily: daily.rows }),
        written: () => {
          for (const [id, s] of taken) if (pending.get(id) === s) pending.delete(id)
          daily.written()
        },
        failed: () => {
          for (const a of live) if (!a.closed) markDirty(a)
          daily.failed()
        }
      }
    }
  })
  if (writeBehind !== undefined) signal = writeBehind.signal

  const markDirty = (actor: Actor): void => {
    if (repo === undefined || dirtyActors.has(actor)) return
    dirtyActors.add(actor)
    signal()
  }

  const putPending = (accountId: string, state: AccountState): void => {
    pending.set(accountId, copyAccount(state))
    if (repo) {
      signal()
    } else if (++pendingInserts >= 1024 && pendingInserts >= pending.size) {
      pendingInserts = 0
      const now = clock.currentTimeMillisUnsafe()
      pending.forEach((s, id) => {
        if (isIdle(s, now)) pending.delete(id)
      })
    }
  }

  if (repo) {
    const today = dayIndex(clock.currentTimeMillisUnsafe())
    gates.seed(yield* repo.loadDaily(today).pipe(Effect.orDie), today)
  }

  // --- command handlers (synchronous; the transitions check everything, then commit) -------------------------

  const onAdmit = (actor: Actor, input: AdmitInput, now: number): Exit.Exit<MemTicket, GatewayError> => {
    const s = actor.state
    const gate = input.byok ? undefined : gates.gateFor(input.model.id, now)
    const cooldownBefore = s.cooldownUntil
    const decision = admit(s, gate, input, abuse, now)
    if (decision._tag === "Rejected") {
      if (s.cooldownUntil !== cooldownBefore) markDirty(actor)
      return Exit.fail(rejectionError(decision.rejection))
    }
    if (gate !== undefined) {
      gates.markDirty(gate)
      markDirty(actor)
    }
    const t: MemTicket = {
      actor,
      input,
      reservation: decision,
      slot: gate,
      outcome: undefined,
      ticket: undefined as unknown as Ticket
    }
    t.ticket = {
      reserved: standingOf(s, input.plan, now),
      rpm: rpmStanding(input.model.rate_limit_rpm, decision.rpmCount, decision.rpmOldest, now),
      settle: (usage) => resolve(t, usage),
      settleNow: (usage) => resolveNow(t, usage),
      refund: Effect.asVoid(resolve(t, null))
    }
    return Exit.succeed(t)
  }

  const onSettle = (actor: Actor, t: MemTicket, usage: SettleUsage | null, now: number): SettleResult => {
    const s = actor.state
    if (t.input.byok) return { standing: standingOf(s, t.input.plan, now), weighted: 0 }
    const model = t.input.model
    const weighted = usage === null ? 0 : weightedCost(model, usage)
    const gate = gates.get(model.id)
    settle(s, gate, t.reservation, weighted, usage === null ? 0 : rawTokens(usage))
    if (gate !== undefined && gate.day === t.reservation.day) gates.markDirty(gate)
    markDirty(actor)
    return { standing: standingOf(s, t.input.plan, now), weighted }
  }

  const handle = (actor: Actor, cmd: Command, now: number): Result => {
    switch (cmd._tag) {
      case "Admit":
        return onAdmit(actor, cmd.input, now)
      case "Settle":
        return Exit.succeed(onSettle(actor, cmd.ticket, cmd.usage, now))
      case "Standing":
        return Exit.succeed(standingOf(actor.state, cmd.plan, now))
      case "Rpm":
        return Exit.succeed(rpmCount(actor.state, now))
      case "Crash":
        throw new Error(`injected defect in quota actor ${actor.key}`)
    }
  }

  /**
   * Answers a command that cannot be served (state could not be loaded, or the layer is closing). A settle
   * or refund is still applied when the state is at hand: it only moves counters of an existing reservation.
   */
  const refuse = (actor: Actor, cmd: Command, why: string, now: number): Result =>
    cmd._tag === "Settle" && actor.loaded
      ? Exit.succeed(onSettle(actor, cmd.ticket, cmd.usage, now))
      : cmd._tag === "Settle"
      ? Exit.succeed({ standing: standingOf(emptyAccount(), cmd.ticket.input.plan, now), weighted: 0 })
      : Exit.fail(unavailable(why))

  const load = (actor: Actor): Effect.Effect<boolean> => {
    const snapshot = pending.get(actor.key)
    if (snapshot !== undefined || repo === undefined) {
      actor.state = snapshot === undefined ? emptyAccount() : copyAccount(snapshot)
      actor.loaded = true
      return Effect.succeed(true)
    }
    return repo.loadAccount(actor.key).pipe(
      Effect.map((row) => {
        // a passivated snapshot may have appeared while the query ran: it is newer
        const newer = pending.get(actor.key)
        actor.state = newer !== undefined ? copyAccount(newer) : fromRow(row)
        actor.loaded = true
        return true
      }),
      Effect.catchCause((cause) =>
        Effect.as(Effect.logWarning(`quota state of ${actor.key} could not be loaded`, cause), false)
      )
    )
  }

  const actors = yield* AccountActors.make<AccountState, Command>({
    clock,
    idleTimeToLive: options.idleTimeToLive ?? "10 minutes",
    mailboxOnly: options.mailboxOnly === true,
    initial: emptyAccount,
    load,
    handle,
    refuse,
    handOver: (actor) => putPending(actor.key, actor.state),
    stopped: (actor) => {
      dirtyActors.delete(actor)
    }
  })

  // --- tickets ---------------------------------------------------------------------------------------------

  /** Settles (or refunds, `usage` null) now: an Exit when the actor served it inline, else the wait for it. */
  const resolveNow = (t: MemTicket, usage: SettleUsage | null): Effect.Effect<SettleResult> => {
    let o = t.outcome
    if (o === undefined) {
      const outcome: Outcome = o = t.outcome = { exit: undefined, waiters: [] }
      const finish = (exit: Exit.Exit<SettleResult>) => {
        outcome.exit = exit
        for (const w of outcome.waiters) w(exit)
        outcome.waiters.length = 0
      }
      const cmd: Command = { _tag: "Settle", ticket: t, usage, reply: finish }
      if (actors.canInline(t.actor)) {
        // a Settle handler cannot fail, only die
        const answer = actors.inline(t.actor, cmd) as Effect.Effect<SettleResult>
        if (Exit.isExit(answer)) finish(answer as Exit.Exit<SettleResult>)
        else return Effect.tapCause(answer, (cause) => Effect.sync(() => finish(Exit.failCause(cause))))
      } else {
        actors.send(t.actor, cmd)
      }
    }
    const settled = o.exit
    if (settled !== undefined) return settled
    return Effect.callback<SettleResult>((resume) => {
      if (o.exit !== undefined) resume(o.exit)
      else o.waiters.push(resume)
    })
  }
  const resolve = (t: MemTicket, usage: SettleUsage | null): Effect.Effect<SettleResult> =>
    Effect.suspend(() => resolveNow(t, usage))

  const releaseTicket = (t: MemTicket): Effect.Effect<void> =>
    Effect.suspend(() => {
      if (t.slot !== undefined) {
        gates.release(t.slot)
        t.slot = undefined
      }
      return t.outcome === undefined ? Effect.asVoid(resolve(t, null)) : Effect.void
    })

  const limiter = RateLimit.makeMemory()

  const admission = Admission.of({
    // `Scope.addFinalizer` rather than `acquireRelease`: the release needs no captured context, and
    // `acquireRelease` merges the whole request context into the closing fiber's (a map copy per request).
    admit: (input) =>
      Effect.flatMap(actors.get(input.accountId), (actor) =>
        // Uninterruptible from the admission to the release's registration: a ticket is never left unowned.
        Effect.uninterruptible(Effect.withFiber((fiber) => {
          const scope = Context.getUnsafe(fiber.context, Scope.Scope)
          const held = (t: MemTicket) => Effect.as(Scope.addFinalizer(scope, releaseTicket(t)), t.ticket)
          // Idle actor: admitted on this fiber, without a trip through the mailbox.
          if (actors.canInline(actor)) {
            const answer = actors.inline(actor, { _tag: "Admit", input, reply: noReply }) as Effect.Effect<
              MemTicket,
              GatewayError
            >
            if (Exit.isExit(answer)) {
              const exit = answer as Exit.Exit<MemTicket, GatewayError>
              return Exit.isSuccess(exit) ? held(exit.value) : (exit as Exit.Exit<never, GatewayError>)
            }
            return Effect.flatMap(answer, held)
          }
          return Effect.flatMap(
            actors.ask<MemTicket>(actor, (reply): Command => ({ _tag: "Admit", input, reply })),
            (t: MemTicket) => held(t)
          )
        }))),

    standing: (accountId, plan) =>
      actors.with(accountId, (actor) => actors.ask<Standing>(actor, (reply) => ({ _tag: "Standing", plan, reply }))),

    currentRpm: (accountId) =>
      actors.with(accountId, (actor) => actors.ask<number>(actor, (reply) => ({ _tag: "Rpm", reply }))),

    dailyUsage: (modelId) => Effect.sync(() => gates.dailyUsage(modelId, clock.currentTimeMillisUnsafe())),

    limit: (key, max, windowSeconds) => limiter.take(key, fixedWindow(max, windowSeconds))
  })

  const probe = AdmissionMemoryProbe.of({
    inFlight: gates.inFlight,
    liveActors: actors.live,
    restarts: actors.restarts,
    crash: (accountId) =>
      actors.with(accountId, (actor) =>
        Effect.suspend(() =>
          // always through the mailbox: this exercises the supervisor
          Effect.callback<void, GatewayError>((resume) => actors.send(actor, { _tag: "Crash", reply: resume }))
        )),
    flush: writeBehind?.flush ?? Effect.void
  })

  return { admission, probe } as const
})

/** Pure in-process admission (no database). */
export const layerMemory = (options: MemoryOptions): Layer.Layer<Admission> =>
  Layer.effect(Admission, Effect.map(make(options), (m) => m.admission))

/** In-process admission with write-behind persistence through the context's SqlClient. */
export const layerMemoryWithSql = (
  options: Omit<MemoryOptions, "sql">
): Layer.Layer<Admission, never, SqlClient.SqlClient> =>
  Layer.effect(
    Admission,
    Effect.flatMap(SqlClient.SqlClient, (sql) => Effect.map(make({ ...options, sql }), (m) => m.admission))
  )

/** Admission plus its probe (tests, diagnostics). */
export const layerMemoryWithProbe = (
  options: MemoryOptions
): Layer.Layer<Admission | AdmissionMemoryProbe> =>
  Layer.effectContext(
    Effect.map(make(options), (m) => Context.make(Admission, m.admission).pipe(Context.add(AdmissionMemoryProbe, m.probe)))
  )
