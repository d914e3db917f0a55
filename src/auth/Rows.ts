/**
 * Rows of the `accounts` and `api_keys` tables as authentication reads them. They live with auth because auth
 * resolves keys and sessions to them; the account module (which writes these tables) imports them from here.
 */

export interface AccountRow {
  readonly id: string
  readonly display_id: number
  readonly username: string
  readonly display_name: string
  readonly community_id: string | null
  readonly community_type: string | null
  readonly email: string | null
  readonly email_verified_at: Date | null
  readonly status: string
  readonly is_guest: boolean
  readonly guest_expires_at: Date | null
  readonly is_admin: boolean
  readonly is_legacy: boolean
  readonly needs_migration: boolean
  readonly plan: string | null
  readonly sfw_mode: boolean
  readonly byok_fallback_override: boolean | null
  readonly created_at: Date
  readonly last_used_at: Date | null
  readonly last_rotated_at: Date | null
  readonly liveness_blocked_at: Date | null
  readonly next_liveness_at: Date | null
  readonly password_changed_at: Date | null
  readonly last_nick_changed_at: Date | null
}

export interface KeyRow {
  readonly id: number
  readonly account_id: string
  readonly label: string
  readonly key_hash: string
  readonly key_prefix: string | null
  readonly ciphertext: string | null
  readonly legacy: boolean
  readonly created_at: Date
  readonly last_used_at: Date | null
  readonly revoked_at: Date | null
}
