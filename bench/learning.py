"""Proof of learning on CPU: the ``cpu-demo`` preset end to end, pass@1 before and after GRPO.

    .venv/bin/python bench/learning.py [--preset cpu-demo] [--workdir DIR] [--grpo-steps N]

Builds a tiny model locally (no model hub), warms it up with SFT (stopped part-way, so
GRPO has room and reward variance), evaluates held-out pass@1 (greedy, ``eval`` split: prompts
no training stream draws), runs GRPO, evaluates again; the peer is a control that continues SFT
from the same warm-up for as many extra steps as GRPO took, evaluated on the same tasks.
Prints the per-step reward curve as JSON lines, then one JSON object: ``pass_before``,
``pass_after``, ``gain_points``, ``control_after``, ``gain_over_control_points``,
``eval_unseen_fraction`` (the share of eval tasks that no SFT or GRPO step trained on),
``minutes`` and per-domain figures. The same functions the ``train_sft`` / ``train_grpo`` /
``evaluate`` jobs call, in-process.
"""

from __future__ import annotations

import os
import sys

# bench/ holds files named like standard modules (queue.py): keep it off the import path.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402


def main() -> None:
    from posttrain.training.demo import run_preset
    from posttrain.training.presets import get_preset

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu-demo")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--sft-steps", type=int, default=None)
    parser.add_argument("--grpo-steps", type=int, default=None)
    parser.add_argument("--grpo-lr", type=float, default=None)
    args = parser.parse_args()
    sft = {"max_steps": args.sft_steps} if args.sft_steps else {}
    grpo = {k: v for k, v in (("max_steps", args.grpo_steps), ("lr", args.grpo_lr)) if v}
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="posttrain-learning-"))

    def on_step(step: int, point: dict[str, float]) -> None:
        print(json.dumps({"curve": "grpo", **point}), flush=True)

    out = run_preset(args.preset, workdir, sft=sft, grpo=grpo, on_step=on_step)
    assert out.held_out is not None and out.control_after is not None
    domains = sorted({k.split("/")[1] for k in out.before if k.count("/") == 2})
    preset = get_preset(args.preset)
    print(json.dumps({
        "figure": "learning", "preset": args.preset,
        "pass_before": round(out.pass_before, 4), "pass_after": round(out.pass_after, 4),
        "gain_points": round(out.gain_points, 2),
        "control_after": round(out.control_after, 4), "gain_over_control_points": round(out.gain_over_control_points or 0.0, 2),
        "eval_unseen_fraction": round(out.held_out.unseen_fraction, 4), "eval_tasks": out.held_out.eval_tasks,
        "minutes": round(out.minutes, 2),
        "sft_steps": len(out.curve) and (args.sft_steps or preset.sft.max_steps), "grpo_steps": len(out.curve),
        "domains": domains, "difficulty": preset.eval.difficulty,
        "per_domain": {d: {"before": out.before[f"eval/{d}/pass@1"], "after": out.after[f"eval/{d}/pass@1"],
                           "control": out.control[f"eval/{d}/pass@1"]} for d in domains},
        "peer": {"name": "SFT control", "setting": f"SFT continued from the same warm-up checkpoint (model, optimizer, data "
                                                   f"position) for {len(out.curve)} extra steps, the same eval tasks"},
        "timings_s": {k: round(v, 1) for k, v in out.timings.items()}, "workdir": str(workdir),
    }), flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
