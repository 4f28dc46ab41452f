"""Numeric answers: the last number in the completion, compared with a tolerance, units converted."""

from __future__ import annotations

import math

from pydantic import Field, field_validator

from posttrain.platform.verifiers.kinds.units import find_unit, known_unit_symbols, last_quantity
from posttrain.platform.verifiers.models import TaskSpec, Verdict
from posttrain.platform.verifiers.registry import BaseSpec, VerifierKind
from posttrain.platform.verifiers.text import ExtractMode, extract_answer


class NumericSpec(BaseSpec):
    """``value`` in ``unit`` (optional). A completion in another unit of the same dimension
    is converted; a bare number is read in ``unit`` unless ``require_unit``."""

    value: float
    unit: str | None = None
    rel_tol: float = Field(default=1e-6, ge=0, le=1)
    abs_tol: float = Field(default=0.0, ge=0)
    require_unit: bool = False
    extract: ExtractMode = "full"

    @field_validator("value")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("must be a finite number, not inf or nan")
        return value

    @field_validator("unit")
    @classmethod
    def _known_unit(cls, unit: str | None) -> str | None:
        if unit is not None and find_unit(unit) is None:
            raise ValueError(f"unknown unit {unit!r}; use one of: {', '.join(known_unit_symbols())}")
        return unit


def check_numeric(spec: NumericSpec, completion: str, task: TaskSpec) -> Verdict:
    text = extract_answer(completion, spec.extract)
    quantity = last_quantity(text)
    if quantity is None:
        unboxed = spec.extract == "boxed_only" and not text
        return Verdict.failure("no \\boxed{...} answer" if unboxed else "no number found in the answer")
    expected_unit = find_unit(spec.unit) if spec.unit else None
    value = quantity.value
    if expected_unit is not None:
        if quantity.unit is None:
            if spec.require_unit:
                return Verdict.failure(f"the answer {quantity.text!r} has no unit; expected {spec.unit}")
        elif quantity.unit.dimension != expected_unit.dimension:
            return Verdict.failure(
                f"the answer's unit {quantity.unit.symbol} is a {quantity.unit.dimension}, "
                f"expected a {expected_unit.dimension} ({spec.unit})"
            )
        else:
            value = expected_unit.from_base(quantity.unit.to_base(value))
    allowed = max(spec.abs_tol, spec.rel_tol * abs(spec.value))
    error = abs(value - spec.value)
    unit = f" {spec.unit}" if spec.unit else ""
    breakdown = {"parsed": quantity.text, "value": value, "expected": spec.value, "error": error}
    if error <= allowed:
        return Verdict.of_score(
            1.0, f"{value:g}{unit} is within {allowed:g} of {spec.value:g}{unit}", breakdown=breakdown
        )
    return Verdict.of_score(
        0.0,
        f"{value:g}{unit} differs from {spec.value:g}{unit} by {error:g} (allowed {allowed:g})",
        breakdown=breakdown,
    )


NUMERIC = VerifierKind(
    name="numeric",
    spec_model=NumericSpec,
    check=check_numeric,
    default_timeout_s=5.0,
    description="the last number in the answer equals value within a tolerance, units converted",
)
