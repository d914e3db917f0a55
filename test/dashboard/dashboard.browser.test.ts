/**
 * Issue 21, the proof: the account dashboard in a real browser (Debian's chromium driven by playwright-core) on a
 * gateway started here on the embedded database (PGlite), with a fake BYOK provider and the embedded simulated
 * image worker. One sequence, as a member would use it: sign in with the first-start key; the quota bars move after
 * a chat request; a key is created, revealed and deleted; all keys are rotated and the old key stops working;
 * a BYOK credential is verified against the fake provider and saved; a preset is created and an image generated
 * into the gallery; safe mode is switched on (and blocks a term); a second session is revoked from settings; a
 * change sent from a foreign origin is refused; a lost session returns to sign-in; sign-out ends the session.
 *
 * Every page is screenshotted to test-artifacts/dashboard/ and scanned by axe-core (no serious or critical
 * violation); the page's Content-Security-Policy is live the whole time, and any violation or page error fails the
 * test. The overview's first load is measured (JavaScript gzipped, time until it shows data) and written to
 * test-artifacts/dashboard/budgets.json; docs/dashboard.md records the figures.
 *
 * Skipped only when /usr/bin/chromium is missing and GATEWAY_REQUIRE_SERVICES is not set (CI installs it).
 */
import { spawnSync } from "node:child_process"
import * as Fs from "node:fs"
import * as Http from "node:http"
import type { AddressInfo } from "node:net"
import * as Path from "node:path"
import * as Zlib from "node:zlib"
import { type Browser, type BrowserContext, chromium, type Page } from "playwright-core"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type FakeProviders, GOOD, startFakeProviders } from "../byok/support.js"
import { startGateway, type TestGateway } from "../support/Gateway.js"
import { requireServices } from "../support/Services.js"

const CHROMIUM = "/usr/bin/chromium"
const hasChromium = Fs.existsSync(CHROMIUM)
if (!hasChromium && requireServices) throw new Error(`${CHROMIUM} is required (GATEWAY_REQUIRE_SERVICES=1): apt-get install -y chromium`)
const ARTIFACTS = Path.resolve("test-artifacts/dashboard")
const DIST = Path.resolve("dashboard/dist/index.html")

/** Builds the dashboard when there is no build or its sources are newer than it (a fresh clone has one from `npm install`). */
const ensureBuilt = () => {
  const newest = (dir: string): number =>
    Fs.readdirSync(dir, { withFileTypes: true }).reduce((latest, entry) => {
      const path = Path.join(dir, entry.name)
      return Math.max(latest, entry.isDirectory() ? newest(path) : Fs.statSync(path).mtimeMs)
    }, 0)
  const sources = Math.max(newest(Path.resolve("dashboard/src")), Fs.statSync(Path.resolve("dashboard/index.html")).mtimeMs)
  if (Fs.existsSync(DIST) && Fs.statSync(DIST).mtimeMs >= sources) return
  const build = spawnSync(process.execPath, ["dashboard/prepare.mjs"], { encoding: "utf8" })
  if (build.status !== 0 || !Fs.existsSync(DIST)) throw new Error(`dashboard build failed: ${build.stderr}`)
}

/** A page on another origin (another port of 127.0.0.1: same site, other origin) that tries changes on the gateway. */
const startForeignSite = async () => {
  const server = Http.createServer((_req, res) => {
    res.writeHead(200, { "content-type": "text/html; charset=utf-8" })
    res.end("<!doctype html><html lang=\"en\"><title>elsewhere</title><p>another site</p></html>")
  })
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/`,
    close: () => new Promise<void>((resolve) => server.close(() => resolve()))
  }
}

describe.skipIf(!hasChromium)(`account dashboard in ${CHROMIUM} (skipped when it is not installed)`, () => {
  let gw: TestGateway
  let fakes: FakeProviders
  let foreign: Awaited<ReturnType<typeof startForeignSite>>
  let browser: Browser
  let context: BrowserContext
  let page: Page
  /** The account's working key: the first-start key until the rotation. */
  let key = ""
  const problems: Array<string> = []
  const axeSource = Fs.readFileSync(Path.resolve("node_modules/axe-core/axe.min.js"), "utf8")

  const api = async (path: string, init: RequestInit & { bearer?: string; cookie?: string } = {}) => {
    const headers: Record<string, string> = { ...(init.headers as Record<string, string> | undefined) }
    if (init.bearer) headers.authorization = `Bearer ${init.bearer}`
    if (init.cookie) headers.cookie = `ws-session=${init.cookie}`
    const res = await fetch(`${gw.url}${path}`, { ...init, headers })
    const text = await res.text()
    return { status: res.status, body: text ? JSON.parse(text) : null, headers: res.headers }
  }
  const chat = (bearer: string) =>
    api("/v1/chat/completions", {
      method: "POST",
      bearer,
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "ws-lite", messages: [{ role: "user", content: "안녕하세요, 길게 답해 주세요." }], max_tokens: 400 })
    })
  /** Signs in over HTTP as the dashboard does, returning the session token. */
  const signInToken = async (apiKey: string) => {
    const r = await api("/api/user/session", {
      method: "POST",
      headers: { "content-type": "application/json", origin: gw.url },
      body: JSON.stringify({ api_key: apiKey })
    })
    expect(r.status).toBe(200)
    return /ws-session=([^;]+)/.exec(r.headers.get("set-cookie")!)![1]!
  }
  const sessionCookie = async () => (await context.cookies(gw.url + "/api/user")).find((c) => c.name === "ws-session")

  const watch = (p: Page) => {
    p.on("console", (message) => {
      const text = message.text()
      // The API's refusals (401 after sign-out, 400 of a blocked prompt) are logged by the browser as failed loads:
      // expected here, and each is asserted on the page. Anything else (a CSP violation above all) is a problem.
      if (/^Failed to load resource: the server responded with a status of 4\d\d/.test(text)) return
      if (message.type() === "error" || /Content Security Policy/i.test(text)) problems.push(`${p.url()}: ${text}`)
    })
    p.on("pageerror", (error) => problems.push(`${p.url()}: ${String(error)}`))
  }

  /** axe-core injected into the page; no serious or critical violations. */
  const scan = async (name: string) => {
    await page.evaluate(axeSource)
    const violations = await page.evaluate(async () => {
      const axe = (globalThis as any).axe
      const result = await axe.run((globalThis as any).document, { resultTypes: ["violations"] })
      return result.violations.map((v: any) => ({ id: v.id, impact: v.impact, help: v.help, nodes: v.nodes.map((n: any) => n.target.join(" ")).slice(0, 5) }))
    }) as Array<{ id: string; impact: string; help: string; nodes: Array<string> }>
    const bad = violations.filter((v) => v.impact === "serious" || v.impact === "critical")
    expect(bad, `${name}: ${JSON.stringify(bad, null, 1)}`).toEqual([])
  }
  const shoot = (name: string, target: Page = page) => target.screenshot({ path: Path.join(ARTIFACTS, `${name}.png`), fullPage: true })
  /** The nav link of a page: keyboard-reachable links named by their text. */
  const go = async (name: string, heading: string) => {
    await page.getByRole("navigation", { name: "대시보드 메뉴" }).getByRole("link", { name, exact: true }).click()
    await page.getByRole("heading", { level: 1, name: heading }).waitFor()
  }

  beforeAll(async () => {
    ensureBuilt()
    fakes = await startFakeProviders()
    foreign = await startForeignSite()
    gw = await startGateway({
      configure: (doc) => {
        doc.request_log = { batch_size: 100, flush_ms: 50 }
        // A small session window, so that one chat request visibly moves the bar.
        doc.plans.default.session_limit = 20_000
        doc.plans.default.weekly_limit = 200_000
        doc.byok = {
          http_allowlist: [fakes.origin],
          providers: { openai: { base_url: `${fakes.origin}/openai/v1` }, anthropic: { base_url: `${fakes.origin}/anthropic/v1` } }
        }
        doc.images = {
          simulated: { latency_ms: 100 },
          content_policy: { safe_mode_blocked: [{ name: "성인", terms: ["nsfw"] }] }
        }
      }
    })
    key = gw.key
    browser = await chromium.launch({
      executablePath: CHROMIUM,
      args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"]
    })
    context = await browser.newContext({ viewport: { width: 1280, height: 900 }, locale: "ko-KR", timezoneId: "Asia/Seoul" })
    await context.grantPermissions(["clipboard-read", "clipboard-write"], { origin: gw.url })
    page = await context.newPage()
    watch(page)
    Fs.mkdirSync(ARTIFACTS, { recursive: true })
  }, 120_000)

  afterAll(async () => {
    await browser?.close()
    await gw?.stop()
    await fakes?.close()
    await foreign?.close()
  })

  it("serves the build under /dashboard/ with hashed, immutable assets and a strict CSP", async () => {
    const index = await fetch(`${gw.url}/dashboard/keys`)
    const html = await index.text()
    expect(index.status).toBe(200)
    expect(index.headers.get("cache-control")).toBe("no-cache")
    const csp = index.headers.get("content-security-policy")!
    expect(csp).toContain("script-src 'self'")
    expect(csp).not.toContain("unsafe-inline")
    expect(html).not.toMatch(/<script(?![^>]*\bsrc=)[^>]*>/)
    const asset = /src="(\/dashboard\/assets\/index-[\w-]+\.js)"/.exec(html)![1]!
    const js = await fetch(`${gw.url}${asset}`, { headers: { "accept-encoding": "gzip" } })
    await js.arrayBuffer()
    expect(js.headers.get("cache-control")).toBe("public, max-age=31536000, immutable")
    expect(js.headers.get("content-type")).toContain("text/javascript")
    expect((await fetch(`${gw.url}/dashboard/assets/missing-abc.js`)).status).toBe(404)
    const again = await fetch(`${gw.url}/dashboard/`, { headers: { "if-none-match": index.headers.get("etag")! } })
    expect(again.status).toBe(304)
  })

  it("signs in with the first-start key from the keyboard (a wrong key gets a Korean message)", async () => {
    await page.goto(`${gw.url}/dashboard/`)
    await page.waitForURL(/\/dashboard\/sign-in$/)
    await page.getByRole("heading", { name: "wellspring 로그인" }).waitFor()
    await scan("sign-in")
    await shoot("sign-in")

    await page.getByLabel("API 키").fill("sk-ws-wrongwrongwrongwrongwrongwrongwrongwrong")
    await page.getByRole("button", { name: "로그인" }).click()
    await expect.poll(() => page.getByRole("alert").textContent()).toContain("API 키가 올바르지 않거나 폐기되었습니다")
    expect(await sessionCookie()).toBeUndefined()

    // Keyboard only: Tab to the field, type, Enter.
    await page.getByLabel("API 키").fill("")
    await page.keyboard.press("Tab")
    await page.getByLabel("API 키").focus()
    await page.keyboard.type(key)
    await page.keyboard.press("Enter")
    await page.getByRole("heading", { level: 1, name: "개요" }).waitFor()
    expect(page.url()).toBe(`${gw.url}/dashboard/`)
    const cookie = (await sessionCookie())!
    expect(cookie).toMatchObject({ httpOnly: true, sameSite: "Lax", path: "/api/user", secure: false })
    // A week from now, give or take a minute.
    expect(Math.abs(cookie.expires * 1000 - (Date.now() + 7 * 24 * 3600_000))).toBeLessThan(60_000)
  })

  it("overview: the quota bars move after a chat request, with a live reset countdown", async () => {
    const bar = page.getByTestId("quota-session")
    await bar.waitFor()
    const before = Number(await bar.getAttribute("data-pct"))
    expect((await chat(key)).status).toBe(200)
    // The request row is written behind the answer (request_log.flush_ms): refresh until it shows.
    await expect.poll(async () => {
      await page.getByRole("button", { name: "새로 고침" }).click()
      return page.getByTestId("total-requests").textContent()
    }, { timeout: 10_000 }).toBe("1")
    expect(Number(await bar.getAttribute("data-pct"))).toBeGreaterThan(before)
    const weekly = Number(await page.getByTestId("quota-weekly").getAttribute("data-pct"))
    expect(weekly).toBeGreaterThan(0)
    const progress = page.getByRole("progressbar", { name: "세션 한도" })
    expect(Number(await progress.getAttribute("aria-valuenow"))).toBeGreaterThan(0)
    // The countdown ticks on its own.
    const countdown = bar.locator(".countdown")
    const first = await countdown.textContent()
    expect(first).toMatch(/^(4시간 \d+분|5시간 0분) \d+초$/)
    await expect.poll(() => countdown.textContent(), { timeout: 5_000 }).not.toBe(first)
    expect(await page.getByRole("region", { name: "최근 요청 표" }).locator("tbody tr").count()).toBe(1)
    await scan("overview")
    await shoot("overview")
  })

  it("usage: charts of the metrics, range and model filters, the request table with its limit", async () => {
    for (let i = 0; i < 2; i++) expect((await chat(key)).status).toBe(200)
    // Request rows are written behind the answers: wait until the API has all three, then open the page.
    await expect.poll(async () => (await api("/api/user/me/requests", { bearer: key })).body.requests.length).toBe(3)
    await go("사용량", "사용량")
    await expect.poll(() => page.getByTestId("metric-requests").textContent()).toBe("3")
    // uPlot draws on canvases: two time series and four bar charts.
    await expect.poll(() => page.locator("figure.chart canvas").count()).toBe(6)
    await page.getByLabel("기간").selectOption("1h")
    await page.getByLabel("모델", { exact: true }).selectOption("ws-lite")
    await expect.poll(() => page.getByTestId("metric-requests").textContent()).toBe("3")
    await page.getByLabel("표시 개수").selectOption("10")
    await expect.poll(() => page.getByTestId("requests-table").locator("tbody tr").count()).toBe(3)
    await scan("usage")
    await shoot("usage")
  })

  it("API keys: create (shown once, copyable), reveal, delete; rotate all and the old key stops working", async () => {
    await go("API 키", "API 키")
    await page.getByLabel("키 이름").fill("노트북")
    await page.getByRole("button", { name: "키 만들기" }).click()
    const secret = page.getByTestId("secret")
    await secret.waitFor()
    const created = (await secret.textContent())!
    expect(created).toMatch(/^sk-ws-/)
    await page.getByRole("button", { name: "새 API 키 (지금만 표시됩니다) 복사" }).click()
    expect(await page.evaluate(() => (globalThis as any).navigator.clipboard.readText() as Promise<string>)).toBe(created)
    expect((await api("/v1/models", { bearer: created })).status).toBe(200)

    const row = page.getByTestId("keys-table").locator("tr", { hasText: "노트북" })
    await page.getByRole("button", { name: "닫기" }).click()
    await row.getByRole("button", { name: "'노트북' 키 보기" }).click()
    await expect.poll(() => secret.textContent()).toBe(created)
    await scan("keys")
    await shoot("keys")

    await row.getByRole("button", { name: "삭제" }).click()
    await row.getByRole("group", { name: "'노트북' 키를 삭제할까요?" }).getByRole("button", { name: "삭제" }).click()
    await expect.poll(() => page.getByTestId("keys-table").locator("tr", { hasText: "노트북" }).count()).toBe(0)
    expect((await api("/v1/models", { bearer: created })).status).toBe(401)

    await page.getByRole("button", { name: "모든 키 교체" }).click()
    await page.getByRole("button", { name: "교체", exact: true }).click()
    await expect.poll(() => page.getByText("이전 키는 모두 폐기되어 더 이상 작동하지 않습니다").count()).toBe(1)
    const rotated = (await secret.textContent())!
    expect(rotated).not.toBe(key)
    expect((await api("/v1/models", { bearer: key })).status).toBe(401)
    expect((await api("/v1/models", { bearer: rotated })).status).toBe(200)
    key = rotated
    // The 60-second cooldown is shown and the button waits for it.
    expect(await page.getByTestId("rotate-cooldown").textContent()).toMatch(/다시 교체하려면 (1분 0초|\d+초) 기다려야 합니다/)
    expect(await page.getByRole("button", { name: "모든 키 교체" }).isDisabled()).toBe(true)
    await shoot("keys-rotated")
  })

  it("BYOK: a wrong secret is refused in Korean; a good one is verified against the fake provider, saved and listed", async () => {
    await go("BYOK", "BYOK (내 공급자 키)")
    await page.getByLabel("공급자").selectOption({ label: "OpenAI" })
    await page.getByLabel("API 키").fill("sk-bad-123456")
    expect(await page.getByRole("button", { name: "저장" }).isDisabled()).toBe(true)
    await page.getByRole("button", { name: "키 확인" }).click()
    await expect.poll(() => page.getByTestId("verify-result").textContent()).toMatch(/[가-힣]/)
    expect(await page.getByRole("button", { name: "저장" }).isDisabled()).toBe(true)

    await page.getByLabel("API 키").fill(`${GOOD}dashboard`)
    await page.getByLabel("라벨 (선택)").fill("work")
    await page.getByRole("button", { name: "키 확인" }).click()
    await expect.poll(() => page.getByTestId("verify-result").textContent()).toBe("확인되었습니다. 사용할 수 있는 모델 2개.")
    await page.getByRole("button", { name: "저장" }).click()
    const row = page.getByTestId("byok-table").locator("tr", { hasText: "work" })
    await row.waitFor()
    expect(await row.getByTestId("credential-status").textContent()).toBe("정상")
    expect(await row.textContent()).toContain("기본")
    await row.getByRole("button", { name: "work 모델 목록" }).click()
    await page.getByRole("region", { name: "공급자 모델 목록" }).getByText("gpt-x").waitFor()
    await row.getByLabel("work 대체 모델").selectOption("ws-lite")
    await expect.poll(async () => (await api("/api/user/me/byok", { bearer: key })).body.data.credentials[0].fallback_model_id).toBe("ws-lite")
    await page.getByLabel("대체 사용").selectOption("on")
    await expect.poll(async () => (await api("/api/user/me/byok", { bearer: key })).body.data.fallback_enabled).toBe(true)
    await scan("byok")
    await shoot("byok")
  })

  it("images: create and activate a preset, generate an image that appears in the gallery", async () => {
    await go("이미지", "이미지")
    await page.getByRole("button", { name: "새 프리셋" }).click()
    const form = page.getByRole("form", { name: "새 프리셋" })
    await form.getByLabel("이름").fill("수채화")
    await form.getByLabel("스텝").fill("20")
    await form.getByRole("button", { name: "저장" }).click()
    const row = page.getByTestId("presets-table").locator("tr[data-preset='수채화']")
    await row.waitFor()
    if ((await row.getByRole("button", { name: "수채화 사용" }).count()) > 0) await row.getByRole("button", { name: "수채화 사용" }).click()
    await expect.poll(() => row.textContent()).toContain("사용 중")

    await page.getByLabel("프롬프트", { exact: true }).fill("{{masterpiece}}, a cat on a windowsill")
    await page.getByRole("button", { name: "생성", exact: true }).click()
    const image = page.getByTestId("gallery").locator("img").first()
    await image.waitFor({ timeout: 20_000 })
    await expect.poll(() => image.evaluate((img) => (img as any).naturalWidth as number)).toBeGreaterThan(0)
    const href = await page.getByTestId("gallery").getByRole("link").first().getAttribute("href")
    expect(href).toMatch(/^\/api\/user\/me\/images\/img_[0-9a-f]{24}$/)
    const gallery = await api("/api/user/me/images", { bearer: key })
    expect(gallery.body.data.images).toHaveLength(1)
    expect(gallery.body.data.images[0]).toMatchObject({ prompt: "{{masterpiece}}, a cat on a windowsill", preset_name: "수채화", steps: 20 })
    await scan("images")
    await shoot("images")
  })

  it("settings: safe mode on (a blocked term is then refused in Korean), a second session revoked", async () => {
    const other = await signInToken(key)
    await go("설정", "설정")
    const toggle = page.getByRole("switch", { name: /세이프 모드/ })
    expect(await toggle.isChecked()).toBe(false)
    await toggle.check()
    await expect.poll(async () => (await api("/api/user/me", { bearer: key })).body.profile.sfwMode).toBe(true)
    await expect.poll(() => page.getByRole("switch", { name: "세이프 모드 켜짐" }).count()).toBe(1)

    const sessions = page.getByTestId("sessions-table")
    await expect.poll(() => sessions.locator("tbody tr").count()).toBe(2)
    expect(await sessions.locator("tr[data-current='true']").count()).toBe(1)
    await scan("settings")
    await shoot("settings")
    const otherRow = sessions.locator("tr[data-current='false']")
    await otherRow.getByRole("button", { name: "끝내기" }).click()
    await otherRow.getByRole("button", { name: "끝내기" }).click()
    await expect.poll(() => sessions.locator("tbody tr").count()).toBe(1)
    expect((await api("/api/user/me", { cookie: other })).status).toBe(401)

    await go("이미지", "이미지")
    await page.getByLabel("프롬프트", { exact: true }).fill("nsfw landscape")
    await page.getByRole("button", { name: "생성", exact: true }).click()
    await expect.poll(() => page.getByRole("alert").first().textContent()).toBe("금지된 내용(성인)이 포함된 프롬프트입니다.")
  })

  it("a change sent from a foreign origin is refused; the account is untouched", async () => {
    const outside = await context.newPage()
    watch(outside)
    await outside.goto(foreign.url)
    const attempts = [
      ["/api/user/sfw", "{\"sfw_mode\":false}"],
      ["/api/user/me/rotate-key", "{}"],
      ["/api/user/me/keys", "{\"label\":\"csrf\"}"]
    ] as const
    for (const [path, body] of attempts) {
      const answered = outside.waitForResponse((r) => r.url() === `${gw.url}${path}`)
      // A simple request (no preflight) that carries the cookie: 127.0.0.1 on another port is the same site.
      await outside.evaluate(([url, text]) =>
        fetch(url, { method: "POST", mode: "no-cors", credentials: "include", headers: { "content-type": "text/plain" }, body: text }).then(() => undefined), [`${gw.url}${path}`, body] as const)
      const response = await answered
      // 403 (`cross_site_request`), not 401: the cookie came along and the origin check refused it. (An opaque
      // response's body is not readable here.)
      expect([path, response.status()]).toEqual([path, 403])
    }
    // A JSON change needs a preflight, which the gateway never grants: the browser does not send it.
    const refused = await outside.evaluate((url) =>
      fetch(url, { method: "POST", credentials: "include", headers: { "content-type": "application/json" }, body: "{\"sfw_mode\":false}" })
        .then(() => "sent", () => "blocked"), `${gw.url}/api/user/sfw`)
    expect(refused).toBe("blocked")
    await outside.close()
    // The CORS refusal above is logged by the browser as an error of the foreign page, not of the dashboard.
    for (let i = problems.length - 1; i >= 0; i--) if (problems[i]!.startsWith(foreign.url)) problems.splice(i, 1)
    const me = await api("/api/user/me", { bearer: key })
    expect(me.body.profile.sfwMode).toBe(true)
    expect((await api("/v1/models", { bearer: key })).status).toBe(200)
    const keys = await api("/api/user/me/keys", { bearer: key })
    expect(keys.body.data.keys.map((k: any) => k.label)).toEqual(["기본"])
  })

  it("a lost session returns to sign-in; sign-out ends the session", async () => {
    // Revoked elsewhere (as from another browser's settings page).
    const token = (await sessionCookie())!.value
    const mine = (await api("/api/user/me/sessions", { cookie: token })).body.data.sessions.find((s: any) => s.current)
    expect((await api(`/api/user/me/sessions/${mine.id}`, { method: "DELETE", bearer: key })).status).toBe(200)
    // The next page's API call gets 401 and the app goes to sign-in.
    await page.getByRole("navigation", { name: "대시보드 메뉴" }).getByRole("link", { name: "사용량", exact: true }).click()
    await page.waitForURL(/\/dashboard\/sign-in$/)
    await page.getByRole("heading", { name: "wellspring 로그인" }).waitFor()

    await page.getByLabel("API 키").fill(key)
    await page.getByRole("button", { name: "로그인" }).click()
    await page.getByRole("heading", { level: 1, name: "개요" }).waitFor()
    const fresh = (await sessionCookie())!.value
    expect((await api("/api/user/me", { cookie: fresh })).status).toBe(200)
    await page.getByRole("banner").getByRole("button", { name: "로그아웃" }).click()
    await page.getByRole("heading", { name: "wellspring 로그인" }).waitFor()
    expect(await sessionCookie()).toBeUndefined()
    expect((await api("/api/user/me", { cookie: fresh })).status).toBe(401)
    await page.goto(`${gw.url}/dashboard/settings`)
    await page.waitForURL(/\/dashboard\/sign-in$/)
  })

  it("phone layout: no horizontal overflow; the overview's first load is measured", async () => {
    const token = await signInToken(key)
    const measure = async (viewport: { width: number; height: number }) => {
      const fresh = await browser.newContext({ viewport, locale: "ko-KR", timezoneId: "Asia/Seoul" })
      await fresh.addCookies([{ name: "ws-session", value: token, url: `${gw.url}/api/user` }])
      const p = await fresh.newPage()
      watch(p)
      const scripts: Array<Promise<number>> = []
      p.on("response", (r) => {
        if (r.url().endsWith(".js")) scripts.push(r.body().then((b) => Zlib.gzipSync(b, { level: 9 }).length))
      })
      await p.goto(`${gw.url}/dashboard/`)
      await p.getByTestId("quota-session").waitFor()
      const ready = await p.evaluate(() => performance.getEntriesByName("wellspring:overview-ready")[0]!.startTime)
      const bytes = (await Promise.all(scripts)).reduce((a, b) => a + b, 0)
      return { p, fresh, ready, bytes, files: scripts.length }
    }
    const phone = await measure({ width: 390, height: 844 })
    const overflow = await phone.p.evaluate(() => {
      const w = globalThis as any
      return w.document.documentElement.scrollWidth - w.innerWidth
    })
    expect(overflow).toBeLessThanOrEqual(0)
    await shoot("overview-phone", phone.p)
    await phone.fresh.close()

    // Cold loads in fresh contexts (nothing cached), the median of three.
    const runs = []
    for (let i = 0; i < 3; i++) {
      const run = await measure({ width: 1280, height: 900 })
      runs.push(run)
      await run.fresh.close()
    }
    const ready = runs.map((r) => r.ready).sort((a, b) => a - b)[1]!
    const budgets = { overview_js_gzip_bytes: runs[0]!.bytes, overview_js_files: runs[0]!.files, overview_ready_ms: Math.round(ready), runs_ms: runs.map((r) => Math.round(r.ready)) }
    Fs.writeFileSync(Path.join(ARTIFACTS, "budgets.json"), JSON.stringify(budgets, null, 2))
    console.log(`dashboard budgets: ${JSON.stringify(budgets)}`)
    expect(budgets.overview_js_gzip_bytes).toBeLessThanOrEqual(200 * 1024)
    expect(budgets.overview_ready_ms).toBeLessThan(1000)
    expect(problems).toEqual([])
  })
})
