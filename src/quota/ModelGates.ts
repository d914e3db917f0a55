/**
 * Model gates of the in-process admission: per model, the in-flight counter (a non-blocking semaphore: full means
 * 529 `model_overloaded`, never a wait) and the shared daily total (raw tokens, day boundary 09:00 KST = 00:00 UTC).
 *
 * Gates are touched only from the account actors' synchronous handlers and from ticket finalizers, so a check
 * and its commit (`Transitions.admit`) are atomic without locks. The gates also keep what the write-behind needs:
 * which totals changed, and the totals of days that rolled over before they were written.
 */
import { dayIndex } from "./Policy.js"
import type { DailyUsageRow } from "./QuotaRepo.js"
import { dailyUsage, type GateState, rollDay } from "./Transitions.js"

export interface Gate extends GateState {
  readonly modelId: string
  /** Changed since the last write-behind. */
  dirty: boolean
}

export interface ModelGates {
  /** The model's gate on the quota day of `now` (created, or rolled over, as needed). */
  readonly gateFor: (modelId: string, now: number) => Gate
  /** The model's gate as it is (no roll-over). */
  readonly get: (modelId: string) => Gate | undefined
  /** Gives a slot back. */
  readonly release: (gate: Gate) => void
  /** Marks the gate's total as changed (no-op when nothing persists). */
  readonly markDirty: (gate: Gate) => void
  readonly inFlight: (modelId: string) => number
  readonly dailyUsage: (modelId: string, now: number) => number
  /** Totals loaded at start (today's rows from PostgreSQL). */
  readonly seed: (rows: ReadonlyArray<DailyUsageRow>, today: number) => void
  /**
   * Takes the changed totals for a write (clearing their marks). `written` forgets the retired days that were
   * written; `failed` marks the taken gates changed again.
   */
  readonly takeDirty: () => {
    readonly rows: ReadonlyArray<DailyUsageRow>
    readonly written: () => void
    readonly failed: () => void
  }
}

/** `persist`: changes are tracked for a write-behind, and `onDirty` runs when a gate first changes. */
export const makeModelGates = (persist: boolean, onDirty: () => void): ModelGates => {
  const gates = new Map<string, Gate>()
  /** Changed totals of days that have rolled over, waiting for the next write. */
  const retired = new Map<string, DailyUsageRow>()

  const markDirty = (gate: Gate): void => {
    if (!persist || gate.dirty) return
    gate.dirty = true
    onDirty()
  }

  const gateFor = (modelId: string, now: number): Gate => {
    let gate = gates.get(modelId)
    if (gate === undefined) {
      gate = { modelId, inFlight: 0, day: dayIndex(now), tokens: 0, dirty: false }
      gates.set(modelId, gate)
      return gate
    }
    const wasDirty = gate.dirty
    const left = rollDay(gate, now)
    if (left !== undefined) {
      if (wasDirty && persist) retired.set(`${modelId}\u0000${left.day}`, { modelId, day: left.day, tokens: left.tokens })
      gate.dirty = false
    }
    return gate
  }

  return {
    gateFor,
    get: (modelId) => gates.get(modelId),
    release: (gate) => {
      gate.inFlight--
    },
    markDirty,
    inFlight: (modelId) => gates.get(modelId)?.inFlight ?? 0,
    dailyUsage: (modelId, now) => dailyUsage(gates.get(modelId), now),
    seed: (rows, today) => {
      for (const row of rows) {
        gates.set(row.modelId, { modelId: row.modelId, inFlight: 0, day: today, tokens: row.tokens, dirty: false })
      }
    },
    takeDirty: () => {
      const dirty = [...gates.values()].filter((g) => g.dirty)
      for (const g of dirty) g.dirty = false
      const taken = [...retired.entries()]
      const rows: Array<DailyUsageRow> = [
        ...taken.map(([, row]) => row),
        ...dirty.map((g) => ({ modelId: g.modelId, day: g.day, tokens: g.tokens }))
      ]
      return {
        rows,
        written: () => {
          for (const [key, row] of taken) if (retired.get(key) === row) retired.delete(key)
        },
        failed: () => {
          for (const g of dirty) markDirty(g)
        }
      }
    }
  }
}
