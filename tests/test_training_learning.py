"""Proof of learning, small: a locally built tiny model, a short SFT warm-up, then GRPO raises
held-out pass@1 (greedy, eval split) on the cpu-demo domains. ``bench/learning.py`` runs the full preset."""

from __future__ import annotations

from pathlib import Path

import pytest

from posttrain.training.demo import run_preset


@pytest.mark.slow
def test_grpo_raises_held_out_pass_at_1(tmp_path: Path) -> None:
    out = run_preset(
        "cpu-demo", tmp_path,
        # one domain (copy a digit), a shorter warm-up, fewer GRPO steps than the full preset
        sft={"domains": ["format.to_hex"], "max_steps": 60, "checkpoint_every": 0},
        grpo={"domains": ["format.to_hex"], "max_steps": 150, "checkpoint_every": 0},
        eval={"domains": ["format.to_hex"], "tasks_per_domain": 100},
    )
    assert len(out.curve) == 150
    early = sum(p["reward_mean"] for p in out.curve[:10]) / 10
    late = sum(p["reward_mean"] for p in out.curve[-10:]) / 10
    assert late > early + 0.1, (early, late)  # the training reward climbs
    assert out.gain_points >= 15, (out.pass_before, out.pass_after)  # and held-out pass@1 with it
