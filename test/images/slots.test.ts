import { Effect } from "effect"
import * as Slots from "../../src/images/Slots.js"
import { slotsContract } from "./contract.js"

slotsContract({
  name: "memory",
  make: (config) =>
    Effect.map(Slots.makeMemory({ config }), (slots) => ({ slots, queue: undefined as never, work: undefined as never }))
})
