"""bench/peers.py runs end to end: posttrain's GRPO step beside TRL's GRPOTrainer at its defaults and at its
fastest, on exactly the prompts posttrain drew, and prints each side's figures and settings, then the summary."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_training_tiny import tiny_policy_dir

ROOT = Path(__file__).resolve().parents[1]


def test_grpo_against_trl_on_the_same_prompts(tmp_path: Path) -> None:
    model = tiny_policy_dir(tmp_path / "tiny")
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "peers.py"), "--trainer", "trl", "--model-dir", str(model),
         "--steps", "2", "--rounds", "1", "--eval-tasks", "2", "--threads", "1"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(line) for line in out.stdout.splitlines()]
    assert [line["side"] for line in lines[:-1]] == ["base", "posttrain", "trl-default", "trl-fast"]
    summary = lines[-1]
    sides = summary["sides"]
    assert set(sides) == {"posttrain", "trl-default", "trl-fast"} and summary["peer"]["side"] in (
        "trl-default",
        "trl-fast",
    )
    # every side trained on the prompts posttrain drew, step by step (the bench refuses otherwise)
    assert len({json.dumps(s["prompts"]) for s in sides.values()}) == 1
    for name, side in sides.items():
        assert len(side["reward_curve"]) == 2, (name, side)
        assert side["trajectories_per_s"] > 0 and side["peak_rss_gb"] > 0
        assert side["held_out_change"]["tasks"] == 4  # the same held-out tasks, paired against the model as it ships
    assert sides["trl-default"]["setting"]["gradient_checkpointing"] is True
    assert sides["trl-fast"]["setting"]["gradient_checkpointing"] is False
    assert sides["posttrain"]["setting"]["prompt_shared"] is True
    peer = sides[summary["peer"]["side"]]
    assert summary["speedup"] == pytest.approx(
        sides["posttrain"]["trajectories_per_s"] / peer["trajectories_per_s"], rel=0.01
    )
    with pytest.raises(subprocess.CalledProcessError):  # posttrain is the side the others are measured against
        subprocess.run([sys.executable, str(ROOT / "bench" / "peers.py"), "--sides", "trl-fast"], check=True,
                       capture_output=True, timeout=120)  # fmt: skip
