/**
 * `POST /v1/embeddings`: the same life as chat's (Pipeline.ts `runEmbeddings`): the exchange route, the body
 * (EmbeddingsRequest.ts), the model and the size, then a catalog model's admission and its deployments, or a BYOK
 * request's credential then its fallback pool model. Answered in the OpenAI list shape.
 */
import { embeddingsRoute } from "./Pipeline.js"

export const embeddings = embeddingsRoute("/v1/embeddings")
