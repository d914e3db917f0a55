/**
 * The in-process model gates: slots, the day roll at 09:00 KST, and what they hand to the write-behind (changed
 * totals, and the totals of days that rolled over before they were written).
 */
import { describe, expect, it } from "vitest"
import { makeModelGates } from "../../src/quota/ModelGates.js"
import { dayIndex } from "../../src/quota/Policy.js"

const before = Date.UTC(2026, 0, 5, 23, 59, 59, 999) // 08:59:59.999 KST
const after = before + 1 // 09:00 KST
const day1 = dayIndex(before)
const day2 = dayIndex(after)

describe("model gates", () => {
  it("slots are counted per model and given back", () => {
    const gates = makeModelGates(false, () => {})
    const a = gates.gateFor("a", before)
    a.inFlight++
    a.inFlight++
    gates.gateFor("b", before).inFlight++
    expect([gates.inFlight("a"), gates.inFlight("b"), gates.inFlight("none")]).toEqual([2, 1, 0])
    gates.release(a)
    expect(gates.inFlight("a")).toBe(1)
    // the day roll keeps the slots
    expect(gates.gateFor("a", after).inFlight).toBe(1)
  })

  it("the daily total resets at 09:00 KST; a changed total of the old day is still written", () => {
    let signals = 0
    const gates = makeModelGates(true, () => signals++)
    const g = gates.gateFor("m", before)
    g.tokens += 500
    gates.markDirty(g)
    gates.markDirty(g) // once per write
    expect(signals).toBe(1)
    expect(gates.dailyUsage("m", before)).toBe(500)
    expect(gates.dailyUsage("m", after)).toBe(0)

    const rolled = gates.gateFor("m", after)
    expect([rolled.day, rolled.tokens, rolled.dirty]).toEqual([day2, 0, false])
    rolled.tokens += 7
    gates.markDirty(rolled)
    const taken = gates.takeDirty()
    expect(taken.rows).toEqual([{ modelId: "m", day: day1, tokens: 500 }, { modelId: "m", day: day2, tokens: 7 }])
    // nothing changed since: an empty take, except the retired day until it is written
    expect(gates.takeDirty().rows).toEqual([{ modelId: "m", day: day1, tokens: 500 }])
    taken.written()
    expect(gates.takeDirty().rows).toEqual([])
  })

  it("a failed write marks the taken totals changed again", () => {
    let signals = 0
    const gates = makeModelGates(true, () => signals++)
    const g = gates.gateFor("m", before)
    g.tokens = 3
    gates.markDirty(g)
    const taken = gates.takeDirty()
    expect(g.dirty).toBe(false)
    taken.failed()
    expect(g.dirty).toBe(true)
    expect(signals).toBe(2)
    expect(gates.takeDirty().rows).toEqual([{ modelId: "m", day: day1, tokens: 3 }])
  })

  it("without persistence nothing is tracked", () => {
    let signals = 0
    const gates = makeModelGates(false, () => signals++)
    const g = gates.gateFor("m", before)
    g.tokens = 3
    gates.markDirty(g)
    gates.gateFor("m", after)
    expect(signals).toBe(0)
    expect(gates.takeDirty().rows).toEqual([])
  })

  it("seeded totals count for today", () => {
    const gates = makeModelGates(true, () => {})
    gates.seed([{ modelId: "m", day: day2, tokens: 42 }], day2)
    expect(gates.dailyUsage("m", after)).toBe(42)
    expect(gates.gateFor("m", after).tokens).toBe(42)
  })
})
