"""Errors a user can cause when configuring a verifier, with the field and the fix."""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError


class VerifierError(Exception):
    """Base class of the verifier package's user-facing errors."""


@dataclass(frozen=True)
class SpecProblem:
    """One thing wrong with a verifier spec: where (a dotted field path), what, and the fix."""

    field: str
    message: str
    fix: str

    def __str__(self) -> str:
        return f"field '{self.field}': {self.message} (fix: {self.fix})"


class VerifierSpecError(VerifierError, ValueError):
    """A verifier spec that does not validate; ``problems`` lists each field at fault."""

    def __init__(self, kind: str, problems: list[SpecProblem]) -> None:
        self.kind = kind
        self.problems = problems
        lines = "; ".join(str(p) for p in problems)
        super().__init__(f"invalid spec for verifier '{kind}': {lines}")

    @classmethod
    def from_validation_error(cls, kind: str, error: ValidationError, *, prefix: str = "spec") -> VerifierSpecError:
        problems: list[SpecProblem] = []
        for item in error.errors(include_url=False):
            path = ".".join(str(part) for part in (prefix, *item["loc"]))
            message = item["msg"].removeprefix("Value error, ")
            problems.append(SpecProblem(field=path, message=message, fix=_fix_for(item["type"], item["loc"])))
        return cls(kind, problems)


class UnknownVerifierError(VerifierError, LookupError):
    """A verifier kind that is not registered."""

    def __init__(self, kind: str, known: list[str]) -> None:
        self.kind = kind
        super().__init__(
            f"unknown verifier kind '{kind}'; registered kinds: {', '.join(sorted(known))} "
            "(fix: use one of these, or register a custom one through the entry-point group "
            "'posttrain.verifiers' and set kind='custom')"
        )


def _fix_for(error_type: str, loc: tuple[int | str, ...]) -> str:
    name = str(loc[-1]) if loc else "spec"
    if error_type == "missing":
        return f"add the required field '{name}'"
    if error_type == "extra_forbidden":
        return f"remove '{name}': this verifier does not take it (check its spelling)"
    if error_type.endswith("_type") or error_type.endswith("_parsing"):
        return f"give '{name}' a value of the expected type"
    if error_type == "value_error":
        return f"correct '{name}' as described"
    if error_type == "literal_error":
        return f"use one of the allowed values for '{name}'"
    if error_type.startswith(("greater", "less")):
        return f"give '{name}' a value within the allowed range"
    return f"correct '{name}'"
