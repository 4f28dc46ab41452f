"""The chat templates the platform writes: ChatML (the locally built tokenizers carry it) and Gemma's turns, and
the plain completion format a base model is trained and evaluated in.

Qwen2.5 / Hermes conventions, so that a real Qwen checkpoint and a tiny local
one render messages, tools and tool calls the same way (and vLLM's
``hermes`` tool-call parser reads the output):

- ``<|im_start|>role\n...<|im_end|>`` turns;
- tools listed as JSON inside ``<tools></tools>`` in the system turn;
- a tool call is ``<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>``;
- a tool result is a user turn wrapping ``<tool_response>...</tool_response>``;
- an image part is ``<|vision_start|><|image_pad|><|vision_end|>``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Every literal is inside {{ '...' }} so that the trim_blocks/lstrip_blocks settings
# transformers renders with cannot eat a newline. The pieces below are shared by every family's template:
# how content is rendered, how tools are listed, how a tool call is written.
_RENDER_CONTENT = (
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
)
_TOOLS_LIST = (
    "{{- '\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}"
    "{%- for tool in tools -%}{{- '\\n' -}}{{- tool | tojson -}}{%- endfor -%}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}'
    "\\n</tool_call>' -}}"
)
_TOOL_CALLS = (
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{%- if message.content or not loop.first -%}{{- '\\n' -}}{%- endif -%}"
    '{{- \'<tool_call>\\n{"name": "\' + fn.name + \'", "arguments": \' -}}'
    "{%- if fn.arguments is string -%}{{- fn.arguments -}}{%- else -%}{{- fn.arguments | tojson -}}{%- endif -%}"
    "{{- '}\\n</tool_call>' -}}"
    "{%- endfor -%}"
)


def _tool_results(open_turn: str, close_turn: str) -> str:
    """Consecutive tool results as one user turn of ``<tool_response>`` blocks."""
    return (
        "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '" + open_turn + "' -}}{%- endif -%}"
        "{{- '\\n<tool_response>\\n' + render_content(message.content) + '\\n</tool_response>' -}}"
        "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '" + close_turn + "' -}}{%- endif -%}"
    )


CHAT_TEMPLATE = (
    _RENDER_CONTENT + "{%- if tools -%}"
    "{{- '<|im_start|>system\\n' -}}"
    "{%- if messages[0].role == 'system' -%}{{- render_content(messages[0].content) -}}"
    "{%- else -%}{{- 'You are a helpful assistant.' -}}{%- endif -%}" + _TOOLS_LIST + "{{- '<|im_end|>\\n' -}}"
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
    "{{- '<|im_start|>assistant\\n' + render_content(message.content) -}}" + _TOOL_CALLS + "{{- '<|im_end|>\\n' -}}"
    "{%- elif message.role == 'tool' -%}" + _tool_results("<|im_start|>user", "<|im_end|>\\n") + "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

# Gemma's own turns (Gemma 3's template: a system message opens the first user turn, the assistant's role is
# ``model``, content trimmed), with the same tool format: the tools listed after the system text in the first
# user turn, calls in the model's turn, results in a user turn.
GEMMA_TEMPLATE = (
    _RENDER_CONTENT + "{{- bos_token -}}"
    "{%- set ns = namespace(prefix='', pending=true) -%}"
    "{%- if messages[0].role == 'system' -%}{%- set ns.prefix = render_content(messages[0].content) | trim -%}{%- endif -%}"
    "{%- if tools -%}{%- set listed -%}" + _TOOLS_LIST + "{%- endset -%}"
    "{%- set ns.prefix = (ns.prefix + listed) | trim -%}{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if not (loop.first and message.role == 'system') -%}"
    "{%- if ns.pending and ns.prefix and message.role != 'user' -%}"
    "{{- '<start_of_turn>user\\n' + ns.prefix + '<end_of_turn>\\n' -}}{%- set ns.pending = false -%}"
    "{%- endif -%}"
    "{%- if message.role in ['user', 'system'] -%}"
    "{{- '<start_of_turn>user\\n' -}}"
    "{%- if ns.pending and ns.prefix -%}{{- ns.prefix + '\\n\\n' -}}{%- endif -%}"
    "{{- render_content(message.content) | trim + '<end_of_turn>\\n' -}}"
    "{%- elif message.role == 'assistant' -%}"
    "{{- '<start_of_turn>model\\n' + render_content(message.content) | trim -}}"
    + _TOOL_CALLS
    + "{{- '<end_of_turn>\\n' -}}"
    "{%- elif message.role == 'tool' -%}" + _tool_results("<start_of_turn>user", "<end_of_turn>\\n") + "{%- endif -%}"
    "{%- set ns.pending = false -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<start_of_turn>model\\n' -}}{%- endif -%}"
)
# The plain completion format a base model (no chat template) is trained and evaluated in, as TRL trains a
# non-conversational dataset: prompt and answer as text. The conversation as text, each question after "Question:"
# and each answer after "Answer:", the worked examples first, then "Answer:" for the model to continue. SFT trains
# the answer and the end-of-sequence token after it (:func:`completion_end`); a base model not yet trained to stop
# goes on with another "Question:", where its answer is cut (:func:`completion_cut`, :func:`completion_answer`), in
# GRPO's rollouts as in evaluation. It has no tool turns. A run selects it as its ``chat_template`` by the name
# ``completion`` (:data:`COMPLETION`); a model with no template of its own gets it by default.
COMPLETION_TEMPLATE = (
    _RENDER_CONTENT + "{%- if bos_token -%}{{- bos_token -}}{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' -%}{{- render_content(message.content) | trim + '\\n\\n' -}}"
    "{%- elif message.role == 'user' -%}{{- 'Question: ' + render_content(message.content) | trim + '\\n' -}}"
    "{%- elif message.role == 'assistant' and not message.tool_calls -%}"
    "{{- 'Answer: ' + render_content(message.content) | trim + '\\n\\n' -}}"
    "{%- else -%}{{- raise_exception('the plain completion format has no tool calls or tool results: give the model "
    "a chat template (a family: chatml, gemma) to use tools') -}}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- 'Answer:' -}}{%- endif -%}"
)
COMPLETION = "completion"  # the name a run's chat_template gives the completion format by
COMPLETION_STOP = "\nQuestion:"


def is_completion_format(tokenizer: Any) -> bool:
    """Whether ``tokenizer`` renders in the plain completion format (a base model's)."""
    return getattr(tokenizer, "chat_template", None) == COMPLETION_TEMPLATE


def completion_answer(text: str) -> str:
    """A base model's continuation in the completion format, cut where it goes on to a question of its own."""
    return text.split(COMPLETION_STOP, 1)[0].strip()


def completion_cut(tokenizer: Any, token_ids: Sequence[int]) -> tuple[int, str, bool]:
    """Where a sampled continuation in the completion format ends, token for token: how many of ``token_ids`` are
    kept (all of them, or those through the token where it goes on to a question of its own: that token is the
    decision to end the answer, scored like a chat template's end of turn), the answer as evaluation reads it
    (:func:`completion_answer` of the whole text), and whether it went on to a question (the answer ended there)."""
    ids = list(token_ids)
    text = tokenizer.decode(ids, skip_special_tokens=True)
    at = text.find(COMPLETION_STOP)
    if at < 0:
        return len(ids), completion_answer(text), False
    kept = next(
        (n for n in range(1, len(ids)) if len(tokenizer.decode(ids[:n], skip_special_tokens=True)) > at), len(ids)
    )
    return kept, completion_answer(text), True


def completion_end(text: str, tokenizer: Any) -> str:
    """A conversation rendered in the completion format, its last answer ended by the end-of-sequence token instead of
    the blank line that would lead to the next question: what SFT trains (the answer, then stop)."""
    return text.rstrip("\n") + (tokenizer.eos_token or "")


FAMILY_TEMPLATES = {"chatml": CHAT_TEMPLATE, "gemma": GEMMA_TEMPLATE}  # the templates an operator can assign, by family
_FAMILY_MARKERS = {"chatml": "<|im_start|>", "gemma": "<start_of_turn>"}
_TURN_ENDS = {"chatml": "<|im_end|>", "gemma": "<end_of_turn>"}  # what each family writes after a message
_FAMILY_OF_MODEL_TYPE = {"gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "gemma3_text": "gemma"}


def resolve_template(spec: str) -> str:
    """The template an operator assigns: a family's by name (``chatml``, ``gemma``; each writes the platform's
    tool format), ``completion`` (the plain completion format, :data:`COMPLETION_TEMPLATE`) or a Jinja template's
    own text."""
    if spec in FAMILY_TEMPLATES:
        return FAMILY_TEMPLATES[spec]
    if spec == COMPLETION:
        return COMPLETION_TEMPLATE
    if "{{" in spec or "{%" in spec:
        return spec
    raise ValueError(
        f"chat template {spec!r} is neither a family ({', '.join(FAMILY_TEMPLATES)}), {COMPLETION} (the plain "
        "completion format) nor a Jinja template; give a family name, completion or the template's text"
    )


def assigned_name(spec: str) -> str:
    """How the registry records an assigned template: its family's name, ``completion``, or ``custom``."""
    return spec if spec in FAMILY_TEMPLATES or spec == COMPLETION else "custom"


def template_family(template: str) -> str | None:
    """The turn format a template writes (``chatml``, ``gemma``), or None when it is neither."""
    return next((family for family, marker in _FAMILY_MARKERS.items() if marker in template), None)


def reply_end_ids(tokenizer: Any, eos: int | list[int] | None = None) -> list[int]:
    """Where a reply ends: the generation config's end-of-sequence ids (``eos``), the tokenizer's, and the token that
    ends a turn in the tokenizer's chat template. A base model given Gemma's template learns to end its turn with
    ``<end_of_turn>``, not the ``<eos>`` that ends its documents: a decoder that stops at ``<eos>`` alone runs on
    past the answer."""
    ids = [eos] if isinstance(eos, int) else list(eos or [])
    template = getattr(tokenizer, "chat_template", None)
    text = template if isinstance(template, str) else " ".join(template.values()) if isinstance(template, dict) else ""
    family = template_family(text)
    candidates = [tokenizer.eos_token_id] + ([tokenizer.convert_tokens_to_ids(_TURN_ENDS[family])] if family else [])
    for token_id in candidates:
        if isinstance(token_id, int) and token_id != tokenizer.unk_token_id and token_id not in ids:
            ids.append(token_id)
    return ids


def model_family(model_type: str) -> str:
    """The family template offered first for a model of this ``config.model_type``: its own family's turn
    markers (Gemma's), else ChatML, the platform's default."""
    return _FAMILY_OF_MODEL_TYPE.get(model_type, "chatml")


# A conversation that offers tools, or carries tool calls or tool results.
_USES_TOOLS = (
    "tools or (messages | selectattr('role', 'equalto', 'tool') | list) or (messages | selectattr('tool_calls') | list)"
)


def supports_tools(template: str) -> bool:
    return "tools" in template and "tool_call" in template


def with_tool_support(template: str) -> str:
    """A template that ignores tools (SmolLM2's ChatML: each turn is ``role + content``, so a tool call's
    ``content: None`` fails to render; a Gemma template) extended with the Hermes tool format above in its own
    family's turns: a conversation with tools renders as Qwen2.5 / vLLM's ``hermes`` parser expect, any other
    renders exactly as the model's own template did. A template that handles tools, or whose turns are of no
    family known here, is returned unchanged."""
    family = template_family(template)
    if supports_tools(template) or family is None:
        return template
    return "{%- if " + _USES_TOOLS + " -%}" + FAMILY_TEMPLATES[family] + "{%- else -%}" + template + "{%- endif -%}"
