import { fileURLToPath } from "node:url"
import { defineConfig } from "vite"

/**
 * The account dashboard (issue 21): Preact + preact-iso, charts by uPlot, built to `dashboard/dist` and served
 * by the gateway under `/dashboard/` (src/dashboard/Assets.ts). Hashed file names under `assets/`; no inline
 * script (the gateway's CSP forbids it), so the module-preload polyfill stays in the entry chunk.
 */
export default defineConfig({
  root: fileURLToPath(new URL(".", import.meta.url)),
  base: "/dashboard/",
  oxc: { jsx: { runtime: "automatic", importSource: "preact" } },
  build: {
    outDir: "dist",
    emptyOutDir: true,
    target: "es2022",
    assetsInlineLimit: 0,
    modulePreload: { polyfill: false },
    reportCompressedSize: false
  }
})
