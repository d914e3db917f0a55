import { Effect } from "effect"
import { SqlClient } from "effect/sql"

/**
 * BYOK credentials (issue 10). The secret and the `meta` object are stored only sealed (AES-256-GCM, the row id
 * and field as associated data, `src/byok/Secrets.ts`); beside them only what the list response shows.
 *
 * - `status`: `active` | `rejected` | `revoked` (soft delete; `revoked_at` set exactly when revoked).
 * - A label is unique among an account's non-revoked credentials of one provider and auth scheme, so a revoked
 *   label can be reused; at most one non-revoked primary per account and provider.
 * - The account-level fallback choice already lives in `accounts.byok_fallback_override` (0001, null = follow
 *   the operator default); audit rows go to `audit_log`.
 * - Text columns are bounded here too, as a last line behind the input validation.
 */
export default Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`
    CREATE TABLE byok_credentials (
      id bigserial PRIMARY KEY,
      account_id text NOT NULL REFERENCES accounts(id),
      provider text NOT NULL CHECK (char_length(provider) BETWEEN 1 AND 32),
      auth_scheme text NOT NULL CHECK (char_length(auth_scheme) BETWEEN 1 AND 32),
      label text NOT NULL CHECK (char_length(label) BETWEEN 1 AND 40),
      secret_ciphertext text NOT NULL CHECK (char_length(secret_ciphertext) <= 16384),
      meta_ciphertext text NOT NULL CHECK (char_length(meta_ciphertext) <= 16384),
      masked_hint text NOT NULL CHECK (char_length(masked_hint) <= 16),
      base_url_origin text CHECK (char_length(base_url_origin) <= 2048),
      region text CHECK (char_length(region) <= 32),
      has_org_id boolean NOT NULL DEFAULT false,
      has_project_id boolean NOT NULL DEFAULT false,
      status text NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'rejected', 'revoked')),
      is_primary boolean NOT NULL DEFAULT false,
      pinned boolean NOT NULL DEFAULT false,
      fallback_model_id text CHECK (char_length(fallback_model_id) <= 128),
      last_error_code text CHECK (char_length(last_error_code) <= 64),
      last_verified_at timestamptz,
      last_used_at timestamptz,
      created_at timestamptz NOT NULL DEFAULT now(),
      revoked_at timestamptz,
      CONSTRAINT byok_credentials_revoked CHECK ((status = 'revoked') = (revoked_at IS NOT NULL)),
      CONSTRAINT byok_credentials_revoked_not_primary CHECK (NOT (is_primary AND status = 'revoked'))
    )`
  yield* sql`
    CREATE UNIQUE INDEX byok_credentials_label
    ON byok_credentials (account_id, provider, auth_scheme, label) WHERE status <> 'revoked'`
  yield* sql`
    CREATE UNIQUE INDEX byok_credentials_primary
    ON byok_credentials (account_id, provider) WHERE is_primary AND status <> 'revoked'`
  yield* sql`CREATE INDEX byok_credentials_account ON byok_credentials (account_id, id) WHERE status <> 'revoked'`
})
