"""Exact and normalised string match against one or more accepted answers."""

from __future__ import annotations

from pydantic import Field, field_validator

from posttrain.platform.verifiers.models import TaskSpec, Verdict
from posttrain.platform.verifiers.registry import BaseSpec, VerifierKind
from posttrain.platform.verifiers.text import ExtractMode, extract_answer, normalize_light


class ExactSpec(BaseSpec):
    """``answer``: the accepted answer (or a list of them). ``normalize``: compare after
    case-folding, collapsing whitespace and dropping outer quotes and a final period."""

    answer: list[str] = Field(min_length=1)
    normalize: bool = False
    extract: ExtractMode = "full"

    @field_validator("answer", mode="before")
    @classmethod
    def _one_or_many(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value


class NormalizedSpec(ExactSpec):
    normalize: bool = True


def check_exact(spec: ExactSpec, completion: str, task: TaskSpec) -> Verdict:
    answer = extract_answer(completion, spec.extract)
    if spec.normalize:
        got = normalize_light(answer)
        accepted = {normalize_light(a) for a in spec.answer}
    else:
        got = answer.strip()
        accepted = {a.strip() for a in spec.answer}
    if got in accepted:
        return Verdict.of_score(1.0, "matches the expected answer")
    shown = got if len(got) <= 80 else got[:77] + "..."
    return Verdict.of_score(0.0, f"got {shown!r}, expected {spec.answer[0]!r}")


EXACT = VerifierKind(
    name="exact",
    spec_model=ExactSpec,
    check=check_exact,
    default_timeout_s=5.0,
    description="the answer equals one of the accepted answers (outer whitespace ignored)",
)
NORMALIZED = VerifierKind(
    name="normalized",
    spec_model=NormalizedSpec,
    check=check_exact,
    default_timeout_s=5.0,
    description="the answer equals an accepted answer after case/whitespace/punctuation normalisation",
)
