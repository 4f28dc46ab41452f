"""Math answers checked for equivalence with math-verify (LaTeX or plain expressions).

math-verify bounds its own work with SIGALRM, which only works in a process's main
thread. The verifier pool runs checks in the main thread of a worker process, so its
timeouts stay on there; anywhere else they are switched off and the pool's
wall-clock limit (which kills the worker) is the bound.
"""

from __future__ import annotations

import threading
from functools import lru_cache
from typing import Any

from pydantic import Field, field_validator

from posttrain.platform.verifiers.models import TaskSpec, Verdict
from posttrain.platform.verifiers.registry import BaseSpec, VerifierKind


def _alarm_seconds(seconds: int) -> int | None:
    return seconds if threading.current_thread() is threading.main_thread() else None


def _parse(text: str, seconds: int = 5) -> list[Any]:
    import math_verify  # heavy (sympy): imported where it is used
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    return list(
        math_verify.parse(
            text,
            extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()],
            parsing_timeout=_alarm_seconds(seconds),  # type: ignore[arg-type]
        )
    )


@lru_cache(maxsize=4096)
def _gold_parses(answer: str) -> bool:
    text = answer if "$" in answer or "\\boxed" in answer else f"${answer}$"
    return bool(_parse(text))


class MathSpec(BaseSpec):
    """``answer``: the gold answer as LaTeX ("\\frac{1}{2}") or a plain expression ("1/2")."""

    answer: str = Field(min_length=1)
    float_rounding: int = Field(default=6, ge=0, le=15)

    @field_validator("answer")
    @classmethod
    def _parseable(cls, answer: str) -> str:
        if not _gold_parses(answer):
            raise ValueError(f"math-verify cannot parse the gold answer {answer!r}; write it as LaTeX or a plain expression")
        return answer


def check_math(spec: MathSpec, completion: str, task: TaskSpec) -> Verdict:
    import math_verify

    gold_text = spec.answer if "$" in spec.answer or "\\boxed" in spec.answer else f"${spec.answer}$"
    gold = _parse(gold_text)
    predicted = _parse(completion)
    if not predicted:
        return Verdict.failure("no mathematical answer found in the completion")
    equal = math_verify.verify(
        gold,
        predicted,
        float_rounding=spec.float_rounding,
        timeout_seconds=_alarm_seconds(5),
    )
    shown = str(predicted[0])[:80]
    if equal:
        return Verdict.of_score(1.0, f"{shown} is equivalent to {spec.answer}")
    return Verdict.of_score(0.0, f"{shown} is not equivalent to {spec.answer}")


MATH = VerifierKind(
    name="math",
    spec_model=MathSpec,
    check=check_math,
    default_timeout_s=20.0,
    description="the answer is mathematically equivalent to the gold answer (math-verify)",
)
