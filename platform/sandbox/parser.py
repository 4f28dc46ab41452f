"""Tool calls in model output: OpenAI ``tool_calls`` and Hermes-style ``<tool_call>`` text."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
MAX_JSON_DEPTH = 64  # deeper arguments are refused: json would recurse, and no tool takes such input


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for. ``error`` is set when it could not be parsed;
    running it then yields an ERROR result that tells the model why."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:12]}")
    error: str | None = None

    def to_openai(self, index: int | None = None) -> dict[str, Any]:
        call: dict[str, Any] = {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)},
        }
        if index is not None:
            call["index"] = index  # streamed tool-call deltas carry their position
        return call


@dataclass(frozen=True)
class ParsedTurn:
    content: str  # the text with Hermes tool-call blocks removed
    calls: list[ToolCall]


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _too_deep(text: str) -> bool:
    """Whether brackets nest deeper than MAX_JSON_DEPTH (outside strings): checked before json.loads,
    which would otherwise recurse until RecursionError."""
    depth = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return True
        elif ch in "]}":
            depth -= 1
    return False


def _loads(text: str, what: str) -> tuple[Any, str | None]:
    """Strict JSON (no NaN/Infinity, bounded nesting) or an error message for the model."""
    if _too_deep(text):
        return None, f"{what} nest deeper than {MAX_JSON_DEPTH} levels; send flat JSON"
    try:
        return json.loads(text, parse_constant=_no_constant), None
    except (json.JSONDecodeError, ValueError) as exc:
        return None, f"{what} are not valid JSON: {exc}"


def _arguments(raw: Any) -> tuple[dict[str, Any], str | None]:
    if raw is None:
        return {}, None
    if isinstance(raw, str):
        if not raw.strip():
            return {}, None
        raw, error = _loads(raw, "tool arguments")
        if error:
            return {}, error
    elif isinstance(raw, dict):
        # Already decoded: it must still be what strict JSON can carry back out.
        try:
            raw = json.loads(json.dumps(raw, allow_nan=False), parse_constant=_no_constant)
        except (TypeError, ValueError, RecursionError) as exc:
            return {}, f"tool arguments must be plain JSON values: {exc}"
        if _too_deep(json.dumps(raw)):
            return {}, f"tool arguments nest deeper than {MAX_JSON_DEPTH} levels; send flat JSON"
    if not isinstance(raw, dict):
        return {}, "tool arguments must be a JSON object"
    return raw, None


def _from_openai(item: Any) -> ToolCall:
    if not isinstance(item, Mapping):
        return ToolCall(
            name="", error=f'a tool call must be an object {{"id", "type", "function"}}, got {type(item).__name__}'
        )
    call_id = item.get("id")
    call_id = call_id if isinstance(call_id, str) and call_id else f"call_{uuid.uuid4().hex[:12]}"
    function = item.get("function")
    if not isinstance(function, Mapping):
        return ToolCall(name="", id=call_id, error='a tool call needs "function": {"name": ..., "arguments": ...}')
    name = function.get("name")
    if not isinstance(name, str):
        name = ""
    args, error = _arguments(function.get("arguments"))
    if not name:
        error = error or "tool call without a function name"
    return ToolCall(name=name, arguments=args, id=call_id, error=error)


def _from_hermes(body: str) -> ToolCall:
    obj, error = _loads(body, "<tool_call> body")
    if error:
        return ToolCall(name="", error=error.replace(" are ", " is ", 1))
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall(name="", error='<tool_call> body must be {"name": ..., "arguments": {...}}')
    args, error = _arguments(obj.get("arguments", obj.get("parameters")))
    return ToolCall(name=obj["name"], arguments=args, error=error)


def _hermes_blocks(text: str) -> tuple[str, list[str]]:
    """Text outside ``<tool_call>`` blocks, and each block's body (an unclosed block runs to the end).
    A linear scan with str.find: no regex backtracking on long or adversarial output."""
    bodies: list[str] = []
    outside: list[str] = []
    pos = 0
    while (start := text.find(OPEN_TAG, pos)) >= 0:
        outside.append(text[pos:start])
        body_at = start + len(OPEN_TAG)
        end = text.find(CLOSE_TAG, body_at)
        if end < 0:
            bodies.append(text[body_at:].strip())
            pos = len(text)
            break
        bodies.append(text[body_at:end].strip())
        pos = end + len(CLOSE_TAG)
    outside.append(text[pos:])
    return "".join(outside), bodies


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return "".join(
            part["text"] for part in content if isinstance(part, Mapping) and isinstance(part.get("text"), str)
        )
    return ""


def parse_tool_calls(message: Mapping[str, Any] | str) -> ParsedTurn:
    """Tool calls of one assistant turn: an OpenAI message dict (``tool_calls``) or
    plain text with Hermes ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks."""
    if isinstance(message, Mapping):
        content = _content_text(message.get("content"))
        tool_calls = message.get("tool_calls")
        if tool_calls:
            if not isinstance(tool_calls, list):
                return ParsedTurn(content, [ToolCall(name="", error="tool_calls must be a list of tool calls")])
            return ParsedTurn(content, [_from_openai(item) for item in tool_calls])
    elif isinstance(message, str):
        content = message
    else:
        content = ""
    outside, bodies = _hermes_blocks(content)
    calls = [_from_hermes(body) for body in bodies]
    return ParsedTurn(outside.strip() if calls else content, calls)
