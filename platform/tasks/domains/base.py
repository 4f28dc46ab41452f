"""What a procedural domain is: a named generator of problems whose answers are computed."""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from posttrain.platform.verifiers.models import VerifierRef

MIN_DIFFICULTY = 1
MAX_DIFFICULTY = 5


@dataclass(frozen=True)
class Problem:
    """One generated problem: a short prompt, the reference answer, how to check answers, and the
    files an environment lays out for it (``TaskSpec.metadata["files"]``)."""

    prompt: str
    answer: str
    verifier: VerifierRef
    files: dict[str, str] = field(default_factory=dict)  # laid into the episode's sandbox (code repair)
    held_out_by: str | None = None  # why it is held out (eval) whatever its prompt's hash: "function" (code repair)


Maker = Callable[[random.Random, int], Problem]


@dataclass(frozen=True)
class Domain:
    """``make(rng, difficulty)`` builds one problem; difficulty runs from 1 (a tiny model can
    learn it) to 5. ``params`` are the family parameters that make this domain distinct."""

    name: str
    family: str
    description: str
    make: Maker
    params: dict[str, Any] = field(default_factory=dict)
    max_difficulty: int = MAX_DIFFICULTY


def exact(prompt: str, answer: str, *, normalize: bool = False) -> Problem:
    kind = "normalized" if normalize else "exact"
    return Problem(prompt, answer, VerifierRef(kind=kind, spec={"answer": answer}))


def numeric(
    prompt: str, value: float, *, answer: str | None = None, unit: str | None = None, rel_tol: float = 1e-9
) -> Problem:
    spec: dict[str, Any] = {"value": value, "rel_tol": rel_tol, "abs_tol": 1e-9}
    if unit is not None:
        spec["unit"] = unit
    text = answer if answer is not None else format_number(value)
    if unit is not None and answer is None:
        text = f"{text} {unit}"
    return Problem(prompt, text, VerifierRef(kind="numeric", spec=spec))


def json_answer(prompt: str, value: Any) -> Problem:
    """A JSON answer checked by a schema derived from ``value`` and equality field by field."""
    return Problem(
        prompt,
        json.dumps(value, ensure_ascii=False),
        VerifierRef(kind="json_schema", spec={"schema": schema_for(value), "expected": value}),
    )


def schema_for(value: Any) -> dict[str, Any]:
    """A JSON Schema that every value shaped like ``value`` satisfies (all keys required)."""
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, int):
        return {"type": "integer"}
    if isinstance(value, float):
        return {"type": "number"}
    if isinstance(value, str):
        return {"type": "string"}
    if value is None:
        return {"type": "null"}
    if isinstance(value, list):
        items = [schema_for(item) for item in value]
        distinct = [s for i, s in enumerate(items) if s not in items[:i]]
        schema: dict[str, Any] = {"type": "array"}
        if len(distinct) == 1:
            schema["items"] = distinct[0]
        return schema
    if isinstance(value, dict):
        return {
            "type": "object",
            "properties": {str(k): schema_for(v) for k, v in value.items()},
            "required": [str(k) for k in value],
            "additionalProperties": False,
        }
    raise TypeError(f"no JSON Schema for a {type(value).__name__}")


def format_number(value: float | int) -> str:
    """A number as a short exact-looking string: 7, -2.5, 0.125 (no float noise)."""
    if isinstance(value, int) or (isinstance(value, float) and value.is_integer() and abs(value) < 1e15):
        return str(int(value))
    text = f"{value:.10g}"
    return text


def digits_number(rng: random.Random, digits: int) -> int:
    """A non-negative integer with exactly ``digits`` digits (0-9 for one digit)."""
    if digits <= 1:
        return rng.randint(0, 9)
    return rng.randint(10 ** (digits - 1), 10**digits - 1)
