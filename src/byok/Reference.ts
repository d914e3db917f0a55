/**
 * BYOK model references (spec, "What the service does" 11): `@<provider>/<upstream_model_id>` and
 * `@<provider>:<label>/<upstream_model_id>`. The provider's model id passes verbatim; the label follows the save
 * rules (`Providers.ts` `isValidLabel`, NFC as `normalizeLabel` stores it), so a reference names at most one
 * credential.
 */
import { isValidLabel, MAX_LABEL_CHARS } from "./Providers.js"

export interface ByokReference {
  readonly provider: string
  /** Null: the provider's primary credential. */
  readonly label: string | null
  /** The provider's own model id, verbatim. */
  readonly model: string
}

/** Longest upstream model id after the prefix (provider listings keep ids up to this length too). */
export const MAX_REFERENCE_MODEL_CHARS = 200

const PROVIDER = /^[a-z][a-z0-9_-]{0,31}$/
/** C0/C1 controls and spaces: never part of a provider model id. */
const UNPRINTABLE = /[\u0000-\u0020\u007f-\u009f]/
/** Half of a surrogate pair alone: not text, so no provider's id (and `encodeURIComponent` throws on it). */
const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/

export const isByokModel = (model: string): boolean => model.startsWith("@")

/** The parts of a reference, or null when it does not have the documented form. */
export const parseReference = (model: string): ByokReference | null => {
  if (!isByokModel(model)) return null
  const slash = model.indexOf("/")
  if (slash < 0) return null
  const head = model.slice(1, slash)
  const id = model.slice(slash + 1)
  // `.` and `..` would be path segments where the id goes into the URL (Azure deployments).
  if (id === "." || id === "..") return null
  if (id === "" || id.length > MAX_REFERENCE_MODEL_CHARS || UNPRINTABLE.test(id) || LONE_SURROGATE.test(id)) return null
  const colon = head.indexOf(":")
  const provider = colon < 0 ? head : head.slice(0, colon)
  const written = colon < 0 ? null : head.slice(colon + 1)
  // Saved labels are stored in NFC (`normalizeLabel`, same length bound): a label typed in NFD names the same one.
  if (written !== null && written.length > MAX_LABEL_CHARS * 4) return null
  const label = written === null ? null : written.normalize("NFC")
  if (!PROVIDER.test(provider)) return null
  if (label !== null && !isValidLabel(label)) return null
  return { provider, label, model: id }
}

/** The admission window a BYOK request counts in: one per provider, so model ids cannot grow the state. */
export const rpmWindowOf = (provider: string): string => `@${provider}`
