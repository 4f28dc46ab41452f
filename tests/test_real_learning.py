"""GRPO makes the real model better: SmolLM2-135M-Instruct, as it ships, learns two-digit addition
with a strict boxed answer from the smollm2-quick preset's recipe, measured greedily on held-out prompts.

The preset's GRPO as it is (the console's one-click demo runs the same recipe as a job), evaluated on
fewer tasks than the preset and without its general check; a fixed seed, so the figures are the same run to run on one machine.
The assertion is on the gain, so a run whose update does nothing (the weights stay as they were,
greedy answers too) fails it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conftest import ImportedRealModel
from posttrain.platform.tasks.heldout import check_held_out
from posttrain.training.evaluate import all_eval_tasks, evaluate_policy
from posttrain.training.loop import train_grpo
from posttrain.training.presets import get_preset

STEPS = 8  # the preset's
EVAL_TASKS = 48


@pytest.mark.slow
@pytest.mark.timeout(1500)  # two cores shared with the rest of the suite: several minutes, more under load
def test_grpo_raises_the_real_models_held_out_pass_rate(real_model_dir: ImportedRealModel, tmp_path: Path) -> None:
    torch.set_num_threads(1)  # one thread per process: the suite shares two cores
    preset = get_preset("smollm2-quick")
    evaluation = preset.eval.model_copy(update={"tasks_per_domain": EVAL_TASKS, "general": None})
    config = preset.grpo.updated(model=str(real_model_dir.path), output_dir=str(tmp_path / "grpo"), checkpoint_every=0)
    before = evaluate_policy(evaluation, str(real_model_dir.path))["eval/pass@1"]
    trained = []
    result = train_grpo(config, on_groups=lambda step, groups: trained.extend(g.task for g in groups))
    assert result.checkpoint is not None and result.steps == STEPS
    used = sum(m.get("rollout/groups_used", 0.0) for m in result.metrics)
    after = evaluate_policy(evaluation, str(result.checkpoint / "model"))["eval/pass@1"]
    print(f"held-out pass@1 {before:.3f} -> {after:.3f} over {EVAL_TASKS} tasks; {used:.0f} groups with a signal")
    assert check_held_out(trained, all_eval_tasks(evaluation)).ok  # measured on prompts it never trained on
    assert used >= STEPS, "most steps should have groups whose rewards differ (the prompt format gives a signal)"
    assert after - before >= 0.04, f"GRPO should raise held-out pass@1 by at least 4 points: {before:.3f} -> {after:.3f}"
