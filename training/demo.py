"""A preset run end to end, in-process: build a model, SFT warm-up, evaluate, GRPO, evaluate.

    out = run_preset("cpu-demo", Path("var/demo"))
    out.pass_before, out.pass_after, out.gain_points, out.minutes

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
from posttrain.training.evaluate import evaluate_policy
from posttrain.training.loop import train_grpo
from posttrain.training.presets import RunPreset, get_preset
from posttrain.training.sft import train_sft


@dataclass
class DemoResult:
    pass_before: float
    pass_after: float
    minutes: float
    before: dict[str, float]
    after: dict[str, float]
    curve: list[dict[str, float]] = field(default_factory=list)
    sft_model: Path | None = None
    grpo_model: Path | None = None
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def gain_points(self) -> float:
        return 100.0 * (self.pass_after - self.pass_before)


def run_preset(
    preset: str | RunPreset,
    workdir: Path,
    *,
    sft: dict[str, Any] | None = None,
    grpo: dict[str, Any] | None = None,
    eval: dict[str, Any] | None = None,  # noqa: A002 - the preset's section name
    on_step: Callable[[int, dict[str, float]], None] | None = None,
) -> DemoResult:
    """Run ``preset`` (with section overrides) under ``workdir``; pass@1 before and after GRPO."""
    run = get_preset(preset) if isinstance(preset, str) else preset
    workdir = Path(workdir)
    started = time.perf_counter()
    timings: dict[str, float] = {}
    torch.set_num_threads(max(1, torch.get_num_threads()))

    t = time.perf_counter()
    base = build_tiny_model(workdir / "base", run.model, overwrite=True)
    sft_config = run.sft.model_copy(update={"model": str(base), "output_dir": str(workdir / "sft"), **(sft or {})})
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
        point = {"step": float(step), "reward_mean": metrics["rollout/reward_mean"], "pass_rate": metrics["rollout/pass_rate"],
                 "groups_used": metrics["rollout/groups_used"], "step_s": metrics["time/step_s"]}
        curve.append(point)
        if on_step is not None:
            on_step(step, point)

    t = time.perf_counter()
    grpo_config = run.grpo.model_copy(update={"model": str(sft_model), "output_dir": str(workdir / "grpo"), **(grpo or {})})
    grpo_result = train_grpo(grpo_config, on_metrics=record)
    assert grpo_result.checkpoint is not None
    grpo_model = grpo_result.checkpoint / "model"
    timings["grpo_s"] = time.perf_counter() - t

    t = time.perf_counter()
    after = evaluate_policy(eval_config, str(grpo_model))
    timings["eval_after_s"] = time.perf_counter() - t
    return DemoResult(
        pass_before=before["eval/pass@1"], pass_after=after["eval/pass@1"], minutes=(time.perf_counter() - started) / 60,
        before=before, after=after, curve=curve, sft_model=sft_model, grpo_model=grpo_model, timings=timings,
    )
