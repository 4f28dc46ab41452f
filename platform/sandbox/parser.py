"""Tool calls in model output: OpenAI ``tool_calls`` and Hermes-style ``<tool_call>`` text."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

HERMES_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|\Z)", re.DOTALL)


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


def _arguments(raw: Any) -> tuple[dict[str, Any], str | None]:
    if raw is None:
        return {}, None
    if isinstance(raw, str):
        try:
            raw = json.loads(raw) if raw.strip() else {}
        except json.JSONDecodeError as exc:
            return {}, f"tool arguments are not valid JSON: {exc}"
    if not isinstance(raw, dict):
        return {}, "tool arguments must be a JSON object"
    return raw, None


def _from_openai(item: Mapping[str, Any]) -> ToolCall:
    function = item.get("function") or {}
    name = str(function.get("name") or "")
    args, error = _arguments(function.get("arguments"))
    call_id = str(item.get("id") or f"call_{uuid.uuid4().hex[:12]}")
    if not name:
        error = error or "tool call without a function name"
    return ToolCall(name=name, arguments=args, id=call_id, error=error)


def _from_hermes(body: str) -> ToolCall:
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        return ToolCall(name="", error=f"<tool_call> body is not valid JSON: {exc}")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall(name="", error='<tool_call> body must be {"name": ..., "arguments": {...}}')
    args, error = _arguments(obj.get("arguments", obj.get("parameters")))
    return ToolCall(name=obj["name"], arguments=args, error=error)


def parse_tool_calls(message: Mapping[str, Any] | str) -> ParsedTurn:
    """Tool calls of one assistant turn: an OpenAI message dict (``tool_calls``) or
    plain text with Hermes ``<tool_call>{"name": ..., "arguments": ...}</tool_call>`` blocks."""
    if isinstance(message, Mapping):
        content = message.get("content") or ""
        if not isinstance(content, str):  # list of content parts
            content = "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
        if message.get("tool_calls"):
            return ParsedTurn(content, [_from_openai(item) for item in message["tool_calls"]])
    else:
        content = message
    calls = [_from_hermes(m.group(1)) for m in HERMES_CALL.finditer(content)]
    return ParsedTurn(HERMES_CALL.sub("", content).strip() if calls else content, calls)
