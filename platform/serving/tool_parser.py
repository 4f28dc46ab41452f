"""Tool calls in generated text, for the OpenAI API: Hermes-style
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks.

Parsing itself is the sandbox agent loop's (one parser for the whole platform);
this module adds what serving needs on top: all-or-nothing acceptance (a block
that does not parse leaves the whole output as plain text) and how much of a
partial output can be streamed before a call might begin.
"""

from __future__ import annotations

from posttrain.platform.sandbox.parser import ToolCall
from posttrain.platform.sandbox.parser import parse_tool_calls as parse_turn

TOOL_CALL_OPEN = "<tool_call>"


def parse_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """Split model output into (content before the first call, parsed calls). Unparseable blocks stay as text."""
    start = text.find(TOOL_CALL_OPEN)
    if start < 0:
        return text, []
    calls = parse_turn(text[start:]).calls
    if not calls or any(call.error for call in calls):
        return text, []
    return text[:start].rstrip(), calls


def safe_prefix_len(text: str) -> int:
    """How much of ``text`` can be streamed as content: up to a tool call or a possible start of one."""
    at = text.find(TOOL_CALL_OPEN)
    if at >= 0:
        return at
    for keep in range(min(len(TOOL_CALL_OPEN) - 1, len(text)), 0, -1):
        if TOOL_CALL_OPEN.startswith(text[-keep:]):
            return len(text) - keep
    return len(text)
