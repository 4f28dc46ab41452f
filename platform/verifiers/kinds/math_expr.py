"""Math answers checked for equivalence with math-verify (LaTeX or plain expressions).

A parse or comparison that runs out of time gives an infrastructure-error verdict (the
answer was not judged; a slow correct answer must never be a reward of 0), not a wrong one.

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


class MathTimeout(RuntimeError):
    """math-verify ran out of time: the answer was not judged (never a reward of 0)."""


def _parse(text: str, seconds: int = 5) -> list[Any]:
    import math_verify  # heavy (sympy): imported where it is used
    from math_verify import ExprExtractionConfig, LatexExtractionConfig
    from math_verify.errors import TimeoutException

    try:
        return list(math_verify.parse(
            text,
            extraction_config=[LatexExtractionConfig(), ExprExtractionConfig()],
            parsing_timeout=_alarm_seconds(seconds),  # type: ignore[arg-type]
            raise_on_error=True,
        ))  # fmt: skip
    except TimeoutException:
        raise MathTimeout(f"parsing took over {seconds} s") from None
    except Exception:  # noqa: BLE001 - what math-verify cannot parse is no answer, as with raise_on_error=False
        return []


def _equivalent(gold: list[Any], predicted: list[Any], spec: MathSpec) -> bool:
    """Whether any extraction of the answer equals any of the gold's. A comparison that times out is
    not a "no": :class:`MathTimeout` when no other comparison said yes."""
    import math_verify
    from math_verify.errors import TimeoutException

    timed_out = False
    for g in gold:
        for p in predicted:
            try:
                if math_verify.verify(g, p, float_rounding=spec.float_rounding, timeout_seconds=_alarm_seconds(spec.step_timeout_s),
                                      raise_on_error=True):  # fmt: skip
                    return True
            except TimeoutException:
                timed_out = True
            except Exception:  # noqa: BLE001 - an expression math-verify cannot compare is not equal
                continue
    if timed_out:
        raise MathTimeout(f"comparing took over {spec.step_timeout_s} s")
    return False


@lru_cache(maxsize=4096)
def _gold_parses(answer: str) -> bool:
    text = answer if "$" in answer or "\\boxed" in answer else f"${answer}$"
    try:
        return bool(_parse(text))
    except MathTimeout:
        return False


class MathSpec(BaseSpec):
    """``answer``: the gold answer as LaTeX ("\\frac{1}{2}") or a plain expression ("1/2")."""

    answer: str = Field(min_length=1)
    float_rounding: int = Field(default=6, ge=0, le=15)
    step_timeout_s: int = Field(default=5, ge=1, le=60, description="math-verify's limit per parse and per comparison")

    @field_validator("answer")
    @classmethod
    def _parseable(cls, answer: str) -> str:
        if not _gold_parses(answer):
            raise ValueError(f"math-verify cannot parse the gold answer {answer!r}; write it as LaTeX or a plain expression")
        return answer


def check_math(spec: MathSpec, completion: str, task: TaskSpec) -> Verdict:
    gold_text = spec.answer if "$" in spec.answer or "\\boxed" in spec.answer else f"${spec.answer}$"
    try:
        gold = _parse(gold_text, spec.step_timeout_s)
        predicted = _parse(completion, spec.step_timeout_s)
        if not predicted:
            return Verdict.failure("no mathematical answer found in the completion")
        equal = _equivalent(gold, predicted, spec)
    except MathTimeout as exc:  # a slow correct answer must never be a reward of 0
        return Verdict.infra(f"math-verify {exc}; the answer was not judged", kind="math")
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
