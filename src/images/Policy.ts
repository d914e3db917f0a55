/**
 * The content policy: operator-configured categories of blocked terms (`images.content_policy`), matched on a
 * normalized prompt, so that case, full-width forms, accents, spacing, underscores, hyphens, braces, brackets and
 * weights do not hide a term.
 *
 * Normalization (prompt and terms alike): NFKC, lower case, accents dropped, then only letters and digits are
 * kept (the compact form); every other character is a separator. A term matches a run of the compact form whose
 * ends fall on word edges: where a Latin, Greek or Cyrillic letter or a digit meets another one, a separator must
 * lie between them (so `rape` does not match `grapes`, but matches `r a p e`, `{{rape}}` and `1.2::r_a-p_e::`);
 * next to any other script (Hangul, kana, CJK, which do not space words) no edge is needed.
 *
 * Matching is one Aho-Corasick pass: linear in the prompt, plus at most one check per distinct term length at each
 * position (terms are at most 100 characters). Automata are built once per configured list.
 */
import type { Category } from "../config/Images.js"

/** A prompt in compact form: the kept code points, whether a separator came before each, and their script class. */
export interface Compact {
  readonly chars: ReadonlyArray<number>
  /** `separated[i]`: a separator lies between `chars[i - 1]` and `chars[i]`. */
  readonly separated: ReadonlyArray<boolean>
  /** `spaced[i]`: `chars[i]` belongs to a script that spaces its words (Latin, Greek, Cyrillic) or is a digit. */
  readonly spaced: ReadonlyArray<boolean>
}

const KEPT = /[\p{L}\p{N}]/u
/** Format characters (zero-width spaces and joiners, bidi marks): dropped without counting as a separator. */
const FORMAT = /\p{Cf}/u
const SPACED = /[\p{Script=Latin}\p{Script=Greek}\p{Script=Cyrillic}\p{N}]/u
const MARKS = /\p{M}/gu

/** Case, width and accents folded: NFKC, lower case, combining marks removed. */
export const fold = (text: string): string =>
  text.normalize("NFKC").toLowerCase().normalize("NFD").replace(MARKS, "").normalize("NFC")

export const compact = (text: string): Compact => {
  const chars: Array<number> = []
  const separated: Array<boolean> = []
  const spaced: Array<boolean> = []
  let gap = false
  for (const ch of fold(text)) {
    if (KEPT.test(ch)) {
      chars.push(ch.codePointAt(0)!)
      separated.push(gap)
      spaced.push(SPACED.test(ch))
      gap = false
    } else if (!FORMAT.test(ch)) gap = true
  }
  return { chars, separated, spaced }
}

interface Term {
  readonly category: number
  readonly length: number
  readonly firstSpaced: boolean
  readonly lastSpaced: boolean
}

/** A compiled list of categories: the name of the first blocked category found in a text, or null. */
export interface Matcher {
  readonly find: (text: string) => string | null
}

/** Transition key: node and code point in one number (code points are below 0x110000). */
const edge = (node: number, cp: number) => node * 0x110000 + cp

export const compile = (categories: ReadonlyArray<Category>): Matcher => {
  const goto = new Map<number, number>()
  const children: Array<Array<number>> = [[]]
  /** Term ending at the node, or -1. */
  const output: Array<number> = [-1]
  const terms: Array<Term> = []
  categories.forEach((category, index) => {
    for (const raw of category.terms) {
      const { chars, spaced } = compact(raw)
      if (chars.length === 0) continue
      let node = 0
      for (const cp of chars) {
        const key = edge(node, cp)
        let next = goto.get(key)
        if (next === undefined) {
          next = children.length
          goto.set(key, next)
          children.push([])
          output.push(-1)
          children[node]!.push(cp)
        }
        node = next
      }
      // A term listed twice keeps its first category.
      if (output[node] === -1) {
        output[node] = terms.length
        terms.push({ category: index, length: chars.length, firstSpaced: spaced[0]!, lastSpaced: spaced[spaced.length - 1]! })
      }
    }
  })
  // Failure links and dictionary links (nearest proper suffix node that ends a term), breadth first.
  const fail = new Int32Array(children.length)
  const dict = new Int32Array(children.length).fill(-1)
  const queue: Array<number> = []
  for (const cp of children[0]!) queue.push(goto.get(edge(0, cp))!)
  for (let head = 0; head < queue.length; head++) {
    const node = queue[head]!
    for (const cp of children[node]!) {
      const child = goto.get(edge(node, cp))!
      let f = fail[node]!
      while (f !== 0 && !goto.has(edge(f, cp))) f = fail[f]!
      const target = goto.get(edge(f, cp))
      fail[child] = target !== undefined && target !== child ? target : 0
      dict[child] = output[fail[child]!] !== -1 ? fail[child]! : dict[fail[child]!]!
      queue.push(child)
    }
  }

  const find = (text: string): string | null => {
    if (terms.length === 0) return null
    const { chars, separated, spaced } = compact(text)
    const edgeOk = (neighbour: number, edgeSpaced: boolean, gapAt: number) =>
      neighbour < 0 || neighbour >= chars.length || separated[gapAt]! || !(edgeSpaced && spaced[neighbour]!)
    let node = 0
    for (let i = 0; i < chars.length; i++) {
      const cp = chars[i]!
      while (node !== 0 && !goto.has(edge(node, cp))) node = fail[node]!
      node = goto.get(edge(node, cp)) ?? 0
      for (let o = output[node] !== -1 ? node : dict[node]!; o !== -1; o = dict[o]!) {
        const term = terms[output[o]!]!
        const start = i - term.length + 1
        if (edgeOk(start - 1, term.firstSpaced, start) && edgeOk(i + 1, term.lastSpaced, i + 1)) {
          return categories[term.category]!.name
        }
      }
    }
    return null
  }
  return { find }
}

const compiled = new WeakMap<ReadonlyArray<Category>, Matcher>()

/** The matcher of a configured list, built on first use. */
export const matcherFor = (categories: ReadonlyArray<Category>): Matcher => {
  let matcher = compiled.get(categories)
  if (matcher === undefined) {
    matcher = compile(categories)
    compiled.set(categories, matcher)
  }
  return matcher
}

export interface PolicyConfig {
  readonly blocked: ReadonlyArray<Category>
  readonly safe_mode_blocked: ReadonlyArray<Category>
}

/**
 * The blocked category a prompt falls in, or null: `blocked` for everyone, `safe_mode_blocked` too for accounts in
 * safe mode. Negative prompts are not checked (they name what the image must not show).
 */
export const blockedCategory = (policy: PolicyConfig, safeMode: boolean, text: string): string | null =>
  matcherFor(policy.blocked).find(text) ?? (safeMode ? matcherFor(policy.safe_mode_blocked).find(text) : null)
