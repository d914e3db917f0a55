/**
 * A strict reader of the Prometheus text exposition format 0.0.4, following the format's rules as the Prometheus
 * documentation states them ("Exposition formats", text format details), for tests: it throws on the first
 * violation instead of guessing. npm's `parse-prometheus-text-format` (unmaintained since 2019) merges the series
 * of a labelled histogram and drops their `_sum` / `_count`, so it cannot check what the gateway exposes.
 *
 * Checked: line grammar (metric and label names, quoted and escaped label values, float values with `+Inf`, `-Inf`,
 * `NaN`, optional integer timestamp); `# HELP` / `# TYPE` at most once per family, `# TYPE` before its samples;
 * each family's lines contiguous; no duplicate series; no duplicate or reserved (`__`) label names; counters
 * non-negative; histograms: `_bucket` lines with an `le` label, cumulative counts never decreasing, a `+Inf` bucket
 * equal to `_count`, and `_sum` and `_count` for every label set; the text ends with a newline.
 */

export type MetricType = "counter" | "gauge" | "histogram" | "summary" | "untyped"

export interface Sample {
  /** The name as written (`x_bucket`, `x_sum`, ...). */
  readonly name: string
  readonly labels: Readonly<Record<string, string>>
  readonly value: number
}

export interface Family {
  readonly name: string
  readonly type: MetricType
  readonly help: string | undefined
  readonly samples: ReadonlyArray<Sample>
}

export interface HistogramSeries {
  /** The series' labels without `le`. */
  readonly labels: Readonly<Record<string, string>>
  /** Upper bound (`+Inf` as Infinity) to cumulative count, in order. */
  readonly buckets: ReadonlyArray<readonly [number, number]>
  readonly sum: number
  readonly count: number
}

const METRIC_NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*$/
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*$/
const TYPES = new Set<MetricType>(["counter", "gauge", "histogram", "summary", "untyped"])

export class ExpositionError extends Error {}

const fail = (line: number, message: string): never => {
  throw new ExpositionError(`line ${line}: ${message}`)
}

const parseValue = (text: string, line: number): number => {
  if (text === "+Inf" || text === "Inf") return Infinity
  if (text === "-Inf") return -Infinity
  if (text === "NaN") return NaN
  if (!/^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/.test(text)) fail(line, `not a float: ${JSON.stringify(text)}`)
  return Number(text)
}

/** One sample line: name, optional label set, value, optional timestamp. */
const parseSample = (text: string, line: number): Sample => {
  let i = 0
  const nameMatch = /^[^{\s]+/.exec(text)
  if (!nameMatch) fail(line, "missing metric name")
  const name = nameMatch![0]
  if (!METRIC_NAME.test(name)) fail(line, `invalid metric name ${JSON.stringify(name)}`)
  i = name.length
  const labels: Record<string, string> = {}
  if (text[i] === "{") {
    i++
    for (;;) {
      if (text[i] === "}") {
        i++
        break
      }
      const labelMatch = /^[^=]*/.exec(text.slice(i))![0]
      if (!LABEL_NAME.test(labelMatch)) fail(line, `invalid label name ${JSON.stringify(labelMatch)}`)
      if (labelMatch.startsWith("__")) fail(line, `reserved label name ${labelMatch}`)
      if (labelMatch in labels) fail(line, `label ${labelMatch} given twice`)
      i += labelMatch.length
      if (text[i] !== "=" || text[i + 1] !== "\"") fail(line, `label ${labelMatch}: expected ="`)
      i += 2
      let value = ""
      for (;;) {
        const c = text[i]
        if (c === undefined) fail(line, "unterminated label value")
        if (c === "\"") break
        if (c === "\\") {
          const next = text[i + 1]
          if (next === "\\") value += "\\"
          else if (next === "\"") value += "\""
          else if (next === "n") value += "\n"
          else fail(line, `invalid escape \\${next}`)
          i += 2
          continue
        }
        if (c === "\n") fail(line, "raw newline in label value")
        value += c
        i++
      }
      i++
      labels[labelMatch] = value
      if (text[i] === ",") i++
      else if (text[i] !== "}") fail(line, "expected , or } after a label")
    }
  }
  const rest = text.slice(i)
  if (!/^[ \t]/.test(rest)) fail(line, "expected a space before the value")
  const parts = rest.trim().split(/[ \t]+/)
  if (parts.length < 1 || parts.length > 2) fail(line, "expected a value and an optional timestamp")
  if (parts.length === 2 && !/^-?\d+$/.test(parts[1]!)) fail(line, `invalid timestamp ${parts[1]}`)
  return { name, labels, value: parseValue(parts[0]!, line) }
}

/** The family a sample belongs to: its own name, or the histogram / summary it is a part of. */
const familyOf = (sample: string, types: ReadonlyMap<string, MetricType>): string => {
  for (const suffix of ["_bucket", "_sum", "_count"]) {
    if (!sample.endsWith(suffix)) continue
    const base = sample.slice(0, -suffix.length)
    const type = types.get(base)
    if (type === "histogram" || (type === "summary" && suffix !== "_bucket")) return base
  }
  return sample
}

const seriesKey = (name: string, labels: Readonly<Record<string, string>>) =>
  JSON.stringify([name, Object.entries(labels).sort(([a], [b]) => (a < b ? -1 : 1))])

/** Parses and checks a whole exposition; throws ExpositionError naming the first violation. */
export const parseExposition = (text: string): ReadonlyMap<string, Family> => {
  if (text.length > 0 && !text.endsWith("\n")) throw new ExpositionError("the text does not end with a newline")
  const families = new Map<string, { type: MetricType; help: string | undefined; samples: Array<Sample> }>()
  const types = new Map<string, MetricType>()
  const closed = new Set<string>()
  const series = new Set<string>()
  let current: string | null = null
  const enter = (name: string, line: number) => {
    if (current === name) return
    if (closed.has(name)) fail(line, `the lines of ${name} are not contiguous`)
    if (current !== null) closed.add(current)
    current = name
  }
  const family = (name: string) => {
    let f = families.get(name)
    if (f === undefined) {
      f = { type: types.get(name) ?? "untyped", help: undefined, samples: [] }
      families.set(name, f)
    }
    return f
  }
  const lines = text.split("\n")
  lines.pop()
  lines.forEach((raw, index) => {
    const line = index + 1
    if (raw.trim() === "") return
    if (raw.startsWith("#")) {
      const meta = /^#[ \t]+(HELP|TYPE)[ \t]+(\S+)(?:[ \t](.*))?$/.exec(raw)
      if (meta === null) return // a comment
      const [, keyword, name, rest = ""] = meta
      if (!METRIC_NAME.test(name!)) fail(line, `invalid metric name ${JSON.stringify(name)}`)
      enter(name!, line)
      const f = family(name!)
      if (keyword === "HELP") {
        if (f.help !== undefined) fail(line, `second HELP for ${name}`)
        if (/\\[^\\n]/.test(rest.replace(/\\\\/g, ""))) fail(line, "invalid escape in HELP")
        f.help = rest.replace(/\\n/g, "\n").replace(/\\\\/g, "\\")
      } else {
        if (types.has(name!)) fail(line, `second TYPE for ${name}`)
        if (f.samples.length > 0) fail(line, `TYPE for ${name} after its samples`)
        if (!TYPES.has(rest.trim() as MetricType)) fail(line, `unknown type ${JSON.stringify(rest)}`)
        types.set(name!, rest.trim() as MetricType)
        f.type = rest.trim() as MetricType
      }
      return
    }
    const sample = parseSample(raw, line)
    const name = familyOf(sample.name, types)
    enter(name, line)
    const key = seriesKey(sample.name, sample.labels)
    if (series.has(key)) fail(line, `duplicate series ${sample.name}${JSON.stringify(sample.labels)}`)
    series.add(key)
    const f = family(name)
    if (f.type === "counter" && !(sample.value >= 0)) fail(line, `counter ${name} is negative or NaN`)
    if (f.type === "histogram" && sample.name === `${name}_bucket` && !("le" in sample.labels)) {
      fail(line, `bucket of ${name} without le`)
    }
    if (f.type === "histogram" && sample.name === name) fail(line, `histogram ${name} has a bare sample`)
    f.samples.push(sample)
  })
  const result = new Map<string, Family>()
  for (const [name, f] of families) {
    const done: Family = { name, type: f.type, help: f.help, samples: f.samples }
    if (f.type === "histogram") histograms(done) // checks its rules
    result.set(name, done)
  }
  return result
}

/** The series of a histogram family, checked: cumulative buckets, `+Inf` = `_count`, `_sum` and `_count` present. */
export const histograms = (family: Family): ReadonlyArray<HistogramSeries> => {
  const bySet = new Map<string, { labels: Record<string, string>; buckets: Array<[number, number]>; sum?: number; count?: number }>()
  for (const sample of family.samples) {
    const { le, ...labels } = sample.labels
    const key = seriesKey("", labels)
    let entry = bySet.get(key)
    if (entry === undefined) {
      entry = { labels, buckets: [] }
      bySet.set(key, entry)
    }
    if (sample.name === `${family.name}_bucket`) entry.buckets.push([parseValue(le!, 0), sample.value])
    else if (sample.name === `${family.name}_sum`) entry.sum = sample.value
    else if (sample.name === `${family.name}_count`) entry.count = sample.value
  }
  return [...bySet.values()].map((entry) => {
    const where = `${family.name}${JSON.stringify(entry.labels)}`
    if (entry.sum === undefined || entry.count === undefined) throw new ExpositionError(`${where}: missing _sum or _count`)
    const buckets = [...entry.buckets].sort(([a], [b]) => a - b)
    if (buckets.length === 0 || buckets[buckets.length - 1]![0] !== Infinity) {
      throw new ExpositionError(`${where}: no +Inf bucket`)
    }
    for (let i = 1; i < buckets.length; i++) {
      if (buckets[i]![1] < buckets[i - 1]![1]) throw new ExpositionError(`${where}: bucket counts decrease`)
    }
    if (buckets[buckets.length - 1]![1] !== entry.count) throw new ExpositionError(`${where}: +Inf bucket is not _count`)
    return { labels: entry.labels, buckets, sum: entry.sum, count: entry.count }
  })
}
