"""The ``build_tasks`` job kind: fill a task set from procedural domains, JSONL, HumanEval or documents.

Each source yields :class:`TaskSpec` lists; every spec is validated against its
verifier before anything is stored, and a task set is written in one
transaction, so a bad input stores nothing.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from posttrain.platform.auth import Identity, action
from posttrain.platform.db.models import Role
from posttrain.platform.failures import BadInput
from posttrain.platform.jobs import queue
from posttrain.platform.jobs.context import JobContext
from posttrain.platform.jobs.registry import JOB_PATH, JobKind, register
from posttrain.platform.settings import get_settings
from posttrain.platform.tasks import store
from posttrain.platform.tasks.builders import KINDS as DOCUMENT_KINDS
from posttrain.platform.tasks.builders import (
    DocumentBuildError,
    build_document_tasks,
    load_ready_document,
    why_no_tasks,
)
from posttrain.platform.tasks.domains import generate, held_out_level, list_domains, prompt_space
from posttrain.platform.tasks.domains.registry import UnknownDomainError
from posttrain.platform.tasks.importers import TaskImportError, import_humaneval, import_jsonl
from posttrain.platform.verifiers import TaskSpec, VerifierSpecError, validate_task
from posttrain.platform.verifiers.forgeable_tests import mutation_report


class ProceduralSource(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["procedural"] = "procedural"
    domains: list[str] = Field(default_factory=list, description="domain names; empty means every domain of `families`")
    families: list[str] = Field(default_factory=list, description="whole families, e.g. arithmetic, strings")
    per_domain: int = Field(default=32, ge=1, le=100_000, description="train tasks per domain")
    eval_per_domain: int = Field(default=8, ge=0, le=100_000)
    difficulty: Annotated[int, Field(ge=1, le=5)] | Literal["auto"] = Field(
        default="auto",
        description="1 (easiest) to 5, or auto: each domain at the lowest level that holds out an eval split "
        "(level 1 for a domain that holds out none, or when eval_per_domain is 0)",
    )
    seed: int = 0

    def level(self, domain: str) -> int:
        """The difficulty ``domain``'s tasks are built at."""
        return build_level(domain, self.difficulty, self.eval_per_domain)

    @model_validator(mode="after")
    def _something_chosen(self) -> ProceduralSource:
        if not self.domains and not self.families:
            raise ValueError("name at least one domain or family (see `posttrain tasks domains`)")
        return self


def build_level(domain: str, difficulty: int | Literal["auto"], eval_per_domain: int) -> int:
    """The difficulty a procedural build makes ``domain``'s tasks at: the one asked for, or (auto) the lowest that
    holds out an eval split; level 1 when no level does or no eval tasks are asked for."""
    if difficulty != "auto":
        return difficulty
    return (held_out_level(domain) or 1) if eval_per_domain else 1


class JsonlSource(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["jsonl"] = "jsonl"
    path: str = Field(json_schema_extra=JOB_PATH)
    domain: str | None = Field(default=None, description="domain for lines that name none")


class HumanEvalSource(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["humaneval"] = "humaneval"
    limit: int | None = Field(default=None, ge=1)
    split: Literal["train", "eval"] = "eval"


class DocumentsSource(BaseModel):
    """Tasks whose answers come from preprocessed documents (see ``posttrain.platform.tasks.builders``)."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["documents"] = "documents"
    document_ids: list[int] = Field(min_length=1, description="ids of documents whose preprocess job succeeded")
    kinds: list[Literal["table_lookup", "field_extraction", "span_recovery"]] = Field(
        default_factory=lambda: list(DOCUMENT_KINDS), min_length=1
    )
    vision: bool = Field(default=False, description="also ask each question over the page image (domain <base>.vision)")
    max_per_document: int = Field(default=50, ge=1, le=100_000, description="questions per document")
    eval_fraction: float = Field(default=0.1, ge=0.0, le=1.0)
    passage_chars: int | None = Field(
        default=None,
        ge=200,
        le=100_000,
        description="put only the passage around each "
        "question's evidence (about this many characters) in the prompt instead of the "
        "whole page (None: the page)",
    )
    seed: int = 0


Source = Annotated[ProceduralSource | JsonlSource | HumanEvalSource | DocumentsSource, Field(discriminator="type")]


class BuildTasksConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task_set: str = Field(min_length=1, max_length=256)
    description: str = ""
    source: Source


def procedural_specs(src: ProceduralSource) -> list[TaskSpec]:
    names = list(src.domains)
    for family in src.families:
        found = [d.name for d in list_domains(family)]
        if not found:
            raise BadInput(f"unknown domain family {family!r}")
        names.extend(found)
    specs: list[TaskSpec] = []
    for name in dict.fromkeys(names):
        try:
            level = src.level(name)
            specs += generate(name, src.per_domain, seed=src.seed, difficulty=level, split="train")
            # a domain too small to hold out an eval split gets none (``run`` names them)
            if src.eval_per_domain and prompt_space(name, level).has_held_out_split:
                specs += generate(name, src.eval_per_domain, seed=src.seed + 1_000_003, difficulty=level, split="eval")
        except UnknownDomainError as exc:
            raise BadInput(str(exc)) from None
    return specs


def document_specs(src: DocumentsSource, url: str | None = None) -> list[TaskSpec]:
    specs: list[TaskSpec] = []
    for document_id in dict.fromkeys(src.document_ids):
        specs += build_document_tasks(
            document_id, kinds=src.kinds, vision=src.vision, max_per_document=src.max_per_document,
            eval_fraction=src.eval_fraction, seed=src.seed, passage_chars=src.passage_chars, url=url,
        )  # fmt: skip
    if not specs:
        raise BadInput(
            f"documents {src.document_ids} gave no {', '.join(src.kinds)} tasks (no tables, key-value "
            "pairs or sentences with key terms were found); try other kinds or documents"
        )
    return specs


def collect_specs(config: BuildTasksConfig, url: str | None = None) -> list[TaskSpec]:
    src = config.source
    try:
        if isinstance(src, DocumentsSource):
            specs = document_specs(src, url)
        elif isinstance(src, ProceduralSource):
            specs = procedural_specs(src)
        elif isinstance(src, JsonlSource):
            if not Path(src.path).is_file():
                raise BadInput(f"JSONL file {src.path} does not exist")
            specs = import_jsonl(src.path, domain=src.domain)
        else:
            specs = import_humaneval(split=src.split, limit=src.limit)
        for spec in specs:
            validate_task(spec)
    except (TaskImportError, VerifierSpecError, DocumentBuildError) as exc:
        raise BadInput(str(exc)) from None
    return specs


def run(ctx: JobContext, config: BuildTasksConfig) -> dict[str, Any]:
    ctx.progress(0.0, "generating tasks", force=True)
    specs = collect_specs(config, ctx.url)
    ctx.progress(0.5, f"storing {len(specs)} tasks", force=True)
    set_id = store.save_tasks(
        config.task_set, specs, source=config.source.type, description=config.description, url=ctx.url
    )
    domains = sorted({s.domain for s in specs})
    ctx.log.info("task set %s (%d): %d tasks over %d domains", config.task_set, set_id, len(specs), len(domains))
    result: dict[str, Any] = {"task_set_id": set_id, "tasks": len(specs), "domains": len(domains)}
    if isinstance(config.source, ProceduralSource):
        result["levels"] = {d: config.source.level(d) for d in domains}
    if isinstance(config.source, ProceduralSource) and config.source.eval_per_domain:
        with_eval = {s.domain for s in specs if s.split == "eval"}
        if missing := [d for d in domains if d not in with_eval]:
            at = "any difficulty" if config.source.difficulty == "auto" else f"difficulty {config.source.difficulty}"
            ctx.log.warning("%d domain(s) have too few distinct prompts at %s to hold out an eval split and got no eval "
                            "tasks: %s%s", len(missing), at, ", ".join(missing),
                            "" if config.source.difficulty == "auto" else " (build at a higher difficulty, or auto, to "
                            "evaluate them)")  # fmt: skip
            result["domains_without_eval_split"] = missing
    if isinstance(config.source, DocumentsSource):  # what each ticked kind made, and why a kind made nothing
        made = Counter(str(s.metadata.get("kind")) for s in specs)
        result["kinds"] = {kind: made[kind] for kind in config.source.kinds}
        if empty := [kind for kind in config.source.kinds if not made[kind]]:
            pages = [
                p for d in dict.fromkeys(config.source.document_ids) for p in load_ready_document(d, url=ctx.url)[1]
            ]
            result["kinds_without_tasks"] = {kind: why_no_tasks(kind, pages) for kind in empty}
            for kind, why in result["kinds_without_tasks"].items():
                ctx.log.warning("no %s tasks: %s", kind, why)
    if isinstance(config.source, (JsonlSource, HumanEvalSource)):  # imported code tasks, checked by the importers
        result.update(mutation_report(specs))
    if result.get("tests_forgeable_by_mutation"):
        ctx.log.warning(
            "%d test(s) of %d code task(s) read an argument again after passing it to the program, so code "
            "that rewrites it in place can pass them: %s",
            result["tests_forgeable_by_mutation"],
            result["tasks_with_tests_forgeable_by_mutation"],
            "; ".join(result["forgeable_by_mutation"][:5]),
        )
    return result


@action("tasks.import_jsonl", Role.operator)
def import_jsonl_upload(identity: Identity, data: bytes, task_set: str, *, url: str | None = None) -> int:
    """Keep an uploaded JSONL file in ``<data_dir>/uploads`` (named by its sha256) and queue the
    ``build_tasks`` job that imports it into ``task_set``; returns the job's id."""
    folder = get_settings().data_dir / "uploads"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{hashlib.sha256(data).hexdigest()}.jsonl"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return queue.submit(identity, "build_tasks", {"task_set": task_set, "source": {"type": "jsonl", "path": str(path)}},
                        url=url)  # fmt: skip


register(
    JobKind(
        name="build_tasks",
        config_model=BuildTasksConfig,
        run=run,
        description="Fill a task set from procedural domains, a JSONL file, HumanEval or documents.",
    )
)
