import { Effect, type Fiber } from "effect"
import type { SseBody, SseOutput } from "../../src/inference/SseBody.js"

/** An in-memory client for an `SseBody`: what was written, whether it ended or was cut, and a switch for back-pressure. */
export const memoryOutput = () => {
  const state = { text: "", ended: false, cuts: 0, full: false }
  const output: SseOutput = {
    write: (text) => {
      state.text += text
      return !state.full
    },
    end: (text) => {
      state.text += text
      state.ended = true
    },
    cut: () => void state.cuts++
  }
  /** The text written since the last call. */
  const take = (): string => {
    const text = state.text
    state.text = ""
    return text
  }
  return { state, output, take }
}

/** Starts `body.run` into a memory output in a child fiber; interrupting the fiber is the client going away. */
export const attach = (body: SseBody) =>
  Effect.gen(function*() {
    const out = memoryOutput()
    const fiber: Fiber.Fiber<void> = yield* Effect.forkChild(body.run(out.output))
    yield* Effect.yieldNow
    return { ...out, fiber }
  })
