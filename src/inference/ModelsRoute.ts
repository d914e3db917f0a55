import { Effect } from "effect"
import { HttpRouter, HttpServerRequest } from "effect/http"
import { Auth } from "../auth/Auth.js"
import type { ModelConfig } from "../config/GatewayConfig.js"
import { type CatalogView, LiveCatalog } from "../config/Live.js"
import { fail } from "../errors/Catalog.js"
import { renderInference } from "../errors/Render.js"
import { handle, json } from "../http/Respond.js"

/** The spec's Model entry, exactly these fields. */
export const modelEntry = (m: ModelConfig) => ({
  id: m.id,
  object: "model" as const,
  created: m.created,
  owned_by: m.owned_by,
  supports_tools: m.supports_tools,
  supports_reasoning: m.supports_reasoning,
  supports_images: m.supports_images,
  supports_embeddings: m.supports_embeddings,
  max_output_tokens: m.max_output_tokens,
  max_input_tokens: m.max_input_tokens,
  rate_limit_rpm: m.rate_limit_rpm
})

/** The list body, built once per catalog version. */
let cached: { readonly version: number; readonly body: unknown } | null = null
const listFor = (view: CatalogView) => {
  if (cached?.version !== view.version) {
    cached = { version: view.version, body: { object: "list", data: view.listed.map(modelEntry) } }
  }
  return cached.body
}

export const listModels = HttpRouter.add(
  "GET",
  "/v1/models",
  Effect.gen(function*() {
    const request = yield* HttpServerRequest.HttpServerRequest
    const auth = yield* Auth
    const catalog = yield* LiveCatalog
    return yield* handle(
      renderInference,
      auth.bearer(request).pipe(
        Effect.map(() => json(listFor(catalog.current())))
      )
    )
  })
)

/**
 * `GET /v1/models/{id}` (the SDKs' `models.retrieve`): a listed model's entry; 404 `model_not_found` for an
 * unknown or disabled id, and for an alias (aliases are never listed).
 */
export const retrieveModel = HttpRouter.add(
  "GET",
  "/v1/models/:id",
  Effect.gen(function*() {
    const request = yield* HttpServerRequest.HttpServerRequest
    const auth = yield* Auth
    const catalog = yield* LiveCatalog
    const params = yield* HttpRouter.params
    return yield* handle(
      renderInference,
      auth.bearer(request).pipe(
        Effect.flatMap(() => {
          const model = params.id === undefined ? undefined : catalog.current().byId.get(params.id)
          return model === undefined || model.disabled
            ? Effect.fail(fail("model_not_listed"))
            : Effect.succeed(json(modelEntry(model)))
        })
      )
    )
  })
)
