"""Job kinds for the worker: ``train_sft``, ``train_grpo``, ``evaluate``.

Config (YAML or JSON, validated by :class:`SFTConfig` / :class:`GRPOConfig` / :class:`EvalConfig`;
``preset: cpu-demo`` fills what the file leaves out, see :mod:`posttrain.training.presets`)::

    # posttrain jobs submit train_grpo --config-file grpo.yaml
    preset: cpu-demo
    model: demo-sft            # a registered model name, or a model directory
    register_as: demo-grpo     # name of the final model (default: train_grpo-job<id>)
    max_steps: 40
    trajectories_per_step: 64  # trajectories of each step kept in the database

- ``model`` may be a registered model name (resolved with the registry) or a directory.
- ``train_sft`` and ``train_grpo`` with ``nproc_per_node: N > 1`` run the learner as N FSDP processes under torchrun,
  children of the job (:mod:`posttrain.training.fsdp`); metrics, trajectories, checkpoints and
  the final model are the same as in one process.
- Checkpoints go under the job's ``workdir`` unless the config names an ``output_dir``; a
  resumed attempt continues from the latest one, so its metrics continue at the next step
  (``ctx.log_metrics`` replaces a step logged twice: no gaps, no duplicates).
- Every step's metrics go to the Metric table; up to ``trajectories_per_step`` of its
  trajectories (spread over its groups) go to the Trajectory table in one insert per step.
- A finished run saves its final model as a Hugging Face directory under
  ``<data_dir>/models/<name>`` and registers it with its lineage (base: the input model
  when it was given by its registered name; produced by this job). The result names it.
- ``evaluate`` takes ``model: x`` or ``models: [before, after]``: per-domain pass@1 (and
  pass@k with ``samples``) of each; with several models, a per-domain comparison (last
  minus first) in the result and in metrics ``compare/<domain>/<metric>`` (step 0), each
  model's figures at step = its index in ``models``.
"""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from posttrain.platform import metric_names
from posttrain.platform.engines.chat_template import resolve_template
from posttrain.platform.failures import BadInput
from posttrain.platform.jobs.registry import JOB_PATH, JobKind, register
from posttrain.platform.models.general_check import GeneralCheck
from posttrain.platform.models.registry import (
    TOOL_TRAINING_KEY,
    ModelNotFound,
    get_model,
    record_general_check,
    register_model,
)
from posttrain.platform.tasks.heldout import check_held_out
from posttrain.training.config import EvalConfig, GRPOConfig, SFTConfig, TrainConfig
from posttrain.training.presets import get_preset
from posttrain.training.scheduler import DomainSpec, resolve_domains
from posttrain.training.trajectories import TrajectoryWriter

if TYPE_CHECKING:
    import torch

    from posttrain.platform.jobs.context import JobContext


# --- what each job kind returns (stored as the job's result; the console reads it back typed) --------
class TrainJobResult(BaseModel):
    """``train_sft`` and ``train_grpo``: the registered final model and the run that made it."""

    steps: int
    model: str = Field(description="the registered name of the final model")
    base_model: str | None = Field(default=None, description="the registered model it started from")
    resumed_from: int = 0
    checkpoint: str | None = Field(default=None, description="the final checkpoint's directory")
    final_reward_mean: float | None = Field(default=None, description="GRPO: the last step's mean reward")


class EvalJobResult(BaseModel):
    """``evaluate``: each model's report, and with several models the comparison (and a greedy arena for two)."""

    model_config = ConfigDict(populate_by_name=True)

    models: list[str]
    paths: dict[str, str]
    pass_at_1: dict[str, float] = Field(alias="pass@1")
    reports: dict[str, dict[str, float]]
    comparison: dict[str, Any] = Field(default_factory=dict)
    domains: list[str] = Field(default_factory=list)
    task_set: str | None = None
    arena: dict[str, Any] | None = None
    records: dict[str, str] = Field(
        default_factory=dict,
        description="each model's per-task records (JSON file in the "
        "job's directory: domain, task id, source, answer, verdict), to pair with another "
        "evaluation of the same tasks (training.evaluate.head_to_head)",
    )


class PresetJobResult(BaseModel):
    """``train_preset``: the recipe's models and the held-out gain of GRPO over its SFT warm-up (and the control).
    What a result stored by an earlier version may lack is None."""

    model: str
    sft_model: str
    models: list[str]
    domains: list[str]
    gain_points: float
    eval_tasks: int
    eval_unseen_fraction: float
    preset: str | None = None
    base_model: str | None = None
    difficulty: int | None = None
    steps: int | None = None
    pass_before: float | None = None
    pass_after: float | None = None
    comparison: dict[str, Any] = Field(default_factory=dict)
    grpo_steps_checked: int | None = None
    control_model: str | None = None
    control_steps: int | None = None
    control_after: float | None = None
    gain_over_control_points: float | None = None
    general_before: float | None = Field(default=None, description="the general check's pass@1 before GRPO")
    general_after: float | None = Field(default=None, description="... and after: what training cost elsewhere")
    general_tasks: int | None = Field(default=None, description="the general check's tasks (for its standard error)")
    pass_base: float | None = Field(
        default=None,
        description="held-out pass@1 of the model before SFT, when the run "
        "evaluated it (a base model: in the plain completion format)",
    )
    general_base: float | None = Field(default=None, description="... and its general check")
    arena: dict[str, Any] | None = Field(
        default=None,
        description="the held-out evaluations before and after GRPO "
        "paired task by task (training.evaluate.head_to_head): the run's comparison",
    )
    peak_rss_gb: float | None = Field(
        default=None, description="the job process's peak RSS (learner, rollouts, evaluation), GiB"
    )


# --- models in and out ------------------------------------------------------------
def resolve_model(ctx: JobContext, ref: str | None) -> tuple[str, str | None]:
    """``(directory, registered name or None)`` for a config's ``model`` (a name or a directory)."""
    if ref is None:
        raise BadInput("the config names no model: set model to a registered model name or a model directory")
    try:
        row = get_model(ref, url=ctx.url)
    except ModelNotFound:
        row = None
    if row is not None:
        return row.path, row.name
    if (Path(ref) / "config.json").is_file():
        return str(Path(ref)), None
    raise BadInput(
        f"model {ref!r} is neither a registered model name nor a model directory (no config.json there); "
        "`posttrain models list` shows the registered models"
    )


def tool_environment(config: TrainConfig) -> str | None:
    """The tool environment a run trains its model to call tools in: a GRPO run's environment unless it is
    single-turn; an SFT run's demonstrations' environment, or ``episodes`` for stored multi-turn episodes."""
    if isinstance(config, GRPOConfig):
        return None if config.environment.name == "single_turn" else config.environment.name
    if isinstance(config, SFTConfig):
        if config.demonstrations is not None:
            return config.demonstrations.environment.name
        return "episodes" if config.episodes_path else None
    return None


def register_final_model(
    ctx: JobContext,
    config: TrainConfig,
    model: torch.nn.Module,
    source_dir: str,
    base: str | None,
    meta: dict[str, Any],
) -> str:
    """Save ``model`` (LoRA merged) with the source's tokenizer, in the chat template the run trained in when it gave
    one (a base model's SFT), under ``<data_dir>/models/<name>`` and register it."""
    # torch: these job kinds' module stays light for the job registry
    from posttrain.training.modeling import load_tokenizer

    name = config.register_as or f"{ctx.kind}-job{ctx.job_id}"
    root = Path(ctx.settings.data_dir) / "models"
    root.mkdir(parents=True, exist_ok=True)
    final = root / name
    tmp = root / f".{name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        merged = model.merge_and_unload() if hasattr(model, "merge_and_unload") else model  # type: ignore[operator]
        merged.save_pretrained(tmp)  # type: ignore[operator]
        tokenizer = load_tokenizer(source_dir)
        if (template := getattr(config, "chat_template", None)) is not None:
            tokenizer.chat_template = resolve_template(template)
        tokenizer.save_pretrained(tmp)
        if final.exists():  # a resumed attempt registering again
            shutil.rmtree(final)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if (environment := tool_environment(config)) is not None:  # the playground says which models call tools
        meta = {TOOL_TRAINING_KEY: environment, **meta}
    register_model(
        ctx.identity,
        name,
        final,
        base=base,
        produced_by_job_id=ctx.job_id,
        meta={"job_kind": ctx.kind, **meta},
        replace=True,
        url=ctx.url,
    )
    return name


# --- reporting ----------------------------------------------------------------------
def _reporter(ctx: JobContext, total: int):
    def on_metrics(step: int, metrics: dict[str, float]) -> None:
        ctx.log_metrics(step, metrics)
        ctx.progress(step / total, f"step {step}/{total} loss {metrics.get('train/loss', float('nan')):.4f}")

    return on_metrics


def check_task_set(ctx: JobContext, config: GRPOConfig, hint: str = "") -> None:
    """A run on stored task sets (its own, or a domain's) fails at its start, naming the set (and ``hint``: how to
    build it), when a set holds no train tasks where the run draws them."""
    try:
        found = resolve_domains(config.domains, config.task_set, url=ctx.url)
    except ValueError as exc:
        raise BadInput(f"{exc}{hint}") from None
    if stored := [d for d in found if isinstance(d, DomainSpec) and d.tasks is not None]:
        ctx.log.info("stored tasks: %s", ", ".join(f"{d.name} ({len(d.tasks or [])} train tasks)" for d in stored))


def _with_output_dir(ctx: JobContext, config: Any) -> Any:
    if config.output_dir is None:
        config = config.model_copy(update={"output_dir": str(ctx.workdir / "run")})
    return config


def _launch_fsdp(
    ctx: JobContext, config: SFTConfig | GRPOConfig, trajectories: tuple[str, int, int] | None = None
) -> Any:
    """Run ``config`` on ``nproc_per_node`` FSDP processes (torchrun children); the model comes back as the last checkpoint."""
    from posttrain.training import fsdp  # torch: see above

    try:
        fsdp.check_launch(config)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    result = fsdp.launch(
        config,
        on_metrics=_reporter(ctx, config.max_steps),
        should_stop=lambda: ctx.should_stop,
        trajectories=trajectories,
    )
    ctx.check_stop()
    if result.checkpoint is None:
        raise RuntimeError(f"the FSDP run ended at step {result.steps} without a checkpoint to register")
    result.model = fsdp.trained_model(config, result.checkpoint)
    return result


# --- kinds --------------------------------------------------------------------------
def run_sft(ctx: JobContext, config: SFTConfig) -> TrainJobResult:
    from posttrain.training.sft import train_sft  # torch: see above

    path, base = resolve_model(ctx, config.model)
    config = _with_output_dir(ctx, config).model_copy(update={"model": path})
    if config.nproc_per_node > 1:  # torchrun + FSDP in child processes; the model comes back as the last checkpoint
        result = _launch_fsdp(ctx, config)
    else:
        result = train_sft(config, on_metrics=_reporter(ctx, config.max_steps), should_stop=lambda: ctx.should_stop)
    ctx.check_stop()
    assert result.model is not None
    name = register_final_model(ctx, config, result.model, path, base, {"steps": result.steps})
    return TrainJobResult(
        steps=result.steps,
        model=name,
        base_model=base,
        resumed_from=result.resumed_from,
        checkpoint=str(result.checkpoint) if result.checkpoint else None,
    )


def run_grpo(ctx: JobContext, config: GRPOConfig) -> TrainJobResult:
    from posttrain.training.loop import train_grpo  # torch: see above

    path, base = resolve_model(ctx, config.model)
    check_task_set(ctx, config)
    config = _with_output_dir(ctx, config).model_copy(update={"model": path})
    if config.nproc_per_node > 1:
        result = _launch_fsdp(ctx, config, trajectories=(ctx.url, ctx.job_id, config.trajectories_per_step))
    else:
        writer = TrajectoryWriter(ctx.url, ctx.job_id, config.trajectories_per_step)
        result = train_grpo(
            config, on_metrics=_reporter(ctx, config.max_steps), on_groups=writer, should_stop=lambda: ctx.should_stop
        )
    ctx.check_stop()
    assert result.model is not None
    name = register_final_model(ctx, config, result.model, path, base, {"steps": result.steps})
    last = result.metrics[-1] if result.metrics else {}
    return TrainJobResult(
        steps=result.steps,
        model=name,
        base_model=base,
        resumed_from=result.resumed_from,
        checkpoint=str(result.checkpoint) if result.checkpoint else None,
        final_reward_mean=last.get(metric_names.REWARD_MEAN),
    )


def log_comparison(ctx: JobContext, comparison: dict[str, dict[str, dict[str, float]]]) -> None:
    """``compare/<domain>/delta_<metric>`` (last model minus first) at step 0."""
    ctx.log_metrics(0, {f"compare/{domain}/delta_{metric}": row["delta"]
                        for metric, table in comparison.items() for domain, row in table.items()})  # fmt: skip


def run_evaluate(ctx: JobContext, config: EvalConfig) -> EvalJobResult:
    from posttrain.training.evaluate import evaluate_models  # torch: see above

    names = config.model_list
    if not names:
        raise BadInput("the evaluate config names no model: set model, or models: [before, after] to compare")
    paths = {name: resolve_model(ctx, name)[0] for name in names}
    ctx.progress(0.0, f"evaluating {names[0]}", force=True)
    try:
        out = evaluate_models(
            config,
            paths.__getitem__,
            on_model=lambda i, name: ctx.progress((i + 1) / len(names), f"evaluated {name}", force=True),
        )
    except ValueError as exc:  # a task set without the split's tasks: the input's fault
        raise BadInput(str(exc)) from None
    for index, name in enumerate(names):
        ctx.log_metrics(index, out["models"][name])
    if len(names) >= 2:
        log_comparison(ctx, out["comparison"])
    summary = {name: out["models"][name]["eval/pass@1"] for name in names}
    kept = {}
    for index, name in enumerate(names):
        kept[name] = str(path := ctx.workdir / f"records-{index}.json")
        (tmp := path.with_suffix(".tmp")).write_text(json.dumps(out["records"][name]))
        tmp.replace(path)
    return EvalJobResult(
        models=names,
        paths=paths,
        pass_at_1=summary,
        reports=out["models"],
        comparison=out["comparison"],
        domains=out["domains"],
        task_set=config.task_set,
        arena=out.get("arena"),
        records=kept,
    )


class PresetRunConfig(BaseModel):
    """``train_preset``: a preset's whole recipe in one job (the console's one-click demo).

    Builds the preset's model (or starts from ``model``, or from the registered model a real-model preset
    names), SFT warm-up (when the preset has one), evaluates the model GRPO starts from, GRPO, evaluates
    the result, then the control: SFT continued from the warm-up for as many steps as GRPO took,
    evaluated on the same held-out tasks (``control: false`` skips it; a preset without SFT has none);
    registers ``<name>-base`` (when built), ``<name>-sft``, ``<name>`` and ``<name>-control``.
    ``sft``/``grpo``/``eval`` override fields of the preset's sections.
    """

    model_config = ConfigDict(extra="forbid")

    preset: str = Field(default="cpu-quick", description="a preset name (posttrain.training.presets)")
    name: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
        description="register the models as <name>-base, <name>-sft and <name> (default '<preset>-job<id>')",
    )
    model: str | None = Field(
        default=None,
        description="start from this registered model (or directory) instead of building one",
        json_schema_extra=JOB_PATH,
    )
    output_dir: str | None = Field(
        default=None, description="checkpoints and stage state (default: the job's workdir)", json_schema_extra=JOB_PATH
    )
    sft: dict[str, Any] = Field(default_factory=dict)
    grpo: dict[str, Any] = Field(default_factory=dict)
    eval: dict[str, Any] = Field(default_factory=dict)
    control: bool = Field(
        default=True, description="also continue SFT for GRPO's number of steps and evaluate it (the peer)"
    )
    evaluate_base: bool | None = Field(
        default=None,
        description="also evaluate the model before SFT (a base model in "
        "the plain completion format); None: as the preset says",
    )

    @model_validator(mode="after")
    def _check(self) -> PresetRunConfig:
        self.sections()  # an unknown preset or a bad override fails at submit
        return self

    def sections(self) -> tuple[SFTConfig | None, GRPOConfig, EvalConfig]:
        run = get_preset(self.preset)
        if run.sft is None and self.sft:
            raise ValueError(f"preset {self.preset!r} has no SFT warm-up to override: leave out sft")
        sft = run.sft.updated(**self.sft) if run.sft is not None else None
        grpo = run.grpo.updated(**self.grpo)
        evaluation = EvalConfig.model_validate({**run.eval.model_dump(exclude_unset=True), **self.eval})
        return sft, grpo, evaluation

    def evaluates_base(self) -> bool:
        """Whether the run evaluates the model before SFT too (only a run with SFT has a "before SFT")."""
        run = get_preset(self.preset)
        return run.sft is not None and (self.evaluate_base if self.evaluate_base is not None else run.evaluate_base)


# a stage's share of the job's progress bar
_STAGE_SHARES = {
    "base": 0.02,
    "eval_base": 0.05,
    "sft": 0.18,
    "eval_before": 0.05,
    "grpo": 0.5,
    "eval_after": 0.05,
    "control": 0.1,
    "eval_control": 0.05,
}


def run_preset_job(ctx: JobContext, config: PresetRunConfig) -> PresetJobResult:
    """Each finished stage is recorded in ``<output_dir>/stages.json``: a retried or resumed job
    skips the stages it finished and continues SFT or GRPO from their checkpoints."""
    from posttrain.platform.models.factory import build_tiny_model  # torch: see above
    from posttrain.training.evaluate import (
        all_eval_tasks,
        compare_reports,
        evaluate_policy,
        general_config,
        head_to_head,
    )
    from posttrain.training.loop import train_grpo  # torch: see above
    from posttrain.training.modeling import peak_rss_bytes
    from posttrain.training.sft import continue_sft, sft_tasks, train_sft

    sft_config, grpo_config, eval_config = config.sections()
    name = config.name or f"{config.preset}-job{ctx.job_id}"
    out = Path(config.output_dir or ctx.workdir / "run")
    out.mkdir(parents=True, exist_ok=True)
    state_file = out / "stages.json"
    state: dict[str, Any] = json.loads(state_file.read_text()) if state_file.is_file() else {}
    done = 0.0

    def finish(stage: str, value: Any) -> None:
        nonlocal done
        state[stage] = value
        tmp = state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state))
        tmp.replace(state_file)
        done += _STAGE_SHARES[stage]
        ctx.progress(done, f"{stage.replace('_', ' ')} done", force=True)

    def stage_progress(stage: str, total: int, step: int, text: str) -> None:
        ctx.progress(done + _STAGE_SHARES[stage] * step / total, text)

    def evaluated(stage: str, path: str) -> dict[str, float]:
        """The held-out evaluation of ``path``; its per-task records kept beside the stages for the run's arena."""
        records: list[dict[str, Any]] = []
        report = evaluate_policy(eval_config, path, records=records)
        (out / f"{stage}.records.json").write_text(json.dumps(records))
        return report

    skipped = [s for s in _STAGE_SHARES if s in state]
    done = sum(_STAGE_SHARES[s] for s in skipped)
    if skipped:
        ctx.log.info("attempt %d continues after the finished stages %s", ctx.attempt, ", ".join(skipped))

    preset = get_preset(config.preset)
    preset_model = preset.model
    documents = preset.documents
    check_task_set(
        ctx,
        grpo_config,
        ""
        if documents is None
        else (
            f". Preset {config.preset!r} trains on task set {documents.task_set!r}, built from "
            f"{', '.join(documents.paths)}: the Training page's button next to the demo uploads them and builds it "
            f"(or `posttrain docs add` each, then `posttrain jobs submit build_tasks` with the documents source "
            f"{documents.source})"
        ),
    )
    if "base" not in state:
        if config.model is not None or isinstance(preset_model, str):
            path, base_name = resolve_model(ctx, config.model or str(preset_model))
            base_name = base_name or Path(path).name
        else:
            base_name = f"{name}-base"
            path = str(
                build_tiny_model(Path(ctx.settings.data_dir) / "models" / base_name, preset_model, overwrite=True)
            )
            register_model(ctx.identity, base_name, path, produced_by_job_id=ctx.job_id, replace=True, url=ctx.url,
                           meta={"job_kind": ctx.kind, "preset": config.preset})  # fmt: skip
        finish("base", {"path": path, "model": base_name})
    base = state["base"]
    first = 1 if config.evaluates_base() else 0  # the step the model GRPO starts from logs its evaluation at
    if first and "eval_base" not in state:
        ctx.progress(done, f"evaluating {base['model']} before SFT", force=True)
        before_sft = evaluated("eval_base", base["path"])
        ctx.log_metrics(0, before_sft)
        finish("eval_base", before_sft)

    if "sft" not in state and sft_config is None:  # GRPO starts from the model as it is
        finish("sft", {"model": base["model"], "path": base["path"], "checkpoint": None})
    if "sft" not in state:
        assert sft_config is not None
        sft_config = sft_config.model_copy(
            update={"model": base["path"], "output_dir": str(out / "sft"), "register_as": f"{name}-sft"}
        )

        def on_sft(step: int, metrics: dict[str, float]) -> None:
            ctx.log_metrics(step, metric_names.renamed(metrics, metric_names.SFT_PREFIX))
            stage_progress("sft", sft_config.max_steps, step, f"SFT warm-up step {step}/{sft_config.max_steps}")

        result = train_sft(sft_config, on_metrics=on_sft, should_stop=lambda: ctx.should_stop)
        ctx.check_stop()
        assert result.model is not None
        assert result.checkpoint is not None
        sft_name = register_final_model(
            ctx, sft_config, result.model, base["path"], base["model"], {"steps": result.steps}
        )
        finish("sft", {"model": sft_name, "path": str(Path(ctx.settings.data_dir) / "models" / sft_name),
                       "checkpoint": str(result.checkpoint)})  # fmt: skip
    sft = state["sft"]

    if "eval_before" not in state:
        ctx.progress(done, f"evaluating {sft['model']}", force=True)
        before = evaluated("eval_before", sft["path"])
        ctx.log_metrics(first, before)
        finish("eval_before", before)

    held_out = all_eval_tasks(eval_config)
    if "grpo" not in state:
        grpo_config = grpo_config.model_copy(
            update={"model": sft["path"], "output_dir": str(out / "grpo"), "register_as": name}
        )
        write_trajectories = TrajectoryWriter(ctx.url, ctx.job_id, grpo_config.trajectories_per_step)
        trained = sft_tasks(sft_config) if sft_config is not None else []

        def writer(step: int, groups: list[Any]) -> None:
            trained.extend(g.task for g in groups)
            write_trajectories(step, groups)

        def on_grpo(step: int, metrics: dict[str, float]) -> None:
            ctx.log_metrics(step, metrics)
            reward = metrics.get(metric_names.REWARD_MEAN, float("nan"))
            stage_progress(
                "grpo", grpo_config.max_steps, step, f"GRPO step {step}/{grpo_config.max_steps} reward {reward:.3f}"
            )

        result = train_grpo(grpo_config, on_metrics=on_grpo, on_groups=writer, should_stop=lambda: ctx.should_stop)
        ctx.check_stop()
        assert result.model is not None
        final = register_final_model(ctx, grpo_config, result.model, sft["path"], sft["model"], {"steps": result.steps})
        # the eval tasks against what SFT and GRPO trained on (GRPO: the steps this attempt ran)
        check = check_held_out(trained, held_out)
        ctx.log.info("held-out check: %s", check.describe())
        finish(
            "grpo",
            {
                "model": final,
                "path": str(Path(ctx.settings.data_dir) / "models" / final),
                "steps": result.steps,
                "grpo_steps_checked": result.steps - result.resumed_from,
                "eval_unseen_fraction": check.unseen_fraction,
            },
        )
    grpo = state["grpo"]

    if "eval_after" not in state:
        ctx.progress(done, f"evaluating {grpo['model']}", force=True)
        after = evaluated("eval_after", grpo["path"])
        ctx.log_metrics(first + 1, after)
        finish("eval_after", after)

    control = config.control and sft_config is not None
    if control and "control" not in state:
        assert sft_config is not None
        control_config = sft_config.model_copy(update={"model": base["path"], "register_as": f"{name}-control"})

        def on_control(step: int, metrics: dict[str, float]) -> None:
            ctx.log_metrics(step, metric_names.renamed(metrics, metric_names.CONTROL_PREFIX))
            stage_progress("control", grpo["steps"], step - sft_config.max_steps, f"SFT control step {step}")

        result = continue_sft(control_config, Path(sft["checkpoint"]), grpo["steps"], out / "control",
                              on_metrics=on_control, should_stop=lambda: ctx.should_stop)  # fmt: skip
        ctx.check_stop()
        assert result.model is not None
        control_name = register_final_model(
            ctx, control_config, result.model, sft["path"], sft["model"], {"steps": result.steps}
        )
        finish("control", {"model": control_name, "path": str(Path(ctx.settings.data_dir) / "models" / control_name),
                           "extra_steps": grpo["steps"]})  # fmt: skip
    if control and "eval_control" not in state:
        ctx.progress(done, f"evaluating {state['control']['model']}", force=True)
        controlled = evaluate_policy(eval_config, state["control"]["path"])
        ctx.log_metrics(first + 2, controlled)
        finish("eval_control", controlled)
    raw: Any  # the base model's evaluation, there when ``first``
    before, after, raw = state["eval_before"], state["eval_after"], state.get("eval_base")
    evaluated_models = {**({base["model"]: raw} if first else {}), sft["model"]: before, grpo["model"]: after}
    comparison = {m: compare_reports(evaluated_models, eval_config.domains, m) for m in ("pass@1",)}  # side by side
    log_comparison(ctx, comparison)
    result_fields: dict[str, Any] = {
        "preset": config.preset, "model": grpo["model"], "sft_model": sft["model"], "base_model": base["model"],
        "models": list(evaluated_models), "domains": eval_config.domains, "difficulty": eval_config.difficulty,
        "steps": grpo["steps"], "pass_before": before["eval/pass@1"], "pass_after": after["eval/pass@1"],
        "gain_points": round(100 * (after["eval/pass@1"] - before["eval/pass@1"]), 2), "comparison": comparison,
        "eval_tasks": len(held_out), "eval_unseen_fraction": grpo["eval_unseen_fraction"],
        "grpo_steps_checked": grpo["grpo_steps_checked"], "general_before": before.get("general/pass@1"),
        "general_after": after.get("general/pass@1"), "peak_rss_gb": round(peak_rss_bytes() / 2**30, 3),
        "general_tasks": general.tasks_per_domain * len(general.domains) if (general := general_config(eval_config)) else None,
        **({"pass_base": raw["eval/pass@1"], "general_base": raw.get("general/pass@1")} if first else {}),
    }  # fmt: skip
    paired = [out / f"{stage}.records.json" for stage in ("eval_before", "eval_after")]
    if eval_config.samples == 1 and all(p.is_file() for p in paired):  # greedy, as the Compare tab's arena
        result_fields["arena"] = {
            "a": sft["model"],
            "b": grpo["model"],
            **head_to_head(*(json.loads(p.read_text()) for p in paired)),
        }
        # each model the run trained beside the one it was trained from, on the general check's tasks (the gate before
        # deploy reads it): GRPO's result beside its start, and the SFT warm-up beside the model before it when evaluated
        checks = {grpo["model"]: (sft["model"], result_fields["arena"].get("general"))}
        if first and sft["model"] != base["model"] and (out / "eval_base.records.json").is_file():
            warm_up = head_to_head(*(json.loads((out / f"{stage}.records.json").read_text())
                                     for stage in ("eval_base", "eval_before")))  # fmt: skip
            checks[sft["model"]] = (base["model"], warm_up.get("general"))
        for model, (start, general) in checks.items():
            if general:
                record_general_check(
                    model,
                    GeneralCheck.from_difference(start, general, job_id=ctx.job_id),
                    by=ctx.identity.username,
                    url=ctx.url,
                )
    if control:
        controlled = state["eval_control"]["eval/pass@1"]
        result_fields |= {
            "control_model": state["control"]["model"],
            "control_steps": state["control"]["extra_steps"],
            "control_after": controlled,
            "gain_over_control_points": round(100 * (after["eval/pass@1"] - controlled), 2),
        }
    return PresetJobResult.model_validate(result_fields)


TRAIN_SFT = register(
    JobKind(
        "train_sft",
        SFTConfig,
        run_sft,
        "supervised fine-tuning",
        resumable=True,
        retryable=True,
        result_model=TrainJobResult,
    )
)
TRAIN_GRPO = register(
    JobKind(
        "train_grpo",
        GRPOConfig,
        run_grpo,
        "GRPO reinforcement learning",
        resumable=True,
        retryable=True,
        result_model=TrainJobResult,
    )
)
EVALUATE = register(
    JobKind(
        "evaluate",
        EvalConfig,
        run_evaluate,
        "pass@1 / pass@k on held-out tasks; compares models",
        retryable=True,
        result_model=EvalJobResult,
    )
)
TRAIN_PRESET = register(
    JobKind(
        "train_preset",
        PresetRunConfig,
        run_preset_job,
        "a preset's whole recipe: build, SFT, evaluate, GRPO, evaluate",
        resumable=True,
        retryable=True,
        result_model=PresetJobResult,
    )
)
