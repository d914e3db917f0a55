/**
 * The `images` section of the gateway config (issue 17). Everything here is live: the catalog reload re-reads
 * it, so switches, thresholds and the content policy change without a restart.
 */
import { Effect, Schema } from "effect"

const PositiveInt = Schema.Int.check(Schema.isGreaterThan(0))
const withDefault = <S extends Schema.Top>(value: () => S["Type"]) => (schema: S) =>
  Schema.withDecodingDefaultType<S>(Effect.sync(value))(schema)

export const Resolution = Schema.Struct({
  width: Schema.Int.check(Schema.isBetween({ minimum: 64, maximum: 4096 })),
  height: Schema.Int.check(Schema.isBetween({ minimum: 64, maximum: 4096 }))
})
export type Resolution = typeof Resolution.Type

/** A blocked category: a name (shown to the user) and its terms, matched on the normalized prompt. */
export const Category = Schema.Struct({
  name: Schema.String.check(Schema.isMinLength(1), Schema.isMaxLength(40)),
  terms: Schema.Array(Schema.String.check(Schema.isMinLength(1), Schema.isMaxLength(100))).check(Schema.isMaxLength(2000))
})
export type Category = typeof Category.Type

export const DEFAULT_RESOLUTIONS: ReadonlyArray<Resolution> = [
  { width: 640, height: 1536 },
  { width: 704, height: 1408 },
  { width: 768, height: 1344 },
  { width: 832, height: 1216 },
  { width: 896, height: 1152 },
  { width: 1024, height: 1024 },
  { width: 1152, height: 896 },
  { width: 1216, height: 832 },
  { width: 1344, height: 768 },
  { width: 1408, height: 704 },
  { width: 1536, height: 640 }
]

export const ImagesConfig = Schema.Struct({
  /** Off: 503. */
  enabled: Schema.Boolean.pipe(withDefault(() => true)),
  /** On: 503 with the maintenance message; queued jobs still finish. */
  maintenance: Schema.Boolean.pipe(withDefault(() => false)),
  /** Only admin accounts may generate (403 for others). */
  admin_only: Schema.Boolean.pipe(withDefault(() => false)),
  /** Longest wait for one image; then 504 and the job is cancelled on its worker. */
  max_wait_seconds: PositiveInt.pipe(withDefault(() => 180)),
  /** Pending image requests per account; one more is 429. */
  pending_per_account: PositiveInt.pipe(withDefault(() => 2)),
  /** Jobs waiting in the queue (not yet taken by a worker) past which new requests get 503. */
  congestion_threshold: PositiveInt.pipe(withDefault(() => 200)),
  /** Allowed resolutions; requests and presets are snapped to the nearest aspect ratio among them. */
  resolutions: Schema.Array(Resolution).check(Schema.isMinLength(1)).pipe(withDefault(() => [...DEFAULT_RESOLUTIONS])),
  /** A worker without a heartbeat for this long is offline; with none online, requests get 503. */
  worker_heartbeat_seconds: PositiveInt.pipe(withDefault(() => 15)),
  /** The in-process simulated worker (on by default in embedded mode). */
  simulated: Schema.Struct({
    enabled: Schema.optional(Schema.Boolean),
    latency_ms: Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)).pipe(withDefault(() => 500)),
    concurrency: PositiveInt.pipe(withDefault(() => 1))
  }).pipe(withDefault(() => ({ latency_ms: 500, concurrency: 1 }))),
  content_policy: Schema.Struct({
    /** Always blocked. */
    blocked: Schema.Array(Category).pipe(withDefault((): ReadonlyArray<Category> => [])),
    /** Blocked too for accounts in safe mode (`sfw_mode`). */
    safe_mode_blocked: Schema.Array(Category).pipe(withDefault((): ReadonlyArray<Category> => [])),
    /** Added to the negative prompt of accounts in safe mode. */
    safe_mode_negative: Schema.String.check(Schema.isMaxLength(2000)).pipe(withDefault(() => "nsfw, nude, explicit"))
  }).pipe(withDefault(() => ({ blocked: [], safe_mode_blocked: [], safe_mode_negative: "nsfw, nude, explicit" }))),
  gallery: Schema.Struct({
    /** Days an image stays in its owner's gallery; 0 keeps it until deleted. */
    retention_days: Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)).pipe(withDefault(() => 30))
  }).pipe(withDefault(() => ({ retention_days: 30 })))
})
export type ImagesConfig = typeof ImagesConfig.Type
