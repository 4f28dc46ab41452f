"""A preset run end to end, in-process: build a model, SFT warm-up, evaluate, GRPO, evaluate,
and the control: SFT continued from the same warm-up for as many extra steps as GRPO took.

    out = run_preset("cpu-demo", Path("var/demo"))
    out.pass_before, out.pass_after, out.gain_points, out.minutes
    out.control_after, out.gain_over_control_points   # GRPO against simply training longer
    out.held_out.unseen_fraction                      # 1.0: no eval prompt was trained on

The same functions the ``train_sft``, ``train_grpo`` and ``evaluate`` jobs call
(:func:`train_sft`, :func:`train_grpo`, :func:`evaluate_policy`), without the job queue;
``bench/learning.py`` prints its figures and ``tests/test_training_learning.py`` checks a
smaller run.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from posttrain.platform.models.factory import build_tiny_model
from posttrain.platform.tasks.heldout import HeldOutCheck, check_held_out
from posttrain.platform.verifiers.models import TaskSpec
from posttrain.training.evaluate import all_eval_tasks, evaluate_policy
from posttrain.training.loop import train_grpo
from posttrain.training.presets import RunPreset, get_preset
from posttrain.training.rollout import RolloutGroup
from posttrain.training.sft import continue_sft, sft_tasks, train_sft


@dataclass
class DemoResult:
    pass_before: float
    pass_after: float
    minutes: float
    before: dict[str, float]
    after: dict[str, float]
    control_after: float | None = None  # SFT continued for GRPO's number of steps (None: no control run)
    control: dict[str, float] = field(default_factory=dict)
    held_out: HeldOutCheck | None = None  # the eval tasks against every task SFT and GRPO trained on
    curve: list[dict[str, float]] = field(default_factory=list)
    sft_model: Path | None = None
    grpo_model: Path | None = None
    control_model: Path | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def gain_points(self) -> float:
        return 100.0 * (self.pass_after - self.pass_before)

    @property
    def gain_over_control_points(self) -> float | None:
        return None if self.control_after is None else 100.0 * (self.pass_after - self.control_after)


def run_preset(
    preset: str | RunPreset,
    workdir: Path,
    *,
    sft: dict[str, Any] | None = None,
    grpo: dict[str, Any] | None = None,
    eval: dict[str, Any] | None = None,  # noqa: A002 - the preset's section name
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    control: bool = True,
) -> DemoResult:
    """Run ``preset`` (with section overrides) under ``workdir``; pass@1 before and after GRPO, and
    after the SFT control (``control``) of as many extra steps."""
    run = get_preset(preset) if isinstance(preset, str) else preset
    if isinstance(run.model, str) or run.sft is None:
        raise ValueError(
            f"preset {run.name!r} starts from a registered model with no SFT warm-up: run it as a "
            "train_preset job (bench/learning.py --preset NAME does), not in-process"
        )
    workdir = Path(workdir)
    started = time.perf_counter()
    timings: dict[str, float] = {}
    torch.set_num_threads(max(1, torch.get_num_threads()))

    t = time.perf_counter()
    base = build_tiny_model(workdir / "base", run.model, overwrite=True)
    sft_config = run.sft.updated(model=str(base), output_dir=str(workdir / "sft"), **(sft or {}))
    sft_result = train_sft(sft_config)
    assert sft_result.checkpoint is not None
    sft_model = sft_result.checkpoint / "model"
    timings["sft_s"] = time.perf_counter() - t

    eval_config = run.eval.model_copy(update=eval or {})
    t = time.perf_counter()
    before = evaluate_policy(eval_config, str(sft_model))
    timings["eval_before_s"] = time.perf_counter() - t

    curve: list[dict[str, float]] = []

    def record(step: int, metrics: dict[str, float]) -> None:
        point = {
            "step": float(step),
            "reward_mean": metrics["rollout/reward_mean"],
            "pass_rate": metrics["rollout/pass_rate"],
            "groups_used": metrics["rollout/groups_used"],
            "step_s": metrics["time/step_s"],
        }
        curve.append(point)
        if on_step is not None:
            on_step(step, point)

    trained: list[TaskSpec] = sft_tasks(sft_config)

    def seen(step: int, groups: list[RolloutGroup]) -> None:
        trained.extend(g.task for g in groups)

    t = time.perf_counter()
    grpo_config = run.grpo.updated(model=str(sft_model), output_dir=str(workdir / "grpo"), **(grpo or {}))
    grpo_result = train_grpo(grpo_config, on_metrics=record, on_groups=seen)
    assert grpo_result.checkpoint is not None
    grpo_model = grpo_result.checkpoint / "model"
    timings["grpo_s"] = time.perf_counter() - t

    t = time.perf_counter()
    after = evaluate_policy(eval_config, str(grpo_model))
    timings["eval_after_s"] = time.perf_counter() - t

    control_report: dict[str, float] = {}
    control_model = None
    if control:
        t = time.perf_counter()
        control_result = continue_sft(sft_config, sft_result.checkpoint, grpo_result.steps, workdir / "control")
        assert control_result.checkpoint is not None
        control_model = control_result.checkpoint / "model"
        timings["control_s"] = time.perf_counter() - t
        t = time.perf_counter()
        control_report = evaluate_policy(eval_config, str(control_model))
        timings["eval_control_s"] = time.perf_counter() - t
    held_out = check_held_out(trained, all_eval_tasks(eval_config))
    return DemoResult(
        pass_before=before["eval/pass@1"],
        pass_after=after["eval/pass@1"],
        minutes=(time.perf_counter() - started) / 60,
        before=before,
        after=after,
        control_after=control_report.get("eval/pass@1"),
        control=control_report,
        held_out=held_out,
        curve=curve,
        sft_model=sft_model,
        grpo_model=grpo_model,
        control_model=control_model,
        timings=timings,
    )
