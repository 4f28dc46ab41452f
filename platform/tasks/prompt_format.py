"""How a task is put to a model: a system prompt, an instruction, worked examples, and where the answer goes.

    fmt = PromptFormat(instruction="Put your final answer within \\boxed{}.",
                       examples=[WorkedExample(user="Compute 12 + 7.", assistant="12 + 7 = 19.\\n\\n\\\\boxed{19}")],
                       answer="boxed")
    task = fmt.apply(task)   # the instruction after the question, the example as an earlier chat turn,
                             # and a verifier that reads the last \\boxed{...} only (no box: no answer)

A worked example may call tools before it answers (``tools``: each call with the tool's result), the
way a run in the ``tool_use`` environment shows the policy how its tools are called.

A run names one format for training and evaluation alike (``prompt_format`` in the GRPO, SFT and
evaluation configs), so the tasks a run learns from and the ones it is measured on are put the same
way, and the held-out check compares like with like. A run over many domains whose answers differ in kind
gives some of them a format of their own in ``domains`` (``{"json.": PromptFormat(...)}``: every ``json.*``
domain is put that way, the longest matching name winning). ``answer: boxed`` is the strict reading: a
completion whose answer is not boxed scores 0 even when its last number is right.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from posttrain.platform.verifiers.models import ChatMessage, TaskSpec

# the verifier kinds whose spec has an ``extract`` mode (where in a completion the answer is read)
EXTRACTING_KINDS = ("numeric", "exact")


class ToolStep(BaseModel):
    """A tool call in a worked example and what the tool answered: the assistant's turn that calls it (written
    as the tool environments read calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``) and
    the ``tool`` message after it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(min_length=1, description="the tool: python, bash, ...")
    arguments: dict[str, Any] = Field(default_factory=dict)
    result: str = Field(description="the tool's output, as the environment shows it")

    def messages(self) -> list[ChatMessage]:
        call = json.dumps({"name": self.name, "arguments": self.arguments}, ensure_ascii=False)
        return [
            ChatMessage(role="assistant", content=f"<tool_call>{call}</tool_call>"),
            ChatMessage(role="tool", content=self.result),
        ]


class WorkedExample(BaseModel):
    """One solved example, shown as an earlier user turn and the assistant's answer to it (after the tool calls
    in ``tools``, for a run in a tool environment)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    user: str = Field(min_length=1)
    assistant: str = Field(min_length=1, description="the final answer")
    tools: list[ToolStep] = Field(
        default_factory=list, description="tool calls before the answer, each with its result"
    )

    def messages(self) -> list[ChatMessage]:
        return [
            ChatMessage(role="user", content=self.user),
            *(m for step in self.tools for m in step.messages()),
            ChatMessage(role="assistant", content=self.assistant),
        ]


class PromptFormat(BaseModel):
    """How every task of a run is put to the model (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    system: str | None = Field(default=None, description="a system message before everything (None: the model's own)")
    instruction: str | None = Field(default=None, description="appended to the task's last user message, on a new line")
    examples: list[WorkedExample] = Field(default_factory=list, description="worked examples as earlier chat turns")
    answer: Literal["as_task", "boxed"] = Field(
        default="as_task",
        description="as_task: the task's verifier reads the answer as it always does; boxed: only the "
        "last \\boxed{...} of the completion is read (numeric and exact verifiers), no box scores 0",
    )
    domains: dict[str, PromptFormat] = Field(
        default_factory=dict,
        description="a format of its own for some domains: a key is a domain's name, or the start "
        "of names when it ends with a dot (json.: every json.* domain); the longest match wins, the rest are put this way",
    )

    @field_validator("domains")
    @classmethod
    def _flat(cls, value: dict[str, PromptFormat]) -> dict[str, PromptFormat]:
        if nested := [k for k, f in value.items() if f.domains]:
            raise ValueError(f"the formats for domains {nested} have domains of their own: one level only")
        return value

    def for_domain(self, domain: str) -> PromptFormat:
        """The format ``domain``'s tasks are put in."""
        keys = [k for k in self.domains if domain == k or (k.endswith(".") and domain.startswith(k))]
        return self.domains[max(keys, key=len)] if keys else self

    def apply(self, task: TaskSpec) -> TaskSpec:
        """``task`` put this way (its domain's format, see ``domains``): its prompt framed, and for ``answer: boxed``
        its verifier made strict and its reference boxed (a reference must still score 1)."""
        if (own := self.for_domain(task.domain)) is not self:
            return own.apply(task)
        prompt = list(task.prompt)
        if self.instruction:
            last = max(i for i, m in enumerate(prompt) if m.role == "user")
            prompt[last] = ChatMessage(role="user", content=f"{prompt[last].text}\n{self.instruction}")
        shots = [m for ex in self.examples for m in ex.messages()]
        system = [m for m in prompt[:1] if m.role == "system"]  # the task's own system message stays first
        if self.system:
            system = [ChatMessage(role="system", content=self.system)]
        update: dict[str, object] = {"prompt": [*system, *shots, *(m for m in prompt if m.role != "system")]}
        if self.answer == "boxed":
            if task.verifier.kind not in EXTRACTING_KINDS:
                raise ValueError(
                    f"prompt_format answer 'boxed' reads the answer from \\boxed{{}} with a "
                    f"{' or '.join(EXTRACTING_KINDS)} verifier; domain {task.domain!r} uses "
                    f"{task.verifier.kind!r}: give it a format of its own with answer: as_task (the format's domains)"
                )
            spec = dict(task.verifier.spec) | {"extract": "boxed_only"}
            update["verifier"] = task.verifier.model_copy(update={"spec": spec})
            if task.reference is not None and "\\boxed{" not in task.reference:
                update["reference"] = f"\\boxed{{{task.reference}}}"
        return task.model_copy(update=update)


def apply_format(tasks: list[TaskSpec], prompt_format: PromptFormat | None) -> list[TaskSpec]:
    """``tasks`` put the way ``prompt_format`` says (unchanged without one)."""
    return tasks if prompt_format is None else [prompt_format.apply(t) for t in tasks]
