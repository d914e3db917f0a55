/**
 * Issue 18, point 4: the status page in a real browser (Debian's chromium driven by playwright-core). A gateway
 * serves a model on a scripted upstream; real traffic makes it `ok` on the page, injected upstream failures make
 * it `degraded`, and the page shows it on its own 20-second refresh, under its strict Content-Security-Policy
 * (any violation is reported to the console and fails the test). Screenshots of the desktop and a 390-px phone
 * layout go to `test-artifacts/` (gitignored).
 *
 * Skipped only when /usr/bin/chromium is missing and GATEWAY_REQUIRE_SERVICES is not set (CI installs it).
 */
import * as Fs from "node:fs"
import * as Path from "node:path"
import { type Browser, chromium, type Page } from "playwright-core"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { run as runCli } from "../../src/cli.js"
import { addMockModel } from "../inference/helpers.js"
import { Behaviour, Chunks, type MockUpstream, startMockUpstream } from "../support/MockUpstream.js"
import { startGateway, type TestGateway } from "../support/Gateway.js"
import { requireServices } from "../support/Services.js"
import { chat, refreshStatus } from "./support.js"

const CHROMIUM = "/usr/bin/chromium"
const hasChromium = Fs.existsSync(CHROMIUM)
if (!hasChromium && requireServices) throw new Error(`${CHROMIUM} is required (GATEWAY_REQUIRE_SERVICES=1): apt-get install -y chromium`)
const ARTIFACTS = Path.resolve("test-artifacts")

const success = Behaviour.stream([
  Chunks.role(),
  Chunks.content("안녕하세요, 반갑습니다."),
  Chunks.finish("stop"),
  Chunks.usage({ prompt: 12, completion: 240 })
])
const failure = Behaviour.status(500, { error: { message: "upstream exploded" } })

describe.skipIf(!hasChromium)(`status page in ${CHROMIUM} (skipped when it is not installed)`, () => {
  let mock: MockUpstream
  let gw: TestGateway
  let browser: Browser
  const problems: Array<string> = []

  beforeAll(async () => {
    mock = await startMockUpstream()
    mock.script(success)
    gw = await startGateway({
      configure: (doc) => {
        addMockModel(doc, { baseUrl: mock.url, model: { display_name: "목업 모델", daily_cap: 1_000_000 } })
        doc.status = { refresh_seconds: 1 }
      }
    })
    const env = { WELLSPRING_CONFIG: gw.configPath, WELLSPRING_DATA_DIR: Path.join(gw.dir, "data") }
    // The CLI names its database on stderr; a failure is its exit code.
    let cliErr = ""
    const io = { out: () => {}, err: (s: string) => void (cliErr += s) }
    const cli = async (args: Array<string>) => expect(await runCli(args, io, env), cliErr).toBe(0)
    await cli(["incident:create", "--title", "대시보드 접속 지연", "--message", "원인을 조사하고 있습니다."])
    await cli(["incident:create", "--title", "ws-reasoner 응답 오류", "--message", "업스트림 오류를 확인했습니다."])
    await cli(["incident:resolve", "--id", "2", "--message", "모든 요청이 정상 처리되고 있습니다."])
    browser = await chromium.launch({
      executablePath: CHROMIUM,
      args: [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync"
      ]
    })
    Fs.mkdirSync(ARTIFACTS, { recursive: true })
  }, 120_000)

  afterAll(async () => {
    await browser?.close()
    await gw?.stop()
    await mock?.close()
  })

  const open = async (viewport: { width: number; height: number }): Promise<Page> => {
    const context = await browser.newContext({ viewport, locale: "ko-KR", timezoneId: "Asia/Seoul" })
    const page = await context.newPage()
    page.on("console", (message) => {
      if (message.type() === "error" || /Content Security Policy/i.test(message.text())) problems.push(message.text())
    })
    page.on("pageerror", (error) => problems.push(String(error)))
    await page.goto(`${gw.url}/`)
    await page.waitForSelector("body[data-loaded]")
    return page
  }

  const statusOf = (page: Page, model: string) =>
    page.locator(`#fleet tr[data-model="${model}"]`).getAttribute("data-status")

  it("shows real traffic as ok, then degraded after upstream failures, on its own refresh", async () => {
    for (let i = 0; i < 10; i++) expect((await chat(gw, "ws-mock")).status).toBe(200)
    for (let i = 0; i < 3; i++) expect((await chat(gw, "ws-pro")).status).toBe(200)
    await refreshStatus(gw)

    const page = await open({ width: 1280, height: 900 })
    expect(await statusOf(page, "ws-mock")).toBe("ok")
    const row = page.locator('#fleet tr[data-model="ws-mock"]')
    expect(await row.locator(".badge").textContent()).toBe("정상")
    expect(await row.locator(".model-name").textContent()).toBe("목업 모델")
    // The sparkline is an SVG polyline whose last point is above the baseline (output in the last 10 minutes).
    const points = (await row.locator("svg.spark polyline").getAttribute("points"))!.split(" ")
    expect(points).toHaveLength(7)
    expect(Number(points[6]!.split(",")[1]), `sparkline ${points.join(" ")}`).toBeLessThan(Number(points[0]!.split(",")[1]))
    expect(await page.locator("#summary").textContent()).toContain("진행 중인 장애 1건")
    expect(await page.locator("#incidents > li").count()).toBe(2)
    expect(await page.locator("#quota .quota-row").count()).toBe(4)
    // The image queue's workers (the simulated one of embedded mode).
    expect(await page.locator("#images").textContent()).toMatch(/^이미지 생성: 작업 서버 \d+대 연결/)
    const loadedAt = await page.locator("body").getAttribute("data-loaded")

    // 3 failures after 10 successes: 23% of the window, 3 of the last 10: degraded, not down.
    mock.script(failure)
    for (let i = 0; i < 3; i++) expect((await chat(gw, "ws-mock")).status).toBe(500)
    mock.script(success)
    await refreshStatus(gw)
    // No reload: the page's own 20-second refresh picks it up.
    // (A selector, not a function: the page's CSP refuses the eval that string predicates need.)
    await page.locator('#fleet tr[data-model="ws-mock"][data-status="degraded"]').waitFor({ timeout: 30_000 })
    expect(await page.locator("body").getAttribute("data-loaded")).not.toBe(loadedAt)
    expect(await row.locator(".badge").textContent()).toBe("성능 저하")
    expect(await page.locator("#summary").textContent()).toContain("성능이 저하")
    await page.screenshot({ path: Path.join(ARTIFACTS, "status-page.png"), fullPage: true })

    const phone = await open({ width: 390, height: 844 })
    expect(await statusOf(phone, "ws-mock")).toBe("degraded")
    // One card per model: nothing wider than the screen.
    const overflow = await phone.evaluate(() => {
      const w = globalThis as any
      return w.document.documentElement.scrollWidth - w.innerWidth
    })
    expect(overflow).toBeLessThanOrEqual(0)
    await phone.screenshot({ path: Path.join(ARTIFACTS, "status-page-mobile.png"), fullPage: true })
    expect(problems).toEqual([])
  }, 90_000)
})
