import { useState } from "preact/hooks"
import { api, get } from "../api"
import { when } from "../format"
import { ConfirmButton, ErrorNote, Note, Section, TableWrap, useAction, useLoad } from "../ui"

export const Settings = ({ onSignOut }: { onSignOut: () => Promise<void> }) => {
  const me = useLoad(() => get("/api/user/me"))
  const sessions = useLoad(() => get("/api/user/me/sessions"))
  const action = useAction()
  // The switch follows the click at once; the account's value replaces it once saved (or the old one on failure).
  const [pending, setPending] = useState<boolean | null>(null)
  const sfw: boolean | undefined = pending ?? me.data?.profile.sfwMode
  const list: Array<any> = sessions.data?.data.sessions ?? []

  return (
    <>
      <div class="page-head">
        <h1 tabIndex={-1}>설정</h1>
      </div>
      <ErrorNote message={me.error} />
      <ErrorNote message={action.error} />
      <Note message={action.note} />
      <div class="grid">
        <Section title="세이프 모드" id="sfw-title">
          <p>
            켜면 이미지 생성에서 운영자가 정한 성인 콘텐츠 용어가 막히고, 네거티브 프롬프트에 세이프 모드 용어가 더해집니다.
          </p>
          {sfw !== undefined && (
            <label class="switch">
              <input
                type="checkbox"
                role="switch"
                data-testid="sfw-toggle"
                checked={sfw}
                disabled={action.busy}
                onChange={async (e) => {
                  const on = e.currentTarget.checked
                  setPending(on)
                  await action.run(() => api("POST", "/api/user/sfw", { sfw_mode: on }), on ? "세이프 모드를 켰습니다." : "세이프 모드를 껐습니다.")
                  await me.reload()
                  setPending(null)
                }}
              />
              세이프 모드 {sfw ? "켜짐" : "꺼짐"}
            </label>
          )}
        </Section>
        <Section title="로그인 세션" id="sessions-title">
          <ErrorNote message={sessions.error} />
          <TableWrap label="로그인 세션 목록">
            <table data-testid="sessions-table">
              <thead>
                <tr>
                  <th scope="col">시작</th>
                  <th scope="col">만료</th>
                  <th scope="col">작업</th>
                </tr>
              </thead>
              <tbody>
                {list.map((s) => (
                  <tr key={s.id} data-current={s.current ? "true" : "false"}>
                    <td>
                      {when(s.created_at)} {s.current ? <span class="badge badge-active">이 브라우저</span> : null}
                    </td>
                    <td>{when(s.expires_at)}</td>
                    <td>
                      {s.current ? (
                        <span class="muted">—</span>
                      ) : (
                        <ConfirmButton
                          label="끝내기"
                          danger
                          question="이 세션을 끝낼까요?"
                          confirmLabel="끝내기"
                          onConfirm={async () => {
                            await action.run(() => api("DELETE", `/api/user/me/sessions/${s.id}`), "세션을 끝냈습니다.")
                            await sessions.reload()
                          }}
                        />
                      )}
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
          </TableWrap>
        </Section>
        <Section title="로그아웃" id="signout-title">
          <p>이 브라우저의 세션을 끝냅니다. 다시 들어오려면 API 키가 필요합니다.</p>
          <button type="button" class="danger" onClick={onSignOut}>
            이 브라우저에서 로그아웃
          </button>
        </Section>
      </div>
    </>
  )
}
