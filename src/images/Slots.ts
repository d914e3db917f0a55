/**
 * Pending image slots in one process (embedded mode, spec image rule 2): each account's slots are an actor
 * (`runtime/Actors.ts`) that counts what is held. `acquire` asks it for a slot (429 `image_pending_full` at
 * `pending_per_account`, read live at each ask) and gives it back when the acquiring scope closes (answer, timeout,
 * client disconnect). The scope also holds the actor, so an account's actor is passivated only when it holds none.
 *
 * Redis mode (`SlotsRedis.ts`) serves the same interface with leases shared by the replicas.
 */
import { Clock, type Context, Effect, Exit, type Scope } from "effect"
import { GatewayError } from "../errors/Catalog.js"
import * as Actors from "../runtime/Actors.js"
import type { ImagesConfig } from "../config/Images.js"
import { ImageSlots } from "./Contracts.js"

type Command =
  | { readonly _tag: "Acquire"; readonly max: number; readonly reply: Actors.Reply }
  | { readonly _tag: "Release"; readonly reply: Actors.Reply }
  | { readonly _tag: "Held"; readonly reply: Actors.Reply }

interface SlotState {
  held: number
}

export const pendingFull = () => new GatewayError({ code: "image_pending_full" })

export interface SlotsOptions {
  /** The live `images` config, read at every acquire. */
  readonly config: () => ImagesConfig
}

/** Builds the service in the current scope (closing it passivates every account's actor). */
export const makeMemory = (options: SlotsOptions): Effect.Effect<Context.Service.Shape<typeof ImageSlots>, never, Scope.Scope> =>
  Effect.gen(function*() {
    const clock = yield* Clock.Clock
    const actors = yield* Actors.make<SlotState, Command>({
      name: "image slot",
      clock,
      idleTimeToLive: "1 minute",
      mailboxOnly: false,
      initial: () => ({ held: 0 }),
      load: (actor) =>
        Effect.sync(() => {
          actor.loaded = true
          return true
        }),
      handle: (actor, cmd) => {
        const state = actor.state
        switch (cmd._tag) {
          case "Acquire":
            if (state.held >= cmd.max) return Exit.fail(pendingFull())
            state.held++
            return Exit.void
          case "Release":
            state.held = Math.max(0, state.held - 1)
            return Exit.void
          case "Held":
            return Exit.succeed(state.held)
        }
      },
      refuse: (_actor, cmd, why) =>
        cmd._tag === "Held" ? Exit.succeed(0) : Exit.fail(new GatewayError({ code: "service_unavailable", detail: why })),
      // held slots keep their actor alive (the acquiring scope holds it), so a passivated actor holds none
      handOver: () => {}
    })

    const acquire = (accountId: string): Effect.Effect<void, GatewayError, Scope.Scope> =>
      Effect.flatMap(actors.get(accountId), (actor) =>
        Effect.acquireRelease(
          actors.ask<void>(actor, (reply) => ({ _tag: "Acquire", max: options.config().pending_per_account, reply })),
          () => Effect.ignore(actors.ask<void>(actor, (reply) => ({ _tag: "Release", reply })))
        ))

    return ImageSlots.of({
      acquire,
      held: (accountId) =>
        actors.with(accountId, (actor) => actors.ask<number>(actor, (reply) => ({ _tag: "Held", reply }))).pipe(
          Effect.orElseSucceed(() => 0)
        )
    })
  })
