/** Shared pieces of the pages: data loading, error and status notes, confirmation, copying. */
import type { ComponentChildren } from "preact"
import { useCallback, useEffect, useRef, useState } from "preact/hooks"
import { ApiError } from "./api"

export interface Loaded<T> {
  readonly data: T | null
  readonly error: string | null
  readonly loading: boolean
  readonly reload: () => Promise<void>
}

/** Runs `load` now, when `deps` change, and on `reload()`; keeps the last data while reloading. */
export const useLoad = <T,>(load: () => Promise<T>, deps: ReadonlyArray<unknown> = []): Loaded<T> => {
  const [data, setData] = useState<T | null>(null)
  const [error, setError] = useState<string | null>(null)
  const [loading, setLoading] = useState(true)
  const latest = useRef(0)
  const reload = useCallback(async () => {
    const run = ++latest.current
    setLoading(true)
    try {
      const value = await load()
      if (run === latest.current) {
        setData(value)
        setError(null)
      }
    } catch (e) {
      if (run === latest.current) setError(errorText(e))
    } finally {
      if (run === latest.current) setLoading(false)
    }
  }, deps)
  useEffect(() => {
    void reload()
  }, [reload])
  return { data, error, loading, reload }
}

export const errorText = (e: unknown): string =>
  e instanceof ApiError ? e.message : "알 수 없는 오류가 발생했습니다. 페이지를 새로 고쳐 주세요."

/** The current time, ticking every second (countdowns). */
export const useNow = (): number => {
  const [now, setNow] = useState(() => Date.now())
  useEffect(() => {
    const timer = setInterval(() => setNow(Date.now()), 1000)
    return () => clearInterval(timer)
  }, [])
  return now
}

/** Runs an action, keeping its error and a success note; `busy` while it runs. */
export const useAction = () => {
  const [busy, setBusy] = useState(false)
  const [error, setError] = useState<string | null>(null)
  const [note, setNote] = useState<string | null>(null)
  const run = async <T,>(action: () => Promise<T>, success?: string | ((value: T) => string)): Promise<T | null> => {
    setBusy(true)
    setError(null)
    setNote(null)
    try {
      const value = await action()
      if (success !== undefined) setNote(typeof success === "string" ? success : success(value))
      return value
    } catch (e) {
      setError(errorText(e))
      return null
    } finally {
      setBusy(false)
    }
  }
  return { busy, error, note, run, setError, setNote }
}

export const ErrorNote = ({ message }: { message: string | null }) =>
  message === null ? null : (
    <p class="note error" role="alert">
      {message}
    </p>
  )

export const Note = ({ message }: { message: string | null }) =>
  message === null ? null : (
    <p class="note ok" role="status">
      {message}
    </p>
  )

export const Section = ({ title, id, children, actions }: {
  title: string
  id: string
  children: ComponentChildren
  actions?: ComponentChildren
}) => (
  <section class="card" aria-labelledby={id}>
    <div class="card-head">
      <h2 id={id}>{title}</h2>
      {actions}
    </div>
    {children}
  </section>
)

/** A scrollable table region that keyboard users can reach. */
export const TableWrap = ({ label, children }: { label: string; children: ComponentChildren }) => (
  <div class="table-wrap" role="region" aria-label={label} tabIndex={0}>
    {children}
  </div>
)

/** A button that asks once more before acting (`question` is shown with 확인 / 취소). */
export const ConfirmButton = ({ label, question, confirmLabel, onConfirm, disabled, danger }: {
  label: string
  question: string
  confirmLabel?: string
  onConfirm: () => void | Promise<void>
  disabled?: boolean
  danger?: boolean
}) => {
  const [asking, setAsking] = useState(false)
  const yes = useRef<HTMLButtonElement>(null)
  useEffect(() => {
    if (asking) yes.current?.focus()
  }, [asking])
  if (!asking) {
    return (
      <button type="button" class={danger ? "danger" : ""} disabled={disabled} onClick={() => setAsking(true)}>
        {label}
      </button>
    )
  }
  return (
    <span class="confirm" role="group" aria-label={question}>
      <span class="confirm-text">{question}</span>
      <button
        ref={yes}
        type="button"
        class="danger"
        onClick={async () => {
          setAsking(false)
          await onConfirm()
        }}
      >
        {confirmLabel ?? "확인"}
      </button>
      <button type="button" onClick={() => setAsking(false)}>
        취소
      </button>
    </span>
  )
}

export const CopyButton = ({ text, label }: { text: string; label: string }) => {
  const [done, setDone] = useState<string | null>(null)
  return (
    <>
      <button
        type="button"
        aria-label={label}
        onClick={async () => {
          try {
            await navigator.clipboard.writeText(text)
            setDone("복사했습니다.")
          } catch {
            setDone("복사하지 못했습니다. 직접 선택해 복사하세요.")
          }
        }}
      >
        복사
      </button>
      <span class="sr-status" role="status">
        {done}
      </span>
    </>
  )
}

/** A secret shown once, selectable, with a copy button. */
export const SecretBox = ({ title, secret, children }: { title: string; secret: string; children?: ComponentChildren }) => (
  <div class="secret" role="group" aria-label={title}>
    <p class="secret-title">{title}</p>
    <div class="secret-row">
      <code class="secret-value" data-testid="secret">
        {secret}
      </code>
      <CopyButton text={secret} label={`${title} 복사`} />
    </div>
    {children}
  </div>
)
