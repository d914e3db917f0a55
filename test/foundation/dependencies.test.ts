/**
 * Dependency direction (issue 9, Structure 4; issue 19, point 6), read from the source's imports:
 * - layers: every module belongs to a unit (a folder, or a single file) with a rank, from the table in
 *   docs/architecture-layers.md (the only copy of it); a module imports only its own unit or units of strictly
 *   lower rank, and every source file is covered by a row;
 * - `accounts` may use `auth`, never the reverse: nothing `src/auth/` imports reaches `src/accounts/`, directly
 *   or through other modules;
 * - no module imports a route module, except the composition root `src/App.ts`, which mounts them. A route module
 *   registers routes when it is loaded: it calls `HttpRouter.add`, or a route factory (an exported function that
 *   calls `HttpRouter.add`, e.g. the pipeline's `pipelineRoute`), outside any function. A module that only exports
 *   a factory is not a route module: its users are.
 * Type-only imports count: they couple the modules just the same.
 */
import * as Fs from "node:fs"
import * as Path from "node:path"
import ts from "typescript"
import { describe, expect, it } from "vitest"

const SRC = Path.resolve("src")
const COMPOSITION_ROOT = "App.ts"
const LAYERS_DOC = Path.resolve("docs/architecture-layers.md")

/** Route modules named by the issue; detection must find at least these. */
const KNOWN_ROUTE_MODULES = [
  "accounts/AccountRoutes.ts",
  "inference/Chat.ts",
  "inference/Embeddings.ts",
  "inference/IdentityRoutes.ts",
  "inference/ModelsRoute.ts",
  "inference/OpenApi.ts",
  "protocols/anthropic/Routes.ts",
  "protocols/responses/Route.ts"
]

interface Module {
  /** Path relative to `src/`, with `/` separators. */
  readonly path: string
  /** Other modules of `src/` it imports (relative specifiers resolved; packages left out). */
  readonly imports: ReadonlyArray<string>
  /** Whether it calls `HttpRouter.add(...)` outside any function (registers routes when loaded). */
  readonly addsRoutes: boolean
  /** Exported functions that call `HttpRouter.add` (route factories). */
  readonly factories: ReadonlyArray<string>
  /** Names it calls outside any function, with the module and export they were imported from. */
  readonly topLevelCalls: ReadonlyArray<{ readonly from: string; readonly name: string }>
}

const listSources = (dir: string): Array<string> =>
  Fs.readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const full = Path.join(dir, entry.name)
    if (entry.isDirectory()) return listSources(full)
    return entry.name.endsWith(".ts") && !entry.name.endsWith(".d.ts") ? [full] : []
  })

/** `./X.js` from `a/B.ts` is `a/X.ts`; a folder import resolves to its `index.ts`. */
const resolve = (from: string, specifier: string, exists: (path: string) => boolean): string | null => {
  if (!specifier.startsWith(".")) return null
  const joined = Path.posix.normalize(Path.posix.join(Path.posix.dirname(from), specifier))
  for (const candidate of [joined.replace(/\.js$/, ".ts"), `${joined}.ts`, `${joined}/index.ts`, joined]) {
    if (exists(candidate)) return candidate
  }
  return joined
}

const isFunctionLike = (node: ts.Node): boolean =>
  ts.isArrowFunction(node) || ts.isFunctionExpression(node) || ts.isFunctionDeclaration(node) ||
  ts.isMethodDeclaration(node) || ts.isAccessor(node) || ts.isConstructorDeclaration(node)

const isExported = (node: ts.Node): boolean =>
  ts.canHaveModifiers(node) && (ts.getModifiers(node) ?? []).some((m) => m.kind === ts.SyntaxKind.ExportKeyword)

/** The exported top-level declaration `node` is in (`export const f = ...`, `export function f`), if any. */
const exportedNameOf = (node: ts.Node): string | null => {
  let at: ts.Node = node
  while (at.parent !== undefined && !ts.isSourceFile(at.parent)) at = at.parent
  if (ts.isFunctionDeclaration(at) && at.name && isExported(at)) return at.name.text
  if (ts.isVariableStatement(at) && isExported(at)) {
    const [declaration] = at.declarationList.declarations
    if (declaration && ts.isIdentifier(declaration.name)) return declaration.name.text
  }
  return null
}

/**
 * Parses one source text: its import specifiers (static, re-exports, dynamic), whether it adds routes when loaded,
 * the route factories it exports, and the imported functions it calls when loaded.
 */
const parseModule = (path: string, text: string, exists: (path: string) => boolean): Module => {
  const source = ts.createSourceFile(path, text, ts.ScriptTarget.Latest, true, ts.ScriptKind.TS)
  const specifiers: Array<string> = []
  /** local name -> [specifier, exported name] of named imports. */
  const bindings = new Map<string, readonly [string, string]>()
  let addsRoutes = false
  const factories = new Set<string>()
  const called = new Set<string>()
  const visit = (node: ts.Node, inFunction: boolean): void => {
    if ((ts.isImportDeclaration(node) || ts.isExportDeclaration(node)) && node.moduleSpecifier) {
      if (ts.isStringLiteral(node.moduleSpecifier)) {
        specifiers.push(node.moduleSpecifier.text)
        const named = ts.isImportDeclaration(node) ? node.importClause?.namedBindings : undefined
        if (named && ts.isNamedImports(named)) {
          for (const element of named.elements) {
            bindings.set(element.name.text, [node.moduleSpecifier.text, (element.propertyName ?? element.name).text])
          }
        }
      }
    } else if (ts.isImportEqualsDeclaration(node) && ts.isExternalModuleReference(node.moduleReference)) {
      const expression = node.moduleReference.expression
      if (ts.isStringLiteral(expression)) specifiers.push(expression.text)
    } else if (ts.isCallExpression(node)) {
      const [first] = node.arguments
      if (node.expression.kind === ts.SyntaxKind.ImportKeyword && first && ts.isStringLiteralLike(first)) {
        specifiers.push(first.text)
      }
      if (
        ts.isPropertyAccessExpression(node.expression) && ROUTER_CALLS.has(node.expression.name.text) &&
        ts.isIdentifier(node.expression.expression) && node.expression.expression.text === "HttpRouter"
      ) {
        if (!inFunction) addsRoutes = true
        else {
          const name = exportedNameOf(node)
          if (name !== null) factories.add(name)
        }
      }
      if (!inFunction && ts.isIdentifier(node.expression)) called.add(node.expression.text)
    } else if (ts.isImportTypeNode(node)) {
      const argument = node.argument
      if (ts.isLiteralTypeNode(argument) && ts.isStringLiteral(argument.literal)) specifiers.push(argument.literal.text)
    }
    ts.forEachChild(node, (child) => visit(child, inFunction || isFunctionLike(node)))
  }
  visit(source, false)
  const imports = [...new Set(specifiers.flatMap((s) => resolve(path, s, exists) ?? []))]
  const topLevelCalls = [...called].flatMap((local) => {
    const binding = bindings.get(local)
    const from = binding === undefined ? null : resolve(path, binding[0], exists)
    return from === null || binding === undefined ? [] : [{ from, name: binding[1] }]
  })
  return { path, imports, addsRoutes, factories: [...factories], topLevelCalls }
}

/** `HttpRouter` calls that register routes: `add`, and `use` (a route added on the router it hands over). */
const ROUTER_CALLS: ReadonlySet<string> = new Set(["add", "use"])

/** Modules that register routes when loaded: `HttpRouter.add`, or an imported route factory, called at top level. */
const routeModulesOf = (modules: ReadonlyArray<Module>): Set<string> => {
  const factories = new Map(modules.map((m) => [m.path, new Set(m.factories)]))
  return new Set(
    modules
      .filter((m) => m.addsRoutes || m.topLevelCalls.some((c) => factories.get(c.from)?.has(c.name) === true))
      .map((m) => m.path)
  )
}

/** Every rule broken by a set of modules, one line per offending import. */
const violations = (modules: ReadonlyArray<Module>): Array<string> => {
  const byPath = new Map(modules.map((m) => [m.path, m]))
  const routeModules = routeModulesOf(modules)
  const found: Array<string> = []
  for (const module of modules) {
    for (const target of module.imports) {
      if (routeModules.has(target) && module.path !== COMPOSITION_ROOT) {
        found.push(`${module.path} imports the route module ${target}`)
      }
    }
  }
  // auth -> accounts, directly or through any chain of imports; the chain is reported.
  for (const start of modules.filter((m) => m.path.startsWith("auth/"))) {
    const via = new Map<string, string | null>([[start.path, null]])
    const queue = [start.path]
    while (queue.length > 0) {
      const current = queue.shift()!
      if (current.startsWith("accounts/")) {
        const chain: Array<string> = []
        for (let at: string | null = current; at !== null; at = via.get(at) ?? null) chain.unshift(at)
        found.push(`auth reaches accounts: ${chain.join(" -> ")}`)
        break
      }
      for (const next of byPath.get(current)?.imports ?? []) {
        if (!via.has(next)) {
          via.set(next, current)
          queue.push(next)
        }
      }
    }
  }
  return found
}

/** A rank table: unit (a folder, a file path, or `(root)` for the files directly in `src/`) -> rank. */
type Ranks = ReadonlyMap<string, number>

/** The rows between the `ranks:begin` / `ranks:end` markers: `| rank | \`unit\` | ... |`. */
const parseRanks = (markdown: string): Ranks => {
  const begin = markdown.indexOf("<!-- ranks:begin -->")
  const end = markdown.indexOf("<!-- ranks:end -->")
  if (begin < 0 || end < begin) throw new Error("no ranks:begin / ranks:end markers")
  const ranks = new Map<string, number>()
  for (const line of markdown.slice(begin, end).split("\n")) {
    const match = /^\|\s*(\d+)\s*\|\s*`([^`]+)`\s*\|/.exec(line)
    if (match === null) continue
    if (ranks.has(match[2]!)) throw new Error(`unit ${match[2]} ranked twice`)
    ranks.set(match[2]!, Number(match[1]))
  }
  return ranks
}

/** The most specific unit of a module: its own path, else its folders from the deepest up, else `(root)`. */
const unitOf = (path: string, ranks: Ranks): string | null => {
  if (ranks.has(path)) return path
  const parts = path.split("/")
  if (parts.length === 1) return ranks.has("(root)") ? "(root)" : null
  for (let n = parts.length - 1; n > 0; n--) {
    const folder = parts.slice(0, n).join("/")
    if (ranks.has(folder)) return folder
  }
  return null
}

/** Every import from a unit to one of equal or higher rank, and every module no row covers. */
const rankViolations = (modules: ReadonlyArray<Module>, ranks: Ranks): Array<string> => {
  const found: Array<string> = []
  for (const module of modules) {
    const from = unitOf(module.path, ranks)
    if (from === null) {
      found.push(`${module.path} has no rank (add its folder to docs/architecture-layers.md)`)
      continue
    }
    for (const target of module.imports) {
      const to = unitOf(target, ranks)
      if (to === null || to === from) continue
      if (ranks.get(to)! >= ranks.get(from)!) {
        found.push(`${module.path} (${from}, rank ${ranks.get(from)}) imports ${target} (${to}, rank ${ranks.get(to)})`)
      }
    }
  }
  return found
}

const readTree = (): Array<Module> => {
  const files = listSources(SRC).map((full) => Path.relative(SRC, full).split(Path.sep).join("/"))
  const known = new Set(files)
  return files.map((path) => parseModule(path, Fs.readFileSync(Path.join(SRC, path), "utf8"), (p) => known.has(p)))
}

describe("dependency direction in src/", () => {
  const modules = readTree()

  it("finds the route modules by their HttpRouter.add and route factory calls (comments do not count)", () => {
    const routes = [...routeModulesOf(modules)]
    expect(routes).toEqual(expect.arrayContaining(KNOWN_ROUTE_MODULES))
    // Server.ts and App.ts mention HttpRouter.add only in comments.
    expect(routes).not.toContain("http/Server.ts")
    expect(routes).not.toContain(COMPOSITION_ROOT)
    // The composition root does mount them, so the imports are read.
    const app = modules.find((m) => m.path === COMPOSITION_ROOT)!
    expect(app.imports).toEqual(expect.arrayContaining(KNOWN_ROUTE_MODULES))
  })

  it("every module imports only its own unit or lower-ranked ones (docs/architecture-layers.md)", () => {
    const ranks = parseRanks(Fs.readFileSync(LAYERS_DOC, "utf8"))
    // The infrastructure named by the issue ranks below every domain folder.
    for (const infrastructure of ["errors", "wire", "store", "runtime", "http"]) {
      for (const domain of ["config", "quota", "auth", "accounts", "byok", "inference", "images", "status"]) {
        expect(ranks.get(infrastructure)!).toBeLessThan(ranks.get(domain)!)
      }
    }
    expect(rankViolations(modules, ranks)).toEqual([])
  })

  it("the rank checker reports an upward import, an import within one rank, and an unranked module", () => {
    const ranks = parseRanks([
      "<!-- ranks:begin -->",
      "| rank | unit | what |",
      "| 0 | `store` | low |",
      "| 0 | `errors` | low |",
      "| 10 | `telemetry/LogText.ts` | a file ranked on its own |",
      "| 20 | `quota` | |",
      "| 30 | `telemetry` | |",
      "| 40 | `(root)` | |",
      "<!-- ranks:end -->",
      "| 99 | `outside` | after the end marker: ignored |"
    ].join("\n"))
    expect(ranks.has("outside")).toBe(false)
    const exists = (p: string) =>
      ["store/Redis.ts", "errors/Catalog.ts", "quota/A.ts", "telemetry/LogText.ts", "telemetry/Rows.ts"].includes(p)
    const modules = [
      parseModule("store/Redis.ts", `import { GatewayError } from "../errors/Catalog.js"`, exists),
      parseModule("quota/A.ts", `import type { Row } from "../telemetry/Rows.js"\nimport { clip } from "../telemetry/LogText.js"`, exists),
      parseModule("telemetry/LogText.ts", `import { A } from "../quota/A.js"`, exists),
      parseModule("telemetry/Rows.ts", `import { clip } from "./LogText.js"\nimport { A } from "../quota/A.js"`, exists),
      parseModule("App.ts", `import { A } from "./quota/A.js"`, exists),
      parseModule("newfolder/X.ts", `export const x = 1`, exists)
    ]
    expect(rankViolations(modules, ranks)).toEqual([
      "store/Redis.ts (store, rank 0) imports errors/Catalog.ts (errors, rank 0)",
      "quota/A.ts (quota, rank 20) imports telemetry/Rows.ts (telemetry, rank 30)",
      "telemetry/LogText.ts (telemetry/LogText.ts, rank 10) imports quota/A.ts (quota, rank 20)",
      "newfolder/X.ts has no rank (add its folder to docs/architecture-layers.md)"
    ])
  })

  it("shared machinery is written once: one AES-GCM sealer, one reader of the config file's YAML", () => {
    const files = listSources(SRC).map((full) => Path.relative(SRC, full).split(Path.sep).join("/"))
    const using = (pattern: RegExp) =>
      files.filter((path) => pattern.test(Fs.readFileSync(Path.join(SRC, path), "utf8"))).sort()
    expect(using(/aes-\d+-gcm|createCipheriv|createDecipheriv/)).toEqual(["store/Sealer.ts"])
    expect(using(/\bparseYaml\(|Yaml\.parse\(/).every((path) => path.startsWith("config/"))).toBe(true)
  })

  it("auth never reaches accounts, and no module but App.ts imports a route module", () => {
    expect(violations(modules)).toEqual([])
  })

  it("the checker reports each kind of violation (so the test above can fail)", () => {
    const exists = (p: string) =>
      ["auth/A.ts", "accounts/Repo.ts", "inference/Route.ts", "x/Y.ts", "x/Index/index.ts", "inference/Factory.ts",
        "inference/Chat.ts", "protocols/Other.ts"].includes(p)
    const modules = [
      parseModule("auth/A.ts", `import type { Row } from "../x/Y.js"`, exists),
      parseModule("x/Y.ts", `export { Repo } from "../accounts/Repo.js"`, exists),
      parseModule("accounts/Repo.ts", `const m = await import("../inference/Route.js")`, exists),
      parseModule("inference/Route.ts", `// HttpRouter.add in a comment\nexport const r = HttpRouter.add("GET", "/", h)`, exists),
      // A factory module is no route module; a module calling the factory when loaded is one.
      parseModule("inference/Factory.ts", `export const route = (p) => HttpRouter.add("POST", p, h)`, exists),
      parseModule("inference/Chat.ts", `import { route } from "./Factory.js"\nexport const chat = route("/c")`, exists),
      parseModule("protocols/Other.ts", `import { route } from "../inference/Factory.js"\nimport { chat } from "../inference/Chat.js"`, exists),
      parseModule("App.ts", `import { r } from "./inference/Route.js"\nimport { chat } from "./inference/Chat.js"`, exists)
    ]
    expect(violations(modules)).toEqual([
      "accounts/Repo.ts imports the route module inference/Route.ts",
      "protocols/Other.ts imports the route module inference/Chat.ts",
      "auth reaches accounts: auth/A.ts -> x/Y.ts -> accounts/Repo.ts"
    ])
    expect(parseModule("z.ts", `/* HttpRouter.add(x) */ const s = "HttpRouter.add("`, exists).addsRoutes).toBe(false)
  })
})
