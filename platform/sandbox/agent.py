"""The multi-turn tool loop of one episode.

``model`` is any callable that takes the conversation so far and the tool
schemas and returns the assistant's message (an OpenAI message dict, or plain
text that may hold Hermes ``<tool_call>`` blocks)::

    with pool.acquire() as sandbox:
        episode = run_agent(model, sandbox, [{"role": "user", "content": "What is 2**100?"}])
    episode.answer, episode.stop_reason, episode.messages
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from posttrain.platform.sandbox.parser import parse_tool_calls
from posttrain.platform.sandbox.result import ToolResult
from posttrain.platform.sandbox.sandbox import Sandbox
from posttrain.platform.sandbox.tools import execute_turn, tool_schemas

Message = dict[str, Any]
ModelFn = Callable[[list[Message], list[dict[str, Any]]], Mapping[str, Any] | str]
StopReason = Literal["answer", "max_turns", "time_budget", "infrastructure_failure"]


@dataclass
class EpisodeResult:
    messages: list[Message]
    answer: str | None
    stop_reason: StopReason
    turns: int
    tool_results: list[ToolResult] = field(default_factory=list)
    elapsed_s: float = 0.0

    @property
    def infrastructure_failure(self) -> bool:
        """True when the episode must not be scored: the sandbox failed, not the model."""
        return self.stop_reason == "infrastructure_failure"


def run_agent(
    model: ModelFn,
    sandbox: Sandbox,
    messages: list[Message],
    *,
    tools: list[str] | None = None,
    max_turns: int = 8,
    time_budget_s: float = 120.0,
    tool_timeout_s: float | None = None,
) -> EpisodeResult:
    """Alternate model turns and tool calls until the model answers without calling a tool,
    ``max_turns`` model turns are used, or ``time_budget_s`` runs out. Tool results are
    appended as ``tool`` messages; the input list is not modified."""
    schemas = tool_schemas(tools)
    allowed = [s["function"]["name"] for s in schemas]
    history = list(messages)
    results: list[ToolResult] = []
    started = time.monotonic()
    turns = 0

    def finish(answer: str | None, reason: StopReason) -> EpisodeResult:
        return EpisodeResult(history, answer, reason, turns, results, time.monotonic() - started)

    while turns < max_turns:
        if time.monotonic() - started >= time_budget_s:
            return finish(None, "time_budget")
        reply = model(history, schemas)
        turns += 1
        parsed = parse_tool_calls(reply)
        if isinstance(reply, Mapping):
            assistant: Message = {"role": "assistant", "content": reply.get("content")}
            if parsed.calls:
                assistant["tool_calls"] = [call.to_openai() for call in parsed.calls]
        else:
            assistant = {"role": "assistant", "content": reply}
        history.append(assistant)
        if not parsed.calls:
            return finish(parsed.content, "answer")
        ran = execute_turn(sandbox, parsed.calls, allowed=allowed, deadline=started + time_budget_s, timeout=tool_timeout_s)
        for call, result in ran:
            results.append(result)
            history.append(
                {"role": "tool", "tool_call_id": call.id, "name": call.name, "content": result.to_message_content()}
            )
        if ran and ran[-1][1].is_infrastructure_failure:
            return finish(None, "infrastructure_failure")
        if len(ran) < len(parsed.calls):
            return finish(None, "time_budget")
    return finish(None, "max_turns")
