"""The registry of verifier kinds, by name, and spec validation against each kind's model."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from posttrain.platform.verifiers.errors import UnknownVerifierError, VerifierSpecError
from posttrain.platform.verifiers.models import TaskSpec, Verdict

if TYPE_CHECKING:
    from posttrain.platform.sandbox import Sandbox, SandboxPool


class BaseSpec(BaseModel):
    """Settings every kind accepts. Kind-specific spec models subclass this."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    timeout_s: float | None = Field(default=None, gt=0, le=3600)


PageLookup = Callable[[str | None, int], str | None]
"""``lookup(document_id, page_number) -> page text or None``: where document QA finds page text."""


@dataclass(frozen=True)
class VerifyContext:
    """What the caller lends a verification beyond the task.

    ``page_lookup``: where document QA finds page text. ``sandbox_pool``: the pool the
    'code' kind runs tests in (default: the process-wide pool of
    ``posttrain.platform.verifiers.sandboxes``). ``sandbox``: the episode's sandbox, which the
    'tool_use' kind inspects after the agent stopped (it must still be checked out).
    """

    page_lookup: PageLookup | None = None
    sandbox_pool: SandboxPool | None = None
    sandbox: Sandbox | None = None


class CheckFn(Protocol):
    def __call__(self, spec: Any, completion: str, task: TaskSpec) -> Verdict: ...


class PrepareFn(Protocol):
    def __call__(self, spec: Any, completion: str, task: TaskSpec, context: VerifyContext) -> Any: ...


@dataclass(frozen=True)
class VerifierKind:
    """A named verifier: its spec model and its check function.

    ``check`` must be a module-level function: with ``isolation="process"`` it is sent
    to a worker process by reference. ``isolation="thread"`` runs it in a thread of the
    calling process (for kinds that isolate themselves, e.g. code run in a sandbox);
    such a check must enforce its own time limit: it finds the limit in ``spec.timeout_s``,
    and the caller waits ``wait_margin_s`` beyond it (for work around the limited part, e.g.
    getting a sandbox from a pool) before giving up on it. ``prepare`` (optional) runs in the
    caller before dispatch, with the caller's ``VerifyContext``, and returns the spec to use.
    """

    name: str
    spec_model: type[BaseSpec]
    check: CheckFn
    isolation: Literal["process", "thread"] = "process"
    default_timeout_s: float = 10.0
    prepare: PrepareFn | None = None
    description: str = ""
    wait_margin_s: float = 0.0
    placeholder: bool = field(default=False)


_lock = threading.Lock()
_kinds: dict[str, VerifierKind] = {}
_builtins_loaded = False
_builtins_lock = threading.Lock()


def _ensure_builtins() -> None:
    global _builtins_loaded
    if _builtins_loaded:
        return
    with _builtins_lock:  # concurrent first callers wait until the kinds are in, not just until loading began
        if _builtins_loaded:
            return
        from posttrain.platform.verifiers.kinds import BUILTIN_KINDS  # cycle: the kinds import this registry

        with _lock:
            for kind in BUILTIN_KINDS:
                _kinds.setdefault(kind.name, kind)
        _builtins_loaded = True


def register_verifier(kind: VerifierKind, *, replace: bool = False) -> None:
    """Add ``kind`` to the registry. Replacing an existing name needs ``replace=True``
    (placeholder kinds such as 'code' and 'tool_use' are meant to be replaced)."""
    _ensure_builtins()
    with _lock:
        existing = _kinds.get(kind.name)
        if existing is not None and not replace and not existing.placeholder:
            raise ValueError(f"verifier kind '{kind.name}' is already registered; pass replace=True to replace it")
        _kinds[kind.name] = kind


def unregister_verifier(name: str) -> None:
    """Remove a kind (tests use this to undo a registration)."""
    with _lock:
        _kinds.pop(name, None)


def get_verifier(name: str) -> VerifierKind:
    """The kind registered as ``name``; ``UnknownVerifierError`` lists the known ones."""
    _ensure_builtins()
    with _lock:
        kind = _kinds.get(name)
        known = list(_kinds)
    if kind is None:
        raise UnknownVerifierError(name, known)
    return kind


def list_verifiers() -> list[str]:
    """Registered kind names, sorted."""
    _ensure_builtins()
    with _lock:
        return sorted(_kinds)


def validate_spec(kind: str, spec: dict[str, Any] | BaseModel) -> BaseSpec:
    """``spec`` validated by kind ``kind``'s model; ``VerifierSpecError`` names each bad field and its fix."""
    verifier = get_verifier(kind)
    if isinstance(spec, verifier.spec_model):
        return spec
    if isinstance(spec, BaseModel):
        spec = spec.model_dump(by_alias=True)
    if not isinstance(spec, dict):
        raise VerifierSpecError.from_validation_error(kind, _not_a_mapping(verifier.spec_model, spec))
    try:
        return verifier.spec_model.model_validate(spec)
    except ValidationError as error:
        raise VerifierSpecError.from_validation_error(kind, error) from None


def validate_task(task: TaskSpec) -> BaseSpec:
    """The validated spec of ``task``'s verifier (raises like ``validate_spec``)."""
    return validate_spec(task.verifier.kind, task.verifier.spec)


def _not_a_mapping(model: type[BaseModel], value: Any) -> ValidationError:
    try:
        model.model_validate(value)
    except ValidationError as error:
        return error
    raise AssertionError("unreachable: a non-mapping validated")  # pragma: no cover
