"""``environment: {name: tool_use}``: the policy may call sandbox tools over several turns before it answers.

Each turn the policy either calls tools, written as Hermes ``<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`` blocks, whose results come back as ``tool`` messages before its next turn, or
answers without a call, which ends the episode; the task's own verifier scores that answer, with the
episode's sandbox in its context (a ``tool_use`` task checks the files the policy left). Whatever the
policy gets wrong about tools (a call that does not parse, an unknown tool, bad arguments, a tool that
times out or floods its output) is a tool error it reads in its next turn, never a failed episode; a
sandbox that fails is an infrastructure failure, which the runner redoes and never scores.

Before the rubric runs, the episode's sandbox is settled (:func:`~posttrain.platform.tasks.episodes.settle`): every process the policy left
in it is killed and a fresh interpreter started (its files are kept), so nothing the policy ran, left
running or patched into its interpreter can answer for the checks or change what they find while they
run. The ``tool_use`` verifier restarts the interpreter again before each of its checks, and code is
graded by the ``code`` verifier in a sandbox of its own (see platform/verifiers/kinds/code.py).
"""

from __future__ import annotations

from typing import Any

from transformers import PreTrainedTokenizerBase

from posttrain.platform.sandbox import Sandbox, parse_tool_calls, tool_schemas
from posttrain.platform.sandbox.agent import Ending, Ran, run_turns
from posttrain.platform.sandbox.parser import ParsedTurn
from posttrain.platform.tasks.episodes import episode_messages, grade_answer, lay_out, task_messages
from posttrain.platform.verifiers import TaskSpec, Verdict, VerifierService
from posttrain.training.config import EnvironmentConfig, SamplingConfig
from posttrain.training.environments.base import EnvironmentBase, Episode, PolicyClient, ToolCallRecord, Turn


def clipped(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[output cut at {limit} of {len(text)} characters]"


class ToolUse(EnvironmentBase):
    name = "tool_use"
    needs_sandbox = True
    default_tools = ["python", "bash"]

    def __init__(self, config: EnvironmentConfig, tokenizer: PreTrainedTokenizerBase, sampling: SamplingConfig) -> None:
        super().__init__(config, tokenizer, sampling)
        self.tools = list(config.tools if config.tools is not None else self.default_tools)
        self.schemas = tool_schemas(self.tools)

    def messages(self, task: TaskSpec) -> list[dict[str, Any]]:
        """The task's messages with the tools described in the system message (after the task's own)."""
        return episode_messages(task_messages(task), self.schemas)

    def prepare(self, task: TaskSpec, sandbox: Sandbox | None) -> None:
        """Lay out what the task needs in the sandbox before the first turn (a project task's files)."""
        assert sandbox is not None
        lay_out(task, sandbox)

    def rollout(self, client: PolicyClient, task: TaskSpec, sandbox: Sandbox | None) -> Episode:
        assert sandbox is not None
        episode = self.start(client, task, self.messages(task))
        self.prepare(task, sandbox)

        def reply() -> ParsedTurn | Ending:
            sampled = self.policy_turn(client, episode)
            if sampled is None:
                return Ending("context")
            completion, text = sampled
            return parse_tool_calls(text) if completion.finished else Ending("length")

        ending = run_turns(
            reply,
            lambda ran: self.give_results(episode, ran),
            sandbox,
            allowed=self.tools,
            max_turns=self.config.max_turns,
            deadline=episode.started + self.config.episode_timeout_s,
            tool_timeout_s=self.config.tool_timeout_s,
        )
        return episode.end(ending.reason, answer=ending.answer, error=ending.error)

    def give_results(self, episode: Episode, ran: Ran) -> None:
        """A turn's tool results into the episode: recorded on the policy's turn, and their messages (each
        clipped to ``tool_output_chars``) tokenised once as the environment's tokens before the next turn."""
        turns, messages = [], []
        for call, result in ran:
            output = clipped(result.to_message_content(), self.config.tool_output_chars)
            record = ToolCallRecord(
                call.name,
                call.arguments,
                "error" if call.error else result.status.value,
                output,
                result.duration_ms / 1000,
            )
            episode.turns[-1].tool_calls.append(record)
            messages.append({"role": "tool", "name": call.name, "content": output})
            turns.append(Turn("tool", output, 0, elapsed_s=record.elapsed_s))
        episode.add_environment(self.chat.between_turns(messages), turns)

    def score(self, episode: Episode, service: VerifierService, sandbox: Sandbox | None) -> Verdict:
        """The task's verifier on the answer, with the settled sandbox in its context."""
        return grade_answer(episode.task, episode.answer or "", sandbox, service)
