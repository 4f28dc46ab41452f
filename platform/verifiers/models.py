"""The data a verifier reads and writes: a task and its verdict.

Both are pydantic models that serialise to plain JSON (``model_dump(mode="json")``)
so the database layer can store them as they are.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

Role = Literal["system", "user", "assistant", "tool"]
Split = Literal["train", "eval"]


class ChatMessage(BaseModel):
    """One message of a chat prompt."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    role: Role
    content: str | list[dict[str, Any]] = Field(
        description="text, or OpenAI-style content parts (text and image_url) for vision-language prompts"
    )

    @property
    def text(self) -> str:
        """The message's text, with image parts left out."""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")


class VerifierRef(BaseModel):
    """Which verifier checks a task (``kind``, a registry name) and its settings.

    ``spec`` is validated against the kind's own pydantic model when the task is
    verified or imported (see ``posttrain.platform.verifiers.validate_spec``).
    """

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(min_length=1)
    spec: dict[str, Any] = Field(default_factory=dict)


class TaskSpec(BaseModel):
    """One verifiable task: a prompt, how to check an answer, and a reference answer.

    ``reference`` is a completion that scores 1 (the gold answer for answer-matching
    kinds, the canonical solution for code tasks).
    """

    model_config = ConfigDict(extra="forbid")

    domain: str = Field(min_length=1)
    prompt: list[ChatMessage] = Field(min_length=1)
    verifier: VerifierRef
    reference: str | None = None
    split: Split = "train"
    task_id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    provenance: dict[str, Any] = Field(default_factory=dict)

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt_from_text(cls, value: Any) -> Any:
        if isinstance(value, str):
            return [{"role": "user", "content": value}]
        return value

    @property
    def prompt_text(self) -> str:
        """The prompt's last user message (handy for logs and tiny models)."""
        for message in reversed(self.prompt):
            if message.role == "user":
                return message.text
        return self.prompt[-1].text


class Verdict(BaseModel):
    """The result of checking one completion.

    ``infra_error`` is set (and ``score`` is 0, ``passed`` False) when the verifier
    itself failed (timeout, crash, missing runner): such a verdict says nothing
    about the completion and must not be used as a reward.
    """

    model_config = ConfigDict(extra="forbid")

    score: float = Field(ge=0.0, le=1.0)
    passed: bool
    details: str = ""
    breakdown: dict[str, Any] = Field(default_factory=dict)
    infra_error: str | None = None
    kind: str | None = None
    elapsed_s: float | None = None

    @property
    def is_infra_error(self) -> bool:
        return self.infra_error is not None

    @classmethod
    def of_score(
        cls,
        score: float,
        details: str = "",
        *,
        threshold: float = 1.0,
        breakdown: dict[str, Any] | None = None,
    ) -> Verdict:
        """A verdict with ``passed`` derived from ``score >= threshold`` (score clipped to [0, 1])."""
        clipped = min(1.0, max(0.0, float(score)))
        return cls(
            score=clipped,
            passed=clipped >= threshold - 1e-12,
            details=details,
            breakdown=breakdown or {},
        )

    @classmethod
    def failure(cls, details: str, **breakdown: Any) -> Verdict:
        """Score 0 for a reason that is the completion's fault (unparseable, too long...)."""
        return cls(score=0.0, passed=False, details=details, breakdown=breakdown)

    @classmethod
    def infra(cls, message: str, *, kind: str | None = None) -> Verdict:
        """The verifier could not judge the completion (not the completion's fault)."""
        return cls(
            score=0.0,
            passed=False,
            details=f"verifier error: {message}",
            infra_error=message,
            kind=kind,
        )
