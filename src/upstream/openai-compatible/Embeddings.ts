/** OpenAI-compatible embeddings: `POST <base>/embeddings`, one buffered JSON answer. */
import { Effect } from "effect"
import { clip, noRedaction, type Redactor } from "../../telemetry/LogText.js"
import type { HttpTransport } from "../http/Transport.js"
import { type UpstreamAdapter, UpstreamError } from "../Upstream.js"
import { encodeEmbeddingsRequest, requestHeaders } from "./Encode.js"
import { statusError } from "./Errors.js"

export const decodeEmbeddings = (
  text: string,
  count: number,
  redact: Redactor = noRedaction
): { vectors: Array<ReadonlyArray<number>>; prompt_tokens: number } | UpstreamError => {
  let body: any
  try {
    body = JSON.parse(text)
  } catch {
    return new UpstreamError({ kind: "protocol", detail: `embeddings answer is not JSON: ${clip(redact(text), 200)}` })
  }
  if (!Array.isArray(body?.data) || body.data.length !== count) {
    return new UpstreamError({ kind: "protocol", detail: `embeddings answer does not hold ${count} vectors` })
  }
  const vectors = new Array<ReadonlyArray<number>>(count)
  for (let i = 0; i < count; i++) {
    const item = body.data[i]
    const at = typeof item?.index === "number" ? item.index : i
    let vector = item?.embedding
    if (typeof vector === "string") {
      const bytes = Buffer.from(vector, "base64")
      vector = Array.from(new Float32Array(bytes.buffer, bytes.byteOffset, bytes.length >> 2))
    }
    if (!Array.isArray(vector) || at < 0 || at >= count) {
      return new UpstreamError({ kind: "protocol", detail: "embeddings answer holds an invalid vector" })
    }
    vectors[at] = vector
  }
  const usage = body.usage
  return { vectors, prompt_tokens: typeof usage?.prompt_tokens === "number" ? usage.prompt_tokens : 0 }
}

/** `UpstreamAdapter.embed` over `transport`: `POST <basePath>/embeddings`, `apiKey` as a bearer token. */
export const openAiEmbed = (
  transport: HttpTransport,
  basePath: string,
  apiKey: string | undefined
): UpstreamAdapter["embed"] => {
  const path = `${basePath}/embeddings`
  return openAiEmbedWith(transport, () => path, requestHeaders(apiKey, "application/json"))
}

/**
 * `embed` over any target: a per-model path (Azure deployments) and fixed headers (BYOK credentials). `redact`
 * removes secrets from upstream text before it is bounded; `mapError` then sees every failure.
 */
export const openAiEmbedWith = (
  transport: HttpTransport,
  pathOf: (model: string) => string,
  headers: Readonly<Record<string, string>>,
  mapError: (error: UpstreamError) => UpstreamError = (e) => e,
  redact: Redactor = noRedaction
): UpstreamAdapter["embed"] =>
  (model, input) =>
    Effect.flatMap(
      transport.request(
        { method: "POST", path: pathOf(model), headers, body: encodeEmbeddingsRequest(model, input) },
        "embeddings"
      ),
      ({ status, text }) => {
        if (status < 200 || status >= 300) return Effect.fail(mapError(statusError(status, text, redact)))
        const decoded = decodeEmbeddings(text, input.length, redact)
        return decoded instanceof UpstreamError ? Effect.fail(mapError(decoded)) : Effect.succeed(decoded)
      }
    )
