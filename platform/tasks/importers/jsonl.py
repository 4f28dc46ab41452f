"""JSONL task files: one task a line, every line validated, errors reported with line numbers.

Each line is an object::

    {"prompt": "2+2?" | [{"role": "user", "content": "..."}],
     "answer": "4",                                   # the reference answer (or "reference")
     "verifier": {"kind": "numeric", "spec": {"value": 4}},
     "split": "train", "id": "optional", "metadata": {...}}

A code task's tests that the program could pass by rewriting an argument in place are recorded in
its metadata (:mod:`posttrain.platform.verifiers.forgeable_tests`), whatever the line's own metadata says.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from posttrain.platform.verifiers.errors import UnknownVerifierError, VerifierSpecError
from posttrain.platform.verifiers.forgeable_tests import flag_tasks
from posttrain.platform.verifiers.models import ChatMessage, Split, TaskSpec, VerifierRef
from posttrain.platform.verifiers.registry import validate_spec

MAX_ERRORS_LISTED = 50


class JsonlTaskLine(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    prompt: str | list[ChatMessage]
    answer: str | None = Field(default=None, alias="answer")
    reference: str | None = None
    verifier: VerifierRef
    split: Split = "train"
    id: str | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


@dataclass(frozen=True)
class ImportErrorLine:
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.field}: {self.message}"


class TaskImportError(ValueError):
    """Every problem found in a task file, each with its line number; nothing was imported."""

    def __init__(self, source: str, errors: list[ImportErrorLine]) -> None:
        self.source = source
        self.errors = errors
        shown = "\n  ".join(str(e) for e in errors[:MAX_ERRORS_LISTED])
        more = f"\n  ... and {len(errors) - MAX_ERRORS_LISTED} more" if len(errors) > MAX_ERRORS_LISTED else ""
        super().__init__(
            f"{source}: {len(errors)} invalid line(s), nothing imported; fix them and import again:\n  {shown}{more}"
        )


def parse_jsonl_lines(lines: Iterable[str], *, domain: str, source: str = "<jsonl>") -> list[TaskSpec]:
    """Tasks from JSONL ``lines`` (blank lines skipped). Raises TaskImportError listing every bad line."""
    tasks: list[TaskSpec] = []
    errors: list[ImportErrorLine] = []
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as error:
            errors.append(ImportErrorLine(number, "(line)", f"not valid JSON: {error.msg} at column {error.colno}"))
            continue
        if not isinstance(data, dict):
            errors.append(ImportErrorLine(number, "(line)", f"expected a JSON object, got {type(data).__name__}"))
            continue
        try:
            row = JsonlTaskLine.model_validate(data)
        except ValidationError as error:
            for item in error.errors(include_url=False):
                field = ".".join(str(p) for p in item["loc"]) or "(line)"
                errors.append(ImportErrorLine(number, field, item["msg"]))
            continue
        try:
            validate_spec(row.verifier.kind, row.verifier.spec)
        except VerifierSpecError as error:
            for problem in error.problems:
                errors.append(
                    ImportErrorLine(number, f"verifier.{problem.field}", f"{problem.message} (fix: {problem.fix})")
                )
            continue
        except UnknownVerifierError as error:
            errors.append(ImportErrorLine(number, "verifier.kind", str(error)))
            continue
        reference = row.reference if row.reference is not None else row.answer
        tasks.append(
            TaskSpec(
                domain=domain,
                prompt=row.prompt,
                verifier=row.verifier,
                reference=reference,
                split=row.split,
                task_id=row.id or f"{domain}/{number}",
                metadata=row.metadata,
                provenance={"source": "jsonl", "file": source, "line": number},
            )
        )
    if errors:
        raise TaskImportError(source, errors)
    return flag_tasks(tasks)


def import_jsonl(path: str | Path, *, domain: str | None = None) -> list[TaskSpec]:
    """Tasks from the JSONL file at ``path``; ``domain`` defaults to the file's stem."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"no task file at {file}; give the path of a .jsonl file")
    with file.open(encoding="utf-8") as handle:
        return parse_jsonl_lines(handle, domain=domain or file.stem, source=str(file))
