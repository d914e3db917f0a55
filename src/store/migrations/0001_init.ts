import { Effect } from "effect"
import { SqlClient } from "effect/sql"

export default Effect.gen(function*() {
  const sql = yield* SqlClient.SqlClient
  yield* sql`
    CREATE TABLE accounts (
      id text PRIMARY KEY,
      display_id serial UNIQUE,
      username text NOT NULL UNIQUE,
      display_name text NOT NULL,
      community_id text,
      community_type text,
      email text,
      email_verified_at timestamptz,
      status text NOT NULL DEFAULT 'active',
      is_guest boolean NOT NULL DEFAULT false,
      guest_expires_at timestamptz,
      is_admin boolean NOT NULL DEFAULT false,
      is_legacy boolean NOT NULL DEFAULT false,
      needs_migration boolean NOT NULL DEFAULT false,
      plan text,
      sfw_mode boolean NOT NULL DEFAULT false,
      byok_fallback_override boolean,
      created_at timestamptz NOT NULL DEFAULT now(),
      last_used_at timestamptz,
      last_rotated_at timestamptz,
      liveness_blocked_at timestamptz,
      next_liveness_at timestamptz,
      password_changed_at timestamptz,
      last_nick_changed_at timestamptz
    )`
  yield* sql`
    CREATE TABLE api_keys (
      id bigserial PRIMARY KEY,
      account_id text NOT NULL REFERENCES accounts(id),
      label text NOT NULL,
      key_hash text NOT NULL UNIQUE,
      key_prefix text,
      ciphertext text,
      legacy boolean NOT NULL DEFAULT false,
      created_at timestamptz NOT NULL DEFAULT now(),
      last_used_at timestamptz,
      revoked_at timestamptz
    )`
  yield* sql`CREATE INDEX api_keys_account ON api_keys (account_id) WHERE revoked_at IS NULL`
  yield* sql`
    CREATE TABLE sessions (
      token_hash text PRIMARY KEY,
      account_id text NOT NULL REFERENCES accounts(id),
      created_at timestamptz NOT NULL DEFAULT now(),
      expires_at timestamptz NOT NULL,
      revoked_at timestamptz
    )`
  // Request ids are handed out in blocks of 1000 so the hot path never asks the database.
  yield* sql`CREATE SEQUENCE request_log_id_blocks START 1 INCREMENT 1000`
  yield* sql`
    CREATE TABLE request_log (
      id bigint PRIMARY KEY,
      request_id text NOT NULL,
      account_id text NOT NULL,
      key_id bigint,
      model_id text NOT NULL,
      status text NOT NULL,
      error_code text,
      http_status integer NOT NULL,
      stream boolean NOT NULL DEFAULT false,
      input_tokens integer NOT NULL DEFAULT 0,
      output_tokens integer NOT NULL DEFAULT 0,
      reasoning_tokens integer NOT NULL DEFAULT 0,
      prompt_cached_tokens integer NOT NULL DEFAULT 0,
      weighted_cost double precision NOT NULL DEFAULT 0,
      ttfb_ms integer,
      duration_ms integer NOT NULL DEFAULT 0,
      tps double precision NOT NULL DEFAULT 0,
      had_tools boolean NOT NULL DEFAULT false,
      tool_choice text,
      byok boolean NOT NULL DEFAULT false,
      provider text,
      fell_back boolean NOT NULL DEFAULT false,
      error text,
      created_at timestamptz NOT NULL
    )`
  yield* sql`CREATE INDEX request_log_account_time ON request_log (account_id, created_at DESC)`
  yield* sql`CREATE INDEX request_log_model_time ON request_log (model_id, created_at DESC)`
  yield* sql`
    CREATE TABLE quota_windows (
      account_id text PRIMARY KEY,
      session_started_at timestamptz,
      session_used double precision NOT NULL DEFAULT 0,
      weekly_anchor_at timestamptz,
      weekly_used double precision NOT NULL DEFAULT 0,
      cooldown_until timestamptz,
      updated_at timestamptz NOT NULL DEFAULT now()
    )`
  yield* sql`
    CREATE TABLE model_daily_usage (
      model_id text NOT NULL,
      day date NOT NULL,
      tokens bigint NOT NULL DEFAULT 0,
      PRIMARY KEY (model_id, day)
    )`
  yield* sql`
    CREATE TABLE audit_log (
      id bigserial PRIMARY KEY,
      account_id text NOT NULL,
      action text NOT NULL,
      target text,
      meta jsonb,
      created_at timestamptz NOT NULL DEFAULT now()
    )`
})
