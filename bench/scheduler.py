"""What the task scheduler costs a step as the domain count grows: 4, 36 and every procedural domain.

    .venv/bin/python bench/scheduler.py [--steps 200] [--batch 8] [--group 8]

One step of a GRPO run asks the scheduler for a batch (``next_batch``), folds each group's results back
(``record``, one call a group) and logs its per-domain figures (``metrics``). Each domain count runs the
signal curriculum with difficulty steps on the same seeded stream of results (a fixed pass rate per
domain, sampled), after a warm-up that generates every domain's first chunk of tasks (task generation is
the generators' cost, paid once per 32 tasks a domain, and timed apart). Prints one JSON line per domain
count, then the summary: microseconds a step for each count and each part, and the step's cost per
domain against the 4-domain peer's (the bound: the work grows linearly in the domain count, one pass
over the weights and one over the logged figures; a draw is a bisection).
"""

from __future__ import annotations

import os
import sys

# bench/ holds files named like standard modules (queue.py): keep it off the import path.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse  # noqa: E402
import json  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402


def measure(domains: list[str], steps: int, batch: int, group: int) -> dict:
    from posttrain.training.scheduler import Scheduler, SchedulerConfig

    sched = Scheduler(SchedulerConfig(batch_size=batch, seed=0, weigh_by="signal", adapt_difficulty=True))
    sched.set_domains(domains)
    rng = random.Random(0)
    rate = {d: rng.random() for d in domains}
    started = time.perf_counter()
    for d in domains:  # the warm-up: every domain's first chunk of tasks generated
        sched._take(d)  # noqa: SLF001 - the generators' cost, timed apart from the steps
    warmup_s = time.perf_counter() - started
    parts = {"next_batch": 0.0, "record": 0.0, "metrics": 0.0}
    generated = 0.0
    for _ in range(steps):
        before = sum(s.chunk for s in sched.stats().values())
        t0 = time.perf_counter()
        tasks = sched.next_batch()
        t1 = time.perf_counter()
        if sum(s.chunk for s in sched.stats().values()) != before:  # a domain's chunk ran out: generation, not drawing
            generated += t1 - t0
        else:
            parts["next_batch"] += t1 - t0
        for task in tasks:
            passed = [rng.random() < rate[task.domain] for _ in range(group)]
            t2 = time.perf_counter()
            sched.record(task.domain, passed)
            parts["record"] += time.perf_counter() - t2
        t3 = time.perf_counter()
        sched.metrics()
        parts["metrics"] += time.perf_counter() - t3
    per_step = {k: round(1e6 * v / steps, 1) for k, v in parts.items()}
    return {
        "domains": len(domains),
        "steps": steps,
        "us_per_step": per_step,
        "us_per_step_total": round(sum(per_step.values()), 1),
        "generation_s": round(warmup_s + generated, 3),
        "metrics_logged_per_step": len(sched.metrics()),
    }


def main() -> None:
    from posttrain.platform.tasks.domains import list_domains

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    args = parser.parse_args()
    from posttrain.training.preset_recipes import BROAD_LEVELS

    every = [d.name for d in list_domains()]
    counts = {"4": list(BROAD_LEVELS)[:4], "36": list(BROAD_LEVELS), str(len(every)): every}
    rows = {}
    for label, domains in counts.items():
        rows[label] = measure(domains, args.steps, args.batch, args.group)
        print(json.dumps(rows[label]), flush=True)
    peer = rows["4"]["us_per_step_total"]
    print(
        json.dumps(
            {
                "figure": "scheduler",
                "steps": args.steps,
                "batch": args.batch,
                "group": args.group,
                "us_per_step": {label: r["us_per_step_total"] for label, r in rows.items()},
                "parts_us_per_step": {label: r["us_per_step"] for label, r in rows.items()},
                "per_domain_us": {label: round(r["us_per_step_total"] / r["domains"], 2) for label, r in rows.items()},
                "ratio_vs_4_domains": {label: round(r["us_per_step_total"] / peer, 2) for label, r in rows.items()},
                "peer": {
                    "name": "the same run over 4 domains",
                    "setting": "the same steps, batch, group and seeded results",
                },
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
