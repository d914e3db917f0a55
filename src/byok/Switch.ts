/** The effective BYOK switch and sealing key, decided from the `byok` section (`config/Byok.ts`) at boot. */
import { Redacted } from "effect"
import type { ByokConfig } from "../config/Byok.js"
import { decodeByokKey, loadOrCreateByokKeyFile } from "./Secrets.js"

/** Why BYOK is off, for the boot log (never the key). */
export type ByokDisabledReason = "disabled_by_operator" | "no_encryption_key"

export type ByokSwitch =
  | { readonly enabled: true; readonly key: Buffer }
  | { readonly enabled: false; readonly reason: ByokDisabledReason }

/**
 * The effective switch (spec, Authentication 6, gate 3: "enabled by the operator, with credential encryption
 * configured"). A configured key wins; in embedded mode a key is read from, or generated into,
 * `<data_dir>/byok.key`; in production without a key BYOK is off even when `enabled: true`. An explicit
 * `enabled: false` creates no key file. Throws on a malformed configured key or key file (a boot error).
 */
export const resolveByok = (
  config: ByokConfig,
  context: { readonly embedded: boolean; readonly dataDir: string }
): ByokSwitch => {
  const enabled = config.enabled ?? context.embedded
  if (!enabled) return { enabled: false, reason: "disabled_by_operator" }
  if (config.encryption_key !== undefined) {
    return { enabled: true, key: decodeByokKey(Redacted.value(config.encryption_key)) }
  }
  if (context.embedded) return { enabled: true, key: loadOrCreateByokKeyFile(context.dataDir) }
  return { enabled: false, reason: "no_encryption_key" }
}
