/**
 * The checkout's root folder (where `package.json` is), found from a module's own URL: the same whether the
 * module runs from `src/` (tsx, tests), from `dist/` as one file among many (`tsc`), or bundled into
 * `dist/main.js` and its chunks (`npm run build`). Files the gateway serves as they are (the status page, the
 * dashboard build) are named from here, never by a fixed number of `..` from the module.
 */
import * as Fs from "node:fs"
import * as Path from "node:path"
import * as Url from "node:url"

/** At most this many folders up from the module; a checkout is never deeper below its root. */
const MAX_DEPTH = 6

let found: string | undefined

export const projectRoot = (): string => {
  if (found !== undefined) return found
  let dir = Path.dirname(Url.fileURLToPath(import.meta.url))
  for (let depth = 0; depth < MAX_DEPTH; depth++) {
    if (Fs.existsSync(Path.join(dir, "package.json")) && Fs.existsSync(Path.join(dir, "src"))) return (found = dir)
    const up = Path.dirname(dir)
    if (up === dir) break
    dir = up
  }
  throw new Error(`project root not found above ${Url.fileURLToPath(import.meta.url)}`)
}

/** A path below the checkout's root. */
export const projectPath = (...segments: ReadonlyArray<string>): string => Path.join(projectRoot(), ...segments)
