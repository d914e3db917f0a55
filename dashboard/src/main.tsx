/**
 * The account dashboard: sign-in, then six pages on the account API. Routing by preact-iso (pages other than the
 * overview load on demand, so the first load stays small); a 401 anywhere returns to the sign-in page.
 */
import { render } from "preact"
import type { ComponentChildren } from "preact"
import { useEffect, useErrorBoundary, useState } from "preact/hooks"
import lazy, { ErrorBoundary } from "preact-iso/lazy"
import { LocationProvider, Route, Router, useLocation } from "preact-iso/router"
import { api, ApiError, get, onUnauthorized } from "./api"
import { Overview } from "./pages/Overview"
import { SignIn } from "./pages/SignIn"
import "./styles.css"

const Usage = lazy(() => import("./pages/Usage").then((m) => m.Usage))
const Keys = lazy(() => import("./pages/Keys").then((m) => m.Keys))
const Byok = lazy(() => import("./pages/Byok").then((m) => m.Byok))
const Images = lazy(() => import("./pages/Images").then((m) => m.Images))
const Settings = lazy(() => import("./pages/Settings").then((m) => m.Settings))

export const BASE = "/dashboard"
const SIGN_IN = `${BASE}/sign-in`

const NAV: ReadonlyArray<readonly [string, string]> = [
  [`${BASE}/`, "개요"],
  [`${BASE}/usage`, "사용량"],
  [`${BASE}/keys`, "API 키"],
  [`${BASE}/byok`, "BYOK"],
  [`${BASE}/images`, "이미지"],
  [`${BASE}/settings`, "설정"]
]

type Who = { readonly name: string } | null

const Shell = () => {
  const location = useLocation()
  // undefined: not known yet; null: signed out.
  const [who, setWho] = useState<Who | undefined>(undefined)
  const onSignInPage = location.path === SIGN_IN

  useEffect(() => {
    onUnauthorized(() => {
      setWho(null)
      if (window.location.pathname !== SIGN_IN) location.route(SIGN_IN, true)
    })
    get("/api/user/me").then(
      (me) => setWho({ name: me.profile.displayName || me.profile.username }),
      // Only a 401 means signed out; any other refusal (a legacy account's 403, a rate limit) is shown by the page.
      (e) => setWho((current) => (current !== undefined ? current : e instanceof ApiError && e.status !== 401 && e.status !== 0 ? { name: "" } : null))
    )
  }, [])

  useEffect(() => {
    if (who === null && !onSignInPage) location.route(SIGN_IN, true)
  }, [who, onSignInPage])

  useEffect(() => {
    const title = NAV.find(([path]) => path === location.path)?.[1] ?? (onSignInPage ? "로그인" : "대시보드")
    document.title = `${title} · wellspring`
    // The new page's heading takes the focus, so screen readers announce the page change.
    document.querySelector<HTMLElement>("main h1")?.focus()
  }, [location.path])

  if (who === undefined) {
    return (
      <main id="main" class="loading" aria-busy="true">
        <p>불러오는 중…</p>
      </main>
    )
  }

  if (who === null || onSignInPage) {
    return (
      <SignIn
        onSignedIn={(name) => {
          setWho({ name })
          location.route(`${BASE}/`)
        }}
      />
    )
  }

  const signOut = async () => {
    await api("DELETE", "/api/user/session").catch(() => undefined)
    setWho(null)
    location.route(SIGN_IN)
  }

  return (
    <>
      <a class="skip" href="#main">
        본문으로 건너뛰기
      </a>
      <header class="top">
        <div class="brand">
          <span class="logo" aria-hidden="true">
            ◆
          </span>{" "}
          wellspring
        </div>
        <nav aria-label="대시보드 메뉴">
          <ul>
            {NAV.map(([path, label]) => (
              <li key={path}>
                <a href={path} aria-current={location.path === path ? "page" : undefined}>
                  {label}
                </a>
              </li>
            ))}
          </ul>
        </nav>
        <div class="who">
          <span class="who-name">{who.name}</span>
          <button type="button" onClick={signOut}>
            로그아웃
          </button>
        </div>
      </header>
      <main id="main">
        <PageErrors key={location.path}>
        <ErrorBoundary>
          <Router>
            <Route path={`${BASE}/`} component={Overview} />
            <Route path={`${BASE}/usage`} component={Usage} />
            <Route path={`${BASE}/keys`} component={Keys} />
            <Route path={`${BASE}/byok`} component={Byok} />
            <Route path={`${BASE}/images`} component={Images} />
            <Route path={`${BASE}/settings`} component={Settings} onSignOut={signOut} />
            <Route default component={NotFound} />
          </Router>
        </ErrorBoundary>
        </PageErrors>
      </main>
    </>
  )
}

/** A page that fails to render (or whose code fails to load) shows a Korean note, never a blank page. */
const PageErrors = ({ children }: { children: ComponentChildren }) => {
  const [error, reset] = useErrorBoundary()
  if (error) {
    return (
      <div class="note error" role="alert">
        이 페이지를 표시하지 못했습니다. 새로 고침하거나 잠시 후 다시 시도하세요.{" "}
        <button type="button" onClick={reset}>
          다시 시도
        </button>
      </div>
    )
  }
  return <>{children}</>
}

const NotFound = () => (
  <>
    <h1 tabIndex={-1}>페이지를 찾을 수 없습니다</h1>
    <p>
      <a href={`${BASE}/`}>개요로 돌아가기</a>
    </p>
  </>
)

render(
  <LocationProvider scope={BASE}>
    <Shell />
  </LocationProvider>,
  document.getElementById("app")!
)
