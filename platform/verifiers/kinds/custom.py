"""Custom verifiers: a Python callable published under the entry-point group ``posttrain.verifiers``.

A package declares, in its pyproject::

    [project.entry-points."posttrain.verifiers"]
    my_rubric = "my_package.rubrics:score"

and a task uses ``{"kind": "custom", "spec": {"entry_point": "my_rubric", "params": {...}}}``.
The callable is ``fn(task: TaskSpec, completion: str, params: dict) -> Verdict | float | bool``;
a float must lie in [0, 1], and ``pass_threshold`` turns it into a pass flag.
"""

from __future__ import annotations

from importlib.metadata import EntryPoint, entry_points
from typing import Any

from pydantic import Field, field_validator

from posttrain.platform.verifiers.models import TaskSpec, Verdict
from posttrain.platform.verifiers.registry import BaseSpec, VerifierKind

ENTRY_POINT_GROUP = "posttrain.verifiers"


def custom_verifier_names() -> list[str]:
    """Names published under the ``posttrain.verifiers`` entry-point group."""
    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def find_entry_point(name: str) -> EntryPoint | None:
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return ep
    return None


class CustomSpec(BaseSpec):
    entry_point: str = Field(min_length=1)
    params: dict[str, Any] = Field(default_factory=dict)
    pass_threshold: float = Field(default=1.0, ge=0, le=1)

    @field_validator("entry_point")
    @classmethod
    def _published(cls, name: str) -> str:
        if find_entry_point(name) is None:
            known = ", ".join(custom_verifier_names()) or "none"
            raise ValueError(
                f"no entry point {name!r} in group '{ENTRY_POINT_GROUP}' (published: {known}); "
                "install the package that declares it, or fix the name"
            )
        return name


def check_custom(spec: CustomSpec, completion: str, task: TaskSpec) -> Verdict:
    ep = find_entry_point(spec.entry_point)
    if ep is None:
        return Verdict.infra(f"entry point {spec.entry_point!r} is not installed in the verifier worker")
    function = ep.load()
    result = function(task, completion, dict(spec.params))
    if isinstance(result, Verdict):
        return result
    if isinstance(result, bool):
        return Verdict.of_score(float(result), f"{spec.entry_point}: {'pass' if result else 'fail'}")
    if isinstance(result, (int, float)):
        if not 0.0 <= float(result) <= 1.0:
            return Verdict.infra(f"custom verifier {spec.entry_point!r} returned {result}, outside [0, 1]")
        return Verdict.of_score(
            float(result), f"{spec.entry_point}: score {float(result):.3f}", threshold=spec.pass_threshold
        )
    return Verdict.infra(
        f"custom verifier {spec.entry_point!r} returned {type(result).__name__}; return a Verdict, a float or a bool"
    )


CUSTOM = VerifierKind(
    name="custom",
    spec_model=CustomSpec,
    check=check_custom,
    default_timeout_s=30.0,
    description="a callable published under the entry-point group 'posttrain.verifiers'",
)
