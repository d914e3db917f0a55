import { Fragment } from "preact"
import { useMemo, useState } from "preact/hooks"
import { api, get } from "../api"
import { when } from "../format"
import { ConfirmButton, ErrorNote, Note, Section, TableWrap, useAction, useLoad } from "../ui"

interface ProviderRow {
  id: string
  label: string
  auth_scheme: string
  required_fields: Array<string>
  optional_fields: Array<string>
  supports_models_list: boolean
  multi_scheme: boolean
}

const FIELD_TEXT: Record<string, string> = {
  base_url: "기본 URL (https)",
  resource: "Azure 리소스 이름",
  api_version: "API 버전",
  organization_id: "조직 ID",
  project_id: "프로젝트 ID",
  region: "리전 (us 또는 eu)"
}
const SCHEME_TEXT: Record<string, string> = { bearer: "Bearer 토큰", "api-key": "api-key 헤더", "x-api-key": "x-api-key 헤더" }
const CRED_STATUS: Record<string, string> = { active: "정상", rejected: "거부됨" }

const choiceOf = (p: ProviderRow) => `${p.id}|${p.auth_scheme}`

/** The add form: provider (and scheme) from the catalog, its fields, verify, then save what was verified. */
const AddCredential = ({ providers, onSaved }: { providers: ReadonlyArray<ProviderRow>; onSaved: () => Promise<void> }) => {
  const [choice, setChoice] = useState(providers[0] ? choiceOf(providers[0]) : "")
  const [secret, setSecret] = useState("")
  const [label, setLabel] = useState("")
  const [meta, setMeta] = useState<Record<string, string>>({})
  const [verified, setVerified] = useState<string | null>(null)
  const [result, setResult] = useState<{ ok: boolean; text: string } | null>(null)
  const action = useAction()
  const provider = providers.find((p) => choiceOf(p) === choice)
  const body = () => {
    const fields: Record<string, string> = {}
    for (const name of [...(provider?.required_fields ?? []), ...(provider?.optional_fields ?? [])]) {
      const value = meta[name]?.trim()
      if (value) fields[name] = value
    }
    return {
      provider: provider?.id,
      auth_scheme: provider?.auth_scheme,
      secret,
      ...(label.trim() ? { label: label.trim() } : {}),
      ...(Object.keys(fields).length > 0 ? { meta: fields } : {})
    }
  }
  const fingerprint = JSON.stringify(body())
  const edit = (apply: () => void) => {
    apply()
    setResult(null)
    setVerified(null)
  }

  const verify = async () => {
    const sent = fingerprint
    const r = await action.run(() => api("POST", "/api/user/me/byok/verify", JSON.parse(sent)))
    if (r === null) return
    if (r.data.ok) {
      setVerified(sent)
      setResult({ ok: true, text: `확인되었습니다. 사용할 수 있는 모델 ${r.data.model_count ?? 0}개.` })
    } else {
      setVerified(null)
      setResult({ ok: false, text: r.data.message })
    }
  }

  const save = async (e: Event) => {
    e.preventDefault()
    const saved = await action.run(() => api("POST", "/api/user/me/byok", JSON.parse(fingerprint)), "자격 증명을 저장했습니다.")
    if (saved) {
      setSecret("")
      setLabel("")
      setMeta({})
      setVerified(null)
      setResult(null)
      await onSaved()
    }
  }

  return (
    <form class="stack" onSubmit={save}>
      <label for="byok-provider">공급자</label>
      <select id="byok-provider" value={choice} onChange={(e) => edit(() => setChoice(e.currentTarget.value))}>
        {providers.map((p) => (
          <option key={choiceOf(p)} value={choiceOf(p)}>
            {p.label}
            {p.multi_scheme ? ` (${SCHEME_TEXT[p.auth_scheme] ?? p.auth_scheme})` : ""}
          </option>
        ))}
      </select>
      <label for="byok-secret">API 키</label>
      <input id="byok-secret" type="password" autocomplete="off" required value={secret} onInput={(e) => edit(() => setSecret(e.currentTarget.value))} />
      {provider?.required_fields.map((name) => (
        <Fragment key={name}>
          <label for={`byok-meta-${name}`}>{FIELD_TEXT[name] ?? name} (필수)</label>
          <input
            id={`byok-meta-${name}`}
            required
            value={meta[name] ?? ""}
            onInput={(e) => {
              const value = e.currentTarget.value
              edit(() => setMeta((m) => ({ ...m, [name]: value })))
            }}
          />
        </Fragment>
      ))}
      {provider?.optional_fields.map((name) => (
        <Fragment key={name}>
          <label for={`byok-meta-${name}`}>{FIELD_TEXT[name] ?? name} (선택)</label>
          <input
            id={`byok-meta-${name}`}
            value={meta[name] ?? ""}
            onInput={(e) => {
              const value = e.currentTarget.value
              edit(() => setMeta((m) => ({ ...m, [name]: value })))
            }}
          />
        </Fragment>
      ))}
      <label for="byok-label">라벨 (선택)</label>
      <input id="byok-label" maxLength={40} placeholder="예: work" value={label} onInput={(e) => edit(() => setLabel(e.currentTarget.value))} />
      <div class="row">
        <button type="button" disabled={action.busy || secret.trim() === ""} onClick={verify}>
          {action.busy ? "확인 중…" : "키 확인"}
        </button>
        <button type="submit" class="primary" disabled={action.busy || verified !== fingerprint}>
          저장
        </button>
      </div>
      {verified !== fingerprint ? <p class="hint">저장하기 전에 먼저 키를 확인하세요.</p> : null}
      {result ? (
        <p class={`note ${result.ok ? "ok" : "error"}`} role={result.ok ? "status" : "alert"} data-testid="verify-result">
          {result.text}
        </p>
      ) : null}
      <ErrorNote message={action.error} />
      <Note message={action.note} />
    </form>
  )
}

export const Byok = () => {
  const byok = useLoad(() => get("/api/user/me/byok"))
  const fleet = useLoad(() => get("/api/stats/fleet").catch(() => ({ models: [] })))
  const action = useAction()
  const [listing, setListing] = useState<{ id: number; models: Array<{ id: string; display_name: string | null }> } | null>(null)
  const data = byok.data?.data
  const poolModels: Array<{ id: string; display_name: string }> = fleet.data?.models ?? []
  const providerLabel = useMemo(
    () => new Map<string, string>((data?.providers ?? []).map((p: ProviderRow) => [p.id, p.label])),
    [data]
  )

  const patch = (id: number, change: Record<string, unknown>, note: string) =>
    action.run(() => api("PATCH", `/api/user/me/byok/${id}`, change), note).then(() => byok.reload())

  return (
    <>
      <div class="page-head">
        <h1 tabIndex={-1}>BYOK (내 공급자 키)</h1>
      </div>
      <p>
        내 OpenAI, Anthropic 등 공급자 키를 등록하면 wellspring 키로 <code>@openai/gpt-4o</code> 처럼 호출할 수 있습니다. 키는 암호화되어 저장되며
        앞 5자만 다시 표시됩니다.
      </p>
      <ErrorNote message={byok.error} />
      <ErrorNote message={action.error} />
      <Note message={action.note} />
      {data && (
        <>
          <Section title="등록된 자격 증명" id="creds-title">
            {data.credentials.length === 0 ? (
              <p>등록된 자격 증명이 없습니다.</p>
            ) : (
              <TableWrap label="BYOK 자격 증명 목록">
                <table data-testid="byok-table">
                  <thead>
                    <tr>
                      <th scope="col">공급자 / 라벨</th>
                      <th scope="col">상태</th>
                      <th scope="col">기본</th>
                      <th scope="col">고정</th>
                      <th scope="col">대체 모델</th>
                      <th scope="col">작업</th>
                    </tr>
                  </thead>
                  <tbody>
                    {data.credentials.map((c: any) => (
                      <tr key={c.id} data-credential-id={c.id}>
                        <td class="wrap">
                          {providerLabel.get(c.provider) ?? c.provider} · {c.label}
                          <div class="muted">
                            <code>{c.masked_hint}…</code> · 확인 {when(c.last_verified_at)}
                          </div>
                        </td>
                        <td>
                          <span class={`badge badge-${c.status}`} data-testid="credential-status">
                            {CRED_STATUS[c.status] ?? c.status}
                          </span>
                          {c.last_error_code ? <span class="muted"> {c.last_error_code}</span> : null}
                        </td>
                        <td>
                          {c.is_primary ? (
                            <span class="badge badge-active">기본</span>
                          ) : (
                            <button type="button" aria-label={`${c.label} 기본으로 지정`} onClick={() => patch(c.id, { is_primary: true }, "기본 자격 증명을 바꿨습니다.")}>
                              기본으로
                            </button>
                          )}
                        </td>
                        <td>
                          <input
                            type="checkbox"
                            aria-label={`${c.label} 고정`}
                            checked={c.pinned}
                            onChange={(e) => patch(c.id, { pinned: e.currentTarget.checked }, e.currentTarget.checked ? "고정했습니다." : "고정을 풀었습니다.")}
                          />
                        </td>
                        <td>
                          <select
                            aria-label={`${c.label} 대체 모델`}
                            value={c.fallback_model_id ?? ""}
                            onChange={(e) => patch(c.id, { fallback_model_id: e.currentTarget.value || null }, "대체 모델을 바꿨습니다.")}
                          >
                            <option value="">없음</option>
                            {poolModels.map((m) => (
                              <option key={m.id} value={m.id}>
                                {m.display_name}
                              </option>
                            ))}
                            {c.fallback_model_id && !poolModels.some((m) => m.id === c.fallback_model_id) ? (
                              <option value={c.fallback_model_id}>{c.fallback_model_id}</option>
                            ) : null}
                          </select>
                        </td>
                        <td class="actions">
                          <button
                            type="button"
                            aria-label={`${c.label} 모델 목록`}
                            onClick={async () => {
                              const r = await action.run(() => get(`/api/user/me/byok/${c.id}/models`))
                              if (r) {
                                setListing({ id: c.id, models: r.data.models })
                                await byok.reload()
                              }
                            }}
                          >
                            모델 목록
                          </button>
                          <ConfirmButton
                            label="삭제"
                            danger
                            question={`${c.label} 자격 증명을 삭제할까요?`}
                            confirmLabel="삭제"
                            onConfirm={async () => {
                              await action.run(() => api("DELETE", `/api/user/me/byok/${c.id}`), "자격 증명을 삭제했습니다.")
                              if (listing?.id === c.id) setListing(null)
                              await byok.reload()
                            }}
                          />
                        </td>
                      </tr>
                    ))}
                  </tbody>
                </table>
              </TableWrap>
            )}
            {listing && (
              <div class="listing" role="region" aria-label="공급자 모델 목록">
                <h3>모델 {listing.models.length}개</h3>
                <ul class="models" tabIndex={0} aria-label="모델 id 목록">
                  {listing.models.slice(0, 200).map((m) => (
                    <li key={m.id}>
                      <code>{m.id}</code>
                      {m.display_name && m.display_name !== m.id ? ` — ${m.display_name}` : ""}
                    </li>
                  ))}
                </ul>
                <button type="button" onClick={() => setListing(null)}>
                  닫기
                </button>
              </div>
            )}
          </Section>
          <div class="grid">
          <Section title="자격 증명 추가" id="add-title">
            <AddCredential providers={data.providers} onSaved={byok.reload} />
          </Section>
          <Section title="공용 모델로 대체" id="fallback-title">
            <p>
              BYOK 호출이 실패하면 자격 증명에 지정한 대체 모델(공용 풀)로 응답합니다. 대체된 요청은 내 사용 한도에서 차감됩니다.
            </p>
            <div class="row">
            <label for="byok-fallback">대체 사용</label>
            <select
              id="byok-fallback"
              value={data.fallback_override === null ? "default" : data.fallback_override ? "on" : "off"}
              onChange={async (e) => {
                const v = e.currentTarget.value
                await action.run(
                  () => api("PUT", "/api/user/me/byok/fallback", { enabled: v === "default" ? null : v === "on" }),
                  "대체 설정을 바꿨습니다."
                )
                await byok.reload()
              }}
            >
              <option value="default">운영자 기본값 ({data.fallback_default_on ? "켜짐" : "꺼짐"})</option>
              <option value="on">켜기</option>
              <option value="off">끄기</option>
            </select>
            </div>
            <p class="hint">현재: {data.fallback_enabled ? "켜짐" : "꺼짐"}</p>
          </Section>
          </div>
        </>
      )}
    </>
  )
}
