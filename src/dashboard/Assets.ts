/**
 * The account dashboard's built files (`dashboard/dist`, made by `npm run build:dashboard` with Vite, which the
 * `prepare` script runs on `npm install`), read once when the routes are built and served from memory under
 * `/dashboard/` on the account origin:
 *
 * - `/dashboard/assets/*`: Vite's content-hashed files, `cache-control: public, max-age=31536000, immutable`; an
 *   unknown name is 404 (never the HTML);
 * - every other path under `/dashboard/` is the app's `index.html` (its router picks the page), `no-cache` with an
 *   ETag, so a new build is picked up on the next load;
 * - text files are gzipped once at load and sent compressed to clients that accept it;
 * - every answer carries a strict Content-Security-Policy: scripts, styles and connections only from this origin,
 *   no inline script or style element, no framing, no form posts.
 *
 * Without a build the dashboard paths answer 404 with a Korean note saying how to build it; the API is unaffected.
 */
import { Effect, Layer } from "effect"
import { HttpRouter, HttpServerRequest, HttpServerResponse } from "effect/http"
import * as Crypto from "node:crypto"
import * as Fs from "node:fs"
import * as Path from "node:path"
import { projectPath } from "../runtime/ProjectRoot.js"
import * as Zlib from "node:zlib"

export const DASHBOARD_CSP = [
  "default-src 'none'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self' data: blob:",
  "font-src 'self'",
  "connect-src 'self'",
  "manifest-src 'self'",
  "base-uri 'none'",
  "form-action 'none'",
  "frame-ancestors 'none'"
].join("; ")

export const IMMUTABLE = "public, max-age=31536000, immutable"

const TYPES: Record<string, string> = {
  ".html": "text/html; charset=utf-8",
  ".js": "text/javascript; charset=utf-8",
  ".css": "text/css; charset=utf-8",
  ".svg": "image/svg+xml",
  ".png": "image/png",
  ".ico": "image/x-icon",
  ".woff2": "font/woff2",
  ".json": "application/json",
  ".txt": "text/plain; charset=utf-8"
}
const COMPRESSIBLE = new Set([".html", ".js", ".css", ".svg", ".json", ".txt"])

export interface DashboardAsset {
  readonly body: Uint8Array
  readonly gzip: Uint8Array | null
  readonly contentType: string
  readonly etag: string
  readonly cacheControl: string
}

/** `dashboard/dist` of the checkout, from `src/` and from the bundle in `dist/` alike. */
export const distDir = (): string => projectPath("dashboard", "dist")

const walk = (dir: string): Array<string> =>
  Fs.readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const full = Path.join(dir, entry.name)
    return entry.isDirectory() ? walk(full) : entry.isFile() ? [full] : []
  })

/** URL path (`/dashboard/...`) → file, or null when there is no build. */
export const loadDashboard = (dir: string = distDir()): ReadonlyMap<string, DashboardAsset> | null => {
  if (!Fs.existsSync(Path.join(dir, "index.html"))) return null
  const assets = new Map<string, DashboardAsset>()
  for (const file of walk(dir)) {
    const relative = Path.relative(dir, file).split(Path.sep).join("/")
    const ext = Path.extname(file).toLowerCase()
    const body = new Uint8Array(Fs.readFileSync(file))
    assets.set(`/dashboard/${relative}`, {
      body,
      gzip: COMPRESSIBLE.has(ext) && body.length > 512 ? new Uint8Array(Zlib.gzipSync(body, { level: 9 })) : null,
      contentType: TYPES[ext] ?? "application/octet-stream",
      etag: `"${Crypto.createHash("sha256").update(body).digest("base64url").slice(0, 22)}"`,
      cacheControl: relative.startsWith("assets/") ? IMMUTABLE : relative === "index.html" ? "no-cache" : "public, max-age=300"
    })
  }
  return assets
}

const securityHeaders = {
  "content-security-policy": DASHBOARD_CSP,
  "x-content-type-options": "nosniff",
  "referrer-policy": "same-origin",
  "x-frame-options": "DENY",
  "cross-origin-opener-policy": "same-origin"
}

const NOT_BUILT = "<!doctype html><html lang=\"ko\"><meta charset=\"utf-8\"><title>대시보드</title>" +
  "<p>대시보드가 아직 빌드되지 않았습니다. 저장소에서 <code>npm run build:dashboard</code> 를 실행하세요.</p></html>"

const notFound = () =>
  HttpServerResponse.text("요청한 파일을 찾을 수 없습니다.", { status: 404, headers: { ...securityHeaders, "cache-control": "no-store" } })

const serve = (assets: ReadonlyMap<string, DashboardAsset> | null) =>
  Effect.map(HttpServerRequest.HttpServerRequest, (request) => {
    if (assets === null) {
      return HttpServerResponse.text(NOT_BUILT, {
        status: 404,
        contentType: "text/html; charset=utf-8",
        headers: { ...securityHeaders, "cache-control": "no-store" }
      })
    }
    const path = request.url.split("?", 1)[0]!.split("#", 1)[0]!
    // The router's `/dashboard/*` also matches `/dashboard`: the app lives under the slash.
    if (path === "/dashboard") return HttpServerResponse.empty({ status: 308, headers: { location: "/dashboard/" } })
    // Hashed assets are exact; any other path is a page of the app.
    const asset = assets.get(path) ?? (path.startsWith("/dashboard/assets/") ? undefined : assets.get("/dashboard/index.html"))
    if (asset === undefined) return notFound()
    const headers: Record<string, string> = {
      ...securityHeaders,
      "cache-control": asset.cacheControl,
      etag: asset.etag,
      vary: "accept-encoding"
    }
    if (request.headers["if-none-match"] === asset.etag) return HttpServerResponse.empty({ status: 304, headers })
    const gzip = asset.gzip !== null && /\bgzip\b/.test(request.headers["accept-encoding"] ?? "")
    if (gzip) headers["content-encoding"] = "gzip"
    return HttpServerResponse.uint8Array(gzip ? asset.gzip! : asset.body, { contentType: asset.contentType, headers })
  })

/** `/dashboard/*` (and `/dashboard`, redirected) of the account origin. */
export const dashboardRoutes = Layer.unwrap(Effect.sync(() => HttpRouter.add("GET", "/dashboard/*", serve(loadDashboard()))))
