"""The ``interpolate_model`` job: weight interpolation (WiSE-FT) of a trained model with its start, alpha given or picked.

    # posttrain jobs submit interpolate_model --config '{"a": "base", "b": "base-grpo", "alpha": 0.5}'
    a: base-sft                 # the model training started from (alpha 0)
    b: base-grpo                # the model trained from it (alpha 1)
    alphas: [0, 0.25, 0.5, 0.75, 1]
    domains: [arith.add.int, format.to_hex]
    tasks_per_domain: 32
    # or a multi-turn run's own domains as episodes, with the general check's domains beside them:
    # domains: [repair.off_by_one], environment: {name: code_repair, ...}, general_domains: [logic.compare, ...]

With ``alpha`` the job writes and registers that interpolation
(:func:`~posttrain.platform.models.interpolate.interpolate_models`). With ``alphas`` it writes each candidate in
turn into the job's directory, evaluates its greedy pass@1 on **validation tasks**, keeps the best (a tie goes to
the smaller alpha, the one closer to the start) and registers that one; the result lists every candidate's
figures and the pick. A candidate's validation pass@1 is over every validation task: those of ``domains`` (run as
whole episodes of ``environment`` when one is given: a repair run's validation is repair episodes, so the pick sees
the gain it would trade away) and those of ``general_domains`` (one completion each, as the general check puts
them: the pick sees what training cost elsewhere).

The validation tasks are generated in the ``train`` split of the procedural domains (``split="train"``), with a
seed (:func:`validation_seed`) that training's scheduler never draws its chunks with (those are below 2**31): the
held-out ``eval`` split, which the evaluate job and the general check measure a model on, is never used to pick
alpha, so a figure measured there afterwards is not one alpha was chosen on. A validation prompt may still be one
training saw (the train split is what it drew from); only the eval split is kept apart. The tasks are written to
``validation-tasks.json`` in the job's directory (domain, task id, split, prompt).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from posttrain.platform.engines.inspect import ModelDirError
from posttrain.platform.failures import BadInput
from posttrain.platform.jobs.registry import JobKind, register
from posttrain.platform.models.interpolate import interpolate_dirs, interpolate_models
from posttrain.platform.models.registry import ModelNotFound, get_model
from posttrain.platform.tasks.domains import UnknownDomainError, get_domain
from posttrain.training.config import EnvironmentConfig, EvalConfig, GeneralCheck

if TYPE_CHECKING:
    from posttrain.platform.jobs.context import JobContext

VALIDATION_SEED_BASE = 2**31  # training's chunk seeds are below it (training.scheduler._chunk_seed)


def validation_seed(seed: int) -> int:
    """The seed validation tasks are generated with: never one training's scheduler draws a chunk with."""
    return VALIDATION_SEED_BASE + seed


class InterpolateConfig(BaseModel):
    """``interpolate_model``: ``alpha`` (write that one) or ``alphas`` with ``domains`` (pick one on validation tasks
    of the train split)."""

    model_config = ConfigDict(extra="forbid")

    a: str = Field(min_length=1, description="the registered model training started from (alpha 0)")
    b: str = Field(min_length=1, description="the registered model trained from a (alpha 1)")
    alpha: float | None = Field(default=None, ge=0, le=1, description="the weight of b: (1 - alpha) * a + alpha * b")
    alphas: list[float] = Field(
        default_factory=list,
        max_length=21,
        description="candidates to pick from on validation tasks from the train split (never the held-out eval split)",
    )
    name: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$",
        description="register the result under this name (default: <b>-alpha<alpha>)",
    )
    domains: list[str] = Field(default_factory=list, description="procedural domains of the validation tasks (alphas)")
    environment: EnvironmentConfig | None = Field(
        default=None,
        description="the environment domains' validation tasks run in as episodes (a multi-turn run's own: "
        "code_repair); None: one completion per task",
    )
    general_domains: list[str] = Field(
        default_factory=list,
        description="procedural domains validated beside domains, one completion per task, never in the "
        "environment (the general check's domains: what training cost elsewhere)",
    )
    tasks_per_domain: int = Field(default=32, ge=1, le=1000)
    difficulty: int = Field(default=1, ge=1)
    seed: int = Field(default=0, ge=0, description="validation tasks are generated with seed 2**31 + seed")
    max_new_tokens: int = Field(default=128, ge=1)
    batch_size: int = Field(default=16, ge=1)
    device: str = "auto"

    @model_validator(mode="after")
    def _check(self) -> InterpolateConfig:
        if (self.alpha is None) == (not self.alphas):
            raise ValueError("give either alpha (one interpolation) or alphas (candidates picked on validation tasks)")
        if bad := [x for x in self.alphas if not 0 <= x <= 1]:
            raise ValueError(f"alphas {bad} are outside [0, 1]: each is the weight of b, from 0 (a) to 1 (b)")
        if len(set(self.alphas)) != len(self.alphas):
            raise ValueError("alphas lists a value twice")
        if self.alphas and not self.domains:
            raise ValueError("alphas needs domains: the procedural domains whose train-split tasks pick alpha")
        if self.alpha is not None and (self.domains or self.general_domains):
            raise ValueError("domains are for picking among alphas; with one alpha leave them out")
        if both := sorted(set(self.domains) & set(self.general_domains)):
            raise ValueError(f"{both} are in domains and general_domains: list each domain once")
        return self

    @field_validator("domains", "general_domains")
    @classmethod
    def _known(cls, domains: list[str]) -> list[str]:
        for domain in domains:
            try:
                get_domain(domain)
            except UnknownDomainError as exc:
                raise ValueError(str(exc)) from None
        return domains

    def validation(self, model: str) -> EvalConfig:
        """How a candidate is evaluated: greedy pass@1 on the train split's tasks, generated with the validation seed
        (``domains`` in ``environment``, ``general_domains`` beside them as the general check, in the same split)."""
        general = (
            GeneralCheck(
                domains=self.general_domains, difficulty=self.difficulty, tasks_per_domain=self.tasks_per_domain
            )  # fmt: skip
            if self.general_domains
            else None
        )
        return EvalConfig(model=model, domains=self.domains, tasks_per_domain=self.tasks_per_domain,
                          difficulty=self.difficulty, split="train", seed=validation_seed(self.seed),
                          max_new_tokens=self.max_new_tokens, batch_size=self.batch_size, device=self.device,
                          environment=self.environment, general=general)  # fmt: skip


class Candidate(BaseModel):
    """One alpha's validation figures."""

    model_config = ConfigDict(populate_by_name=True)

    alpha: float
    pass_at_1: float = Field(alias="pass@1")
    domains: dict[str, float] = Field(default_factory=dict, description="pass@1 per domain")


class InterpolateJobResult(BaseModel):
    """``interpolate_model``: the registered interpolation, and with ``alphas`` every candidate and the pick."""

    model: str
    path: str
    a: str
    b: str
    alpha: float
    candidates: list[Candidate] = Field(default_factory=list)
    split: str | None = Field(default=None, description="the split the validation tasks came from: always train")
    validation_seed: int | None = None
    validation_tasks: int | None = None
    validation_file: str | None = Field(
        default=None, description="the validation tasks (domain, task id, split, prompt)"
    )


def pick(candidates: list[Candidate]) -> Candidate:
    """The best validation pass@1; a tie goes to the smaller alpha (closer to the model training started from)."""
    return min(candidates, key=lambda c: (-c.pass_at_1, c.alpha))


def validation_tasks(config: InterpolateConfig, model: str) -> list[Any]:
    """The tasks every candidate answers; each is checked to be from the train split."""
    # torch: this job kind's module stays light for the job registry
    from posttrain.training.evaluate import all_eval_tasks, general_config

    validation = config.validation(model)
    general = general_config(validation)
    tasks = all_eval_tasks(validation) + (all_eval_tasks(general) if general is not None else [])
    if stray := [t.task_id for t in tasks if t.split != "train"]:  # the eval split never picks alpha
        raise RuntimeError(f"validation tasks outside the train split: {stray[:3]}")
    return tasks


def run_interpolate(ctx: JobContext, config: InterpolateConfig) -> InterpolateJobResult:
    from posttrain.training.evaluate import evaluate_policy  # torch: see above

    try:
        a_row, b_row = get_model(config.a, url=ctx.url), get_model(config.b, url=ctx.url)
    except ModelNotFound as exc:
        raise BadInput(str(exc)) from None
    candidates: list[Candidate] = []
    extra: dict[str, Any] = {}
    alpha = config.alpha
    if alpha is None:
        alphas = sorted(config.alphas)
        tasks = validation_tasks(config, b_row.path)
        file = ctx.workdir / "validation-tasks.json"
        file.write_text(json.dumps([{"domain": t.domain, "task_id": t.task_id, "split": t.split, "prompt": t.prompt_text}
                                    for t in tasks]))  # fmt: skip
        for i, x in enumerate(alphas):
            ctx.progress(i / (len(alphas) + 1), f"alpha {x:g}: writing and evaluating on {len(tasks)} validation tasks",
                         force=True)  # fmt: skip
            where = ctx.workdir / f"candidate-{i}"
            shutil.rmtree(where, ignore_errors=True)  # a retried attempt's leftover
            try:
                interpolate_dirs(
                    Path(a_row.path), Path(b_row.path), where, x, a_label=repr(config.a), b_label=repr(config.b)
                )
            except ModelDirError as exc:
                raise BadInput(str(exc)) from None
            records: list[dict[str, Any]] = []
            try:
                report = evaluate_policy(config.validation(str(where)), records=records)
            finally:
                shutil.rmtree(where, ignore_errors=True)  # one candidate on disk at a time
            if [r["task_id"] for r in records] != [t.task_id for t in tasks]:  # what it answered is what the file lists
                raise RuntimeError(f"alpha {x:g} was evaluated on other tasks than the validation tasks")
            found = Candidate(alpha=x, pass_at_1=sum(r["passed"] for r in records) / len(records),
                              domains={d: report[f"eval/{d}/pass@1"] for d in config.domains}
                              | {f"general/{d}": report[f"general/{d}/pass@1"] for d in config.general_domains})  # fmt: skip
            candidates.append(found)
            ctx.log_metrics(i, {"validation/pass@1": found.pass_at_1, "validation/alpha": x,
                                **{f"validation/{d}/pass@1": v for d, v in found.domains.items()}})  # fmt: skip
            ctx.log.info("alpha %g: validation pass@1 %.4f", x, found.pass_at_1)
        alpha = pick(candidates).alpha
        ctx.log.info("picked alpha %g", alpha)
        extra = {"split": "train", "validation_seed": validation_seed(config.seed), "validation_tasks": len(tasks),
                 "validation_file": str(file)}  # fmt: skip
    ctx.progress(len(candidates) / (len(candidates) + 1), f"writing and registering alpha {alpha:g}", force=True)
    picked = {"picked_on": {"split": "train", "domains": config.domains + config.general_domains, "candidates": [c.model_dump(by_alias=True)
                                                                                        for c in candidates]}} if candidates else {}  # fmt: skip
    try:
        row = interpolate_models(ctx.identity, config.a, config.b, alpha, name=config.name, url=ctx.url,
                                 produced_by_job_id=ctx.job_id, meta={"job_kind": ctx.kind, **picked})  # fmt: skip
    except (ModelDirError, ModelNotFound) as exc:
        raise BadInput(str(exc)) from None
    return InterpolateJobResult(model=row.name, path=row.path, a=config.a, b=config.b, alpha=alpha,
                                candidates=candidates, **extra)  # fmt: skip


INTERPOLATE_MODEL = register(
    JobKind(
        "interpolate_model",
        InterpolateConfig,
        run_interpolate,
        "weight interpolation of a trained model with its start (WiSE-FT); alpha given, or "
        "picked on validation tasks of the train split",
        result_model=InterpolateJobResult,
    )
)
