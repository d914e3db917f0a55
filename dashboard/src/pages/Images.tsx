import { useState } from "preact/hooks"
import { api, get } from "../api"
import { when } from "../format"
import { ConfirmButton, ErrorNote, Note, Section, TableWrap, useAction, useLoad } from "../ui"

const SAMPLERS = ["euler", "euler_ancestral", "dpmpp_2m", "dpmpp_2m_sde", "dpmpp_sde", "ddim", "uni_pc"]
const SCHEDULERS = ["normal", "karras", "exponential", "sgm_uniform", "simple", "ddim_uniform", "beta", "linear_quadratic", "kl_optimal"]

interface Preset {
  id: string
  name: string
  checkpoint: string
  sampler: string
  scheduler: string
  quality_prompt: string
  negative_prompt: string
  steps: number
  scale: number | null
  width: number
  height: number
  active: boolean
}

type Draft = Omit<Preset, "id" | "active" | "scale"> & { scale: string }

const EMPTY: Draft = {
  name: "",
  checkpoint: "default.safetensors",
  sampler: "euler_ancestral",
  scheduler: "normal",
  quality_prompt: "masterpiece, best quality",
  negative_prompt: "lowres, worst quality, low quality",
  steps: 28,
  scale: "5",
  width: 832,
  height: 1216
}

const draftOf = (p: Preset): Draft => ({
  name: p.name,
  checkpoint: p.checkpoint,
  sampler: p.sampler,
  scheduler: p.scheduler,
  quality_prompt: p.quality_prompt,
  negative_prompt: p.negative_prompt,
  steps: p.steps,
  scale: p.scale === null ? "" : String(p.scale),
  width: p.width,
  height: p.height
})

const bodyOf = (d: Draft) => ({ ...d, scale: d.scale.trim() === "" ? null : Number(d.scale) })

/** Create or edit a preset. */
const PresetForm = ({ initial, title, onSubmit, onCancel, busy }: {
  initial: Draft
  title: string
  onSubmit: (draft: Draft) => Promise<void>
  onCancel?: () => void
  busy: boolean
}) => {
  const [d, setD] = useState<Draft>(initial)
  const field = (name: keyof Draft) => (e: { currentTarget: HTMLInputElement | HTMLSelectElement | HTMLTextAreaElement }) => {
    const raw = e.currentTarget.value
    setD((old) => ({ ...old, [name]: typeof old[name] === "number" ? Number(raw) : raw }))
  }
  return (
    <form
      class="preset-form"
      aria-label={title}
      onSubmit={async (e) => {
        e.preventDefault()
        await onSubmit(d)
      }}
    >
      <div class="fields">
        <label>
          이름
          <input required maxLength={40} value={d.name} onInput={field("name")} />
        </label>
        <label>
          체크포인트
          <input required maxLength={200} value={d.checkpoint} onInput={field("checkpoint")} />
        </label>
        <label>
          샘플러
          <select value={d.sampler} onChange={field("sampler")}>
            {SAMPLERS.map((s) => (
              <option key={s} value={s}>
                {s}
              </option>
            ))}
          </select>
        </label>
        <label>
          스케줄러
          <select value={d.scheduler} onChange={field("scheduler")}>
            {SCHEDULERS.map((s) => (
              <option key={s} value={s}>
                {s}
              </option>
            ))}
          </select>
        </label>
        <label>
          스텝
          <input type="number" min={1} max={60} value={d.steps} onInput={field("steps")} />
        </label>
        <label>
          가이던스 스케일 (비우면 요청 값)
          <input type="number" min={0} max={30} step={0.1} value={d.scale} onInput={field("scale")} />
        </label>
        <label>
          너비
          <input type="number" min={64} max={4096} step={8} value={d.width} onInput={field("width")} />
        </label>
        <label>
          높이
          <input type="number" min={64} max={4096} step={8} value={d.height} onInput={field("height")} />
        </label>
      </div>
      <label>
        품질 프롬프트 (앞에 붙음)
        <textarea maxLength={2000} rows={2} value={d.quality_prompt} onInput={field("quality_prompt")} />
      </label>
      <label>
        네거티브 프롬프트
        <textarea maxLength={2000} rows={2} value={d.negative_prompt} onInput={field("negative_prompt")} />
      </label>
      <div class="row">
        <button type="submit" class="primary" disabled={busy}>
          저장
        </button>
        {onCancel ? (
          <button type="button" onClick={onCancel}>
            취소
          </button>
        ) : null}
      </div>
    </form>
  )
}

export const Images = () => {
  const presets = useLoad(() => get("/api/user/me/image-presets"))
  const gallery = useLoad(() => get("/api/user/me/images?limit=20"))
  const [more, setMore] = useState<Array<any>>([])
  const [nextBefore, setNextBefore] = useState<string | null | undefined>(undefined)
  const action = useAction()
  const gen = useAction()
  const [editing, setEditing] = useState<string | null>(null)
  const [creating, setCreating] = useState(false)
  const [prompt, setPrompt] = useState("")
  const [negative, setNegative] = useState("")
  const list: Array<Preset> = presets.data?.data.presets ?? []
  const max = presets.data?.data.max ?? 10
  const images: Array<any> = [...(gallery.data?.data.images ?? []), ...more]
  const cursor = nextBefore === undefined ? gallery.data?.data.next_before ?? null : nextBefore

  const reloadGallery = async () => {
    setMore([])
    setNextBefore(undefined)
    await gallery.reload()
  }

  return (
    <>
      <div class="page-head">
        <h1 tabIndex={-1}>이미지</h1>
      </div>
      <ErrorNote message={presets.error} />
      <ErrorNote message={action.error} />
      <Note message={action.note} />
      <div class="grid">
        <Section title="이미지 생성" id="generate-title">
          <form
            class="stack"
            onSubmit={async (e) => {
              e.preventDefault()
              const r = await gen.run(
                () => api("POST", "/api/user/me/images/generate", { input: prompt, parameters: negative.trim() ? { negative_prompt: negative } : {} }),
                "이미지를 만들었습니다. 갤러리에 추가되었습니다."
              )
              if (r) await reloadGallery()
            }}
          >
            <label for="gen-prompt">프롬프트</label>
            <textarea id="gen-prompt" required maxLength={8000} rows={3} value={prompt} onInput={(e) => setPrompt(e.currentTarget.value)} />
            <label for="gen-negative">네거티브 프롬프트 (선택)</label>
            <textarea id="gen-negative" maxLength={8000} rows={2} value={negative} onInput={(e) => setNegative(e.currentTarget.value)} />
            <p class="hint">활성 프리셋: {list.find((p) => p.active)?.name ?? "기본"}</p>
            <button type="submit" class="primary" disabled={gen.busy || prompt.trim() === ""} aria-busy={gen.busy}>
              {gen.busy ? "생성 중…" : "생성"}
            </button>
            <ErrorNote message={gen.error} />
            <Note message={gen.note} />
          </form>
        </Section>
        <Section
          title={`프리셋 (${list.length}/${max})`}
          id="presets-title"
          actions={
            <button type="button" disabled={list.length >= max || creating} onClick={() => setCreating(true)}>
              새 프리셋
            </button>
          }
        >
          {creating && (
            <PresetForm
              title="새 프리셋"
              initial={EMPTY}
              busy={action.busy}
              onCancel={() => setCreating(false)}
              onSubmit={async (d) => {
                const r = await action.run(() => api("POST", "/api/user/me/image-presets", bodyOf(d)), "프리셋을 만들었습니다.")
                if (r) {
                  setCreating(false)
                  await presets.reload()
                }
              }}
            />
          )}
          <TableWrap label="프리셋 목록">
            <table data-testid="presets-table">
              <thead>
                <tr>
                  <th scope="col">이름</th>
                  <th scope="col">설정</th>
                  <th scope="col">작업</th>
                </tr>
              </thead>
              <tbody>
                {list.map((p) => (
                  <tr key={p.id} data-preset={p.name}>
                    <td>
                      {p.name} {p.active ? <span class="badge badge-active">사용 중</span> : null}
                    </td>
                    <td class="muted">
                      {p.sampler} · {p.steps}스텝 · {p.width}×{p.height}
                    </td>
                    <td class="actions">
                      {!p.active ? (
                        <button
                          type="button"
                          aria-label={`${p.name} 사용`}
                          onClick={async () => {
                            await action.run(() => api("POST", `/api/user/me/image-presets/${p.id}/activate`), `'${p.name}' 프리셋을 사용합니다.`)
                            await presets.reload()
                          }}
                        >
                          사용
                        </button>
                      ) : null}
                      <button type="button" aria-label={`${p.name} 편집`} onClick={() => setEditing(editing === p.id ? null : p.id)}>
                        편집
                      </button>
                      <ConfirmButton
                        label="삭제"
                        danger
                        question={`'${p.name}' 프리셋을 삭제할까요?`}
                        confirmLabel="삭제"
                        onConfirm={async () => {
                          await action.run(() => api("DELETE", `/api/user/me/image-presets/${p.id}`), "프리셋을 삭제했습니다.")
                          await presets.reload()
                        }}
                      />
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
          </TableWrap>
          {editing !== null && list.some((p) => p.id === editing) ? (
            <PresetForm
              key={editing}
              title="프리셋 편집"
              initial={draftOf(list.find((p) => p.id === editing)!)}
              busy={action.busy}
              onCancel={() => setEditing(null)}
              onSubmit={async (d) => {
                const r = await action.run(() => api("PATCH", `/api/user/me/image-presets/${editing}`, bodyOf(d)), "프리셋을 저장했습니다.")
                if (r) {
                  setEditing(null)
                  await presets.reload()
                }
              }}
            />
          ) : null}
        </Section>
      </div>
      <Section title="내 갤러리" id="gallery-title" actions={<span class="muted">나만 볼 수 있습니다</span>}>
        <ErrorNote message={gallery.error} />
        {images.length === 0 && gallery.data ? <p>아직 만든 이미지가 없습니다.</p> : null}
        <ul class="gallery" data-testid="gallery">
          {images.map((img) => (
            <li key={img.id}>
              <figure>
                <img src={img.download_url} alt={`생성한 이미지: ${img.prompt.slice(0, 100)}`} width={img.width} height={img.height} loading="lazy" />
                <figcaption>
                  <span class="prompt">{img.prompt}</span>
                  <span class="muted">
                    {img.width}×{img.height} · {when(img.created_at)}
                  </span>
                  <span class="row">
                    <a class="button" href={img.download_url} download={`${img.id}.png`} aria-label={`이미지 내려받기: ${img.prompt.slice(0, 40)}`}>
                      내려받기
                    </a>
                    <ConfirmButton
                      label="삭제"
                      danger
                      question="이 이미지를 삭제할까요?"
                      confirmLabel="삭제"
                      onConfirm={async () => {
                        await action.run(() => api("DELETE", `/api/user/me/images/${img.id}`), "이미지를 삭제했습니다.")
                        await reloadGallery()
                      }}
                    />
                  </span>
                </figcaption>
              </figure>
            </li>
          ))}
        </ul>
        {cursor ? (
          <button
            type="button"
            onClick={async () => {
              const r = await action.run(() => get(`/api/user/me/images?limit=20&before=${encodeURIComponent(cursor)}`))
              if (r) {
                setMore((m) => [...m, ...r.data.images])
                setNextBefore(r.data.next_before)
              }
            }}
          >
            더 보기
          </button>
        ) : null}
      </Section>
    </>
  )
}
