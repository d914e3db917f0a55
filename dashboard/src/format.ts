/** Korean number, date and duration texts. */

const integer = new Intl.NumberFormat("ko-KR", { maximumFractionDigits: 0 })
const decimal = new Intl.NumberFormat("ko-KR", { maximumFractionDigits: 1 })
const dateTime = new Intl.DateTimeFormat("ko-KR", { dateStyle: "medium", timeStyle: "short" })

export const num = (value: number | null | undefined): string => (value === null || value === undefined ? "—" : integer.format(value))
export const dec = (value: number | null | undefined): string => (value === null || value === undefined ? "—" : decimal.format(value))
export const pct = (fraction: number | null | undefined): string =>
  fraction === null || fraction === undefined ? "—" : `${decimal.format(fraction * 100)}%`
export const ms = (value: number | null | undefined): string => (value === null || value === undefined ? "—" : `${integer.format(value)}ms`)

export const when = (value: string | number | null | undefined): string => {
  if (value === null || value === undefined) return "—"
  const date = new Date(value)
  return Number.isNaN(date.getTime()) ? "—" : dateTime.format(date)
}

/** `1일 2시간 3분 4초`, leading zero units left out. */
export const duration = (seconds: number): string => {
  const s = Math.max(0, Math.floor(seconds))
  const parts: Array<string> = []
  const d = Math.floor(s / 86400)
  const h = Math.floor((s % 86400) / 3600)
  const m = Math.floor((s % 3600) / 60)
  if (d > 0) parts.push(`${d}일`)
  if (d > 0 || h > 0) parts.push(`${h}시간`)
  if (d > 0 || h > 0 || m > 0) parts.push(`${m}분`)
  parts.push(`${s % 60}초`)
  return parts.join(" ")
}

export const STATUS_TEXT: Record<string, string> = {
  success: "성공",
  error: "오류",
  cancelled: "취소됨",
  active: "정상",
  rejected: "거부됨"
}
