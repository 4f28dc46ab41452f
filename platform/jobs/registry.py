"""Job kinds register here by name.

A kind is a name, a pydantic model that validates its JSON config, the function
that runs it inside a job process, and how the worker treats it: the resource
slots it takes, whether an interrupted attempt can resume from its checkpoint,
and whether a failure is worth retrying.

Heavy kinds (training, preprocessing) live in their own modules and import
torch or PyMuPDF inside ``run``, so the worker itself stays light; the modules
that define kinds are listed in :data:`KIND_MODULES` and imported on first use.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

if TYPE_CHECKING:
    from posttrain.platform.jobs.context import JobContext

KIND_MODULES: tuple[str, ...] = (
    "posttrain.platform.jobs.selftest",
    "posttrain.platform.documents",
    "posttrain.platform.tasks.jobs",
    "posttrain.platform.serving.jobs",
    "posttrain.training.jobs",
)


class BadInput(ValueError):
    """A job failed because of its input (a kind raises it; never retried)."""


class TransientError(RuntimeError):
    """A failure worth retrying (a flaky network, a busy resource): retried with backoff."""


class JobConfigError(BadInput):
    """A job was submitted with an unknown kind or a config its kind rejects."""


@dataclass(frozen=True)
class JobKind:
    name: str
    config_model: type[BaseModel]
    run: Callable[["JobContext", Any], dict[str, Any] | None]
    description: str = ""
    resumable: bool = False
    retryable: bool = False
    cpu_slots: int = 1
    gpu_slots: int = 0
    max_attempts: int = 3


_kinds: dict[str, JobKind] = {}
_loaded = False
_lock = threading.Lock()


def register(kind: JobKind) -> JobKind:
    if kind.name in _kinds and _kinds[kind.name] is not kind:
        raise ValueError(f"job kind {kind.name!r} is registered twice")
    _kinds[kind.name] = kind
    return kind


def _load() -> None:
    global _loaded
    if _loaded:
        return
    with _lock:
        if not _loaded:
            for module in KIND_MODULES:
                importlib.import_module(module)
            _loaded = True


def kinds() -> dict[str, JobKind]:
    _load()
    return dict(sorted(_kinds.items()))


def get_kind(name: str) -> JobKind:
    _load()
    try:
        return _kinds[name]
    except KeyError:
        known = ", ".join(sorted(_kinds)) or "none"
        raise JobConfigError(f"unknown job kind {name!r}; known kinds: {known}") from None


MAX_CONFIG_VALUES = 100_000  # values in one config, counting repeats (a YAML alias bomb expands to billions)
MAX_CONFIG_DEPTH = 64


def _is_text(value: str) -> bool:
    """Whether ``value`` encodes as UTF-8 (JSON from a file or a request can still carry lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _not_plain_json(config: Any) -> str | None:
    """Why ``config`` is not a plain, bounded JSON value (non-finite numbers, non-string keys, too deep
    or too many values), or None. Stored configs must read back exactly as they were validated."""
    import math

    seen = 0
    stack: list[tuple[Any, str, int]] = [(config, "(config)", 0)]
    while stack:
        value, where, depth = stack.pop()
        seen += 1
        if seen > MAX_CONFIG_VALUES:
            return f"more than {MAX_CONFIG_VALUES} values (a YAML alias bomb?); write the config out plainly"
        if depth > MAX_CONFIG_DEPTH:
            return f"{where}: nested deeper than {MAX_CONFIG_DEPTH} levels"
        if isinstance(value, float) and not math.isfinite(value):
            return f"{where}: {value} is not a finite number; give a number such as 1.0"
        if isinstance(value, str) and not _is_text(value):
            return f"{where}: the value is not valid Unicode text (it holds a lone surrogate); send UTF-8"
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    return f"{where}: key {key!r} is not a string; quote it"
                if not _is_text(key):
                    return f"{where}: a key is not valid Unicode text (it holds a lone surrogate); send UTF-8"
                stack.append((item, key if where == "(config)" else f"{where}.{key}", depth + 1))
        elif isinstance(value, (list, tuple)):
            stack.extend((item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value))
    return None


def validate_config(kind_name: str, config: dict[str, Any] | None) -> BaseModel:
    """Validate ``config`` for ``kind_name``; :class:`JobConfigError` names each bad field."""
    kind = get_kind(kind_name)
    if config is not None and not isinstance(config, dict):
        raise JobConfigError(
            f"invalid config for job kind {kind_name!r}: expected a JSON object, got {type(config).__name__}"
        )
    if problem := _not_plain_json(config or {}):
        raise JobConfigError(f"invalid config for job kind {kind_name!r}: {problem}")
    try:
        return kind.config_model.model_validate(config or {})
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(config)'}: {e['msg']}"
            + ("" if e["type"] == "missing" else f" (got {e.get('input')!r})")
            for e in exc.errors()
        )
        raise JobConfigError(f"invalid config for job kind {kind_name!r}: {problems}") from None
