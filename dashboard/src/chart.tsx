/** uPlot charts: a time series, and bars over named categories. */
import { useEffect, useRef } from "preact/hooks"
import uPlot from "uplot"
import "uplot/dist/uPlot.min.css"

export interface Series {
  readonly label: string
  readonly color: string
}

const widthOf = (ref: { current: HTMLElement | null }, fallback = 600) => () => Math.max(240, ref.current?.clientWidth ?? fallback)

/** Keeps a uPlot instance in `ref` sized to its container; rebuilt when `data` or `options` change. */
const usePlot = (make: (width: number) => uPlot.Options, data: uPlot.AlignedData, key: string) => {
  const host = useRef<HTMLDivElement>(null)
  useEffect(() => {
    const el = host.current
    if (el === null) return
    const width = widthOf(host)
    const plot = new uPlot(make(width()), data, el)
    const observer = new ResizeObserver(() => plot.setSize({ width: width(), height: plot.height }))
    observer.observe(el)
    return () => {
      observer.disconnect()
      plot.destroy()
    }
  }, [key])
  return host
}

const clock = new Intl.DateTimeFormat("ko-KR", { hour: "2-digit", minute: "2-digit", hour12: false })
const day = new Intl.DateTimeFormat("ko-KR", { month: "numeric", day: "numeric" })
const full = new Intl.DateTimeFormat("ko-KR", { month: "numeric", day: "numeric", hour: "2-digit", minute: "2-digit", hour12: false })

/** Lines over time (`x` in epoch seconds); times in Korean form, days when the span is over two days. */
export const TimeChart = ({ title, x, series, values }: {
  title: string
  x: ReadonlyArray<number>
  series: ReadonlyArray<Series>
  values: ReadonlyArray<ReadonlyArray<number>>
}) => {
  const data = [x as number[], ...(values as number[][])] as uPlot.AlignedData
  const host = usePlot(
    (width) => ({
      width,
      height: 220,
      series: [
        { label: "시각", value: (_u: uPlot, v: number | null) => (v === null ? "—" : full.format(new Date(v * 1000))) },
        ...series.map((s) => ({ label: s.label, stroke: s.color, width: 2, points: { show: false } }))
      ],
      axes: [
        {
          values: (_u: uPlot, splits: Array<number>) => {
            const span = splits.length > 1 ? splits[splits.length - 1]! - splits[0]! : 0
            return splits.map((v) => (span > 2 * 86400 ? day : clock).format(new Date(v * 1000)))
          }
        },
        { size: 60 }
      ],
      legend: { show: true },
      cursor: { drag: { x: false, y: false } }
    }),
    data,
    JSON.stringify(data)
  )
  return (
    <figure class="chart">
      <figcaption>{title}</figcaption>
      <div ref={host} role="img" aria-label={`${title} 시계열 차트`} />
    </figure>
  )
}

/** Bars over named categories, one series; the category names are the x-axis labels. */
export const BarChart = ({ title, labels, values, color, unit }: {
  title: string
  labels: ReadonlyArray<string>
  values: ReadonlyArray<number | null>
  color: string
  unit: string
}) => {
  const xs = labels.map((_, i) => i)
  const data = [xs, values as Array<number | null>] as uPlot.AlignedData
  const summary = labels.map((label, i) => `${label} ${values[i] === null ? "없음" : `${values[i]}${unit}`}`).join(", ")
  const host = usePlot(
    (width) => ({
      width,
      height: 200,
      scales: { x: { time: false, range: [-0.5, labels.length - 0.5] }, y: { range: (_u, _min, max) => [0, Math.max(1, max) * 1.1] } },
      series: [
        {},
        {
          label: title,
          fill: color,
          stroke: color,
          paths: uPlot.paths.bars!({ size: [0.6, 80] }),
          points: { show: false }
        }
      ],
      axes: [
        { splits: () => xs, values: (_u, splits) => splits.map((i) => labels[i] ?? "") , gap: 4 },
        { size: 60, values: (_u, splits) => splits.map((v) => `${v}${unit}`) }
      ],
      legend: { show: false },
      cursor: { show: false }
    }),
    data,
    JSON.stringify(data) + labels.join("|")
  )
  return (
    <figure class="chart">
      <figcaption>{title}</figcaption>
      <div ref={host} role="img" aria-label={`${title}: ${summary}`} />
    </figure>
  )
}
