"""Before a training run starts: its wall time on this host, from a short calibration, measured, not guessed.

    posttrain jobs estimate train_preset --config '{"preset": "smollm2-quick"}'
    # -> about 6.1 min: 6 GRPO steps, 192 trajectories, ~4,300 generated tokens, 2 x 150 eval tasks

The ``estimate`` job runs each stage of the run in miniature, in the same kind of job process the run gets, on the
run's own model and tasks, and times it:

- **SFT and GRPO**: a warm-up step and ``calibration_steps`` more of the run's own config (scratch output directory),
  timed at the loop's start and at each step's metrics: the setup (model, engine, verifiers, and what the warm-up step
  took beyond a measured one), the step (a GRPO step: the measured steps' rollouts, dynamic sampling's extra batches
  included as they came, plus the mean update of every calibration step: :func:`timed_loop`) and the checkpoint
  written after the last step. The run's estimate is setup + ``max_steps`` x step + its checkpoints x the save.
- **Evaluation**: the model loaded once (timed), then one batch of each evaluated domain and of the general check
  (the same batch size, decoding and environment), timed per task and scaled to the run's task counts.
- **Registering** a model (``save_pretrained``) and building a preset's tiny model: done once, timed.
- **The job itself**: from the estimate job's start to its calibration's start (the forked process, imports).

The estimate is the sum of its stages (each with how it was made: :class:`StageEstimate`). An estimate job's config
holds the run's config as the run's job stores it, so the console finds the estimate made for exactly a run's config
and shows it against the run's actual wall time.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from pydantic import BaseModel, ConfigDict, Field, model_validator

from posttrain.platform import metric_names as names
from posttrain.platform.db.models import utcnow
from posttrain.platform.failures import BadInput
from posttrain.platform.jobs import queue
from posttrain.platform.jobs.registry import JobConfigError, JobKind, register, validate_config
from posttrain.platform.metrics import duration
from posttrain.training.jobs import check_task_set, resolve_model
from posttrain.training.presets import get_preset

if TYPE_CHECKING:
    from posttrain.platform.jobs.context import JobContext
    from posttrain.training.config import EvalConfig, GRPOConfig, SFTConfig
    from posttrain.training.learner import TrainResult


class EstimateConfig(BaseModel):
    """``estimate``: the run to estimate (a job kind and its config, validated as that kind's)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["train_preset", "train_grpo", "train_sft"] = Field(description="the kind of the run to estimate")
    config: dict[str, Any] = Field(default_factory=dict, description="the run's config, as it would be submitted")
    calibration_steps: int = Field(default=1, ge=1, le=10, description="SFT/GRPO steps timed after a warm-up step")

    @model_validator(mode="after")
    def _normalise(self) -> EstimateConfig:
        # stored as the run's job stores it, so the run finds its estimate by equality
        try:
            self.config = validate_config(self.kind, self.config).model_dump(mode="json")
        except JobConfigError as exc:
            raise ValueError(f"the run's config: {exc}") from None
        return self


class StageEstimate(BaseModel):
    stage: str
    seconds: float
    how: str = Field(description="what was measured and how it was scaled")


class RunEstimate(BaseModel):
    """An ``estimate`` job's result."""

    kind: str
    config: dict[str, Any]
    wall_s: float = Field(description="the run's estimated wall time on this host, seconds")
    stages: list[StageEstimate]
    steps: int = Field(description="training steps: SFT, GRPO and the SFT control")
    trajectories: int = Field(description="GRPO trajectories sampled")
    generated_tokens: int = Field(description="tokens the GRPO rollouts generate")
    eval_tasks: int = Field(description="tasks evaluated, every evaluation and general check together")
    calibration_s: float = Field(description="what the calibration itself took")

    def summary(self) -> str:
        parts = [f"{self.steps} training steps"]
        if self.trajectories:
            parts.append(f"{self.trajectories:,} trajectories, about {self.generated_tokens:,} generated tokens")
        if self.eval_tasks:
            parts.append(f"{self.eval_tasks:,} eval tasks")
        return f"about {duration(self.wall_s)} on this host: {', '.join(parts)}"


# --- timing the stages -------------------------------------------------------------------------
class Timed(BaseModel):
    """A loop run for a few steps: its setup, mean step, the save after its last step, and its step metrics."""

    setup_s: float
    step_s: float
    save_s: float
    metrics: list[dict[str, float]]


def timed_loop(run: Callable[..., TrainResult], config: Any) -> Timed:
    """``run(config, on_start=..., on_metrics=...)`` (train_sft, train_grpo), timed at its callbacks. Its first step is a
    warm-up (first calls, allocations): what it takes beyond a measured step counts as setup.

    A GRPO step is its rollouts and an update whose cost follows how many groups had a learning signal, which
    changes from step to step (12 to 30 s a step on the demo): the step is the measured steps' rollout time plus the
    update time of every calibration step, warm-up included, averaged."""
    marks: list[float] = []
    started = time.perf_counter()
    result = run(
        config,
        on_start=lambda _step: marks.append(time.perf_counter()),
        on_metrics=lambda _step, _m: marks.append(time.perf_counter()),
    )
    ended = time.perf_counter()
    if len(marks) < 3:
        raise RuntimeError(f"the calibration run made {len(marks) - 1} steps; it needs a warm-up step and one more")
    steps = [b - a for a, b in zip(marks, marks[1:])]
    updates = [m.get(names.UPDATE_S) for m in result.metrics]
    if all(u is not None for u in updates):
        known = cast("list[float]", updates)
        rollouts = [s - u for s, u in zip(steps[1:], known[1:])]
        step_s = sum(rollouts) / len(rollouts) + sum(known) / len(known)
    else:
        step_s = sum(steps[1:]) / len(steps[1:])
    return Timed(
        setup_s=max(0.0, marks[1] - started - step_s), step_s=step_s, save_s=ended - marks[-1], metrics=result.metrics
    )


def checkpoints(config: SFTConfig | GRPOConfig, steps: int) -> int:
    every = config.checkpoint.every
    return (steps // every + (1 if steps % every else 0)) if every else 1


def loop_stage(stage: str, timed: Timed, config: SFTConfig | GRPOConfig, steps: int, k: int) -> StageEstimate:
    saves = checkpoints(config, steps)
    seconds = timed.setup_s + steps * timed.step_s + saves * timed.save_s
    return StageEstimate(
        stage=stage,
        seconds=seconds,
        how=f"setup {timed.setup_s:.1f} s + {steps} steps x {timed.step_s:.1f} s ({k} measured after a warm-up step) "
        f"+ {saves} checkpoints x {timed.save_s:.1f} s",
    )


class EvalTiming(BaseModel):
    load_s: float
    per_task_s: float
    general_per_task_s: float


def load_timed(path: str, device: str) -> tuple[Any, float]:
    """The model at ``path`` loaded as an evaluation loads it, and how long that took."""
    # torch: this job kind's module stays light for the job registry
    from posttrain.training.modeling import load_policy, resolve_device

    t = time.perf_counter()
    policy = load_policy(path, device=resolve_device(device))
    return policy, time.perf_counter() - t


def time_eval(config: EvalConfig, policy: Any, load_s: float) -> EvalTiming:
    """One batch of each domain (and of the general check) through the loaded ``policy``, timed per task."""
    from posttrain.training.evaluate import all_eval_tasks, evaluate_policy, general_config  # torch: see above

    subset = config.model_copy(
        update={"tasks_per_domain": min(config.tasks_per_domain, config.batch_size), "general": None}
    )
    t = time.perf_counter()
    evaluate_policy(subset, policy)
    per_task = (time.perf_counter() - t) / max(1, len(all_eval_tasks(subset)))
    general_per_task = 0.0
    if (general := general_config(config)) is not None:
        general = general.model_copy(update={"tasks_per_domain": min(general.tasks_per_domain, general.batch_size)})
        t = time.perf_counter()
        evaluate_policy(general, policy)
        general_per_task = (time.perf_counter() - t) / max(1, len(all_eval_tasks(general)))
    return EvalTiming(load_s=load_s, per_task_s=per_task, general_per_task_s=general_per_task)


def eval_counts(config: EvalConfig) -> tuple[int, int]:
    """(tasks, general check tasks) of one evaluation."""
    from posttrain.training.evaluate import all_eval_tasks, general_config  # torch: see above

    general = general_config(config)
    return len(all_eval_tasks(config)), (len(general.domains) * general.tasks_per_domain if general is not None else 0)


def eval_stage(stage: str, timing: EvalTiming, counts: tuple[int, int]) -> StageEstimate:
    tasks, general = counts
    seconds = timing.load_s + tasks * timing.per_task_s + general * timing.general_per_task_s
    how = f"load {timing.load_s:.1f} s + {tasks} tasks x {timing.per_task_s:.2f} s"
    return StageEstimate(
        stage=stage,
        seconds=seconds,
        how=how + (f" + {general} general-check tasks x {timing.general_per_task_s:.2f} s" if general else ""),
    )


def time_register(policy: Any, scratch: Path) -> float:
    """Saving the loaded ``policy`` as a registered run saves its final model."""
    model, tokenizer = policy
    t = time.perf_counter()
    model.save_pretrained(scratch / "register")
    tokenizer.save_pretrained(scratch / "register")
    return time.perf_counter() - t


def grpo_counts(timed: Timed, config: GRPOConfig, steps: int) -> tuple[int, int]:
    """(trajectories, generated tokens) of ``steps`` GRPO steps, at the calibration's groups per step and lengths."""
    groups = sum(m.get(names.GROUPS, 0.0) for m in timed.metrics) / len(timed.metrics)
    length = sum(m.get(names.COMPLETION_LEN_MEAN, 0.0) for m in timed.metrics) / len(timed.metrics)
    trajectories = round(steps * groups * config.algorithm.group_size)
    return trajectories, round(trajectories * length)


# --- the job -------------------------------------------------------------------------------------
def calibrate(
    ctx: JobContext, kind: str, config: Any, k: int, scratch: Path
) -> tuple[list[StageEstimate], dict[str, int]]:
    """The stages of a ``kind`` run with ``config``, each timed in miniature under ``scratch``."""
    from posttrain.training.loop import train_grpo  # torch: see above
    from posttrain.training.sft import train_sft

    stages: list[StageEstimate] = []
    counts = {"steps": 0, "trajectories": 0, "generated_tokens": 0, "eval_tasks": 0}

    def progress(what: str) -> None:
        ctx.progress(len(stages) / 8, f"calibrating: {what}", force=True)
        ctx.check_stop()

    def grpo(config: GRPOConfig, path: str) -> Timed:
        progress(f"{k + 1} GRPO steps")
        return timed_loop(
            train_grpo,
            config.updated(
                model=path, output_dir=str(scratch / "grpo"), max_steps=k + 1, checkpoint_every=k + 1, register_as=None
            ),
        )

    def sft(config: SFTConfig, path: str) -> Timed:
        progress(f"{k + 1} SFT steps")
        return timed_loop(
            train_sft,
            config.updated(
                model=path, output_dir=str(scratch / "sft"), max_steps=k + 1, checkpoint_every=k + 1, register_as=None
            ),
        )

    if kind in ("train_grpo", "train_sft"):
        path, _ = resolve_model(ctx, config.model)
        if kind == "train_grpo":
            check_task_set(ctx, config)
            timed = grpo(config, path)
            stages.append(loop_stage("grpo", timed, config, config.max_steps, k))
            counts["trajectories"], counts["generated_tokens"] = grpo_counts(timed, config, config.max_steps)
        else:
            stages.append(loop_stage("sft", sft(config, path), config, config.max_steps, k))
        counts["steps"] = config.max_steps
        progress("saving a model")
        save_s = time_register(load_timed(path, config.device)[0], scratch)
        stages.append(
            StageEstimate(stage="register", seconds=save_s, how=f"one save of the model, timed: {save_s:.1f} s")
        )
        return stages, counts

    from posttrain.platform.models.factory import build_tiny_model  # torch: see above

    sft_config, grpo_config, eval_config = config.sections()
    preset = get_preset(config.preset)
    check_task_set(ctx, grpo_config)
    if config.model is not None or isinstance(preset.model, str):
        path, _ = resolve_model(ctx, config.model or str(preset.model))
    else:
        progress("building the preset's model")
        t = time.perf_counter()
        path = str(build_tiny_model(scratch / "base", preset.model, overwrite=True))
        stages.append(
            StageEstimate(stage="base", seconds=time.perf_counter() - t, how="the preset's model built once, timed")
        )
    progress("one evaluation batch per domain and saving a model")
    policy, load_s = load_timed(path, eval_config.device)  # the model GRPO starts from has the same shape: timed once
    timing = time_eval(eval_config, policy, load_s)
    save_s = time_register(policy, scratch)
    del policy
    registers = 1
    if sft_config is not None:
        timed_sft = sft(sft_config, path)
        stages.append(loop_stage("sft", timed_sft, sft_config, sft_config.max_steps, k))
        counts["steps"] += sft_config.max_steps
        registers += 1
    counted = eval_counts(eval_config)
    evaluations = 2 + (1 if config.control and sft_config is not None else 0)
    stages.append(eval_stage("eval_before", timing, counted))
    timed = grpo(grpo_config, path)
    stages.append(loop_stage("grpo", timed, grpo_config, grpo_config.max_steps, k))
    counts["steps"] += grpo_config.max_steps
    counts["trajectories"], counts["generated_tokens"] = grpo_counts(timed, grpo_config, grpo_config.max_steps)
    stages.append(eval_stage("eval_after", timing, counted))
    if config.control and sft_config is not None:
        # SFT continued for GRPO's steps: SFT's own step, from its own checkpoint
        stages.append(
            StageEstimate(
                stage="control",
                seconds=grpo_config.max_steps * timed_sft.step_s
                + timed_sft.setup_s
                + timed_sft.save_s * checkpoints(sft_config, grpo_config.max_steps),
                how=f"{grpo_config.max_steps} SFT steps x {timed_sft.step_s:.1f} s + setup and checkpoints",
            )
        )
        stages.append(eval_stage("eval_control", timing, counted))
        counts["steps"] += grpo_config.max_steps
        registers += 1
    counts["eval_tasks"] = evaluations * sum(counted)
    stages.append(
        StageEstimate(
            stage="register",
            seconds=registers * save_s,
            how=f"{registers} models saved x {save_s:.1f} s (one save, timed)",
        )
    )
    return stages, counts


def run_estimate(ctx: JobContext, config: EstimateConfig) -> RunEstimate:
    job = queue.get_job(ctx.job_id, url=ctx.url)
    # the run's process imports the training code before its first stage (seconds under load): the same imports here,
    # before the start is read, so that they count in it as they will in the run's
    from posttrain.training import loop, sft  # noqa: F401

    started = job.started_at
    overhead = max(0.0, (utcnow() - started).total_seconds()) if started is not None else 0.0
    target = validate_config(config.kind, config.config)
    scratch = Path(tempfile.mkdtemp(prefix="calibration-", dir=ctx.workdir))
    t = time.perf_counter()
    try:
        stages, counts = calibrate(ctx, config.kind, target, config.calibration_steps, scratch)
    except (FileNotFoundError, ValueError) as exc:
        if isinstance(exc, BadInput):
            raise
        raise BadInput(f"cannot calibrate this {config.kind} run: {exc}") from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    stages.insert(
        0,
        StageEstimate(
            stage="job",
            seconds=overhead,
            how=f"the job process's start and its imports, as this job's: {overhead:.1f} s",
        ),
    )
    estimate = RunEstimate(
        kind=config.kind,
        config=config.config,
        wall_s=sum(s.seconds for s in stages),
        stages=stages,
        calibration_s=time.perf_counter() - t,
        **counts,
    )
    for stage in stages:
        ctx.log.info("%s: %.1f s (%s)", stage.stage, stage.seconds, stage.how)
    ctx.log.info("estimate: %s", estimate.summary())
    return estimate


ESTIMATE = register(
    JobKind(
        "estimate",
        EstimateConfig,
        run_estimate,
        "a training run's wall time on this host, from a short calibration of its stages",
        retryable=True,
        result_model=RunEstimate,
    )
)
