import { useState } from "preact/hooks"
import { api } from "../api"
import { ErrorNote, errorText } from "../ui"

/** Exchanges an API key for a session cookie (`POST /api/user/session`). */
export const SignIn = ({ onSignedIn }: { onSignedIn: (name: string) => void }) => {
  const [key, setKey] = useState("")
  const [error, setError] = useState<string | null>(null)
  const [busy, setBusy] = useState(false)
  return (
    <main id="main" class="sign-in">
      <div class="card sign-in-card">
        <h1 tabIndex={-1}>wellspring 로그인</h1>
        <p>
          API 키로 로그인합니다. 키는 이 브라우저에 저장되지 않으며, 로그인하면 7일 동안 유지되는 세션이 만들어집니다.
        </p>
        <form
          method="post"
          onSubmit={async (event) => {
            event.preventDefault()
            setBusy(true)
            setError(null)
            try {
              const result = await api("POST", "/api/user/session", { api_key: key })
              setKey("")
              onSignedIn(result.data.display_name || result.data.username)
            } catch (e) {
              setError(errorText(e))
            } finally {
              setBusy(false)
            }
          }}
        >
          <label for="api-key">API 키</label>
          <input
            id="api-key"
            name="api_key"
            type="password"
            autocomplete="off"
            spellcheck={false}
            required
            placeholder="sk-ws-..."
            value={key}
            onInput={(e) => setKey(e.currentTarget.value)}
          />
          <button type="submit" class="primary" disabled={busy}>
            {busy ? "확인 중…" : "로그인"}
          </button>
        </form>
        <ErrorNote message={error} />
        <p class="hint">
          키가 없다면 운영자에게 요청하세요. 로컬 개발 서버는 처음 시작할 때 <code>API key:</code> 줄에 키를 출력합니다. 그 줄을
          놓쳤다면 <code>npm run cli -- key:create --username dev</code> 로 새 키를 만들 수 있습니다.
        </p>
      </div>
    </main>
  )
}
