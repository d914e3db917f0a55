/**
 * The `responses` section of the gateway config: how long and how much of the Responses API's stored responses
 * (`store`, the API's default) are kept. Defaults are listed in docs/api-responses.md.
 */
import { Effect, Schema } from "effect"

const PositiveInt = Schema.Int.check(Schema.isGreaterThan(0))
const withDefault = <S extends Schema.Top>(value: () => S["Type"]) => (schema: S) =>
  Schema.withDecodingDefaultType<S>(Effect.sync(value))(schema)

const MB = 1024 * 1024

export const ResponsesConfig = Schema.Struct({
  /** A stored response is kept this long after it was created (default 30 days), then deleted. */
  store_hours: PositiveInt.pipe(withDefault(() => 720)),
  /** A response larger than this (its turn's input and output, serialized) is answered but not stored. */
  max_response_bytes: PositiveInt.pipe(withDefault(() => 8 * MB)),
  /** Per account: past this many bytes or responses the oldest stored responses are deleted. */
  max_account_bytes: PositiveInt.pipe(withDefault(() => 256 * MB)),
  max_account_responses: PositiveInt.pipe(withDefault(() => 10_000)),
  /** A `previous_response_id` whose stored conversation is larger than this is refused (400). */
  max_chain_bytes: PositiveInt.pipe(withDefault(() => 32 * MB)),
  /** Stored responses are written in batches this often, after the answer (never on the request's path). */
  flush_ms: PositiveInt.pipe(withDefault(() => 100)),
  /** Expired responses are deleted this often. */
  sweep_minutes: PositiveInt.pipe(withDefault(() => 10))
})
export type ResponsesConfig = typeof ResponsesConfig.Type
