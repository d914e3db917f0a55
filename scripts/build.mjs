// `npm run build`: the gateway as one ES module bundle in dist/ (dist/main.js and the chunks it loads lazily).
// Bundled, `effect` keeps only what the gateway uses, without its documentation comments: V8 holds every loaded
// module's source text in the heap, and the per-module build kept ~20 MB of it (docs/decisions.md, "One bundle").
// Types are checked by `npm run typecheck`, not here. `node scripts/build.mjs <folder>` writes elsewhere (inside the
// checkout: the bundle finds the status page and the dashboard build from it).
import { build } from "esbuild"
import { rmSync } from "node:fs"

const root = new URL("..", import.meta.url).pathname
const outdir = process.argv[2] ?? "dist"
rmSync(new URL(outdir, `file://${root}`), { recursive: true, force: true })
await build({
  absWorkingDir: root,
  entryPoints: ["src/main.ts"],
  outdir,
  bundle: true,
  // main.ts restarts the process with its heap flags before it imports the gateway: that import stays lazy.
  splitting: true,
  format: "esm",
  platform: "node",
  target: "node22",
  minifyWhitespace: true,
  minifySyntax: true,
  legalComments: "none",
  sourcemap: "linked",
  // Packages that locate files next to themselves at run time (WebAssembly, data) or are CommonJS stay
  // in node_modules, imported as they are.
  external: ["@electric-sql/*", "gpt-tokenizer", "gpt-tokenizer/*", "ioredis", "pg", "undici", "yaml", "ipaddr.js"],
  // CommonJS packages bundled in (ws, pg's helpers...) call `require` for Node's own modules.
  banner: { js: `import { createRequire as __createRequire } from "node:module"; const require = __createRequire(import.meta.url);` },
  logLevel: "warning"
})
