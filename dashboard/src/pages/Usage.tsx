import { useState } from "preact/hooks"
import { get } from "../api"
import { BarChart, TimeChart } from "../chart"
import { dec, ms, num, pct, STATUS_TEXT, when } from "../format"
import { ErrorNote, Section, TableWrap, useLoad } from "../ui"

const RANGES: ReadonlyArray<readonly [string, string]> = [
  ["1h", "1시간"],
  ["4h", "4시간"],
  ["24h", "24시간"],
  ["7d", "7일"],
  ["30d", "30일"]
]
const LIMITS = [10, 20, 50]

export const Usage = () => {
  const [range, setRange] = useState("24h")
  const [model, setModel] = useState("")
  const [limit, setLimit] = useState(20)
  const [models, setModels] = useState<ReadonlyArray<string>>([])
  const metrics = useLoad(async () => {
    const q = new URLSearchParams({ range })
    if (model !== "") q.set("model", model)
    const body = await get(`/api/user/me/metrics?${q}`)
    // The model choices come from the unfiltered view (and stay while a filter is set).
    if (model === "") setModels(body.by_model.map((m: any) => m.model_id))
    return body
  }, [range, model])
  const requests = useLoad(() => get(`/api/user/me/requests?limit=${limit}`), [limit])
  const m = metrics.data

  return (
    <>
      <div class="page-head">
        <h1 tabIndex={-1}>사용량</h1>
      </div>
      <form class="filters" onSubmit={(e) => e.preventDefault()} aria-label="사용량 필터">
        <label for="usage-range">기간</label>
          <select id="usage-range" value={range} onChange={(e) => setRange(e.currentTarget.value)}>
            {RANGES.map(([value, label]) => (
              <option key={value} value={value}>
                {label}
              </option>
            ))}
          </select>
        <label for="usage-model">모델</label>
          <select id="usage-model" value={model} onChange={(e) => setModel(e.currentTarget.value)}>
            <option value="">전체 모델</option>
            {models.map((id) => (
              <option key={id} value={id}>
                {id}
              </option>
            ))}
          </select>
      </form>
      <ErrorNote message={metrics.error} />
      {m && (
        <div class="grid">
          <Section title="요약" id="summary-title">
            <dl class="stats">
              <div>
                <dt>요청</dt>
                <dd data-testid="metric-requests">{num(m.totals.requests)}</dd>
              </div>
              <div>
                <dt>성공률</dt>
                <dd>{pct(m.totals.success_rate)}</dd>
              </div>
              <div>
                <dt>토큰</dt>
                <dd>{num(m.tokens.total)}</dd>
              </div>
              <div>
                <dt>캐시 적중률</dt>
                <dd>{pct(m.tokens.cache_rate)}</dd>
              </div>
              <div>
                <dt>초당 토큰 (평균 / 중앙 / 최대)</dt>
                <dd>
                  {dec(m.tps.avg)} / {dec(m.tps.p50)} / {dec(m.tps.max)}
                </dd>
              </div>
              <div>
                <dt>첫 토큰까지 (p50 / p95)</dt>
                <dd>
                  {ms(m.latency.ttfb_p50)} / {ms(m.latency.ttfb_p95)}
                </dd>
              </div>
            </dl>
          </Section>
          <Section title="요청 추이" id="series-title">
            <TimeChart
              title={`요청 (${m.bucket_seconds / 60}분 단위)`}
              x={m.series.map((s: any) => Date.parse(s.start) / 1000)}
              series={[
                { label: "성공", color: "#1a7f37" },
                { label: "오류", color: "#c62828" }
              ]}
              values={[m.series.map((s: any) => s.success), m.series.map((s: any) => s.errors)]}
            />
            <TimeChart
              title="토큰"
              x={m.series.map((s: any) => Date.parse(s.start) / 1000)}
              series={[
                { label: "입력", color: "#1f5fbf" },
                { label: "출력", color: "#8a4baf" }
              ]}
              values={[m.series.map((s: any) => s.input_tokens), m.series.map((s: any) => s.output_tokens)]}
            />
          </Section>
          <Section title="지연 시간" id="latency-title">
            <BarChart
              title="지연 시간 (밀리초)"
              labels={["첫 토큰 p50", "첫 토큰 p95", "전체 p50", "전체 p95"]}
              values={[m.latency.ttfb_p50, m.latency.ttfb_p95, m.latency.duration_p50, m.latency.duration_p95]}
              color="#1f5fbf"
              unit="ms"
            />
            <BarChart
              title="초당 토큰"
              labels={["평균", "중앙값", "최대"]}
              values={[m.tps.avg, m.tps.p50, m.tps.max]}
              color="#8a4baf"
              unit=""
            />
          </Section>
          <Section title="오류와 BYOK" id="errors-title">
            <BarChart
              title="오류 유형별 건수"
              labels={["요청 오류", "한도 초과", "서버 오류"]}
              values={[m.errors.by_tier.client, m.errors.by_tier.limit, m.errors.by_tier.server]}
              color="#c62828"
              unit=""
            />
            <BarChart
              title="요청 경로별 건수"
              labels={["공용 모델", "BYOK", "BYOK 대체"]}
              values={[m.totals.requests - m.byok.requests, m.byok.requests, m.byok.fell_back]}
              color="#1a7f37"
              unit=""
            />
            <p class="hint">
              BYOK 비중: {m.totals.requests === 0 ? "—" : pct(m.byok.requests / m.totals.requests)}
            </p>
            {m.errors.by_code.length > 0 && (
              <TableWrap label="오류 코드 표">
                <table>
                  <thead>
                    <tr>
                      <th scope="col">코드</th>
                      <th scope="col">유형</th>
                      <th scope="col">건수</th>
                    </tr>
                  </thead>
                  <tbody>
                    {m.errors.by_code.map((e: any) => (
                      <tr key={e.code}>
                        <td>{e.code}</td>
                        <td>{e.tier}</td>
                        <td class="num">{num(e.count)}</td>
                      </tr>
                    ))}
                  </tbody>
                </table>
              </TableWrap>
            )}
          </Section>
        </div>
      )}
      <Section
        title="요청 기록"
        id="requests-title"
        actions={
          <span class="inline">
            <label for="usage-limit">표시 개수</label>
            <select id="usage-limit" value={String(limit)} onChange={(e) => setLimit(Number(e.currentTarget.value))}>
              {LIMITS.map((n) => (
                <option key={n} value={n}>
                  {n}개
                </option>
              ))}
            </select>
          </span>
        }
      >
        <ErrorNote message={requests.error} />
        {requests.data && (
          <TableWrap label="요청 기록 표">
            <table data-testid="requests-table">
              <thead>
                <tr>
                  <th scope="col">시각</th>
                  <th scope="col">모델</th>
                  <th scope="col">결과</th>
                  <th scope="col">입력</th>
                  <th scope="col">출력</th>
                  <th scope="col">소요</th>
                  <th scope="col">초당 토큰</th>
                  <th scope="col">경로</th>
                </tr>
              </thead>
              <tbody>
                {requests.data.requests.map((r: any) => (
                  <tr key={r.id}>
                    <td>{when(r.created_at)}</td>
                    <td>{r.model_id}</td>
                    <td>
                      <span class={`badge badge-${r.status}`}>{STATUS_TEXT[r.status] ?? r.status}</span>
                      {r.error_code ? <span class="muted"> {r.error_code}</span> : null}
                    </td>
                    <td class="num">{num(r.input_tokens)}</td>
                    <td class="num">{num(r.output_tokens)}</td>
                    <td class="num">{ms(r.duration_ms)}</td>
                    <td class="num">{dec(r.tps)}</td>
                    <td>{r.byok ? (r.fell_back ? "BYOK→공용" : "BYOK") : "공용"}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          </TableWrap>
        )}
      </Section>
    </>
  )
}
