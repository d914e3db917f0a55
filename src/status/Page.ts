/**
 * The status page's static files (`src/status/page/`: plain HTML, CSS and JS, no build step), read once at start
 * and served from memory at `/` of the status origin with a strict Content-Security-Policy: no inline script or
 * style, everything from the page's own origin, data only from its own `/api/*`.
 *
 * The folder is the checkout's `src/status/page`, whether the gateway runs from `src/` or from the bundle that
 * `npm run build` writes to `dist/` (which copies no HTML, CSS or JS).
 */
import * as Crypto from "node:crypto"
import * as Fs from "node:fs"
import { projectPath } from "../runtime/ProjectRoot.js"

export const CONTENT_SECURITY_POLICY = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self' data:",
  "connect-src 'self'",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'"
].join("; ")

export interface Asset {
  readonly path: `/${string}`
  readonly body: Uint8Array
  readonly contentType: string
  readonly etag: string
}

/** URL path → file in the page folder. */
const FILES: ReadonlyArray<readonly [`/${string}`, string, string]> = [
  ["/", "index.html", "text/html; charset=utf-8"],
  ["/status.css", "status.css", "text/css; charset=utf-8"],
  ["/status.js", "status.js", "text/javascript; charset=utf-8"]
]

/** The page folder, or an error naming where it was looked for. */
export const pageDir = (): string => {
  const dir = projectPath("src", "status", "page")
  if (Fs.existsSync(`${dir}/index.html`)) return dir
  throw new Error(`status page files not found (looked in ${dir})`)
}

export const loadAssets = (dir: string = pageDir()): ReadonlyArray<Asset> =>
  FILES.map(([path, file, contentType]) => {
    const body = Fs.readFileSync(`${dir}/${file}`)
    return {
      path,
      body: new Uint8Array(body),
      contentType,
      etag: `"${Crypto.createHash("sha256").update(body).digest("base64url").slice(0, 22)}"`
    }
  })
