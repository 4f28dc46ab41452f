"""A small OpenAI-compatible chat client (httpx) for the console's playground and for scripts.

The official ``openai`` package works against the same endpoints; this one keeps
the platform's runtime dependencies small and streams deltas as plain dicts.
:func:`chat_as` is the console's chat: an audited operator action that sends the
console's own API key for the model, once keys exist (:func:`posttrain.platform.api_keys.service_key`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx

from posttrain.platform.api_keys import ApiKeyError, service_key
from posttrain.platform.auth import AUDITED_CHARS, Identity, action, audit
from posttrain.platform.db.models import Role
from posttrain.platform.sandbox import tool_schemas
from posttrain.platform.sandbox.agent import UNSCORED, EpisodeResult, ModelFn, run_agent
from posttrain.platform.sandbox.parser import parse_tool_calls
from posttrain.platform.serving.gateway import TIER_HEADER
from posttrain.platform.settings import get_settings
from posttrain.platform.tasks import store
from posttrain.platform.tasks.episodes import (
    ANSWER_TOOLS,
    PROJECT_TOOLS,
    episode_messages,
    grade_answer,
    grade_project,
    is_project,
    lay_out,
    task_messages,
)
from posttrain.platform.verifiers import Verdict, default_service


class ChatError(RuntimeError):
    """The server answered with an OpenAI-style error (the message is the server's)."""


def _raise_for(resp: httpx.Response) -> None:
    if resp.status_code >= 400:
        resp.read()
        try:
            message = resp.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = resp.text[:500]
        raise ChatError(f"{resp.status_code}: {message}")


def stream_chat(
    base_url: str,
    model: str,
    messages: list[dict[str, Any]],
    *,
    tier: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    max_tokens: int = 256,
    temperature: float = 0.0,
    timeout_s: float = 300.0,
    api_key: str | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield each streamed ``delta`` (content pieces, tool calls), then ``{"finish_reason": ...}``."""
    body: dict[str, Any] = {
        "model": model, "messages": messages, "stream": True, "max_tokens": max_tokens, "temperature": temperature,
    }  # fmt: skip
    if tools:
        body["tools"] = tools
    headers = {TIER_HEADER: tier} if tier else {}
    if api_key:
        headers["authorization"] = f"Bearer {api_key}"
    with httpx.stream(
        "POST", f"{base_url.rstrip('/')}/v1/chat/completions", json=body, headers=headers, timeout=timeout_s
    ) as resp:
        _raise_for(resp)
        for line in resp.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: ") :]
            if data == "[DONE]":
                return
            event = json.loads(data)
            if "error" in event:
                raise ChatError(event["error"].get("message", "error while streaming"))
            for choice in event.get("choices", []):
                if choice.get("delta"):
                    yield choice["delta"]
                if choice.get("finish_reason"):
                    yield {"finish_reason": choice["finish_reason"]}


CONSOLE_KEY = "console"  # the name of the console's own API key


@action("model.chat", Role.operator)
def chat_as(
    identity: Identity,
    base_url: str,
    model: str,
    messages: list[dict[str, Any]],
    *,
    tier: str | None = None,
    tools: list[dict[str, Any]] | None = None,
    max_tokens: int = 256,
    temperature: float = 0.0,
    url: str | None = None,
) -> Iterator[dict[str, Any]]:
    """:func:`stream_chat` for a console user (the playground, a task's "ask the model"): audited, and
    sent, once keys exist, with the console's own API key for ``model``, which may use that model alone."""
    audit(identity.username, "model.chat", target=model, details={"url": base_url, "tier": tier}, url=url)
    try:
        key = service_key(CONSOLE_KEY, model, get_settings().secrets_dir(), url=url)
    except ApiKeyError as exc:
        raise ChatError(str(exc)) from None
    return stream_chat(base_url, model, messages, tier=tier, tools=tools, max_tokens=max_tokens,
                       temperature=temperature, api_key=key)  # fmt: skip


def choose_by_loglik(
    base_url: str, model: str, context: str, options: list[str], *, api_key: str | None = None, timeout_s: float = 120.0
) -> tuple[int, list[float]]:
    """A log-likelihood multiple-choice answer through the completions API, as evaluation harnesses ask it: each
    ``context + option`` echoed with its tokens' log-probs (one request, the options as a list of prompts), each
    option scored by the summed log-probs of the tokens that start at or after the end of ``context``. Returns the
    index of the likeliest option and every option's score."""
    resp = httpx.post(f"{base_url.rstrip('/')}/v1/completions", timeout=timeout_s,
                      headers={"Authorization": f"Bearer {api_key}"} if api_key else {},
                      json={"model": model, "prompt": [context + o for o in options], "max_tokens": 1, "temperature": 0,
                            "echo": True, "logprobs": 0})  # fmt: skip
    _raise_for(resp)
    scores = []
    for option, choice in zip(options, sorted(resp.json()["choices"], key=lambda c: c["index"])):
        found = choice["logprobs"]
        end = len(context) + len(option)  # the one generated token lies beyond the echoed prompt
        scores.append(sum(lp for at, lp in zip(found["text_offset"], found["token_logprobs"])
                          if len(context) <= at < end and lp is not None))  # fmt: skip
    return max(range(len(options)), key=scores.__getitem__), scores


def list_models(base_url: str, *, timeout_s: float = 5.0) -> list[str]:
    resp = httpx.get(f"{base_url.rstrip('/')}/v1/models", timeout=timeout_s)
    _raise_for(resp)
    return [m["id"] for m in resp.json().get("data", [])]


def prometheus_values(base_url: str, names: tuple[str, ...], *, timeout_s: float = 2.0) -> dict[str, float]:
    """Read a few metrics from a deployment's ``/metrics`` (Prometheus text), summed over labels."""
    resp = httpx.get(f"{base_url.rstrip('/')}/metrics", timeout=timeout_s)
    _raise_for(resp)
    values: dict[str, float] = {}
    for line in resp.text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        key, _, value = line.rpartition(" ")
        name = key.split("{", 1)[0]
        if name in names:
            try:
                values[name] = values.get(name, 0.0) + float(value)
            except ValueError:
                continue
    return values


def assistant_message(deltas: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """A streamed reply's deltas as one assistant message: the content pieces joined, tool calls merged by their
    ``index`` (a server may stream a call's arguments in pieces: the first piece carries its id and name), and the
    ``finish_reason`` the server ended it with (``length``: cut at max tokens)."""
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    finish: str | None = None
    for delta in deltas:
        finish = delta.get("finish_reason") or finish
        content.append(delta.get("content") or "")
        for piece in delta.get("tool_calls") or []:
            call = calls.setdefault(
                int(piece.get("index", len(calls))), {"type": "function", "function": {"name": "", "arguments": ""}}
            )
            call["id"] = piece.get("id") or call.get("id")
            function = piece.get("function") or {}
            call["function"]["name"] += function.get("name") or ""
            call["function"]["arguments"] += function.get("arguments") or ""
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    if finish is not None:
        message["finish_reason"] = finish
    return message


PLAYGROUND_TOOLS = ("python", "bash", "read_file", "write_file", "edit_file", "list_dir")


def agent_reply(
    identity: Identity,
    base_url: str,
    model: str,
    *,
    tier: str | None,
    max_tokens: int,
    temperature: float,
    url: str | None,
    send_tools: bool = True,
) -> ModelFn:
    """The agent loop's model side for a deployment: each reply through :func:`chat_as`, every tool call in it
    audited before it runs. ``send_tools``: the tool schemas go in the request's ``tools`` (the deployment's chat
    template describes them); else the messages describe them already (:func:`~posttrain.platform.tasks.episodes.
    episode_messages`, as in training) and the calls come back as Hermes blocks in the reply's text."""

    def reply(history: list[dict[str, Any]], schemas: list[dict[str, Any]]) -> dict[str, Any]:
        message = assistant_message(
            chat_as(
                identity,
                base_url,
                model,
                history,
                tier=tier,
                tools=schemas if send_tools else None,
                max_tokens=max_tokens,
                temperature=temperature,
                url=url,
            )
        )
        for call in parse_tool_calls(message).calls:
            audit(
                identity.username,
                "sandbox.run",
                target=call.name,
                details={"arguments": json.dumps(call.arguments, ensure_ascii=False)[:AUDITED_CHARS], "model": model},
                url=url,
            )
        return message

    return reply


@action("model.chat_tools", Role.operator)
def chat_with_tools(
    identity: Identity,
    pool: Callable[[], Any],
    base_url: str,
    model: str,
    messages: list[dict[str, Any]],
    *,
    tier: str | None = None,
    tools: Iterable[str] = PLAYGROUND_TOOLS,
    max_turns: int = 4,
    max_tokens: int = 256,
    temperature: float = 0.0,
    on_message: Callable[[dict[str, Any]], None] | None = None,
    url: str | None = None,
) -> EpisodeResult:
    """The playground's agent: the deployment's replies (:func:`agent_reply`) and the tool calls in them, run in one
    sandbox lent by ``pool()`` for the whole conversation, for up to ``max_turns`` replies, through the agent loop
    training episodes run through (:func:`~posttrain.platform.sandbox.agent.run_agent`). ``on_message`` sees each
    assistant and tool message as it comes. Returns the :class:`~posttrain.platform.sandbox.agent.EpisodeResult`."""
    reply = agent_reply(identity, base_url, model, tier=tier, max_tokens=max_tokens, temperature=temperature, url=url)
    with pool().acquire() as sandbox:
        return run_agent(reply, sandbox, messages, tools=list(tools), max_turns=max_turns, on_message=on_message)


@dataclass
class TaskEpisode:
    """A stored task run as an episode by a deployment: the conversation, what was graded and its verdict."""

    result: EpisodeResult
    tools: list[str]
    graded: str | None  # the final answer, or a project's final module
    verdict: Verdict


@action("task.try_episode", Role.operator)
def try_task(
    identity: Identity,
    pool: Callable[[], Any],
    base_url: str,
    model: str,
    task_id: int,
    *,
    tier: str | None = None,
    max_turns: int = 8,
    max_tokens: int = 256,
    on_message: Callable[[dict[str, Any]], None] | None = None,
    url: str | None = None,
) -> TaskEpisode:
    """Stored task ``task_id`` as a real episode, the way the ``tool_use`` and ``code_repair`` environments run it
    in training: the tools described in the system message, a project's files laid into a sandbox from ``pool()``,
    the deployment's replies (greedy) and its tool calls through the one agent loop for up to ``max_turns``
    replies, then the environment's rubric (:mod:`posttrain.platform.tasks.episodes`): a project graded on its
    final module by the hidden tests in the verifier's own sandbox, another task on its final answer."""
    task = store.get_task(task_id, url=url).spec
    project = is_project(task)
    tools = list(PROJECT_TOOLS if project else ANSWER_TOOLS)
    audit(
        identity.username,
        "task.try_episode",
        target=f"task:{task_id}",
        details={"model": model, "tools": tools},
        url=url,
    )
    reply = agent_reply(
        identity, base_url, model, tier=tier, max_tokens=max_tokens, temperature=0.0, url=url, send_tools=False
    )
    with pool().acquire() as sandbox:
        lay_out(task, sandbox)
        result = run_agent(
            reply,
            sandbox,
            episode_messages(task_messages(task), tool_schemas(tools)),
            tools=tools,
            max_turns=max_turns,
            on_message=on_message,
        )
        if result.stop_reason in UNSCORED:
            return TaskEpisode(
                result, tools, None, Verdict.infra(f"the episode ended {result.stop_reason}; it is not scored")
            )
        if project:  # the module as the episode left it, whether or not the model said it was done
            graded, verdict = grade_project(task, sandbox, default_service())
        else:
            graded = result.answer or ""
            verdict = grade_answer(task, graded, sandbox, default_service())
    return TaskEpisode(result, tools, graded, verdict)
