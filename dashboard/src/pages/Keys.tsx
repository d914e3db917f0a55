import { useState } from "preact/hooks"
import { api, get } from "../api"
import { duration, when } from "../format"
import { ConfirmButton, ErrorNote, Note, SecretBox, Section, TableWrap, useAction, useLoad, useNow } from "../ui"

/** The gateway's rotation cooldown (spec Limits: once per 60 s per account). */
const ROTATE_COOLDOWN_S = 60

export const Keys = () => {
  const keys = useLoad(() => get("/api/user/me/keys"))
  const action = useAction()
  const [label, setLabel] = useState("")
  const [shown, setShown] = useState<{ title: string; secret: string; rotated?: boolean } | null>(null)
  const [rotatedAt, setRotatedAt] = useState<number | null>(null)
  const now = useNow()
  const cooldown = rotatedAt === null ? 0 : Math.max(0, ROTATE_COOLDOWN_S - (now - rotatedAt) / 1000)
  const list = keys.data?.data.keys ?? []
  const max = keys.data?.data.max ?? 5

  const create = async (e: Event) => {
    e.preventDefault()
    const result = await action.run(() => api("POST", "/api/user/me/keys", { label }))
    if (result) {
      setLabel("")
      setShown({ title: "새 API 키 (지금만 표시됩니다)", secret: result.data.apiKey })
      await keys.reload()
    }
  }

  const reveal = async (id: number, keyLabel: string) => {
    const result = await action.run(() => get(`/api/user/me/keys/${id}/reveal`))
    if (result) setShown({ title: `'${keyLabel}' 키`, secret: result.data.key })
  }

  const remove = async (id: number, keyLabel: string) => {
    const done = await action.run(() => api("DELETE", `/api/user/me/keys/${id}`), `'${keyLabel}' 키를 삭제했습니다. 이 키는 더 이상 작동하지 않습니다.`)
    if (done) {
      setShown(null)
      await keys.reload()
    }
  }

  const rotate = async () => {
    const result = await action.run(() => api("POST", "/api/user/me/rotate-key"))
    if (result) {
      setRotatedAt(Date.now())
      setShown({ title: "새 기본 키 (지금만 표시됩니다)", secret: result.data.apiKey, rotated: true })
      await keys.reload()
    }
  }

  return (
    <>
      <div class="page-head">
        <h1 tabIndex={-1}>API 키</h1>
      </div>
      <ErrorNote message={keys.error} />
      <ErrorNote message={action.error} />
      <Note message={action.note} />
      {shown && (
        <SecretBox title={shown.title} secret={shown.secret}>
          {shown.rotated ? (
            <p class="note warn" role="status">
              이전 키는 모두 폐기되어 더 이상 작동하지 않습니다. 사용하는 프로그램의 키를 새 키로 바꾸세요.
            </p>
          ) : null}
          <button type="button" onClick={() => setShown(null)}>
            닫기
          </button>
        </SecretBox>
      )}
      <Section title={`활성 키 (${list.length}/${max})`} id="keys-title">
        {list.length === 0 ? (
          <p>활성 키가 없습니다.</p>
        ) : (
          <TableWrap label="API 키 목록">
            <table data-testid="keys-table">
              <thead>
                <tr>
                  <th scope="col">이름</th>
                  <th scope="col">앞부분</th>
                  <th scope="col">만든 시각</th>
                  <th scope="col">마지막 사용</th>
                  <th scope="col">작업</th>
                </tr>
              </thead>
              <tbody>
                {list.map((k: any) => (
                  <tr key={k.id} data-key-id={k.id}>
                    <td>{k.label}</td>
                    <td>
                      <code>{k.key_prefix}…</code>
                      {k.legacy ? <span class="badge">구형</span> : null}
                    </td>
                    <td>{when(k.created_at)}</td>
                    <td>{k.last_used_at === null ? "사용 전" : when(k.last_used_at)}</td>
                    <td class="actions">
                      {k.revealable ? (
                        <button type="button" aria-label={`'${k.label}' 키 보기`} disabled={action.busy} onClick={() => reveal(k.id, k.label)}>
                          보기
                        </button>
                      ) : null}
                      <ConfirmButton
                        label="삭제"
                        danger
                        question={`'${k.label}' 키를 삭제할까요?`}
                        confirmLabel="삭제"
                        disabled={action.busy}
                        onConfirm={() => remove(k.id, k.label)}
                      />
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
          </TableWrap>
        )}
      </Section>
      <Section title="새 키 만들기" id="create-title">
        <form class="row" onSubmit={create}>
          <label for="key-label">키 이름</label>
          <input id="key-label" maxLength={40} placeholder="예: 노트북" value={label} onInput={(e) => setLabel(e.currentTarget.value)} />
          <button type="submit" class="primary" disabled={action.busy || list.length >= max}>
            키 만들기
          </button>
        </form>
        {list.length >= max ? <p class="hint">키는 최대 {max}개까지 만들 수 있습니다. 새로 만들려면 하나를 삭제하세요.</p> : null}
      </Section>
      <Section title="모든 키 교체" id="rotate-title">
        <p>모든 활성 키를 폐기하고 새 기본 키 하나를 발급합니다. 로그인 세션은 유지됩니다. 1분에 한 번만 할 수 있습니다.</p>
        {cooldown > 0 ? (
          <p class="note warn" data-testid="rotate-cooldown" role="status">
            다시 교체하려면 {duration(cooldown)} 기다려야 합니다.
          </p>
        ) : null}
        <ConfirmButton
          label="모든 키 교체"
          danger
          question="모든 키를 폐기하고 새 키를 발급할까요? 이전 키는 즉시 작동하지 않습니다."
          confirmLabel="교체"
          disabled={action.busy || cooldown > 0}
          onConfirm={rotate}
        />
      </Section>
    </>
  )
}
