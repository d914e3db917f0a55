import { Redacted, Result, Schema } from "effect"
import { decodeChatRequest, decodeGatewayConfig, GatewayConfig, Listener } from "./schema.js"

const show = (label: string, r: Result.Result<unknown, unknown>) =>
  console.log(label, Result.isSuccess(r) ? JSON.stringify(r.success) : `FAIL ${JSON.stringify(r.failure)}`)

const catalog = {
  models: [{ id: "m1", route: { provider: "p", model: "x" } }],
  providers: { p: { kind: "simulated" } }
}
export const runSchemaChecks = () => {
  show("defaults:", decodeGatewayConfig({ plans: { default: { session_limit: 1 } }, catalog }))
  show("undefined→default:", decodeGatewayConfig({ plans: { default: { session_limit: 1 } }, catalog, default_plan: undefined }))
  const a = Schema.decodeUnknownSync(Listener)({ port: 1 }), b = Schema.decodeUnknownSync(Listener)({ port: 2 })
  console.log("fresh default per decode:", a.origins !== b.origins)
  show("errors all + filter paths + excess:", decodeGatewayConfig({
    plans: { x: { session_limit: 0 } }, default_plan: "nope", extra: 1,
    catalog: { models: [{ id: "m1", route: { provider: "zz", model: "x" } }, { id: "m1", route: { provider: "p", model: "y" } }], providers: { p: { kind: "simulated" } } }
  }))
  show("struct filter on valid fields:", decodeGatewayConfig({ plans: { x: { session_limit: 1 } }, default_plan: "nope", catalog }))
  show("pattern message:", decodeGatewayConfig({ plans: { default: { session_limit: 1 } }, catalog: { ...catalog, providers: { p: { kind: "openai-compatible", api_key_env: "HOME" } } } }))
  const red = decodeGatewayConfig({ plans: { default: { session_limit: 1 } }, catalog, database_url: "postgres://u:secret@h/db" })
  if (Result.isSuccess(red)) console.log("redacted:", String(red.success.database_url), Redacted.value(red.success.database_url!))
  console.log("encoded type of GatewayConfig.limits optional:", Object.keys(Schema.decodeSync(GatewayConfig.fields.limits)(undefined)).join(","))
  show("chat ok:", decodeChatRequest({ model: "m", messages: [{ role: "user", content: "hi" }], extra: "stripped" }))
  show("chat missing:", decodeChatRequest({ messages: [{ role: "user", content: "hi" }] }))
  show("chat bad role:", decodeChatRequest({ model: "m", messages: [{ role: "user", content: "hi" }, { role: "robot", content: "x" }] }))
  show("chat bad content deep:", decodeChatRequest({ model: "m", messages: [{ role: "assistant", content: 5 }] }))
  show("chat exact undefined:", decodeChatRequest({ model: "m", messages: [{ role: "user", content: "x" }], stream: undefined }))
  show("chat filter msg:", decodeChatRequest({ model: "m", messages: [{ role: "user", content: "x" }], image_url: "http://x" }))
  show("chat minItems:", decodeChatRequest({ model: "m", messages: [] }))
  show("chat temperature:", decodeChatRequest({ model: "m", messages: [{ role: "user", content: "x" }], temperature: 3 }))
}
if (process.argv[1]?.endsWith("schema-check.ts")) runSchemaChecks()
