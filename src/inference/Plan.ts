/**
 * How a BYOK request is answered: a plan of steps tried in order, each admitted its own way and sent through its
 * own adapter, until one answers or a failure may not move on: the credential, then the pool model it falls back
 * to (ByokRoute.ts). A catalog model needs no plan: the pipeline admits it and calls it once (its deployments fail
 * over inside its adapter, deployments/Router.ts). Only a failure before the first byte reaches the plan: after
 * it, the answer is the client's already.
 */
import { Effect } from "effect"
import type { GatewayError } from "../errors/Catalog.js"

export interface Step<A, R> {
  /**
   * Admits the step (the fallback step records itself as the fallback first, Pipeline.ts); a failure here is the
   * answer (the plan does not move on).
   */
  readonly admit: Effect.Effect<void, GatewayError>
  /** The call. */
  readonly run: Effect.Effect<A, GatewayError, R>
  /** After `run` failed: whether the next step may answer instead (default: no). */
  readonly movesOn?: (error: GatewayError) => Effect.Effect<boolean>
}

/**
 * A step as planned: built when its turn comes, from the failure that led to it (null for the first); a
 * `GatewayError` instead of a step means it is skipped, with that failure handed on.
 */
export type PlannedStep<A, R> = (previous: GatewayError | null) => Effect.Effect<Step<A, R> | GatewayError, GatewayError>

/** Runs the plan; the answer is the first success, or the failure after which the plan could not move on. */
export const runPlan = <A, R>(steps: ReadonlyArray<PlannedStep<A, R>>): Effect.Effect<A, GatewayError, R> => {
  const from = (index: number, previous: GatewayError | null): Effect.Effect<A, GatewayError, R> => {
    const planned = steps[index]
    if (planned === undefined) {
      return previous === null ? Effect.die(new Error("empty plan")) : Effect.fail(previous)
    }
    return Effect.flatMap(planned(previous), (step) => {
      if (!("run" in step)) return from(index + 1, step)
      return Effect.andThen(
        step.admit,
        Effect.catch(step.run, (error) => {
          if (step.movesOn === undefined || index + 1 >= steps.length) return Effect.fail(error)
          return Effect.flatMap(step.movesOn(error), (moves) => (moves ? from(index + 1, error) : Effect.fail(error)))
        })
      )
    })
  }
  return from(0, null)
}
