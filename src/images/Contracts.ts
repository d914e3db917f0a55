/**
 * The seams of the image domain (issue 17), shared by its parts:
 * - the endpoint (`Route.ts`): validates, applies the settings precedence and the content policy, takes a pending
 *   slot, submits a job and waits for its PNG, answers a ZIP;
 * - pending slots (`Slots.ts`): at most `pending_per_account` per account; memory actors or Redis leases;
 * - the queue and its workers (`Queue.ts`, `Workers.ts`, `WorkerRoutes.ts`, `Simulated.ts`): round-robin across
 *   accounts, workers that register with a token, heartbeat and long-poll for jobs;
 * - presets and the gallery (`Presets.ts`, `Gallery.ts`, `AccountRoutes.ts`).
 * Each part depends on the others only through the services below.
 */
import { Context, type Effect, type Scope } from "effect"
import type { GatewayError } from "../errors/Catalog.js"

/** One LoRA of a preset. */
export interface Lora {
  readonly name: string
  readonly weight: number
}

/** An illustration preset (snake_case on the wire, like the rest of the account API). */
export interface Preset {
  readonly id: number
  readonly name: string
  readonly checkpoint: string
  readonly loras: ReadonlyArray<Lora>
  readonly sampler: string
  readonly scheduler: string
  /** Added in front of the prompt. */
  readonly quality_prompt: string
  /** Added to the negative prompt. */
  readonly negative_prompt: string
  readonly upscaler: string | null
  /** Default steps (1–60). */
  readonly steps: number
  /** Default guidance scale; null: the request's `scale` (else 5). */
  readonly scale: number | null
  readonly width: number
  readonly height: number
  readonly active: boolean
  readonly created_at: string
  readonly updated_at: string
}

/** What a worker needs to make one image: prompts already converted to the worker's `(text:1.1)` syntax. */
export interface JobSpec {
  readonly prompt: string
  readonly negative_prompt: string
  readonly width: number
  readonly height: number
  readonly steps: number
  readonly scale: number
  readonly seed: number
  /** The preset's generation fields (checkpoint, LoRAs, sampler, scheduler, upscaler). */
  readonly preset: Pick<Preset, "name" | "checkpoint" | "loras" | "sampler" | "scheduler" | "upscaler">
}

export interface ImageJob {
  /** `img_` + 24 hex. */
  readonly id: string
  readonly accountId: string
  readonly spec: JobSpec
}

/** How a job ended on its worker. */
export type JobOutcome =
  | { readonly _tag: "Done"; readonly png: Uint8Array; readonly workerId: string }
  | { readonly _tag: "Failed"; readonly reason: string }

/** Pending image requests per account (spec rule 2). */
export class ImageSlots extends Context.Service<ImageSlots, {
  /**
   * Takes one of the account's pending slots for the life of the scope (released when it closes: answer,
   * timeout, client disconnect); 429 when the account already holds `pending_per_account`.
   */
  readonly acquire: (accountId: string) => Effect.Effect<void, GatewayError, Scope.Scope>
  /** Slots the account holds now (tests, the dashboard). */
  readonly held: (accountId: string) => Effect.Effect<number>
}>()("wellspring/images/ImageSlots") {}

/** The job queue, fair across accounts, and the workers that drain it. */
export class ImageQueue extends Context.Service<ImageQueue, {
  /**
   * Queues the job and waits for its outcome. 503 (`image_congested`, `image_no_worker`) when it cannot be
   * queued. Interrupting the wait (timeout, disconnect) withdraws the job, or cancels it on its worker.
   */
  readonly run: (job: ImageJob) => Effect.Effect<JobOutcome, GatewayError>
  /** Jobs waiting for a worker. */
  readonly waiting: Effect.Effect<number>
  /** Workers with a fresh heartbeat. */
  readonly workersOnline: Effect.Effect<number>
}>()("wellspring/images/ImageQueue") {}

/** Presets of an account. */
export class ImagePresets extends Context.Service<ImagePresets, {
  /** The account's active preset; a default one is created (and activated) on first use. */
  readonly active: (accountId: string) => Effect.Effect<Preset>
}>()("wellspring/images/ImagePresets") {}

/** What the gallery keeps of an image besides its bytes. */
export interface GalleryEntry {
  readonly id: string
  readonly accountId: string
  /** The prompt as the user wrote it (before conversion). */
  readonly prompt: string
  readonly spec: JobSpec
  readonly png: Uint8Array
}

/** The private gallery. */
export class ImageGallery extends Context.Service<ImageGallery, {
  readonly save: (entry: GalleryEntry) => Effect.Effect<void>
}>()("wellspring/images/ImageGallery") {}

/** A worker as it announces itself (its id is its own choice, e.g. a UUID per process). */
export interface WorkerInfo {
  readonly id: string
  readonly name: string
  /** `simulated`, `comfyui`, ... (shown to operators). */
  readonly kind: string
}

/**
 * The worker side of the queue, used in-process by the simulated worker and over HTTP (`WorkerRoutes.ts`) by
 * remote workers. The HTTP protocol, on the inference origin, `Authorization: Bearer <worker token>`:
 * - `POST /v1/images/workers/jobs/next` `{worker_id, name, kind, wait_ms}` (wait at most 25 s): 200
 *   `{job: {id, spec}}` or 204 when none came; counts as a heartbeat;
 * - `POST /v1/images/workers/heartbeat` `{worker_id, name, kind}`: 204; a worker sends it at least every
 *   `worker_heartbeat_seconds / 3` while it works;
 * - `POST /v1/images/workers/jobs/:id/progress` `{worker_id, step, total}`: 200 `{cancelled: boolean}`; a
 *   cancelled job's worker should stop and not report a result;
 * - `POST /v1/images/workers/jobs/:id/result?worker_id=…` with the PNG as the body (`image/png`): 204;
 * - `POST /v1/images/workers/jobs/:id/failure` `{worker_id, message}`: 204.
 * A job whose worker stops heartbeating goes back to the queue once; the second loss fails it (500).
 */
export class ImageWork extends Context.Service<ImageWork, {
  readonly heartbeat: (worker: WorkerInfo) => Effect.Effect<void>
  /** Waits up to `waitMs` for a job for this worker; null when none came. */
  readonly take: (worker: WorkerInfo, waitMs: number) => Effect.Effect<ImageJob | null>
  /** Progress of a job this worker holds; whether the job was cancelled meanwhile. */
  readonly progress: (workerId: string, jobId: string, step: number, total: number) => Effect.Effect<{ readonly cancelled: boolean }>
  readonly complete: (workerId: string, jobId: string, png: Uint8Array) => Effect.Effect<void>
  readonly fail: (workerId: string, jobId: string, reason: string) => Effect.Effect<void>
}>()("wellspring/images/ImageWork") {}
