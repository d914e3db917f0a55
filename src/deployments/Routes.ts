/**
 * `GET /deployments` on the `operator` origin: every catalog model's deployments with their health and load on
 * this replica (what `npm run cli -- deployments:list` prints). Operator listeners are meant for a private address.
 */
import { Effect } from "effect"
import { HttpRouter, HttpServerResponse } from "effect/http"
import { LiveCatalog } from "../config/Live.js"
import { Deployments } from "./Router.js"

export const deploymentRoutes = HttpRouter.add(
  "GET",
  "/deployments",
  Effect.gen(function*() {
    const catalog = yield* LiveCatalog
    const deployments = yield* Deployments
    const list = yield* deployments.status(catalog.current().catalog.models)
    return HttpServerResponse.jsonUnsafe({ object: "list", data: list }, { headers: { "cache-control": "no-store" } })
  })
)
