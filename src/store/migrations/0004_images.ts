import { Effect } from "effect"
import { SqlClient } from "effect/sql"

/**
 * Image generation (issue 17): presets, the private gallery and worker tokens. Text columns are bounded here
 * too, as a last line behind the input validation.
 *
 * - `image_presets`: at most 10 per account (enforced by the repository), exactly one `active` per account
 *   (partial unique index); `loras` is a JSON array of `{name, weight}`.
 * - `images`: the private gallery; the PNG bytes live in the row (`bytea`), so they survive a restart with the
 *   database and leave with the account's rows. `expires_at` drives retention.
 * - `image_worker_tokens`: a worker proves itself with a token whose SHA-256 is stored; revoked softly.
 */
export default Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`
    CREATE TABLE image_presets (
      id bigserial PRIMARY KEY,
      account_id text NOT NULL REFERENCES accounts(id),
      name text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 40),
      checkpoint text NOT NULL CHECK (char_length(checkpoint) BETWEEN 1 AND 200),
      loras jsonb NOT NULL DEFAULT '[]'::jsonb,
      sampler text NOT NULL CHECK (char_length(sampler) BETWEEN 1 AND 64),
      scheduler text NOT NULL CHECK (char_length(scheduler) BETWEEN 1 AND 64),
      quality_prompt text NOT NULL DEFAULT '' CHECK (char_length(quality_prompt) <= 2000),
      negative_prompt text NOT NULL DEFAULT '' CHECK (char_length(negative_prompt) <= 2000),
      upscaler text CHECK (char_length(upscaler) <= 200),
      steps integer NOT NULL CHECK (steps BETWEEN 1 AND 60),
      scale double precision CHECK (scale IS NULL OR (scale >= 0 AND scale <= 30)),
      width integer NOT NULL CHECK (width BETWEEN 64 AND 4096),
      height integer NOT NULL CHECK (height BETWEEN 64 AND 4096),
      active boolean NOT NULL DEFAULT false,
      created_at timestamptz NOT NULL DEFAULT now(),
      updated_at timestamptz NOT NULL DEFAULT now()
    )
  `
  yield* sql`CREATE INDEX image_presets_account ON image_presets (account_id, id)`
  yield* sql`CREATE UNIQUE INDEX image_presets_one_active ON image_presets (account_id) WHERE active`
  yield* sql`
    CREATE TABLE images (
      id text PRIMARY KEY CHECK (char_length(id) BETWEEN 1 AND 64),
      account_id text NOT NULL REFERENCES accounts(id),
      prompt text NOT NULL CHECK (char_length(prompt) <= 8000),
      negative_prompt text NOT NULL DEFAULT '' CHECK (char_length(negative_prompt) <= 10000),
      width integer NOT NULL,
      height integer NOT NULL,
      steps integer NOT NULL,
      scale double precision NOT NULL,
      seed bigint NOT NULL,
      preset_name text CHECK (char_length(preset_name) <= 40),
      png bytea NOT NULL,
      bytes integer NOT NULL,
      created_at timestamptz NOT NULL DEFAULT now(),
      expires_at timestamptz
    )
  `
  yield* sql`CREATE INDEX images_account ON images (account_id, created_at DESC)`
  yield* sql`CREATE INDEX images_expiry ON images (expires_at) WHERE expires_at IS NOT NULL`
  yield* sql`
    CREATE TABLE image_worker_tokens (
      id bigserial PRIMARY KEY,
      name text NOT NULL CHECK (char_length(name) BETWEEN 1 AND 64),
      token_hash text NOT NULL UNIQUE CHECK (char_length(token_hash) = 64),
      created_at timestamptz NOT NULL DEFAULT now(),
      revoked_at timestamptz
    )
  `
})
