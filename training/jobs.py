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

import shutil
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from posttrain.platform.jobs.registry import BadInput, JobKind, register
from posttrain.training.config import EvalConfig, GRPOConfig, SFTConfig, TrainConfig

if TYPE_CHECKING:
    import torch

    from posttrain.platform.jobs.context import JobContext
    from posttrain.training.rollout import RolloutGroup


# --- models in and out ------------------------------------------------------------
def resolve_model(ctx: JobContext, ref: str | None) -> tuple[str, str | None]:
    """``(directory, registered name or None)`` for a config's ``model`` (a name or a directory)."""
    from posttrain.platform.models.registry import ModelNotFound, get_model

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
    raise BadInput(f"model {ref!r} is neither a registered model name nor a model directory (no config.json there); "
                   "`posttrain models list` shows the registered models")


def register_final_model(ctx: JobContext, config: TrainConfig, model: torch.nn.Module, source_dir: str,
                         base: str | None, meta: dict[str, Any]) -> str:
    """Save ``model`` (LoRA merged) with the source's tokenizer under ``<data_dir>/models/<name>`` and register it."""
    from posttrain.platform.models.registry import register_model
    from posttrain.training.modeling import load_tokenizer

    name = config.register_as or f"{ctx.kind}-job{ctx.job_id}"
    root = Path(ctx.settings.data_dir) / "models"
    root.mkdir(parents=True, exist_ok=True)
    final = root / name
    tmp = root / f".{name}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        merged = model.merge_and_unload() if hasattr(model, "merge_and_unload") else model  # type: ignore[operator]
        merged.save_pretrained(tmp)  # type: ignore[operator]
        load_tokenizer(source_dir).save_pretrained(tmp)
        if final.exists():  # a resumed attempt registering again
            shutil.rmtree(final)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    register_model(name, final, base=base, produced_by_job_id=ctx.job_id, meta={"job_kind": ctx.kind, **meta},
                   replace=True, url=ctx.url)
    return name


# --- reporting ----------------------------------------------------------------------
def _reporter(ctx: JobContext, total: int):  # type: ignore[no-untyped-def]
    def on_metrics(step: int, metrics: dict[str, float]) -> None:
        ctx.log_metrics(step, metrics)
        ctx.progress(step / total, f"step {step}/{total} loss {metrics.get('train/loss', float('nan')):.4f}")

    return on_metrics


def pick_trajectories(groups: list[RolloutGroup], limit: int) -> list[tuple[RolloutGroup, int]]:
    """Up to ``limit`` (group, index) pairs, round-robin over groups so every task is represented."""
    picked: list[tuple[RolloutGroup, int]] = []
    depth = max((len(g.trajectories) for g in groups), default=0)
    for j in range(depth):
        for group in groups:
            if len(picked) >= limit:
                return picked
            if j < len(group.trajectories):
                picked.append((group, j))
    return picked


class TrajectoryWriter:
    """``on_groups`` callback: one transaction per step, at most ``limit`` rows, idempotent per step."""

    def __init__(self, url: str, job_id: int, limit: int) -> None:
        self.url, self.job_id, self.limit = url, job_id, limit

    def __call__(self, step: int, groups: list[RolloutGroup]) -> None:
        if self.limit <= 0:
            return
        from sqlalchemy import delete

        from posttrain.platform.db.engine import session
        from posttrain.platform.db.models import Trajectory

        rows = []
        for group, j in pick_trajectories(groups, self.limit):
            t = group.trajectories[j]
            verdict: dict[str, Any] = t.verdict.model_dump() if t.verdict is not None else {}
            verdict |= {"task_id": group.task.task_id, "policy_version": group.policy_version, "finished": t.finished}
            rows.append(Trajectory(
                job_id=self.job_id, step=step, domain=group.task.domain,
                prompt=[m.model_dump() for m in group.task.prompt], completion=t.text,
                reward=float(t.reward or 0.0), verdict=verdict,
            ))
        with session(self.url) as s:
            # a step redone after a resume replaces its rows
            s.exec(delete(Trajectory).where(Trajectory.job_id == self.job_id, Trajectory.step == step))  # type: ignore[call-overload]
            s.add_all(rows)


def _with_output_dir(ctx: JobContext, config: Any) -> Any:
    if config.output_dir is None:
        config = config.model_copy(update={"output_dir": str(ctx.workdir / "run")})
    return config


def _resume_step(ctx: JobContext, config: TrainConfig) -> int:
    """The step the run continues from (0: a fresh start), logged."""
    import json

    from posttrain.training.checkpoint import latest_checkpoint

    last = latest_checkpoint(Path(config.output_dir or "") / "checkpoints") if config.resume else None
    step = int(json.loads((last / "state.json").read_text())["step"]) if last is not None else 0
    if step:
        ctx.log.info("attempt %d resumes from checkpoint %s (step %d)", ctx.attempt, last, step)
    return step


# --- kinds --------------------------------------------------------------------------
def run_sft(ctx: JobContext, config: SFTConfig) -> dict[str, Any]:
    from posttrain.training.sft import train_sft

    path, base = resolve_model(ctx, config.model)
    config = _with_output_dir(ctx, config).model_copy(update={"model": path})
    resumed_from = _resume_step(ctx, config)
    result = train_sft(config, on_metrics=_reporter(ctx, config.max_steps), should_stop=lambda: ctx.should_stop)
    ctx.check_stop()
    assert result.model is not None
    name = register_final_model(ctx, config, result.model, path, base, {"steps": result.steps})
    return {"steps": result.steps, "model": name, "base_model": base, "resumed_from": resumed_from,
            "checkpoint": str(result.checkpoint) if result.checkpoint else None}


def run_grpo(ctx: JobContext, config: GRPOConfig) -> dict[str, Any]:
    from posttrain.training.loop import train_grpo

    path, base = resolve_model(ctx, config.model)
    config = _with_output_dir(ctx, config).model_copy(update={"model": path})
    resumed_from = _resume_step(ctx, config)
    writer = TrajectoryWriter(ctx.url, ctx.job_id, config.trajectories_per_step)
    result = train_grpo(config, on_metrics=_reporter(ctx, config.max_steps), on_groups=writer, should_stop=lambda: ctx.should_stop)
    ctx.check_stop()
    assert result.model is not None
    name = register_final_model(ctx, config, result.model, path, base, {"steps": result.steps})
    last = result.metrics[-1] if result.metrics else {}
    return {"steps": result.steps, "model": name, "base_model": base, "resumed_from": resumed_from,
            "checkpoint": str(result.checkpoint) if result.checkpoint else None,
            "final_reward_mean": last.get("rollout/reward_mean")}


def run_evaluate(ctx: JobContext, config: EvalConfig) -> dict[str, Any]:
    from posttrain.training.evaluate import evaluate_models

    names = config.model_list
    if not names:
        raise BadInput("the evaluate config names no model: set model, or models: [before, after] to compare")
    paths = {name: resolve_model(ctx, name)[0] for name in names}
    out = evaluate_models(config, paths.__getitem__)
    for index, name in enumerate(names):
        ctx.log_metrics(index, out["models"][name])
        ctx.progress((index + 1) / len(names), f"evaluated {name}")
    if len(names) >= 2:
        ctx.log_metrics(0, {f"compare/{domain}/delta_{metric}": row["delta"]
                            for metric, table in out["comparison"].items() for domain, row in table.items()})
    summary = {name: out["models"][name]["eval/pass@1"] for name in names}
    return {"models": names, "paths": paths, "pass@1": summary, "reports": out["models"], "comparison": out["comparison"]}


TRAIN_SFT = register(JobKind("train_sft", SFTConfig, run_sft, "supervised fine-tuning", resumable=True, retryable=True))
TRAIN_GRPO = register(JobKind("train_grpo", GRPOConfig, run_grpo, "GRPO reinforcement learning", resumable=True, retryable=True))
EVALUATE = register(JobKind("evaluate", EvalConfig, run_evaluate, "pass@1 / pass@k on held-out tasks; compares models", retryable=True))
