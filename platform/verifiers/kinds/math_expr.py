"""Math answers checked for equivalence with math-verify (LaTeX or plain expressions).

The gold answer and the completion are read by one rule (:func:`read_answer`), so that a completion
that writes the gold answer exactly as the task does scores 1:

* text with LaTeX delimiters (``$...$``, ``\\(...\\)``, ``\\[...\\]``, ``\\boxed{}``) is read as math-verify
  reads it, LaTeX first;
* plain text is read the way math-verify reads a plain completion. Its reading stands when it accounts
  for the whole text (every character but spaces and the separators ``,`` and ``.``): ``1,22`` is the
  decimal 1.22 and ``3,5`` is 3.5 (a comma between digits is a decimal comma), ``1,000`` and
  ``12,345.67`` are thousands separated, ``-1,5`` is -1.5;
* plain text that this reading does not account for whole, and that is a bare formula (no word of two
  or more letters outside a backslash command), is read as LaTeX instead: ``{1, 22}`` is the set
  {1, 22}, ``1,22,3`` the set {1, 3, 22}, ``(1, 2)`` an interval, ``x^2 + 2x + 1`` a polynomial,
  ``\\frac12`` one half (a number in scientific notation, ``1e3``, is written as ``1\\times10^{3}`` first);
* a gold answer neither reading understands is read as LaTeX, as before (``pi/2``: write ``\\pi/2``).

So a set is written with braces (or as LaTeX, ``$1,22$`` and ``\\boxed{1,22}`` read as sets, as
math-verify reads them), and a plain ``1,22`` means the decimal number.

A parse or comparison that runs out of time gives an infrastructure-error verdict (the
answer was not judged; a slow correct answer must never be a reward of 0), not a wrong one.

math-verify bounds its own work with SIGALRM, which only works in a process's main
thread. The verifier pool runs checks in the main thread of a worker process, so its
timeouts stay on there; anywhere else they are switched off and the pool's
wall-clock limit (which kills the worker) is the bound.
"""

from __future__ import annotations

import re
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
            parsing_timeout=_alarm_seconds(seconds),
            raise_on_error=True,
        ))  # fmt: skip
    except TimeoutException:
        raise MathTimeout(f"parsing took over {seconds} s") from None
    except Exception:  # noqa: BLE001 - what math-verify cannot parse is no answer, as with raise_on_error=False
        return []


def _equivalent(gold: list[Any], predicted: list[Any], spec: MathSpec) -> bool:
    """Whether any extraction of the answer equals any of the gold's. A comparison that times out is
    not a "no": :class:`MathTimeout` when no other comparison said yes."""
    import math_verify  # heavy (sympy): see above
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


_DELIMITED = re.compile(r"\$|\\\(|\\\[|\\boxed")
_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_SEPARATORS = re.compile(r"[\s,.]")
_SCIENTIFIC = re.compile(r"(?<![A-Za-z\\])(\d+(?:\.\d+)?)[eE]([+-]?\d+)\b")


def _as_latex(text: str) -> str:
    return "$" + _SCIENTIFIC.sub(r"\1\\times10^{\2}", text) + "$"


def _whole(reading: list[Any], text: str) -> bool:
    """Whether math-verify's reading of plain ``text`` took all of it (its matched string, against the
    text, ignoring spaces and the separators it normalises)."""
    return len(reading) > 1 and _SEPARATORS.sub("", str(reading[-1])) == _SEPARATORS.sub("", text)


def read_answer(text: str, seconds: int = 5, *, gold: bool = False) -> list[Any]:
    """The readings of ``text`` by the rule of the module's docstring (the same for a gold answer and a
    completion; ``gold`` only adds the last fallback)."""
    if _DELIMITED.search(text):
        return _parse(text, seconds)
    plain = _parse(text, seconds)
    stripped = text.strip()
    if _whole(plain, stripped):
        return plain
    if stripped and "\n" not in stripped and len(stripped) <= 200 and not _WORD.search(stripped):
        latex = _parse(_as_latex(stripped), seconds)
        if latex:
            return latex
    if not plain and gold:
        return _parse(_as_latex(stripped), seconds)
    return plain


@lru_cache(maxsize=4096)
def _gold_parses(answer: str) -> bool:
    try:
        return bool(read_answer(answer, gold=True))
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
            raise ValueError(
                f"math-verify cannot parse the gold answer {answer!r}; write it as LaTeX or a plain expression"
            )
        return answer


def check_math(spec: MathSpec, completion: str, task: TaskSpec) -> Verdict:
    try:
        gold = read_answer(spec.answer, spec.step_timeout_s, gold=True)
        predicted = read_answer(completion, spec.step_timeout_s)
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
