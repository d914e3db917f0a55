import { useEffect } from "preact/hooks"
import { get } from "../api"
import { dec, duration, num, STATUS_TEXT, when } from "../format"
import { ErrorNote, Section, TableWrap, useLoad, useNow } from "../ui"

interface Pool {
  used: number | null
  limit: number | null
  remaining: number | null
  used_pct: number
  resets_at: string | null
  resets_in_seconds: number | null
  active?: boolean
}

/** A quota pool as a bar with its live reset countdown; absolutes only when the plan shows them. */
const QuotaBar = ({ id, title, pool, now, idle }: { id: string; title: string; pool: Pool; now: number; idle: string }) => {
  const percent = Math.min(100, Math.max(0, pool.used_pct))
  const left = pool.resets_at === null ? null : Math.max(0, (Date.parse(pool.resets_at) - now) / 1000)
  const hidden = pool.limit === null
  const text = hidden ? `${dec(percent)}% 사용` : `${num(pool.used)} / ${num(pool.limit)} 사용 (${dec(percent)}%)`
  return (
    <div class="quota" data-testid={`quota-${id}`} data-pct={percent}>
      <div class="quota-head">
        <span class="quota-title" id={`${id}-label`}>
          {title}
        </span>
        <span class="quota-text">{text}</span>
      </div>
      <div
        class={`bar ${percent >= 90 ? "bar-high" : percent >= 70 ? "bar-mid" : ""}`}
        role="progressbar"
        aria-labelledby={`${id}-label`}
        aria-valuemin={0}
        aria-valuemax={100}
        aria-valuenow={Math.round(percent * 10) / 10}
        aria-valuetext={text}
      >
        <div class="bar-fill" style={{ width: `${percent}%` }} />
      </div>
      <p class="quota-reset">
        {left === null ? idle : <>초기화까지 <span class="countdown">{duration(left)}</span></>}
        {!hidden && pool.remaining !== null ? ` · 남은 양 ${num(pool.remaining)}` : ""}
      </p>
    </div>
  )
}

export const READY_MARK = "wellspring:overview-ready"

export const Overview = () => {
  const now = useNow()
  const me = useLoad(() => get("/api/user/me"))
  // Live figures: refreshed every 15 s, and as soon as a window resets.
  useEffect(() => {
    const timer = setInterval(() => void me.reload(), 15_000)
    return () => clearInterval(timer)
  }, [me.reload])
  const snapshot = me.data
  const session = snapshot?.plan.session as Pool | undefined
  const resetDue = session?.resets_at != null && Date.parse(session.resets_at) <= now
  useEffect(() => {
    if (resetDue) void me.reload()
  }, [resetDue])
  // The first render with data: when the overview is usable (the load-time budget in docs/dashboard.md).
  const ready = snapshot !== null
  useEffect(() => {
    if (ready && performance.getEntriesByName(READY_MARK).length === 0) performance.mark(READY_MARK)
  }, [ready])

  return (
    <>
      <div class="page-head">
        <h1 tabIndex={-1}>개요</h1>
        <button type="button" onClick={() => me.reload()} disabled={me.loading} aria-busy={me.loading}>
          새로 고침
        </button>
      </div>
      <ErrorNote message={me.error} />
      {snapshot && (
        <div class="grid">
          <Section title="사용 한도" id="quota-title">
            <QuotaBar id="session" title="세션 한도" pool={snapshot.plan.session} now={now} idle="첫 요청부터 세션이 시작됩니다." />
            <QuotaBar id="weekly" title="주간 한도" pool={snapshot.plan.weekly} now={now} idle="첫 요청부터 주간 집계가 시작됩니다." />
            <p class="hint">
              {snapshot.plan.session.limit === null
                ? "이 요금제는 사용량을 비율로만 보여 줍니다."
                : `요금제: 세션당 ${num(snapshot.plan.session.limit)}, 주간 ${num(snapshot.plan.weekly.limit)} (가중치 적용 토큰)`}
            </p>
          </Section>
          <Section title="오늘" id="today-title">
            <dl class="stats">
              <div>
                <dt>오늘 순위</dt>
                <dd data-testid="rank">{snapshot.today_self?.rank == null ? "순위 없음" : `${num(snapshot.today_self.rank)}위`}</dd>
              </div>
              <div>
                <dt>오늘 토큰</dt>
                <dd>{num(snapshot.today_self?.tokens)}</dd>
              </div>
              <div>
                <dt>오늘 성공한 요청</dt>
                <dd>{num(snapshot.today_self?.requests)}</dd>
              </div>
              <div>
                <dt>24시간 요청</dt>
                <dd data-testid="total-requests">{num(snapshot.totals.totalRequests)}</dd>
              </div>
              <div>
                <dt>24시간 토큰</dt>
                <dd>{num(snapshot.totals.totalTokens)}</dd>
              </div>
              <div>
                <dt>현재 분당 요청</dt>
                <dd>{num(snapshot.rpm.current)}</dd>
              </div>
            </dl>
            {snapshot.today_self?.leader_tokens ? <p class="hint">오늘 1위: {num(snapshot.today_self.leader_tokens)} 토큰</p> : null}
          </Section>
          <Section title="최근 요청" id="recent-title">
            {snapshot.recentRequests.length === 0 ? (
              <p>아직 요청이 없습니다.</p>
            ) : (
              <TableWrap label="최근 요청 표">
                <table>
                  <thead>
                    <tr>
                      <th scope="col">시각</th>
                      <th scope="col">모델</th>
                      <th scope="col">결과</th>
                      <th scope="col">입력</th>
                      <th scope="col">출력</th>
                      <th scope="col">초당 토큰</th>
                    </tr>
                  </thead>
                  <tbody>
                    {snapshot.recentRequests.map((r: any) => (
                      <tr key={r.id}>
                        <td>{when(r.created_at)}</td>
                        <td>{r.model_id}</td>
                        <td>
                          <span class={`badge badge-${r.status}`}>{STATUS_TEXT[r.status] ?? r.status}</span>
                          {r.error ? <span class="muted err">{r.error}</span> : null}
                        </td>
                        <td class="num">{num(r.input_tokens)}</td>
                        <td class="num">{num(r.output_tokens)}</td>
                        <td class="num">{dec(r.tps)}</td>
                      </tr>
                    ))}
                  </tbody>
                </table>
              </TableWrap>
            )}
          </Section>
        </div>
      )}
    </>
  )
}
