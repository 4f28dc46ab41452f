"""The chat template the locally built tokenizers carry.

Qwen2.5 / Hermes conventions, so that a real Qwen checkpoint and a tiny local
one render messages, tools and tool calls the same way (and vLLM's
``hermes`` tool-call parser reads the output):

- ``<|im_start|>role\n...<|im_end|>`` turns;
- tools listed as JSON inside ``<tools></tools>`` in the system turn;
- a tool call is ``<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>``;
- a tool result is a user turn wrapping ``<tool_response>...</tool_response>``;
- an image part is ``<|vision_start|><|image_pad|><|vision_end|>``.
"""

# Every literal is inside {{ '...' }} so that the trim_blocks/lstrip_blocks settings
# transformers renders with cannot eat a newline.
CHAT_TEMPLATE = (
    "{%- macro render_content(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- elif content is iterable and content is not mapping -%}"
    "{%- for part in content -%}"
    "{%- if part.type == 'text' -%}{{ part.text }}"
    "{%- elif part.type in ['image', 'image_url'] -%}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages[0].role == 'system' -%}{{- render_content(messages[0].content) -}}"
    "{%- else -%}{{- 'You are a helpful assistant.' -}}{%- endif -%}"
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' -}}{{- tool | tojson -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}"
    "\\n</tool_call><|im_end|>\\n' -}}"
    "{%- elif messages[0].role != 'system' -%}"
    "{{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' -%}"
    "{%- if not (loop.first and tools) -%}"
    "{{- '<|im_start|>system\\n' + render_content(message.content) + '<|im_end|>\\n' -}}"
    "{%- endif -%}"
    "{%- elif message.role == 'user' -%}"
    "{{- '<|im_start|>user\\n' + render_content(message.content) + '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'assistant' -%}"
    "{{- '<|im_start|>assistant\\n' + render_content(message.content) -}}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{%- if message.content or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    "{{- '<tool_call>\\n{\"name\": \"' + fn.name + '\", \"arguments\": ' -}}"
    "{%- if fn.arguments is string -%}{{- fn.arguments -}}{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
    "{{- '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'tool' -%}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}"
    "{{- '\\n<tool_response>\\n' + render_content(message.content) + '\\n</tool_response>' -}}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
# A conversation that offers tools, or carries tool calls or tool results.
_USES_TOOLS = (
    "tools or (messages | selectattr('role', 'equalto', 'tool') | list)"
    " or (messages | selectattr('tool_calls') | list)"
)


def supports_tools(template: str) -> bool:
    return "tools" in template and "tool_call" in template


def with_tool_support(template: str) -> str:
    """A ChatML template that ignores tools (SmolLM2's: each turn is ``role + content``, so a tool
    call's ``content: None`` fails to render) extended with the Hermes tool format above: a
    conversation with tools renders as Qwen2.5 / vLLM's ``hermes`` parser expect, any other
    renders exactly as the model's own template did. A template that handles tools, or is not
    ChatML, is returned unchanged."""
    if supports_tools(template) or "<|im_start|>" not in template:
        return template
    return "{%- if " + _USES_TOOLS + " -%}" + CHAT_TEMPLATE + "{%- else -%}" + template + "{%- endif -%}"
