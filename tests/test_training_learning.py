"""Proof of learning, small: the ``cpu-quick`` preset end to end (a locally built tiny model, an SFT
warm-up stopped part-way, GRPO), evaluated on prompts no training step drew, beside the control that
continues SFT for as many steps. ``bench/learning.py`` runs the full ``cpu-demo`` preset."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.training.demo import run_preset
from posttrain.training.presets import get_preset


@pytest.mark.slow
def test_grpo_raises_pass_at_1_on_unseen_prompts_and_is_measured_against_an_sft_control(tmp_path: Path) -> None:
    preset = get_preset("cpu-quick")
    out = run_preset(preset, tmp_path)
    # held out, checked: every eval task against every task the warm-up, GRPO and the control trained on
    assert out.held_out is not None and out.held_out.eval_tasks == preset.eval.tasks_per_domain
    assert out.held_out.unseen_fraction == 1.0, out.held_out.describe()
    assert len(out.curve) == preset.grpo.max_steps
    # The training reward per step is noisy (a few prompts a step: 0.24 to 0.66 in one run), so the
    # proof is the held-out evaluation on 200 tasks; the reward only has to rise over the run as a
    # whole (its first 10 steps against the mean of the rest), not collapse.
    rewards = [p["reward_mean"] for p in out.curve]
    early, rest = sum(rewards[:10]) / 10, sum(rewards[10:]) / len(rewards[10:])
    assert rest > early, (early, rest)
    # measured: 17% -> 30% (+13) in one session's environment, 45.5% -> 54% (+8.5) in another's
    # (the SFT warm-up lands elsewhere with other builds of the numerics); the control 37% / 81%
    assert out.gain_points >= 5, (out.pass_before, out.pass_after)
    assert (
        out.control_after is not None
        and out.control_model is not None
        and (out.control_model / "config.json").is_file()
    )
    assert out.control_after > out.pass_before, (
        out.control
    )  # the control trained too: a real peer, not a copy of the warm-up
