import { Effect } from "effect"
import * as Queue from "../../src/images/Queue.js"
import * as Slots from "../../src/images/Slots.js"
import { queueContract } from "./contract.js"

queueContract({
  name: "memory",
  make: (config) =>
    Effect.gen(function*() {
      const { queue, work } = yield* Queue.makeMemory({ config })
      return { slots: yield* Slots.makeMemory({ config }), queue, work }
    })
})
