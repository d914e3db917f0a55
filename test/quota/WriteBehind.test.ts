/**
 * The write-behind of both admission backends (on the one batched writer, runtime/Batcher.ts), on the TestClock
 * with a recording repository: a change is written one interval after the first signal (a burst is one batch), a
 * failure hands the marks back and is retried, and closing the scope writes what is left.
 */
import { describe, expect, it } from "@effect/vitest"
import { Effect, Exit, Scope } from "effect"
import { SqlError } from "effect/sql"
import { TestClock } from "effect/testing"
import type { AccountWindows, DailyUsageRow, QuotaRepo } from "../../src/quota/QuotaRepo.js"
import * as WriteBehind from "../../src/quota/WriteBehind.js"

const row = (accountId: string, used: number): AccountWindows => ({
  accountId,
  sessionStart: 0,
  sessionUsed: used,
  weeklyAnchor: 0,
  weeklyUsed: used,
  cooldownUntil: null
})

/** A repository that records writes and fails while `failing` is set. */
const recordingRepo = () => {
  const writes: Array<{ accounts: ReadonlyArray<AccountWindows>; daily: ReadonlyArray<DailyUsageRow> }> = []
  const state = { failing: false }
  const sqlError = () => new SqlError.SqlError({ reason: new SqlError.UnknownError({ cause: new Error("down") }) })
  const repo: QuotaRepo = {
    loadAccount: () => Effect.succeed(undefined),
    loadDaily: () => Effect.succeed([]),
    loadDailyModel: () => Effect.succeed(undefined),
    saveAccounts: (accounts) =>
      state.failing ? Effect.fail(sqlError()) : Effect.sync(() => void writes.push({ accounts, daily: [] })),
    saveDaily: (daily) =>
      state.failing ? Effect.fail(sqlError()) : Effect.sync(() => void (writes[writes.length - 1]!.daily = daily))
  }
  return { repo, writes, state }
}

/** A toy backend: changed accounts in a map, taken by each flush. */
const backend = () => {
  const dirty = new Map<string, number>()
  const log: Array<string> = []
  const take = () => {
    if (dirty.size === 0) return undefined
    const taken = [...dirty]
    dirty.clear()
    return {
      rows: Effect.succeed({ accounts: taken.map(([id, used]) => row(id, used)), daily: [] }),
      written: () => void log.push("written"),
      failed: () => {
        log.push("failed")
        for (const [id, used] of taken) if (!dirty.has(id)) dirty.set(id, used)
      }
    }
  }
  return { dirty, log, take }
}

describe("write-behind loop", () => {
  it.effect("writes one batch an interval after the first change; retries after a failure; flushes on close", () =>
    Effect.gen(function*() {
      const { repo, writes, state } = recordingRepo()
      const b = backend()
      const scope = yield* Scope.make()
      const wb = yield* WriteBehind.make({ repo, interval: "1 second", label: "test", take: b.take }).pipe(
        Scope.provide(scope)
      )
      const change = (id: string, used: number) => {
        b.dirty.set(id, used)
        wb.signal()
      }

      change("a", 1)
      yield* TestClock.adjust(500)
      change("b", 2)
      change("a", 3)
      expect(writes).toHaveLength(0)
      yield* TestClock.adjust(500)
      expect(writes.map((w) => w.accounts.map((r) => [r.accountId, r.sessionUsed]))).toEqual([[["a", 3], ["b", 2]]])
      expect(b.log).toEqual(["written"])

      // nothing changed: the loop sleeps, nothing is written
      yield* TestClock.adjust("1 minute")
      expect(writes).toHaveLength(1)

      // a failing database: the marks come back, the next change retries both
      state.failing = true
      change("c", 4)
      yield* TestClock.adjust("1 second")
      expect(b.log).toEqual(["written", "failed"])
      expect(b.dirty.get("c")).toBe(4)
      state.failing = false
      change("d", 5)
      yield* TestClock.adjust("1 second")
      expect(writes[1]!.accounts.map((r) => r.accountId).sort()).toEqual(["c", "d"])

      // closing the scope writes what is pending without waiting for the interval
      change("e", 6)
      yield* Scope.close(scope, Exit.void)
      expect(writes[2]!.accounts.map((r) => r.accountId)).toEqual(["e"])
    }))

  it.effect("flush writes at once and is a no-op when nothing changed", () =>
    Effect.scoped(Effect.gen(function*() {
      const { repo, writes } = recordingRepo()
      const b = backend()
      const wb = yield* WriteBehind.make({ repo, interval: "1 hour", label: "test", take: b.take })
      yield* wb.flush
      expect(writes).toHaveLength(0)
      b.dirty.set("a", 1)
      yield* wb.flush
      expect(writes).toHaveLength(1)
    })))
})
