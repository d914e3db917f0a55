/**
 * OpenTelemetry traces (ARCHITECTURE §3 `telemetry/`: off unless configured). Set `OTEL_EXPORTER_OTLP_ENDPOINT`
 * (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) and every request gets a server span with children for auth,
 * admission, the upstream call and the settlement, exported over OTLP/HTTP by `effect`'s OTLP tracer.
 *
 * Variables read, as the OpenTelemetry SDKs read them:
 * - `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as is) or `OTEL_EXPORTER_OTLP_ENDPOINT` (+ `/v1/traces`);
 * - `OTEL_EXPORTER_OTLP_PROTOCOL` / `..._TRACES_PROTOCOL`: `http/protobuf` (default) or `http/json`;
 * - `OTEL_EXPORTER_OTLP_HEADERS` / `..._TRACES_HEADERS`: `key=value,key2=value2` (values percent-decoded);
 * - `OTEL_SERVICE_NAME` (else `service.name` in `OTEL_RESOURCE_ATTRIBUTES`, else `wellspring`), `OTEL_RESOURCE_ATTRIBUTES`;
 * - `OTEL_BSP_SCHEDULE_DELAY` (ms between exports, default 5000);
 * - `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` turn it off.
 *
 * Without an endpoint nothing here runs: `TracingEnabled` stays false and `http/Server.ts` keeps per-request
 * tracing disabled (spans cost 20-30% of the request path), and the gateway's own span helpers are skipped.
 */
import { Context, Data, Duration, Effect, Layer } from "effect"
import { FetchHttpClient } from "effect/http"
import { type OtlpExporter, OtlpSerialization, OtlpTracer } from "effect/observability"

/** True when traces are exported; read once when the listeners and services are built. */
export const TracingEnabled = Context.Reference<boolean>("wellspring/telemetry/TracingEnabled", {
  defaultValue: () => false
})

export class TracingConfigError extends Data.TaggedError("TracingConfigError")<{ readonly message: string }> {}

export interface TracingSettings {
  readonly url: string
  readonly protocol: "http/protobuf" | "http/json"
  readonly headers: Readonly<Record<string, string>>
  /** OTEL_SERVICE_NAME, else `service.name` of OTEL_RESOURCE_ATTRIBUTES, else `wellspring`. */
  readonly serviceName: string
  readonly exportIntervalMs: number | undefined
}

const parsePairs = (name: string, text: string): Record<string, string> => {
  const headers: Record<string, string> = {}
  for (const entry of text.split(",")) {
    if (entry.trim() === "") continue
    const eq = entry.indexOf("=")
    if (eq <= 0) throw new TracingConfigError({ message: `${name} must be key=value pairs separated by commas` })
    try {
      headers[decodeURIComponent(entry.slice(0, eq).trim()).toLowerCase()] = decodeURIComponent(entry.slice(eq + 1).trim())
    } catch {
      throw new TracingConfigError({ message: `${name} has a malformed percent-encoding` })
    }
  }
  return headers
}

const checkedUrl = (name: string, value: string): URL => {
  try {
    const url = new URL(value)
    if (url.protocol === "http:" || url.protocol === "https:") return url
  } catch {
    // reported below
  }
  throw new TracingConfigError({ message: `${name} must be an http(s) URL, got ${JSON.stringify(value.slice(0, 200))}` })
}

/** The exporter settings from `env`; null when tracing is off. Throws TracingConfigError naming a bad variable. */
export const tracingSettings = (env: NodeJS.ProcessEnv): TracingSettings | null => {
  if (env.OTEL_SDK_DISABLED?.trim().toLowerCase() === "true") return null
  const exporters = (env.OTEL_TRACES_EXPORTER ?? "otlp").split(",").map((s) => s.trim().toLowerCase())
  if (!exporters.includes("otlp")) return null
  let url: string
  if (env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) {
    url = checkedUrl("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT).href
  } else if (env.OTEL_EXPORTER_OTLP_ENDPOINT) {
    const base = checkedUrl("OTEL_EXPORTER_OTLP_ENDPOINT", env.OTEL_EXPORTER_OTLP_ENDPOINT)
    base.pathname = base.pathname.replace(/\/?$/, "/v1/traces")
    url = base.href
  } else {
    return null
  }
  const protocolVar = env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL ? "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL" : "OTEL_EXPORTER_OTLP_PROTOCOL"
  const protocol = (env[protocolVar] ?? "http/protobuf").trim()
  if (protocol !== "http/protobuf" && protocol !== "http/json") {
    throw new TracingConfigError({
      message: `${protocolVar}=${protocol.slice(0, 40)} is not supported; use http/protobuf (default) or http/json`
    })
  }
  const headersVar = env.OTEL_EXPORTER_OTLP_TRACES_HEADERS ? "OTEL_EXPORTER_OTLP_TRACES_HEADERS" : "OTEL_EXPORTER_OTLP_HEADERS"
  const headers = parsePairs(headersVar, env[headersVar] ?? "")
  const attributes = parsePairs("OTEL_RESOURCE_ATTRIBUTES", env.OTEL_RESOURCE_ATTRIBUTES ?? "")
  const delay = env.OTEL_BSP_SCHEDULE_DELAY
  if (delay !== undefined && !/^\d+$/.test(delay.trim())) {
    throw new TracingConfigError({ message: `OTEL_BSP_SCHEDULE_DELAY must be a number of milliseconds, got ${delay.slice(0, 40)}` })
  }
  return {
    url,
    protocol,
    headers,
    serviceName: env.OTEL_SERVICE_NAME?.trim() || attributes["service.name"] || "wellspring",
    exportIntervalMs: delay === undefined ? undefined : Number(delay)
  }
}

/** The OTLP tracer and `TracingEnabled` when the environment configures an endpoint; nothing otherwise. */
export const layer = (env: NodeJS.ProcessEnv = process.env): Layer.Layer<OtlpExporter.Flusher, TracingConfigError> =>
  Layer.unwrap(Effect.try({
    try: () => tracingSettings(env),
    catch: (error) => error instanceof TracingConfigError ? error : new TracingConfigError({ message: String(error) })
  }).pipe(Effect.map((settings) => {
    if (settings === null) return Layer.empty as Layer.Layer<OtlpExporter.Flusher>
    const tracer = OtlpTracer.layer({
      url: settings.url,
      headers: settings.headers,
      resource: { serviceName: settings.serviceName },
      ...(settings.exportIntervalMs === undefined ? {} : { exportInterval: Duration.millis(settings.exportIntervalMs) })
    }).pipe(
      Layer.provide(settings.protocol === "http/json" ? OtlpSerialization.layerJson : OtlpSerialization.layerProtobuf),
      Layer.provide(FetchHttpClient.layer)
    )
    // The layer's context carries the tracer (a reference, so not in its type) and the flusher.
    return Layer.merge(tracer, Layer.succeed(TracingEnabled, true))
  })))
