"""GRPO throughput: lock-step (rollout, then verify, then update) against the pipelined loop, in one run.

    .venv/bin/python bench/pipeline.py [--model DIR] [--steps 12] [--batch 16] [--group 8] [--ray 2 [--ray-address ADDR]]

The same workload both ways: the ``cpu-demo`` preset's GRPO config (a tiny model warmed up
by a short SFT, so groups have reward variance and the learner really updates), the same
number of steps. Lock-step runs each stage with the whole machine (torch threads = all
cores). Pipelined runs the rollout thread, the verifier pool and the learner at once; it
is measured with every torch thread setting from 1 to the core count and the best one
is reported. Prints one JSON object per measurement, then a summary object last with
``lockstep_traj_per_s``, ``pipelined_traj_per_s``, ``speedup`` and ``learner_busy`` (the
pipelined learner's busy fraction: time in the update over wall time per step).
``--ray N`` also measures the loop with N rollout worker actors and one verifier actor on Ray
(``--ray-address``, else POSTTRAIN_RAY_ADDRESS, else a local Ray started for the run) and adds
``ray_traj_per_s`` and ``ray_learner_busy`` to the summary.
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
import time  # noqa: E402
from pathlib import Path  # noqa: E402


def measure(model: str, steps: int, batch: int, group: int, pipeline: bool, threads: int, workdir: Path,
            ray_workers: int = 0, ray_address: str | None = None) -> dict[str, float]:
    import torch

    from posttrain.training.loop import train_grpo
    from posttrain.training.presets import get_preset
    from posttrain.training.scheduler import SchedulerConfig

    torch.set_num_threads(threads)
    grpo = get_preset("cpu-demo").grpo
    config = grpo.model_copy(update={
        "model": model, "max_steps": steps, "pipeline": pipeline, "output_dir": None, "checkpoint_every": 0,
        "scheduler": SchedulerConfig(batch_size=batch, seed=0), "group_size": group, "queue_size": 2,
        "max_off_policy_steps": 1, "verifier_workers": 1, "rollout_workers": ray_workers, "ray_address": ray_address,
    })
    started = time.perf_counter()
    result = train_grpo(config)
    wall = time.perf_counter() - started
    warm = result.metrics[1:] or result.metrics  # step 1 includes start-up
    trajectories = sum(m["rollout/groups"] for m in result.metrics) * group
    return {
        "mode": "ray" if ray_workers else "pipelined" if pipeline else "lockstep", "threads": threads, "steps": steps, "wall_s": round(wall, 2),
        "traj_per_s": round(trajectories / wall, 2),
        "learner_busy": round(sum(m["pipeline/learner_busy_frac"] for m in warm) / len(warm), 3),
        "groups_used_mean": round(sum(m["rollout/groups_used"] for m in result.metrics) / len(result.metrics), 2),
    }


def main() -> None:
    from posttrain.platform.models.factory import build_tiny_model
    from posttrain.training.presets import get_preset
    from posttrain.training.sft import train_sft

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a model directory (default: build the cpu-demo model and warm it up)")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--sft-steps", type=int, default=None)
    parser.add_argument("--ray", type=int, default=0, metavar="N", help="also measure with N rollout worker actors on Ray")
    parser.add_argument("--ray-address", default=None, help="the Ray cluster (default: POSTTRAIN_RAY_ADDRESS or a local Ray)")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    model = args.model
    if model is None:
        work = Path(tempfile.mkdtemp(prefix="posttrain-pipeline-"))
        demo = get_preset("cpu-demo")
        base = build_tiny_model(work / "base", demo.model)
        sft = demo.sft.model_copy(update={"model": str(base), "output_dir": str(work / "sft"),
                                          **({"max_steps": args.sft_steps} if args.sft_steps else {})})
        result = train_sft(sft)
        assert result.checkpoint is not None
        model = str(result.checkpoint / "model")
    work = Path(tempfile.mkdtemp(prefix="posttrain-pipeline-runs-"))
    lock = measure(model, args.steps, args.batch, args.group, False, cores, work)
    print(json.dumps(lock), flush=True)
    piped = []
    for threads in sorted({1, max(1, cores // 2), cores}):
        piped.append(measure(model, args.steps, args.batch, args.group, True, threads, work))
        print(json.dumps(piped[-1]), flush=True)
    best = max(piped, key=lambda m: m["traj_per_s"])
    on_ray = {}
    if args.ray:
        ray_run = measure(model, args.steps, args.batch, args.group, True, best["threads"], work, args.ray, args.ray_address)
        print(json.dumps(ray_run | {"rollout_workers": args.ray}), flush=True)
        on_ray = {"ray_rollout_workers": args.ray, "ray_traj_per_s": ray_run["traj_per_s"], "ray_learner_busy": ray_run["learner_busy"]}
    print(json.dumps({
        "figure": "pipeline", "cores": cores, "lockstep_traj_per_s": lock["traj_per_s"],
        "pipelined_traj_per_s": best["traj_per_s"], "pipelined_threads": best["threads"],
        "speedup": round(best["traj_per_s"] / lock["traj_per_s"], 3), "learner_busy": best["learner_busy"],
        "lockstep_learner_busy": lock["learner_busy"], "goal_speedup": 1.6, "goal_learner_busy": 0.85, **on_ray,
    }), flush=True)


if __name__ == "__main__":
    main()
