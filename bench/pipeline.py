"""GRPO throughput: lock-step (rollout, then verify, then update) against the pipelined loop, in one run.

    .venv/bin/python bench/pipeline.py [--model DIR] [--steps 20] [--batch 16] [--group 8] [--ray 2 [--ray-address ADDR]]
    .venv/bin/python bench/pipeline.py --env code_repair     # multi-turn episodes in sandboxes
    .venv/bin/python bench/pipeline.py --env code_repair --preset smollm2-repair --threads 2 [--model DIR]
        # the real model after its SFT warm-up (made as bench/learning.py's arms make it, or DIR), the repair
        # preset's GRPO config: groups with a learning signal

``--env code_repair`` (or ``tool_use``) measures the same way on an environment's episodes: each
rollout lays a project into a sandbox from the warm pool, runs its turns and is graded by the hidden
tests in a fresh sandbox (the ``repair.*`` domains), every episode of a step at once; the lock-step
peer is the sync backend, the pipelined side the rollout thread (the backends episodes run on).

The same workload every way: the ``cpu-demo`` preset's GRPO config (a tiny model warmed up
by a short SFT, so groups have reward variance and the learner really updates), the same
number of steps, the same staleness bound and queue size.

- Lock-step runs each stage alone with the whole machine, and with its own best torch thread
  count: every pair (rollout threads, update threads) from 1 to the core count is measured (the
  stage's count is set as it starts) and the best pair is the baseline.
- Pipelined runs rollout, verification and update at once, measured with each backend and
  thread setting: the rollout thread in the learner's process (``rollout: {backend: thread}``) with
  every torch thread count, and rollout worker processes (``backend: process``, 1 and 2 workers) with
  every split of the cores between the workers and the learner that does not ask for more torch
  threads than there are cores. The best is reported.

Throughput is the steady state: trajectories of steps 2 and on over their time (step 1 holds
the start-up of worker processes and pools); ``wall_traj_per_s`` counts the whole run. Prints
one JSON object per measurement, then a summary object last with ``lockstep_traj_per_s``,
``pipelined_traj_per_s``, ``speedup``, ``learner_busy`` (the pipelined learner's busy
fraction: time from batch in hand to weights published, over the step's wall time) and
``peer`` (the lock-step baseline's setting; both sides skip step 1 alike).
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
import contextlib  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402


@contextlib.contextmanager
def stage_threads(rollout: int, update: int) -> Iterator[None]:
    """Lock-step only: each stage of the loop sets its own torch thread count as it starts."""
    import torch

    from posttrain.training.learner import Learner
    from posttrain.training.rollouts import sync

    def pinned(fn: Callable[..., Any], threads: int) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            torch.set_num_threads(threads)
            return fn(*args, **kwargs)

        return call

    saved = sync.sample_groups, Learner.grpo_update
    sync.sample_groups, Learner.grpo_update = pinned(saved[0], rollout), pinned(saved[1], update)  # type: ignore[method-assign]
    try:
        yield
    finally:
        sync.sample_groups, Learner.grpo_update = saved  # type: ignore[method-assign]


FIGURES = {
    None: "pipeline",
    "code_repair": "pipeline-repair",
    "tool_use": "pipeline-tool-use",
}  # names in bench/results.py


def measure(
    model: str,
    steps: int,
    batch: int,
    group: int,
    variant: dict[str, Any],
    workdir: Path,
    ray_address: str | None = None,
    env: str | None = None,
    preset: str = "cpu-demo",
) -> dict[str, Any]:
    """One run of ``variant``: ``mode`` lockstep (``threads``: rollout and update), pipelined (``backend``
    thread with ``threads``, or process with ``rollout_processes`` and the thread split) or ray."""
    import torch

    from posttrain.training.loop import train_grpo
    from posttrain.training.preset_recipes import REPAIR_DOMAINS
    from posttrain.training.presets import get_preset
    from posttrain.training.scheduler import SchedulerConfig

    mode = variant["mode"]
    bound = {"queue_size": 2, "max_off_policy_steps": 1}
    if mode == "lockstep":
        rollout: dict[str, Any] = {"backend": "sync"}
    elif variant.get("rollout_workers"):
        rollout = {"backend": "ray", "workers": variant["rollout_workers"], "address": ray_address, **bound}
    elif variant.get("rollout_processes"):
        rollout = {
            "backend": "process",
            "workers": variant["rollout_processes"],
            "threads": variant.get("rollout_threads"),
            "learner_threads": variant.get("learner_threads"),
            **bound,
        }
    else:
        rollout = {"backend": "thread", **bound}
    update: dict[str, Any] = {
        "model": model,
        "max_steps": steps,
        "output_dir": None,
        "checkpoint_every": 0,
        "scheduler": SchedulerConfig(batch_size=batch, seed=0),
        "group_size": group,
        "verifier_workers": 1,
        "rollout": rollout,
    }
    base = get_preset(preset).grpo
    if env and base.environment.name == env:  # the preset's own environment, every episode of a step at once
        update["environment"] = base.environment.model_copy(update={"concurrency": min(64, batch * group)})
    elif env:  # episodes of an environment: every episode of a step at once, each with its own sandbox
        update |= {
            "environment": {"name": env, "max_turns": 3, "concurrency": min(64, batch * group)},
            **({"domains": [d.name for d in REPAIR_DOMAINS]} if env == "code_repair" else {}),
        }
    config = base.updated(**update)
    threads = variant.get("threads", (os.cpu_count() or 1,))
    torch.set_num_threads(threads[-1])
    pinned = stage_threads(*threads) if mode == "lockstep" else contextlib.nullcontext()
    started = time.perf_counter()
    with pinned:
        result = train_grpo(config)
    wall = time.perf_counter() - started
    warm = result.metrics[1:] or result.metrics  # step 1 includes start-up
    trajectories = sum(m["rollout/groups"] for m in result.metrics) * group
    warm_trajectories = sum(m["rollout/groups"] for m in warm) * group
    return variant | {
        "steps": steps,
        "wall_s": round(wall, 2),
        "traj_per_s": round(warm_trajectories / sum(m["time/step_s"] for m in warm), 2),
        "wall_traj_per_s": round(trajectories / wall, 2),
        "learner_busy": round(sum(m["pipeline/learner_busy_frac"] for m in warm) / len(warm), 3),
        "step_s_median": round(sorted(m["time/step_s"] for m in warm)[len(warm) // 2], 4),
        "groups_used_mean": round(sum(m["rollout/groups_used"] for m in result.metrics) / len(result.metrics), 2),
        "stale_dropped": int(sum(m["rollout/groups_stale_dropped"] for m in result.metrics)),
    }


def variants(
    cores: int, env: str | None = None, threads: int | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(lock-step variants, pipelined variants) for a machine with ``cores`` cores (an environment's
    episodes run on the sync and thread backends only); ``threads``: that torch thread count alone."""
    counts = [threads] if threads else sorted({1, max(1, cores // 2), cores})
    lockstep = [{"mode": "lockstep", "threads": (r, u)} for r in counts for u in counts]
    pipelined: list[dict[str, Any]] = [{"mode": "pipelined", "backend": "thread", "threads": (t,)} for t in counts]
    if env:
        return lockstep, pipelined
    for processes in (1, 2):
        for rollout_threads in counts:
            for learner_threads in counts:
                # more torch threads than cores: OpenMP's spinning threads then wait for each other's cores
                # (tried on 2 cores: 1 worker thread + 2 learner threads ran 3-5x slower than 1 + 1)
                if processes * rollout_threads + learner_threads <= max(cores, 2):
                    pipelined.append(
                        {
                            "mode": "pipelined",
                            "backend": "process",
                            "rollout_processes": processes,
                            "rollout_threads": rollout_threads,
                            "learner_threads": learner_threads,
                        }
                    )
    return lockstep, pipelined


def main() -> None:
    from posttrain.platform.models.factory import build_tiny_model
    from posttrain.training.presets import get_preset
    from posttrain.training.sft import train_sft

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default=None, help="a model directory (default: build the cpu-demo model and warm it up)"
    )
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--sft-steps", type=int, default=None)
    parser.add_argument(
        "--ray", type=int, default=0, metavar="N", help="also measure with N rollout worker actors on Ray"
    )
    parser.add_argument(
        "--ray-address", default=None, help="the Ray cluster (default: POSTTRAIN_RAY_ADDRESS or a local Ray)"
    )
    parser.add_argument(
        "--env",
        default=None,
        choices=["tool_use", "code_repair"],
        help="episodes of this environment (code_repair: the repair.* domains) instead of single completions",
    )
    parser.add_argument(
        "--preset",
        default="cpu-demo",
        help="whose GRPO config (and environment) the runs take; a "
        "real-model preset measures its SFT warm-up (made if missing) or --model DIR",
    )
    parser.add_argument("--threads", type=int, default=None, help="measure this torch thread count only (each side)")
    args = parser.parse_args()
    if args.model is None and args.preset != "cpu-demo":  # the SFT warm-up the preset's arms share (bench/learning.py)
        import subprocess

        arms = Path(tempfile.gettempdir()) / f"posttrain-{args.preset}-arms"
        warm = arms / "data" / "models" / f"{args.preset}-warmup"
        if not (warm / "config.json").is_file():  # made here as the arms would make it, and left for them to reuse
            subprocess.run(
                [
                    sys.executable,
                    str(Path(__file__).with_name("learning.py")),
                    "--preset",
                    args.preset,
                    "--stage",
                    "sft",
                    "--workdir",
                    str(arms),
                    "--threads",
                    str(args.threads or 1),
                ],
                check=True,
            )
        args.model = str(warm)
    cores = os.cpu_count() or 1
    model = args.model
    if model is None:
        work = Path(tempfile.mkdtemp(prefix="posttrain-pipeline-"))
        demo = get_preset("cpu-demo")
        base = build_tiny_model(work / "base", demo.model)
        sft = demo.sft.updated(
            model=str(base), output_dir=str(work / "sft"), **({"max_steps": args.sft_steps} if args.sft_steps else {})
        )
        result = train_sft(sft)
        assert result.checkpoint is not None
        model = str(result.checkpoint / "model")
    work = Path(tempfile.mkdtemp(prefix="posttrain-pipeline-runs-"))
    lockstep_variants, pipelined_variants = variants(cores, args.env, args.threads)
    runs: dict[str, list[dict[str, Any]]] = {"lockstep": [], "pipelined": []}
    for variant in [*lockstep_variants, *pipelined_variants]:
        runs[variant["mode"]].append(
            measure(model, args.steps, args.batch, args.group, variant, work, env=args.env, preset=args.preset)
        )
        print(json.dumps(runs[variant["mode"]][-1]), flush=True)
    lock = max(runs["lockstep"], key=lambda m: m["traj_per_s"])
    best = max(runs["pipelined"], key=lambda m: m["traj_per_s"])
    on_ray = {}
    if args.ray:
        ray_variant = {"mode": "ray", "rollout_workers": args.ray, "threads": best.get("threads", (cores,))}
        ray_run = measure(model, args.steps, args.batch, args.group, ray_variant, work, args.ray_address)
        print(json.dumps(ray_run), flush=True)
        on_ray = {
            "ray_rollout_workers": args.ray,
            "ray_traj_per_s": ray_run["traj_per_s"],
            "ray_learner_busy": ray_run["learner_busy"],
        }
    setting = {
        k: best[k]
        for k in ("backend", "threads", "rollout_processes", "rollout_threads", "learner_threads")
        if k in best
    }
    print(
        json.dumps(
            {
                "figure": FIGURES[args.env] + ("" if args.preset == "cpu-demo" else "-real"),
                "workload": args.env or "single_turn",
                "preset": args.preset,
                "model": model,
                "cores": cores,
                "steps": args.steps,
                "lockstep_traj_per_s": lock["traj_per_s"],
                "lockstep_threads": lock["threads"],
                "pipelined_traj_per_s": best["traj_per_s"],
                "pipelined": setting,
                "speedup": round(best["traj_per_s"] / lock["traj_per_s"], 3),
                "learner_busy": best["learner_busy"],
                "lockstep_learner_busy": lock["learner_busy"],
                "groups_used_mean": best["groups_used_mean"],
                "lockstep_groups_used_mean": lock["groups_used_mean"],
                "goal_speedup": 1.6,
                "goal_learner_busy": 0.85,
                **on_ray,
                "batch": args.batch,
                "group": args.group,
                "pipelined_variants_tried": len(runs["pipelined"]),
                "peer": {
                    "name": "lock-step loop (rollout, then verify, then update), the best of its thread settings",
                    "threads": lock["threads"],
                    "variants_tried": len(runs["lockstep"]),
                    "steps": args.steps,
                    "warmup_steps": 1,
                    "batch": args.batch,
                    "group": args.group,
                },
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
