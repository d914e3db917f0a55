/**
 * In-process `Admission` (embedded mode, ARCHITECTURE §4): one actor per account, one gate per model.
 *
 * - Account actor: a fiber that owns the account's state (session pool, weekly pool, RPM sliding windows per
 *   model, abuse burst window and cooldown) and serves a mailbox of commands, each answered through a callback.
 *   Actors are created on first use through an `RcMap` keyed by account id and passivated after
 *   `idleTimeToLive` without references (a held ticket keeps its actor alive). A supervisor loop restarts the
 *   actor after a defect: the failing command is answered with the defect and the state is reloaded through
 *   the store (in-process snapshot, else PostgreSQL). Every command is handled synchronously: all checks run
 *   first, then a handful of assignments commit, so a defect never leaves half-applied state.
 *   Fast path: when the actor is idle (state loaded, nothing queued, nothing being served) a command is
 *   handled inline on the caller's fiber instead of through the mailbox. Handlers are synchronous, so this is
 *   indistinguishable from the actor serving it next, and it saves two fiber hops per command (~4x cheaper).
 *   The mailbox serializes whenever the actor is busy (loading its state, restarting, closing);
 *   `mailboxOnly: true` disables the fast path.
 * - Model gate: in-flight counter (non-blocking; full -> 529) and the shared daily cap (raw tokens,
 *   day boundary 09:00 KST = 00:00 UTC). Touched only from actors' synchronous handlers and ticket
 *   finalizers, so check-and-commit is atomic without locks.
 * - Persistence (optional, `sql`): write-behind to `quota_windows` / `model_daily_usage` — batched a
 *   `flushInterval` after the first change, on passivation (through the pending buffer) and on scope close;
 *   read when an actor starts (pending buffer first, so a passivated but unflushed account is never read stale)
 *   and, for the daily caps, when the layer starts. RPM and abuse windows (at most a minute of history) stay in
 *   process: they survive passivation and actor restarts but not a process restart.
 *
 * All time comes from `Clock` (captured once when the layer is built), so `TestClock` drives everything.
 * Abuse counts admitted requests only: a request rejected by any check adds nothing to the burst window.
 * The attempt that would exceed `abuse.burst` admissions within `abuse.window_seconds` starts the cooldown
 * and is itself rejected with `abuse_cooldown`.
 */
import {
  Clock,
  Context,
  Duration,
  Effect,
  Exit,
  Layer,
  Queue,
  RcMap,
  Semaphore
} from "effect"
import { SqlClient } from "effect/sql"
import type { ModelConfig, PlanConfig } from "../config/GatewayConfig.js"
import type { GatewayError } from "../errors/Catalog.js"
import { Admission, type AdmitInput, type SettleUsage, type Standing, type Ticket } from "./Admission.js"
import {
  abuseCooldown,
  type AbuseSettings,
  dayIndex,
  modelOverloaded,
  modelQuotaExceeded,
  nextDailyReset,
  poolStanding,
  rateLimited,
  rawTokens,
  reservationOf,
  RPM_WINDOW_MS,
  rpmRetryAfter,
  rpmStanding,
  secondsUntil,
  sessionExhausted,
  sessionMs,
  unavailable,
  WEEK_MS,
  weeklyExhausted,
  weightedCost
} from "./Policy.js"
import { type AccountWindows, type DailyUsageRow, makeQuotaRepo, type QuotaRepo } from "./QuotaRepo.js"

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
// State

interface AccountState {
  sessionStart: number | null
  sessionUsed: number
  weeklyAnchor: number | null
  weeklyUsed: number
  /** Epoch ms; 0 = none. */
  cooldownUntil: number
  /** Admission times within the abuse window, ascending. */
  abuse: Array<number>
  /** Admission times within the last 60 s per model, ascending. */
  rpm: Map<string, Array<number>>
}

const emptyState = (): AccountState => ({
  sessionStart: null,
  sessionUsed: 0,
  weeklyAnchor: null,
  weeklyUsed: 0,
  cooldownUntil: 0,
  abuse: [],
  rpm: new Map()
})

const finiteOr = (x: unknown, fallback: number): number =>
  typeof x === "number" && Number.isFinite(x) ? x : fallback
const finiteOrNull = (x: unknown): number | null => (typeof x === "number" && Number.isFinite(x) ? x : null)
const sortedTimes = (xs: ReadonlyArray<number>): Array<number> =>
  xs.filter((x) => Number.isFinite(x)).sort((a, b) => a - b)

/** Copies (and validates, when reloading after a defect) a state. */
const copyState = (s: AccountState): AccountState => {
  const rpm = new Map<string, Array<number>>()
  s.rpm.forEach((times, model) => {
    const t = sortedTimes(times)
    if (t.length > 0) rpm.set(model, t)
  })
  return {
    sessionStart: finiteOrNull(s.sessionStart),
    sessionUsed: Math.max(0, finiteOr(s.sessionUsed, 0)),
    weeklyAnchor: finiteOrNull(s.weeklyAnchor),
    weeklyUsed: Math.max(0, finiteOr(s.weeklyUsed, 0)),
    cooldownUntil: finiteOr(s.cooldownUntil, 0),
    abuse: sortedTimes(s.abuse),
    rpm
  }
}

const fromRow = (row: AccountWindows | undefined): AccountState =>
  row === undefined ? emptyState() : copyState({
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

/** Drops entries at or before `cutoff` from the front of an ascending array. */
const pruneUpTo = (times: Array<number>, cutoff: number): void => {
  let i = 0
  while (i < times.length && times[i]! <= cutoff) i++
  if (i > 0) times.splice(0, i)
}

const rollWindows = (s: AccountState, plan: PlanConfig, now: number): void => {
  if (s.sessionStart !== null && now >= s.sessionStart + sessionMs(plan)) {
    s.sessionStart = null
    s.sessionUsed = 0
  }
  if (s.weeklyAnchor !== null && now >= s.weeklyAnchor + WEEK_MS) {
    s.weeklyAnchor = null
    s.weeklyUsed = 0
  }
}

const standingOf = (s: AccountState, plan: PlanConfig, now: number): Standing => ({
  session: poolStanding(
    s.sessionUsed,
    plan.session_limit,
    s.sessionStart === null ? null : s.sessionStart + sessionMs(plan),
    now
  ),
  weekly: poolStanding(
    s.weeklyUsed,
    plan.weekly_limit,
    s.weeklyAnchor === null ? null : s.weeklyAnchor + WEEK_MS,
    now,
    s.weeklyAnchor
  )
})

/** Nothing in the state can affect a future decision: safe to forget (pure in-process mode). */
const isIdle = (s: AccountState, now: number): boolean =>
  (s.weeklyAnchor === null || now >= s.weeklyAnchor + WEEK_MS) &&
  (s.sessionStart === null || now >= s.sessionStart + WEEK_MS) &&
  now >= s.cooldownUntil &&
  (s.abuse.length === 0 || now - s.abuse[s.abuse.length - 1]! > 86_400_000) &&
  [...s.rpm.values()].every((t) => t.length === 0 || now - t[t.length - 1]! > RPM_WINDOW_MS)

interface Gate {
  readonly modelId: string
  inFlight: number
  day: number
  tokens: number
  dirty: boolean
}

interface SettleResult {
  readonly standing: Standing
  readonly weighted: number
}

interface MemTicket {
  readonly actor: Actor
  readonly input: AdmitInput
  readonly reserveWeighted: number
  readonly reserveRaw: number
  /** The windows the reservation went into; a settle after they rolled over leaves the new windows alone. */
  readonly sessionStart: number | null
  readonly weeklyAnchor: number | null
  readonly day: number
  /** The gate whose slot this ticket holds, until released. */
  slot: Gate | undefined
  /** First settle/refund wins; later calls get the same result. */
  outcome: Outcome | undefined
  ticket: Ticket
}

interface Outcome {
  exit: Exit.Exit<SettleResult> | undefined
  readonly waiters: Array<Reply>
}

/** Receives the answer (an Exit) of a command: an `Effect.callback` resume, or a settle outcome. */
type Reply = (exit: any) => void
type Result = Exit.Exit<unknown, GatewayError>

type Command =
  | { readonly _tag: "Admit"; readonly input: AdmitInput; readonly reply: Reply }
  | {
    readonly _tag: "Settle"
    readonly ticket: MemTicket
    /** null = refund. */
    readonly usage: SettleUsage | null
    readonly reply: Reply
  }
  | { readonly _tag: "Standing"; readonly plan: PlanConfig; readonly reply: Reply }
  | { readonly _tag: "Rpm"; readonly reply: Reply }
  | { readonly _tag: "Crash"; readonly reply: Reply }

class Actor {
  state: AccountState = emptyState()
  loaded = false
  closed = false
  dirty = false
  /** Commands in the mailbox. */
  queued = 0
  /** The command being served from the mailbox, answered by the supervisor if serving it dies. */
  current: Command | undefined = undefined
  constructor(readonly accountId: string, readonly mailbox: Queue.Queue<Command>) {}
}

const noReply: Reply = () => {}

// ---------------------------------------------------------------------------------------------------------------

/** Builds the service and its probe; needs a Scope (actors, flusher and the final flush live in it). */
export const make = (options: MemoryOptions) =>
  Effect.gen(function*() {
    const clock: Clock.Clock = yield* Clock.Clock
    const repo: QuotaRepo | undefined = options.sql === undefined ? undefined : makeQuotaRepo(options.sql)
    const abuseWindowMs = options.abuse.window_seconds * 1000
    const cooldownMs = options.abuse.cooldown_seconds * 1000
    const flushInterval = Duration.fromInputUnsafe(options.flushInterval ?? "1 second")
    const idleTimeToLive = options.idleTimeToLive ?? "10 minutes"
    const mailboxOnly = options.mailboxOnly === true
    let restarts = 0

    // --- model gates -------------------------------------------------------------------------------------------
    const gates = new Map<string, Gate>()
    /** Dirty daily totals of days that have rolled over, waiting for the next flush. */
    const retiredDaily = new Map<string, DailyUsageRow>()

    const gateFor = (modelId: string, now: number): Gate => {
      const today = dayIndex(now)
      let gate = gates.get(modelId)
      if (gate === undefined) {
        gate = { modelId, inFlight: 0, day: today, tokens: 0, dirty: false }
        gates.set(modelId, gate)
      } else if (gate.day !== today) {
        if (gate.dirty && repo) {
          retiredDaily.set(`${modelId}\u0000${gate.day}`, { modelId, day: gate.day, tokens: gate.tokens })
        }
        gate.day = today
        gate.tokens = 0
        gate.dirty = false
      }
      return gate
    }

    // --- write-behind ------------------------------------------------------------------------------------------
    /**
     * Snapshots of passivated (or restarted) actors. With `sql` these wait here until written; without it this
     * map is the store, swept of accounts whose windows have all ended.
     */
    const pending = new Map<string, AccountState>()
    let pendingInserts = 0
    const dirtyActors = new Set<Actor>()
    const wake = yield* Queue.sliding<void>(1)

    const markDirty = (actor: Actor): void => {
      if (repo === undefined || actor.dirty) return
      actor.dirty = true
      dirtyActors.add(actor)
      Queue.offerUnsafe(wake, undefined)
    }
    const markGateDirty = (gate: Gate): void => {
      if (repo === undefined || gate.dirty) return
      gate.dirty = true
      Queue.offerUnsafe(wake, undefined)
    }

    const putPending = (accountId: string, state: AccountState): void => {
      pending.set(accountId, copyState(state))
      if (repo) {
        Queue.offerUnsafe(wake, undefined)
      } else if (++pendingInserts >= 1024 && pendingInserts >= pending.size) {
        pendingInserts = 0
        const now = clock.currentTimeMillisUnsafe()
        pending.forEach((s, id) => {
          if (isIdle(s, now)) pending.delete(id)
        })
      }
    }

    const flushLock = yield* Semaphore.make(1)
    // Uninterruptible: it clears dirty marks before writing, so it must not stop half way (shutdown waits for it).
    const flush: Effect.Effect<void> = repo === undefined ? Effect.void : flushLock.withPermits(1)(Effect.suspend(() => {
      const live = [...dirtyActors]
      dirtyActors.clear()
      for (const a of live) a.dirty = false
      const taken = [...pending.entries()]
      const rows = new Map<string, AccountWindows>()
      for (const [id, s] of taken) rows.set(id, toRow(id, s))
      for (const a of live) if (a.loaded) rows.set(a.accountId, toRow(a.accountId, a.state))
      const dirtyGates = [...gates.values()].filter((g) => g.dirty)
      for (const g of dirtyGates) g.dirty = false
      const retired = [...retiredDaily.entries()]
      const daily: Array<DailyUsageRow> = [
        ...retired.map(([, row]) => row),
        ...dirtyGates.map((g) => ({ modelId: g.modelId, day: g.day, tokens: g.tokens }))
      ]
      if (rows.size === 0 && daily.length === 0) return Effect.void
      return repo.saveAccounts([...rows.values()]).pipe(
        Effect.andThen(repo.saveDaily(daily)),
        Effect.matchCauseEffect({
          onSuccess: () =>
            Effect.sync(() => {
              for (const [id, s] of taken) if (pending.get(id) === s) pending.delete(id)
              for (const [key, row] of retired) if (retiredDaily.get(key) === row) retiredDaily.delete(key)
            }),
          onFailure: (cause) =>
            Effect.andThen(
              Effect.sync(() => {
                for (const a of live) if (!a.closed) markDirty(a)
                for (const g of dirtyGates) markGateDirty(g)
              }),
              Effect.logWarning("quota write-behind failed; will retry", cause)
            )
        })
      )
    }).pipe(Effect.uninterruptible))

    // Registered before the actors' RcMap, so it runs after every actor has been passivated into `pending`.
    yield* Effect.addFinalizer(() => flush)

    if (repo) {
      const today = dayIndex(clock.currentTimeMillisUnsafe())
      const rows = yield* repo.loadDaily(today).pipe(Effect.orDie)
      for (const row of rows) gates.set(row.modelId, { modelId: row.modelId, inFlight: 0, day: today, tokens: row.tokens, dirty: false })
    }

    // --- command handlers (synchronous: check everything, then commit) ----------------------------------------

    const onAdmit = (actor: Actor, input: AdmitInput, now: number): Exit.Exit<MemTicket, GatewayError> => {
      const s = actor.state
      const model = input.model
      const plan = input.plan
      // 1. abuse cooldown
      if (now < s.cooldownUntil) return Exit.fail(abuseCooldown(s.cooldownUntil))
      pruneUpTo(s.abuse, now - abuseWindowMs)
      if (s.abuse.length >= options.abuse.burst) {
        s.cooldownUntil = now + cooldownMs
        s.abuse.length = 0
        markDirty(actor)
        return Exit.fail(abuseCooldown(s.cooldownUntil))
      }
      // 2. RPM
      let times = s.rpm.get(model.id)
      if (times !== undefined) pruneUpTo(times, now - RPM_WINDOW_MS)
      if (times !== undefined && times.length >= model.rate_limit_rpm) {
        return Exit.fail(rateLimited(rpmRetryAfter(times, model.rate_limit_rpm, now)))
      }
      let gate: Gate | undefined
      let reserve = { weighted: 0, raw: 0 }
      if (!input.byok) {
        rollWindows(s, plan, now)
        // 3. session, 4. weekly
        if (s.sessionStart !== null && s.sessionUsed >= plan.session_limit) {
          return Exit.fail(sessionExhausted(s.sessionStart + sessionMs(plan)))
        }
        if (s.weeklyAnchor !== null && s.weeklyUsed >= plan.weekly_limit) {
          return Exit.fail(weeklyExhausted(s.weeklyAnchor + WEEK_MS))
        }
        // 5. model daily cap, 6. in-flight
        gate = gateFor(model.id, now)
        if (model.daily_cap !== null && gate.tokens >= model.daily_cap) {
          return Exit.fail(modelQuotaExceeded(nextDailyReset(now)))
        }
        if (gate.inFlight >= model.concurrency) return Exit.fail(modelOverloaded())
        reserve = reservationOf(model, input.estimatedInputTokens)
      }
      // commit
      if (times === undefined) {
        times = []
        s.rpm.set(model.id, times)
      }
      times.push(now)
      s.abuse.push(now)
      if (gate !== undefined) {
        if (s.sessionStart === null) {
          s.sessionStart = now
          s.sessionUsed = 0
        }
        if (s.weeklyAnchor === null) {
          s.weeklyAnchor = now
          s.weeklyUsed = 0
        }
        s.sessionUsed += reserve.weighted
        s.weeklyUsed += reserve.weighted
        gate.tokens += reserve.raw
        gate.inFlight++
        markGateDirty(gate)
        markDirty(actor)
      }
      const t: MemTicket = {
        actor,
        input,
        reserveWeighted: reserve.weighted,
        reserveRaw: reserve.raw,
        sessionStart: s.sessionStart,
        weeklyAnchor: s.weeklyAnchor,
        day: dayIndex(now),
        slot: gate,
        outcome: undefined,
        ticket: undefined as unknown as Ticket
      }
      t.ticket = {
        reserved: standingOf(s, plan, now),
        rpm: rpmStanding(model.rate_limit_rpm, times.length, times[0], now),
        settle: (usage) => resolve(t, usage),
        refund: Effect.asVoid(resolve(t, null))
      }
      return Exit.succeed(t)
    }

    const onSettle = (actor: Actor, t: MemTicket, usage: SettleUsage | null, now: number): SettleResult => {
      const s = actor.state
      if (t.input.byok) return { standing: standingOf(s, t.input.plan, now), weighted: 0 }
      const model: ModelConfig = t.input.model
      const weighted = usage === null ? 0 : weightedCost(model, usage)
      const raw = usage === null ? 0 : rawTokens(usage)
      const dw = weighted - t.reserveWeighted
      if (t.sessionStart !== null && s.sessionStart === t.sessionStart) s.sessionUsed = Math.max(0, s.sessionUsed + dw)
      if (t.weeklyAnchor !== null && s.weeklyAnchor === t.weeklyAnchor) s.weeklyUsed = Math.max(0, s.weeklyUsed + dw)
      const gate = gates.get(model.id)
      if (gate !== undefined && gate.day === t.day) {
        gate.tokens = Math.max(0, gate.tokens + raw - t.reserveRaw)
        markGateDirty(gate)
      }
      markDirty(actor)
      return { standing: standingOf(s, t.input.plan, now), weighted }
    }

    const onRpm = (s: AccountState, now: number): number => {
      let n = 0
      s.rpm.forEach((times, model) => {
        pruneUpTo(times, now - RPM_WINDOW_MS)
        if (times.length === 0) s.rpm.delete(model)
        n += times.length
      })
      return n
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
          return Exit.succeed(onRpm(actor.state, now))
        case "Crash":
          throw new Error(`injected defect in quota actor ${actor.accountId}`)
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
        ? Exit.succeed({ standing: standingOf(emptyState(), cmd.ticket.input.plan, now), weighted: 0 })
        : Exit.fail(unavailable(why))

    /** After a defect: count it, hand the (consistent) state to the store, and reload it on the next command. */
    const recover = (actor: Actor, defect: unknown): Effect.Effect<void> => {
      restarts++
      if (actor.loaded) {
        putPending(actor.accountId, actor.state)
        actor.loaded = false
      }
      return Effect.logError(`quota actor ${actor.accountId} failed; restarting`, defect)
    }

    // --- actor lifecycle ---------------------------------------------------------------------------------------

    const load = (actor: Actor): Effect.Effect<boolean> => {
      const snapshot = pending.get(actor.accountId)
      if (snapshot !== undefined || repo === undefined) {
        actor.state = snapshot === undefined ? emptyState() : copyState(snapshot)
        actor.loaded = true
        return Effect.succeed(true)
      }
      return repo.loadAccount(actor.accountId).pipe(
        Effect.map((row) => {
          // a passivated snapshot may have appeared while the query ran: it is newer
          const newer = pending.get(actor.accountId)
          actor.state = newer !== undefined ? copyState(newer) : fromRow(row)
          actor.loaded = true
          return true
        }),
        Effect.catchCause((cause) =>
          Effect.as(Effect.logWarning(`quota state of ${actor.accountId} could not be loaded`, cause), false)
        )
      )
    }

    const serve = (actor: Actor) =>
      Effect.gen(function*() {
        while (true) {
          const cmd = yield* Queue.take(actor.mailbox)
          actor.queued--
          actor.current = cmd
          const exit = !actor.loaded && !(yield* load(actor))
            ? refuse(actor, cmd, "quota state unavailable", clock.currentTimeMillisUnsafe())
            : handle(actor, cmd, clock.currentTimeMillisUnsafe())
          actor.current = undefined
          cmd.reply(exit)
        }
      })

    /** Supervisor: a defect answers the command being served, reloads the state, and serves on. */
    const supervise = (actor: Actor): Effect.Effect<never> =>
      serve(actor).pipe(
        Effect.catchDefect((defect) =>
          Effect.suspend(() => {
            const failed = actor.current
            actor.current = undefined
            // recover first: a v4 `resume` runs the waiting caller at once, and it must see the restart done
            const logged = recover(actor, defect)
            failed?.reply(Exit.die(defect))
            return logged
          })
        ),
        Effect.forever
      )

    /** Entry-scope finalizer, after the actor fiber was interrupted: answer leftovers, hand the state over. */
    const passivate = (actor: Actor) =>
      Effect.suspend(() => {
        // from here on `send` serves this actor's commands inline; nothing new reaches the mailbox
        actor.closed = true
        dirtyActors.delete(actor)
        actor.dirty = false
        // v4 Queue.takeAll waits for an item; Queue.clear drains what is there without waiting
        return Queue.clear(actor.mailbox)
      }).pipe(Effect.flatMap((leftovers) =>
        Effect.sync(() => {
          const now = clock.currentTimeMillisUnsafe()
          const interrupted = actor.current
          actor.current = undefined
          actor.queued = 0
          const answers: Array<readonly [Command, Result]> = []
          if (interrupted !== undefined) answers.push([interrupted, refuse(actor, interrupted, "quota actor stopped", now)])
          for (const cmd of leftovers) answers.push([cmd, refuse(actor, cmd, "quota actor stopped", now)])
          // hand the state over before answering: a v4 `resume` runs the waiting caller at once, and its next
          // command (on a new actor) must load this state
          if (actor.loaded) putPending(actor.accountId, actor.state)
          for (const [cmd, exit] of answers) cmd.reply(exit)
        })
      ))

    const actors = yield* RcMap.make({
      lookup: (accountId: string) =>
        Effect.gen(function*() {
          const actor = new Actor(accountId, yield* Queue.unbounded<Command>())
          yield* Effect.addFinalizer(() => passivate(actor))
          yield* Effect.forkScoped(supervise(actor))
          return actor
        }),
      idleTimeToLive
    })

    const canInline = (actor: Actor): boolean =>
      !mailboxOnly && actor.loaded && !actor.closed && actor.queued === 0 && actor.current === undefined

    /** Serves a command on the caller's fiber (the actor is idle). Returns the answer, and a defect if any. */
    const inline = (actor: Actor, cmd: Command): Effect.Effect<any, GatewayError> => {
      try {
        return handle(actor, cmd, clock.currentTimeMillisUnsafe())
      } catch (defect) {
        return Effect.andThen(recover(actor, defect), Exit.die(defect))
      }
    }

    const send = (actor: Actor, cmd: Command): void => {
      if (actor.closed) {
        cmd.reply(refuse(actor, cmd, "quota actor stopped", clock.currentTimeMillisUnsafe()))
      } else {
        actor.queued++
        Queue.offerUnsafe(actor.mailbox, cmd)
      }
    }

    const ask = <A>(actor: Actor, build: (reply: Reply) => Command): Effect.Effect<A, GatewayError> =>
      Effect.suspend(() =>
        canInline(actor)
          ? inline(actor, build(noReply))
          : Effect.callback<A, GatewayError>((resume) => send(actor, build(resume)))
      )

    const resolve = (t: MemTicket, usage: SettleUsage | null): Effect.Effect<SettleResult> =>
      Effect.suspend(() => {
        let o = t.outcome
        if (o === undefined) {
          const outcome: Outcome = o = t.outcome = { exit: undefined, waiters: [] }
          const finish = (exit: Exit.Exit<SettleResult>) => {
            outcome.exit = exit
            for (const w of outcome.waiters) w(exit)
            outcome.waiters.length = 0
          }
          const cmd: Command = { _tag: "Settle", ticket: t, usage, reply: finish }
          if (canInline(t.actor)) {
            // a Settle handler cannot fail, only die
            const answer = inline(t.actor, cmd) as Effect.Effect<SettleResult>
            if (Exit.isExit(answer)) finish(answer as Exit.Exit<SettleResult>)
            else return Effect.tapCause(answer, (cause) => Effect.sync(() => finish(Exit.failCause(cause))))
          } else {
            send(t.actor, cmd)
          }
        }
        const settled = o.exit
        if (settled !== undefined) return settled
        return Effect.callback<SettleResult>((resume) => {
          if (o.exit !== undefined) resume(o.exit)
          else o.waiters.push(resume)
        })
      })

    const releaseTicket = (t: MemTicket): Effect.Effect<void> =>
      Effect.suspend(() => {
        if (t.slot !== undefined) {
          t.slot.inFlight--
          t.slot = undefined
        }
        return t.outcome === undefined ? Effect.asVoid(resolve(t, null)) : Effect.void
      })

    const withActor = <A, E>(accountId: string, f: (actor: Actor) => Effect.Effect<A, E>): Effect.Effect<A, E> =>
      Effect.scoped(Effect.flatMap(RcMap.get(actors, accountId), f))

    // --- background write-behind (only with sql; sleeps only while something is dirty) ---------------------------
    if (repo) {
      yield* Queue.take(wake).pipe(
        Effect.andThen(Effect.sleep(flushInterval)),
        Effect.andThen(flush),
        Effect.forever,
        Effect.forkScoped
      )
    }

    // --- limit(): fixed windows started by the first hit ----------------------------------------------------------
    const limits = new Map<string, { start: number; end: number; count: number }>()
    let limitInserts = 0

    const admission = Admission.of({
      admit: (input) =>
        Effect.flatMap(RcMap.get(actors, input.accountId), (actor) =>
          Effect.acquireRelease(
            ask<MemTicket>(actor, (reply) => ({ _tag: "Admit", input, reply })),
            releaseTicket
          )).pipe(Effect.map((t) => t.ticket)),

      standing: (accountId, plan) =>
        withActor(accountId, (actor) => ask<Standing>(actor, (reply) => ({ _tag: "Standing", plan, reply }))),

      currentRpm: (accountId) => withActor(accountId, (actor) => ask<number>(actor, (reply) => ({ _tag: "Rpm", reply }))),

      dailyUsage: (modelId) =>
        Effect.sync(() => {
          const gate = gates.get(modelId)
          return gate === undefined || gate.day !== dayIndex(clock.currentTimeMillisUnsafe()) ? 0 : gate.tokens
        }),

      limit: (key, max, windowSeconds) =>
        Effect.sync(() => {
          const now = clock.currentTimeMillisUnsafe()
          let w = limits.get(key)
          if (w === undefined || now >= w.end) {
            w = { start: now, end: now + windowSeconds * 1000, count: 0 }
            limits.set(key, w)
            if (++limitInserts >= 1024 && limitInserts >= limits.size) {
              limitInserts = 0
              limits.forEach((x, k) => {
                if (now >= x.end) limits.delete(k)
              })
            }
          }
          const allowed = w.count < max
          if (allowed) w.count++
          return { allowed, remaining: Math.max(0, max - w.count), reset_seconds: secondsUntil(w.end, now) }
        })
    })

    const probe = AdmissionMemoryProbe.of({
      inFlight: (modelId) => gates.get(modelId)?.inFlight ?? 0,
      liveActors: Effect.map(RcMap.keys(actors), (keys) => Array.from(keys).length),
      restarts: () => restarts,
      crash: (accountId) =>
        withActor(accountId, (actor) =>
          Effect.suspend(() =>
            // always through the mailbox: this exercises the supervisor
            Effect.callback<void, GatewayError>((resume) => send(actor, { _tag: "Crash", reply: resume }))
          )),
      flush
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
