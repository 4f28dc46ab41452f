"""What every environment shares: the episode it returns, the policy client it samples through, and
the chat-template bookkeeping that keeps an episode token-in, token-out.

An :class:`Episode` is the whole of one rollout: after the prompt, every token in the order the
model saw it, the policy's own tokens with the behaviour log-prob of each and loss weight 1, and the
tokens the environment put between its turns (tool output, the template's turn markers) with log-prob
0 and loss weight 0. Nothing is re-tokenised between turns: the policy's tokens are kept exactly as
sampled, and only the environment's text is tokenised, once, when it is added
(:meth:`ChatTokens.between_turns`), so the learner scores exactly what was sampled.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, cast, runtime_checkable

from transformers import PreTrainedTokenizerBase

from posttrain.platform.sandbox import Sandbox
from posttrain.platform.sandbox.agent import UNSCORED, StopReason
from posttrain.platform.verifiers import TaskSpec, Verdict, VerifierService
from posttrain.platform.verifiers.registry import VerifyContext
from posttrain.training.config import EnvironmentConfig, SamplingConfig
from posttrain.training.inference import Completion
from posttrain.training.rollout import prompt_ids


class PolicyClient(Protocol):
    """Token-in, token-out sampling from the policy (an engine's batcher: :class:`~posttrain.training.inference.ContinuousBatcher`
    on the embedded engine, :class:`~posttrain.training.vllm_engines.VLLMBatcher` on vLLM)."""

    @property
    def version(self) -> int: ...

    def complete(
        self, prompt_ids: Sequence[int], sampling: SamplingConfig, *, max_new_tokens: int | None = None
    ) -> Completion: ...


@dataclass
class ToolCallRecord:
    """One tool call of a turn: what was asked, how it ended, what the policy saw of it, how long it took."""

    name: str
    arguments: dict[str, Any]
    status: str  # a CallStatus value, or "error" for a call that could not be parsed
    output: str  # the tool message's content, as the policy saw it
    elapsed_s: float

    @property
    def failed(self) -> bool:
        return self.status != "ok"


@dataclass
class Turn:
    """One message of the episode after the prompt: the policy's (``assistant``) or the environment's."""

    role: str
    content: str
    tokens: int
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    elapsed_s: float = 0.0

    def stored(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "content": self.content,
            "tokens": self.tokens,
            "elapsed_s": round(self.elapsed_s, 4),
            "tool_calls": [vars(c) for c in self.tool_calls],
        }


@dataclass
class Episode:
    task: TaskSpec
    prompt_ids: list[int]
    policy_version: int
    token_ids: list[int] = field(default_factory=list)  # after the prompt: policy and environment tokens
    logprobs: list[float] = field(default_factory=list)  # behaviour log-prob per token (0.0 on the environment's)
    loss_mask: list[int] = field(default_factory=list)  # 1 on the policy's tokens
    turns: list[Turn] = field(default_factory=list)
    answer: str | None = None  # what the rubric scores
    stop_reason: StopReason | None = None
    error: str | None = None  # why an unscored episode failed
    attempts: int = 1  # 1 + times it was redone after an infrastructure failure
    started: float = field(default_factory=time.monotonic)
    elapsed_s: float = 0.0
    verdict: Verdict | None = None

    @property
    def scored(self) -> bool:
        return self.stop_reason not in UNSCORED

    @property
    def policy_turns(self) -> int:
        return sum(t.role == "assistant" for t in self.turns)

    @property
    def tool_calls(self) -> list[ToolCallRecord]:
        return [c for t in self.turns for c in t.tool_calls]

    @property
    def finished(self) -> bool:
        return self.stop_reason == "answer"

    def add_policy(self, completion: Completion, text: str, elapsed_s: float) -> None:
        self.token_ids += completion.token_ids
        self.logprobs += completion.logprobs
        self.loss_mask += [1] * len(completion.token_ids)
        self.turns.append(Turn("assistant", text, len(completion.token_ids), elapsed_s=elapsed_s))

    def add_environment(self, ids: list[int], turns: list[Turn]) -> None:
        self.token_ids += ids
        self.logprobs += [0.0] * len(ids)
        self.loss_mask += [0] * len(ids)
        if turns:
            turns[0].tokens = len(ids)  # the turn markers and every message of this gap
        self.turns += turns

    def end(self, reason: StopReason, *, answer: str | None = None, error: str | None = None) -> Episode:
        self.stop_reason, self.answer, self.error = reason, answer, error
        self.elapsed_s = time.monotonic() - self.started
        return self

    @property
    def all_ids(self) -> list[int]:
        return self.prompt_ids + self.token_ids


class ChatTokens:
    """The chat template, used token-in, token-out: after the prompt's ids (:func:`prompt_ids`), the ids of what the
    environment adds between two policy turns, from the template's rendering of those messages alone
    (the template's text after an assistant turn's end marker, which the policy sampled itself, and the
    added messages with the next generation prompt)."""

    # a system message of its own: templates put a default one first otherwise, and some pick it by
    # whether tool messages follow (SmolLM2's does), which would change the probe's first turn
    _PROBE = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "a"},
    ]

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.end_text = (
            cast(str, tokenizer.decode([tokenizer.eos_token_id])) if tokenizer.eos_token_id is not None else ""
        )

    def _render(self, messages: list[dict[str, Any]], generation_prompt: bool) -> str:
        text = self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)
        return cast(str, text)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def between_turns(self, messages: list[dict[str, Any]]) -> list[int]:
        """The ids that follow a policy turn ended by its end-of-turn token: ``messages`` (tool results,
        a user's reply) and the generation prompt of the next policy turn."""
        before = self._render(self._PROBE, False)
        after = self._render(self._PROBE + messages, True)
        if not after.startswith(before):
            raise ValueError(
                "this chat template renders earlier turns differently once more follow; "
                "a multi-turn episode cannot be kept token-in, token-out with it"
            )
        end = (
            before.rindex(self.end_text) + len(self.end_text)
            if self.end_text and self.end_text in before
            else len(before)
        )
        return self.encode(before[end:] + after[len(before) :])

    def decode(self, ids: Sequence[int]) -> str:
        return cast(str, self.tokenizer.decode(list(ids), skip_special_tokens=True))


@runtime_checkable
class Environment(Protocol):
    """Tasks plus a rubric plus a rollout. Built as ``cls(config, tokenizer)``; ``needs_sandbox`` says
    whether each episode is lent a sandbox from the pool (acquired before :meth:`rollout`, released
    and wiped after :meth:`score`)."""

    name: str
    needs_sandbox: bool

    def rollout(self, client: PolicyClient, task: TaskSpec, sandbox: Sandbox | None) -> Episode:
        """Run one episode of ``task``; raise only for a fault of the environment itself."""
        ...

    def score(self, episode: Episode, service: VerifierService, sandbox: Sandbox | None) -> Verdict:
        """The rubric: the verdict on a finished episode (its sandbox still lent)."""
        ...


class EnvironmentBase:
    """What the built-in environments share: their config and template, and the default rubric (the
    task's own verifier on the final answer, with the episode's sandbox in the verifier's context)."""

    name = "environment"
    needs_sandbox = False

    def __init__(self, config: EnvironmentConfig, tokenizer: PreTrainedTokenizerBase, sampling: SamplingConfig) -> None:
        self.config, self.chat, self.sampling = config, ChatTokens(tokenizer), sampling

    def start(self, client: PolicyClient, task: TaskSpec, messages: list[dict[str, Any]]) -> Episode:
        return Episode(task=task, prompt_ids=prompt_ids(self.chat.tokenizer, messages), policy_version=client.version)

    def policy_turn(self, client: PolicyClient, episode: Episode) -> tuple[Completion, str] | None:
        """Sample the policy's next turn into ``episode``; None (the episode ended) when no room is left."""
        room = self.config.max_episode_tokens - len(episode.all_ids)
        if room <= 0:
            episode.end("context")
            return None
        started = time.monotonic()
        completion = client.complete(
            episode.all_ids, self.sampling, max_new_tokens=min(self.sampling.max_new_tokens, room)
        )
        text = self.chat.decode(completion.token_ids)
        episode.add_policy(completion, text, time.monotonic() - started)
        return completion, text

    def score(self, episode: Episode, service: VerifierService, sandbox: Sandbox | None) -> Verdict:
        context = VerifyContext(sandbox=sandbox) if sandbox is not None else None
        return service.verify(episode.task, episode.answer or "", context=context)


# ----------------------------------------------------------------------------- storage


def episode_record(episode: Episode) -> dict[str, Any]:
    """An episode as one JSON object: its task, its ids and masks token for token, its turns and verdict."""
    return {
        "task": episode.task.model_dump(mode="json"),
        "prompt_ids": episode.prompt_ids,
        "token_ids": episode.token_ids,
        "logprobs": episode.logprobs,
        "loss_mask": episode.loss_mask,
        "turns": [t.stored() for t in episode.turns],
        "stop_reason": episode.stop_reason,
        "answer": episode.answer,
        "policy_version": episode.policy_version,
        "reward": episode.verdict.score if episode.verdict is not None else None,
    }


def write_episodes(path: str | Path, episodes: Iterable[Episode]) -> Path:
    """Write ``episodes`` as JSON lines to ``path`` at once (a temporary file renamed over it)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(handle, "w") as fh:
            for episode in episodes:
                fh.write(json.dumps(episode_record(episode)) + "\n")
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return target


@dataclass(frozen=True)
class StoredEpisode:
    """What an SFT run reads of a stored episode."""

    prompt_ids: list[int]
    token_ids: list[int]
    loss_mask: list[int]
    reward: float | None


def read_episodes(path: str | Path, *, min_reward: float | None = None) -> list[StoredEpisode]:
    """The episodes of a file :func:`write_episodes` wrote (those with at least ``min_reward``); a line
    that is not one is an error naming the file, the line and the fix."""
    episodes = []
    for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            stored = StoredEpisode(
                [int(i) for i in row["prompt_ids"]],
                [int(i) for i in row["token_ids"]],
                [int(m) for m in row["loss_mask"]],
                row.get("reward"),
            )
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
            raise ValueError(
                f"{path}, line {number}: not an episode ({type(error).__name__}); write episodes with "
                "posttrain.training.environments.base.write_episodes"
            ) from None
        if len(stored.token_ids) != len(stored.loss_mask):
            raise ValueError(f"{path}, line {number}: token_ids and loss_mask differ in length; the episode is damaged")
        if min_reward is None or (stored.reward is not None and stored.reward >= min_reward):
            episodes.append(stored)
    return episodes
