"""The one multi-turn tool loop: every episode that lets a model call sandbox tools runs through
:func:`run_turns`, whatever produces the model's replies (the training environments' token-in,
token-out policy, a deployment answering chat messages in the playground, a test's script).

Each turn the model either calls tools, whose results go back to it before its next turn, or answers
without a call, which ends the episode. The loop stops at ``max_turns`` replies, at the deadline, when
a tool call's sandbox fails (an infrastructure failure, never the model's fault) or when the reply
side ends the episode itself (its reply was cut at its length limit, or no room is left).

:func:`run_agent` is the loop over chat messages (``model`` takes the conversation so far and the tool
schemas and returns the assistant's message: an OpenAI message dict, or text that may hold Hermes
``<tool_call>`` blocks)::

    with pool.acquire() as sandbox:
        episode = run_agent(model, sandbox, [{"role": "user", "content": "What is 2**100?"}])
    episode.answer, episode.stop_reason, episode.messages
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from posttrain.platform.sandbox.parser import ParsedTurn, ToolCall, parse_tool_calls
from posttrain.platform.sandbox.result import ToolResult
from posttrain.platform.sandbox.sandbox import Sandbox
from posttrain.platform.sandbox.tools import execute_turn, tool_schemas

Message = dict[str, Any]
Reply = Mapping[str, Any] | str
ModelFn = Callable[[list[Message], list[dict[str, Any]]], Reply]
Ran = list[tuple[ToolCall, ToolResult]]
StopReason = Literal[
    "answer",  # the model answered without calling a tool
    "max_turns",  # it used every turn
    "length",  # a reply hit its token limit before its end-of-turn token
    "context",  # the episode reached its token budget
    "time_budget",  # the episode's wall clock ran out
    "infrastructure_failure",  # the sandbox failed: redone, never scored
    "environment_error",  # the environment (a plugin) raised: never scored
]
UNSCORED: frozenset[str] = frozenset({"infrastructure_failure", "environment_error"})


@dataclass
class Ending:
    """How an episode ended: its reason, the answer (``answer``), why it failed (``error``), and the calls of
    the last turn that ran when not all of them did (an infrastructure failure, the deadline)."""

    reason: StopReason
    answer: str | None = None
    error: str | None = None
    ran: Ran = field(default_factory=list)


def run_turns(
    next_reply: Callable[[], ParsedTurn | Ending],
    give_results: Callable[[Ran], None],
    sandbox: Sandbox,
    *,
    allowed: list[str],
    max_turns: int,
    deadline: float,
    tool_timeout_s: float | None = None,
) -> Ending:
    """Alternate the model's replies (``next_reply``: its next turn, parsed with :func:`parse_tool_calls`, or an
    :class:`Ending` when it could not give one) and its tool calls, run in ``sandbox`` (``give_results``: hand a turn's results back to the
    model's side) until it answers, ``max_turns`` replies are used or ``deadline`` (``time.monotonic()``)
    passes."""
    for _ in range(max_turns):
        if time.monotonic() >= deadline:
            return Ending("time_budget")
        parsed = next_reply()
        if isinstance(parsed, Ending):
            return parsed
        if not parsed.calls:
            return Ending("answer", answer=parsed.content.strip())
        ran = execute_turn(sandbox, parsed.calls, allowed=allowed, deadline=deadline, timeout=tool_timeout_s)
        if ran and ran[-1][1].is_infrastructure_failure:
            return Ending("infrastructure_failure", error=ran[-1][1].to_message_content(), ran=ran)
        if len(ran) < len(parsed.calls):
            return Ending("time_budget", ran=ran)
        give_results(ran)
    return Ending("max_turns")


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
    on_message: Callable[[Message], None] | None = None,
) -> EpisodeResult:
    """:func:`run_turns` over chat messages: tool results are appended as ``tool`` messages (``on_message`` sees
    each assistant and tool message as it is appended); the input list is not modified."""
    schemas = tool_schemas(tools)
    history = list(messages)
    results: list[ToolResult] = []
    started = time.monotonic()

    def reply() -> ParsedTurn | Ending:
        answer = model(history, schemas)
        parsed = parse_tool_calls(answer)
        assistant: Message = {
            "role": "assistant",
            "content": answer.get("content") if isinstance(answer, Mapping) else answer,
        }
        if isinstance(answer, Mapping) and answer.get("tool_calls") and parsed.calls:
            assistant["tool_calls"] = [call.to_openai() for call in parsed.calls]  # calls in the text stay in the text
        append(assistant)
        if isinstance(answer, Mapping) and answer.get("finish_reason") == "length":
            return Ending("length")  # cut at max tokens: neither an answer nor calls, as training's episodes end it
        return parsed

    def append(message: Message) -> None:
        history.append(message)
        if on_message is not None:
            on_message(message)

    def give(ran: Ran) -> None:
        for call, result in ran:
            results.append(result)
            append({"role": "tool", "tool_call_id": call.id, "name": call.name, "content": result.to_message_content()})

    ending = run_turns(
        reply,
        give,
        sandbox,
        allowed=[s["function"]["name"] for s in schemas],
        max_turns=max_turns,
        deadline=started + time_budget_s,
        tool_timeout_s=tool_timeout_s,
    )
    give(ending.ran)
    turns = sum(m["role"] == "assistant" for m in history[len(messages) :])
    return EpisodeResult(history, ending.answer, ending.reason, turns, results, time.monotonic() - started)
