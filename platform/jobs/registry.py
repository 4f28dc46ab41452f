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
import json
import math
import re
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from pydantic import BaseModel, ValidationError

from posttrain.platform.failures import BadInput
from posttrain.platform.settings import get_settings

if TYPE_CHECKING:
    from posttrain.platform.jobs.context import JobContext

KIND_MODULES: tuple[str, ...] = (
    "posttrain.platform.jobs.selftest",
    "posttrain.platform.documents",
    "posttrain.platform.tasks.jobs",
    "posttrain.platform.models.jobs",
    "posttrain.platform.serving.jobs",
    "posttrain.training.jobs",
    "posttrain.training.estimate",
    "posttrain.training.interpolation",
    "posttrain.training.tier_card",
)


def no_room_left(path: str | Path, margin_bytes: int = 1 << 20) -> bool:
    """Whether the filesystem holding ``path`` has under ``margin_bytes`` free: a job (or a write) that fails then
    failed for it, also where the error reached the job without its cause (torch.save's "unexpected pos" or
    "file write failed", a helper process that exited with code 1). Measure before cleaning up a partial write."""
    try:
        return shutil.disk_usage(path).free < margin_bytes
    except OSError:
        return False


Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class ConfigProblem:
    """One thing wrong in a job config, kept apart from how it is shown: ``loc``, the keys and list indices
    that lead to it, as the config gave them; ``kind``, pydantic's error type or one of this module's
    (``not_plain``, ``outside_roots``); ``message``, what is wrong: this module's never quote the input, but
    pydantic's message is a validator's own where the kind wrote one (``value_error``), which may; ``echo``,
    the whole line a config typed in (``--config``, the console) is shown, which may quote the input."""

    loc: Loc
    kind: str
    message: str
    echo: str


class JobConfigError(BadInput):
    """A job was submitted with an unknown kind or a config its kind rejects; ``problems`` says where,
    for a caller that shows them otherwise (a config file's errors never quote the file)."""

    def __init__(self, message: str, problems: tuple[ConfigProblem, ...] = ()) -> None:
        super().__init__(message)
        self.problems = problems


@dataclass(frozen=True)
class Admitted:
    """An audit entry a kind's ``admit`` asks for: written in the submission's transaction, by the submitter, with the
    job's id added to ``details``."""

    action: str
    target: str
    details: dict[str, Any]


@dataclass(frozen=True)
class JobKind:
    name: str
    config_model: type[BaseModel]
    run: Callable[[JobContext, Any], BaseModel | dict[str, Any] | None]
    description: str = ""
    result_model: type[BaseModel] | None = None  # what ``run`` returns, stored as JSON; read back with read_result
    resumable: bool = False
    retryable: bool = False
    cpu_slots: int = 1
    gpu_slots: int = 0
    serving: bool = False  # a server for its whole life (a deployment): a serving slot, no CPU slot
    max_attempts: int = 3
    # checked when the job is submitted, after its config validates, with who submits it and the database url:
    # raises JobConfigError to refuse the job, else returns the audit entries to write beside the submission
    # (an override the config asked for, by whom)
    admit: Callable[[Any, Any, str | None], list[Admitted]] | None = None


_kinds: dict[str, JobKind] = {}
_loaded = False
_lock = threading.Lock()


def result_json(kind: JobKind, result: BaseModel | dict[str, Any] | None) -> dict[str, Any]:
    """A job's return value as the JSON object its row stores (checked against the kind's result model)."""
    if isinstance(result, BaseModel):
        return result.model_dump(mode="json", by_alias=True)
    if kind.result_model is not None and result is not None:
        return kind.result_model.model_validate(result).model_dump(mode="json", by_alias=True)
    return dict(result or {})


def read_result(kind_name: str, result: dict[str, Any] | None) -> BaseModel | None:
    """A finished job's stored result as its kind's typed result (None: no result, or a kind without a model)."""
    kind = get_kind(kind_name)
    if kind.result_model is None or not result:
        return None
    return kind.result_model.model_validate(result)


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


def serving_kinds() -> list[str]:
    """The kinds whose jobs serve for their whole life (:attr:`JobKind.serving`)."""
    return [name for name, kind in kinds().items() if kind.serving]


def get_kind(name: str) -> JobKind:
    _load()
    try:
        return _kinds[name]
    except KeyError:
        known = ", ".join(sorted(_kinds)) or "none"
        raise JobConfigError(f"unknown job kind {name!r}; known kinds: {known}") from None


CUT = "…"  # what an error shows in place of a piece of the input it may not quote
MAX_CONFIG_VALUES = 100_000  # values in one config, counting repeats (a YAML alias bomb expands to billions)
MAX_CONFIG_DEPTH = 64


def _is_text(value: str) -> bool:
    """Whether ``value`` encodes as UTF-8 (JSON from a file or a request can still carry lone surrogates)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def dotted(loc: Loc) -> str:
    """A config path as errors write it: ``optim.lr``, ``models[1]``, ``(config)`` for the whole."""
    text = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc).lstrip(".")
    return text or "(config)"


def _problem(loc: Loc, kind: str, message: str, echo: str | None = None) -> ConfigProblem:
    return ConfigProblem(loc, kind, message, f"{dotted(loc)}: {echo or message}" if loc else echo or message)


def _not_plain_json(config: Any) -> ConfigProblem | None:
    """Why ``config`` is not a plain, bounded JSON value (non-finite numbers, non-string keys, too deep
    or too many values), or None. Stored configs must read back exactly as they were validated."""
    seen = 0
    stack: list[tuple[Any, Loc]] = [(config, ())]
    while stack:
        value, loc = stack.pop()
        seen += 1
        if seen > MAX_CONFIG_VALUES:
            return _problem((), "not_plain", f"more than {MAX_CONFIG_VALUES} values (a YAML alias bomb?); "
                                             "write the config out plainly")  # fmt: skip
        if len(loc) > MAX_CONFIG_DEPTH:
            return _problem(loc, "not_plain", f"nested deeper than {MAX_CONFIG_DEPTH} levels")
        if isinstance(value, float) and not math.isfinite(value):
            return _problem(
                loc,
                "not_plain",
                "not a finite number; give a number such as 1.0",
                f"{value} is not a finite number; give a number such as 1.0",
            )
        if isinstance(value, str) and not _is_text(value):
            return _problem(
                loc, "not_plain", "the value is not valid Unicode text (it holds a lone surrogate); send UTF-8"
            )
        if isinstance(value, dict):
            for key, item in value.items():
                if not isinstance(key, str):
                    return _problem(
                        loc, "not_plain", "a key is not a string; quote it", f"key {key!r} is not a string; quote it"
                    )
                if not _is_text(key):
                    return _problem(
                        loc, "not_plain", "a key is not valid Unicode text (it holds a lone surrogate); send UTF-8"
                    )
                stack.append((item, (*loc, key)))
        elif isinstance(value, (list, tuple)):
            stack.extend((item, (*loc, i)) for i, item in enumerate(value))
    return None


def _shown(value: Any) -> str:
    """A rejected value as an error shows it: short (an unknown key's value is never shown at all)."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


JOB_PATH: dict[str, Any] = {"job_path": True}
"""``Field(json_schema_extra=JOB_PATH)`` marks a config field that names a file or directory (or a
list of them; a plain registered name, without a slash, is not a path): :func:`validate_config`
resolves it (a relative path against the data directory) and refuses one outside the data
directory and ``settings.path_roots``."""


def _names_a_path(value: str) -> bool:
    return "/" in value or value in (".", "..") or value.startswith("~")


def _allowed_roots() -> list[Path]:
    settings = get_settings()
    return [Path(root).expanduser().resolve() for root in (settings.data_dir, *settings.path_roots)]


def _confined(value: str, loc: Loc, roots: list[Path]) -> str:
    if "\x00" in value:  # no file has one; os calls raise a bare ValueError on it
        raise _refused(_problem(loc, "outside_roots", "the path contains a NUL byte; give a plain path inside the "
                                                      "data directory"))  # fmt: skip
    path = Path(value).expanduser()
    resolved = (path if path.is_absolute() else roots[0] / path).resolve()
    if not any(resolved.is_relative_to(root) for root in roots):
        allowed = ", ".join(str(r) for r in roots)
        fix = f"is outside the data directory ({allowed}); put it there, or add its folder to POSTTRAIN_PATH_ROOTS"
        raise _refused(_problem(loc, "outside_roots", f"the path {fix}", f"{value} {fix}"))
    return str(resolved)


def _refused(*problems: ConfigProblem, prefix: str = "") -> JobConfigError:
    return JobConfigError(prefix + "; ".join(p.echo for p in problems), problems)


def confine_paths(config: BaseModel, roots: list[Path] | None = None, loc: Loc = ()) -> None:
    """Resolve every :data:`JOB_PATH` field of ``config`` (and of the models nested in it) in place,
    refusing a path outside the allowed roots with :class:`JobConfigError` naming the field."""
    roots = roots if roots is not None else _allowed_roots()
    for name, field in type(config).model_fields.items():
        value, at = getattr(config, name), (*loc, name)
        marked = isinstance(field.json_schema_extra, dict) and field.json_schema_extra.get("job_path")
        if marked and isinstance(value, str) and _names_a_path(value):
            setattr(config, name, _confined(value, at, roots))
        elif marked and isinstance(value, list):
            setattr(config, name, [_confined(v, (*at, i), roots) if isinstance(v, str) and _names_a_path(v) else v
                                   for i, v in enumerate(value)])  # fmt: skip
        elif isinstance(value, BaseModel):
            confine_paths(value, roots, at)
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, BaseModel):
                    confine_paths(item, roots, (*at, i))


class _BadKey(ValueError):
    pass


def _plain_unique_keys(pairs: list[tuple[Any, Any]], where: Callable[[int], str] | None = None) -> dict[Any, Any]:
    seen: dict[Any, Any] = {}
    for index, (key, value) in enumerate(pairs):
        if not isinstance(key, (str, int, float, bool, type(None))):
            raise _BadKey(f"a key is a {type(key).__name__}{where(index) if where else ''}; keys are plain names")
        if key in seen:  # a file's key is not shown (a config file can be anything on disk): its line is
            raise _BadKey(
                f"a key appears twice{where(index)}; keep one" if where else f"key {key!r} appears twice; keep one"
            )
        seen[key] = value
    return seen


_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'" + r'|"(?:[^"\\]|\\.)*"')
_TOKEN = re.compile(r"""['"](?:<[a-z ]+>|[^\w\s])['"]""")  # a YAML token's name ('<block end>') or one punctuation mark


def _yaml_error(exc: Exception, text: str) -> str:
    """Where PyYAML stopped and why, without what it quotes from the text (an alias's, anchor's or tag's
    name, a character), except a token's name or a punctuation mark: the line and column say where."""
    if isinstance(exc, yaml.reader.ReaderError):
        line = text.count("\n", 0, max(exc.position, 0)) + 1
        return f"YAML syntax error at line {line}: a control character YAML does not allow (is it a binary file?)"
    mark = getattr(exc, "problem_mark", None)
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = str(getattr(exc, "problem", None) or "unreadable")
    return f"YAML syntax error{at}: " + _QUOTED.sub(
        lambda m: m.group(0) if _TOKEN.fullmatch(m.group(0)) else CUT, problem
    )


def parse_config_text(text: str, source: str, *, json_only: bool = False) -> Any:
    """A job config written as YAML (or JSON, ``json_only``) by a person: a duplicate key is refused,
    not silently the last one, and an error names ``source``, the line and the problem, never a
    line of the text itself (a config file can be anything on disk)."""

    if json_only:
        try:
            return json.loads(text, object_pairs_hook=_plain_unique_keys)
        except json.JSONDecodeError as exc:
            raise JobConfigError(f"{source} is not valid JSON ({exc.msg} at column {exc.colno}); "
                                 "e.g. --config '{\"steps\": 5}'") from None  # fmt: skip
        except _BadKey as exc:
            raise JobConfigError(f"{source}: {exc}") from None
        except RecursionError:
            raise JobConfigError(f"{source} nests too deeply to read; write it out flatter") from None

    class UniqueKeys(yaml.SafeLoader):
        pass

    def mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        loader.flatten_mapping(node)
        pairs = [(loader.construct_object(k, deep=deep), loader.construct_object(v, deep=deep)) for k, v in node.value]
        return _plain_unique_keys(pairs, lambda i: f" (line {node.value[i][0].start_mark.line + 1})")

    UniqueKeys.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, mapping)
    try:
        return yaml.load(text, Loader=UniqueKeys) if text.strip() else None  # noqa: S506 - a SafeLoader
    except _BadKey as exc:
        raise JobConfigError(f"{source}: {exc}") from None
    except yaml.YAMLError as exc:
        raise JobConfigError(f"{source}: {_yaml_error(exc, text)}") from None
    except (ValueError, OverflowError):  # a date or number YAML recognised but could not build (2001-13-01)
        raise JobConfigError(f"{source}: a value looks like a date or number that does not exist; quote it") from None
    except RecursionError:
        raise JobConfigError(f"{source} nests too deeply to read; write it out flatter") from None


def validate_config(kind_name: str, config: dict[str, Any] | None) -> BaseModel:
    """Validate ``config`` for ``kind_name``; :class:`JobConfigError` names each bad field (its
    ``problems`` say the same apart from the text, for a caller that shows them otherwise)."""
    kind = get_kind(kind_name)
    prefix = f"invalid config for job kind {kind_name!r}: "
    if config is not None and not isinstance(config, dict):
        raise JobConfigError(f"{prefix}expected a JSON object, got {type(config).__name__}")
    if problem := _not_plain_json(config or {}):
        raise _refused(problem, prefix=prefix)
    try:
        validated = kind.config_model.model_validate(config or {})
    except ValidationError as exc:
        raise _refused(*map(_pydantic_problem, exc.errors()), prefix=prefix) from None
    # A value can turn non-finite in validation ("Infinity" or "nan" as text read as a float): the
    # stored config must still be plain JSON, so the validated form is checked as the input was.
    if problem := _not_plain_json(validated.model_dump(mode="json")):
        raise _refused(problem, prefix=prefix)
    try:
        confine_paths(validated)
    except JobConfigError as exc:
        raise _refused(*exc.problems, prefix=prefix) from None
    return validated


def _pydantic_problem(error: Any) -> ConfigProblem:
    loc, kind, message = tuple(error["loc"]), str(error["type"]), str(error["msg"])
    got = "" if kind in ("missing", "extra_forbidden") else f" (got {_shown(error.get('input'))})"
    return ConfigProblem(loc, kind, message, f"{dotted(loc)}: {message}{got}")
