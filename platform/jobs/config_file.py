"""A job config read from a file that a command names (``posttrain jobs submit KIND --config-file run.yaml``).

A config file can be anything on disk (``--config-file /etc/shadow``), and whoever reads the error need not be
someone allowed to read the file, so nothing the file holds is shown:

- a file over :data:`MAX_CONFIG_FILE_BYTES` is refused by its size, before a byte of it is read;
- every error names the file, the line and the kind of problem (``line 3: an unknown key at the top level``);
- a key is named only where the kind's schema has a field of that name (the name is then the schema's),
  every other key reads ``<key>``, and no value is quoted;
- a kind's own validator may word its message with the value: that message is shown with every word of
  the file cut out (``…``).

::

    config = read_config_file(Path("run.yaml"))
    with config.errors_explained("train_sft"):
        queue.submit(me(), "train_sft", config.data)
"""

from __future__ import annotations

import contextlib
import functools
import re
import sys
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from posttrain.platform.jobs.registry import CUT, ConfigProblem, JobConfigError, Loc, get_kind, parse_config_text

MAX_CONFIG_FILE_BYTES = 1 << 20  # a job config is a page of YAML (a preset's is under 2 KB); data is named by path
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
MIN_CUT = 3  # the file's words shorter than this are left in a message (they would cut up its own words)


@dataclass(frozen=True)
class ConfigFile:
    """A config file read and parsed: ``data`` is what it holds, ``text`` what it says (kept for line numbers)."""

    path: Path
    text: str
    data: dict[str, Any]

    @property
    def source(self) -> str:
        return f"config file {self.path}"

    @contextlib.contextmanager
    def errors_explained(self, kind_name: str) -> Iterator[None]:
        """Within it, a :class:`JobConfigError` about this file's config for ``kind_name`` is raised again
        as :meth:`explained` words it."""
        try:
            yield
        except JobConfigError as exc:
            try:
                explained = self.explained(exc, kind_name)
            except Exception:  # noqa: BLE001 - a traceback here would chain back to the message that quotes the file
                explained = JobConfigError(f"invalid config for job kind {kind_name!r} in {self.source} "
                                           "(its problems could not be placed by line)")  # fmt: skip
            raise explained from None

    def explained(self, exc: JobConfigError, kind_name: str) -> JobConfigError:
        """``exc`` worded by the file's lines, never by what they hold: its problems in line order."""
        model = _config_model(kind_name)
        names = _schema_names(model) if model is not None else frozenset()
        if not exc.problems:
            return JobConfigError(f"{self.source}: {self._cut(str(exc), model)}")
        listed: set[Loc] = set()  # the levels whose fields one unknown key's line listed already
        found = sorted(((self._locate(p.loc, names), p) for p in exc.problems), key=lambda found: found[0][0])
        lines = "; ".join(f"line {line}: {self._explain(p, path, names, model, listed)}" for (line, path), p in found)
        return JobConfigError(f"invalid config for job kind {kind_name!r} in {self.source}: {lines}")

    def _explain(
        self, problem: ConfigProblem, path: str, names: frozenset[str], model: type[BaseModel] | None, listed: set[Loc]
    ) -> str:
        if problem.kind == "extra_forbidden" and problem.loc:
            return self._unknown_key(problem.loc, names, model, listed)
        if problem.kind == "missing":
            return f"`{path}` is missing; add it"
        return (f"`{path}`: " if problem.loc else "") + self._cut(problem.message, model)

    def _unknown_key(self, loc: Loc, names: frozenset[str], model: type[BaseModel] | None, listed: set[Loc]) -> str:
        parent = loc[:-1]
        here = f"under `{self._locate(parent, names)[1]}`" if parent else "at the top level"
        what = f"`{loc[-1]}` is not a field {here}" if loc[-1] in names else f"an unknown key {here}"
        fields = _fields_at(model, parent) if model is not None and parent not in listed else []
        listed.add(parent)
        return what + (f" (its fields: {', '.join(fields)})" if fields else "")

    def _locate(self, loc: Loc, names: frozenset[str]) -> tuple[int, str]:
        """The line of ``loc``'s deepest part that the file holds, and ``loc`` as an error may show it: a
        part that is not a name in the schema reads ``<key>`` (``[i]`` for a list's item), and a part the
        file does not hold that is not one either (pydantic's own, such as a union member's tag) is left out."""
        node = self._root()
        line = 1 if node is None else node.start_mark.line + 1
        shown: list[str | int] = []
        for part in loc:
            child, at = _child(node, part)
            if child is not None:
                node, line = child, at
            if isinstance(part, int):
                shown.append(part)
            elif part in names:
                shown.append(part)
            elif child is not None:
                shown.append("<key>")
        return line, "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in shown).lstrip(".") or "(config)"

    @functools.cached_property
    def _nodes(self) -> yaml.Node | None:
        return yaml.compose(self.text, Loader=yaml.SafeLoader) if self.text.strip() else None

    def _root(self) -> yaml.Node | None:
        try:
            return self._nodes
        except yaml.YAMLError:  # it parsed once already; a line number is all this is for
            return None

    @functools.cached_property
    def _words(self) -> list[str]:
        found: set[str] = set()
        _collect_words(self.data, found)
        return sorted((w for w in found if len(w) >= MIN_CUT), key=len, reverse=True)

    def _cut(self, message: str, model: type[BaseModel] | None) -> str:
        """``message`` with every word of the file cut out (the longest first, so no piece of one stays),
        but for the words of ``model``'s schema, which the message may quote from there."""
        keep = _schema_words(model) if model is not None else frozenset()
        for word in self._words:
            if word not in keep:
                message = message.replace(word, CUT)
        return message


def read_config_file(path: Path) -> ConfigFile:
    """Read and parse a job config file (YAML or JSON): refused unread when it is over
    :data:`MAX_CONFIG_FILE_BYTES`, and by line when it is not a mapping of fields."""
    source = f"config file {path}"
    if not path.is_file():
        raise FileNotFoundError(f"{source} does not exist")
    try:
        _check_size(path.stat().st_size, source)
        with path.open("rb") as fh:
            raw = fh.read(MAX_CONFIG_FILE_BYTES + 1)
    except OSError as exc:
        raise JobConfigError(f"{source} cannot be read ({exc.strerror or type(exc).__name__}); "
                             "give a file this user may read") from None  # fmt: skip
    _check_size(len(raw), source)  # a file that says it is small and is not (/proc, one still growing)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise JobConfigError(f"{source} is not UTF-8 text; give a YAML or JSON file") from None
    data = parse_config_text(text, source)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise JobConfigError(f"{source}: line 1: the file holds a {type(data).__name__}, not a mapping of fields; "
                             "give YAML such as `max_steps: 5`, or a JSON object")  # fmt: skip
    return ConfigFile(path, text, data)


def _check_size(size: int, source: str) -> None:
    if size > MAX_CONFIG_FILE_BYTES:
        raise JobConfigError(
            f"{source} is over {MAX_CONFIG_FILE_BYTES // 1024} KiB, the most a job config may be; "
            "give the config alone (a data set goes into the data directory, named by its path)"
        )


def _child(node: yaml.Node | None, part: str | int) -> tuple[yaml.Node | None, int]:
    """The node under ``node`` at ``part`` (a mapping's key, a sequence's index) and the line it is on."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                return value, key.start_mark.line + 1
    if isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
        item = node.value[part]
        return item, item.start_mark.line + 1
    return None, 0


def _collect_words(value: Any, found: set[str]) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _collect_words(key, found)
            _collect_words(item, found)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect_words(item, found)
    elif isinstance(value, str):
        found.add(value)
        found.add(repr(value)[1:-1])  # as a message quotes it with !r
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        found.add(str(value))


def _config_model(kind_name: str) -> type[BaseModel] | None:
    try:
        return get_kind(kind_name).config_model
    except JobConfigError:
        return None


@functools.cache
def _schema_words(model: type[BaseModel]) -> frozenset[str]:
    """What the schema itself says: its names, and the words of its models' and modules' docs and its fields'
    descriptions (``preset``, which a validator takes in, is one). A message may quote them from there."""
    texts: list[str] = []
    for sub in _models_in(model, set()):
        for cls in sub.__mro__[: sub.__mro__.index(BaseModel)]:  # the model and the models it extends
            texts += [cls.__doc__ or "", getattr(sys.modules.get(cls.__module__), "__doc__", None) or ""]
        texts += [field.description or "" for field in sub.model_fields.values()]
    return _schema_names(model) | frozenset(_WORD.findall("\n".join(texts)))


@functools.cache
def _schema_names(model: type[BaseModel]) -> frozenset[str]:
    """Every field name and alias of ``model`` and of the models its fields hold, at any depth."""
    names: set[str] = set()
    for sub in _models_in(model, set()):
        for name, field in sub.model_fields.items():
            names.update(n for n in (name, field.alias, field.validation_alias) if isinstance(n, str))
    return frozenset(names)


def _models_in(model: type[BaseModel], seen: set[type[BaseModel]]) -> set[type[BaseModel]]:
    seen.add(model)
    for field in model.model_fields.values():
        for sub in _models_of(field.annotation):
            if sub not in seen:
                _models_in(sub, seen)
    return seen


def _models_of(annotation: Any) -> list[type[BaseModel]]:
    """The models an annotation holds: itself, or inside ``X | None``, ``list[X]``, ``dict[str, X]`` and such."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_of(arg)]


def _fields_at(model: type[BaseModel], loc: Loc) -> list[str]:
    """The field names of the model at ``loc`` in ``model`` (empty where that is not one model)."""
    current: Any = model
    for part in loc:
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part)) or next(
                (f for f in current.model_fields.values() if f.alias == part), None)  # fmt: skip
            if field is None:
                return []
            current = field.annotation
        else:
            current = _item_type(current)
        current = _one_model(current) or current
    return sorted(f.alias or n for n, f in current.model_fields.items()) if _one_model(current) else []


def _item_type(annotation: Any) -> Any:
    """What a ``list[X]`` or ``dict[str, X]`` (or either ``| None``) holds, else nothing."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return _item_type(args[0]) if len(args) == 1 else None
    return args[-1] if args else None


def _one_model(annotation: Any) -> type[BaseModel] | None:
    """The model ``annotation`` is, alone or as ``X | None``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(models) == 1:
            return _one_model(models[0])
    return None
