/** Korean user messages of the Anthropic Messages API (field errors name the field and path, never the value). */
export const AnthropicMessages = {
  field: {
    model: "model 은 256자 이하의 문자열이어야 합니다.",
    max_tokens: "max_tokens 는 양의 정수여야 합니다.",
    messages:
      "messages 형식이 올바르지 않습니다. {role: user|assistant, content} 객체 배열(최소 1개)이어야 하며, content 는 문자열 또는 블록 배열입니다.",
    system: "system 은 문자열 또는 text 블록 배열이어야 합니다.",
    tools:
      "tools 형식이 올바르지 않습니다. 각 도구는 {name, description, input_schema} 형식이며 이름은 ^[a-zA-Z0-9_-]{1,64}$ 형식이어야 합니다.",
    tool_choice: "tool_choice 는 {type: auto|any|none} 또는 {type: tool, name} 이어야 합니다.",
    stop_sequences: "stop_sequences 는 최대 4개의 문자열 배열이어야 하며, 각 문자열은 256자 이하여야 합니다.",
    temperature: "temperature 는 0 이상 1 이하의 숫자여야 합니다.",
    top_p: "top_p 는 0 이상 1 이하의 숫자여야 합니다.",
    top_k: "top_k 는 양의 정수여야 합니다.",
    stream: "stream 은 true 또는 false 여야 합니다.",
    thinking: "thinking 은 {type: enabled, budget_tokens} 또는 {type: disabled} 이어야 합니다.",
    metadata: "metadata 는 객체여야 합니다."
  } as Record<string, string>,
  messageKey: {
    role: "role 은 user 또는 assistant 여야 합니다.",
    content: "content 는 문자열 또는 블록 배열이어야 합니다.",
    type: "블록의 type 은 text, image, tool_use, tool_result, thinking 중 하나여야 합니다.",
    text: "text 는 문자열이어야 합니다.",
    source: "image.source 는 {type: base64, media_type, data} 또는 {type: url, url} 이어야 합니다.",
    media_type: "image.source.media_type 은 image/jpeg, image/png, image/gif, image/webp 중 하나여야 합니다.",
    data: "image.source.data 는 base64 문자열이어야 합니다.",
    url: "image.source.url 은 https URL 이어야 합니다.",
    id: "tool_use.id 는 256자 이하의 문자열이어야 합니다.",
    name: "tool_use.name 은 256자 이하의 문자열이어야 합니다.",
    input: "tool_use.input 은 객체여야 합니다.",
    tool_use_id: "tool_result.tool_use_id 는 256자 이하의 문자열이어야 합니다.",
    is_error: "tool_result.is_error 는 true 또는 false 여야 합니다.",
    thinking: "thinking 블록의 thinking 은 문자열이어야 합니다."
  } as Record<string, string>,
  unsupportedBlock: (type: string, where: string) =>
    `지원하지 않는 콘텐츠 블록입니다: ${type} (위치: ${where}). text, image, tool_use, tool_result, thinking 블록만 사용할 수 있습니다.`,
  serverTool: (type: string) =>
    `게이트웨이가 실행할 수 없는 서버 도구입니다: ${type}. input_schema 를 가진 사용자 정의 도구만 사용할 수 있습니다.`,
  assistantBlock: "assistant 메시지에는 text, thinking, tool_use 블록만 사용할 수 있습니다."
} as const
