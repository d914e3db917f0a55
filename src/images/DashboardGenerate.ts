/**
 * `POST /api/user/me/images/generate` on the account origin: the dashboard's generate form. The same generation
 * as `POST /v1/images/nai/generate-image` (Generate.ts `runGeneration`: gates, body, content policy, active preset,
 * pending slot, queue, gallery), with the account API's authentication (the `ws-session` cookie with its
 * cross-site check, or a Bearer key) and its wrapped answer: `{success: true, data: {id, download_url, width,
 * height, seed}}`, the image being in the gallery under `id`. Errors are `{success: false, error: {message, type,
 * code}}` with the image endpoint's Korean messages; the request row is written as for the `/v1` endpoint.
 */
import { Effect } from "effect"
import { HttpRouter } from "effect/http"
import { authenticateAccount } from "../accounts/SessionAuth.js"
import { renderAccount } from "../errors/Render.js"
import { json } from "../http/Respond.js"
import { exchangeRoute } from "../inference/Exchange.js"
import { IMAGE_MODEL_ID, runGeneration } from "./Generate.js"

export const DASHBOARD_GENERATE_PATH = "/api/user/me/images/generate"

export const dashboardGenerate = HttpRouter.add(
  "POST",
  DASHBOARD_GENERATE_PATH,
  exchangeRoute(
    { render: renderAccount, modelId: IMAGE_MODEL_ID, operation: "image_generation", authenticate: authenticateAccount },
    (exchange, request) =>
      Effect.gen(function*() {
        const generated = yield* runGeneration(exchange, exchange, request)
        yield* exchange.succeed()
        return json({
          success: true,
          data: {
            id: generated.id,
            download_url: `/api/user/me/images/${generated.id}`,
            width: generated.width,
            height: generated.height,
            seed: generated.seed
          }
        })
      })
  )
)
