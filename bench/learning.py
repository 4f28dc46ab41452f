"""Proof of learning on CPU: a preset end to end, pass@1 before and after GRPO.

    .venv/bin/python bench/learning.py [--preset cpu-demo] [--workdir DIR] [--grpo-steps N]
    .venv/bin/python bench/learning.py --preset smollm2-arith [--grpo-steps N] [--threads 1]
    .venv/bin/python bench/learning.py --preset smollm2-tools     # episodes in the tool_use environment
    .venv/bin/python bench/learning.py --preset smollm2-docqa     # uploads the preset's documents, builds its task set
    .venv/bin/python bench/learning.py --preset smollm2-arith --ablation [--ablation-steps 3]   # each saving on its own
    .venv/bin/python bench/learning.py --preset smollm2-repair --arms        # three arms: GRPO alone, SFT alone, SFT then GRPO
    .venv/bin/python bench/learning.py --preset gemma3-base-to-instruct --arms   # a base model: as it ships, SFT, GRPO
    .venv/bin/python bench/learning.py --preset smollm2-broad --arms   # 37 domains: uniform draws, signal weights alone, the curriculum
    .venv/bin/python bench/learning.py --preset smollm2-arith --rollout vllm --device cuda      # a GPU host (the gpu extra)

A real-model preset (``smollm2-*``: the built-in SmolLM2-135M-Instruct, no SFT) runs as a job, the
way the console runs it: a fresh data directory and SQLite database, the built-in model imported from
its wheel, one ``train_preset`` job (evaluate, GRPO, evaluate, each evaluation with the general check
on domains the run never trained on) run by a real ``posttrain worker``. ``--rollout vllm --device cuda`` runs
the same preset on a GPU host with its rollouts through vLLM (episodes too) and the learner and evaluations on
the GPU; its figure is named with ``-vllm``. Prints the reward curve as JSON
lines while it runs, then one JSON object with ``model``, ``model_params``, ``pass_before``,
``pass_after``, ``gain_points``, ``gain_se_points`` (the paired standard error of the gain: the two evaluations
answer the same tasks, so the per-task differences give it, clustered by source where tasks share one; ``gain_se``
says which SE a figure has), ``general_before``, ``general_after``, ``minutes``, ``steps``,
``peak_rss_gb`` (the job process: learner, rollouts and evaluation), the step's cost (``step_s_mean``,
``update_s_per_useful_group``, ``groups_used_mean``) and per-domain figures. The peer is the model
before training, evaluated on the same held-out tasks in the same run. Arms and stages compare the same way: each
evaluation keeps its per-task records, and two parts are paired task by task (:func:`paired_points`); a part file
from before records were kept gets the unpaired SE, labelled so.

A tiny-model preset (``cpu-*``):
Builds a tiny model locally (no model hub), warms it up with SFT (stopped part-way, so
GRPO has room and reward variance), evaluates held-out pass@1 (greedy, ``eval`` split: prompts
no training stream draws), runs GRPO, evaluates again; the peer is a control that continues SFT
from the same warm-up for as many extra steps as GRPO took, evaluated on the same tasks.
Prints the per-step reward curve as JSON lines, then one JSON object: ``pass_before``,
``pass_after``, ``gain_points``, ``control_after``, ``gain_over_control_points``,
``eval_unseen_fraction`` (the share of eval tasks that no SFT or GRPO step trained on),
``minutes`` and per-domain figures. It runs as a ``train_preset`` job too, the one function that runs a preset's
stages (the console's one-click demo), through a real worker in a fresh data directory.
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
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

from posttrain.training.preset_recipes import BROAD_SIGNAL, BROAD_UNIFORM  # noqa: E402

FIGURES = {"smollm2-tools": "learning-tools", "smollm2-docqa": "learning-docqa"}  # bench/results/<figure>.json
# each saving of the GRPO step switched off on its own (LoRA, which the presets leave off, switched on), against all on
ABLATIONS: dict[str, dict] = {
    "all savings": {},
    "no zero-signal skip": {"algorithm": {"skip_zero_signal": False}},
    "no shared prompt": {"algorithm": {"shared_prompt": False}},
    "no micro-batches": {"algorithm": {"micro_batch_size": 1024}},
    "with LoRA r=16": {"lora": {"r": 16, "alpha": 32}},
}


def ablation_variant(preset: str, name: str, model_dir: str, steps: int, threads: int) -> dict:
    """One variant's GRPO steps in this process (its own, so its peak RSS is its own): the step's cost."""
    import resource
    import time

    import torch

    from posttrain.training.loop import train_grpo
    from posttrain.training.presets import get_preset

    torch.set_num_threads(threads)
    workdir = Path(tempfile.mkdtemp(prefix="posttrain-ablation-"))
    config = get_preset(preset).grpo.updated(
        model=model_dir,
        output_dir=str(workdir),
        max_steps=steps,
        checkpoint_every=0,
        logprob_check={"every": 0},
        **ABLATIONS[name],
    )
    started = time.perf_counter()
    result = train_grpo(config)
    used = sum(m.get("rollout/groups_used", 0.0) for m in result.metrics)
    return {
        "variant": name,
        "steps": len(result.metrics),
        "minutes": round((time.perf_counter() - started) / 60, 2),
        "step_s_mean": round(sum(m["time/step_s"] for m in result.metrics) / len(result.metrics), 2),
        "update_s_mean": round(sum(m["time/update_s"] for m in result.metrics) / len(result.metrics), 2),
        "update_s_per_useful_group": round(sum(m["time/update_s"] for m in result.metrics) / max(1.0, used), 3),
        "groups_used": used,
        "trained_tokens": sum(m.get("train/tokens", 0.0) for m in result.metrics),
        "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
    }


def run_ablation(preset: str, workdir: Path, steps: int, threads: int) -> None:
    """Every variant of :data:`ABLATIONS` for ``steps`` GRPO steps from the same model and seed, one process each,
    one after another; prints a line per variant, then the summary: each variant's cost against all savings on."""
    import subprocess

    from posttrain.platform.auth import Identity
    from posttrain.platform.db import migrate
    from posttrain.platform.db.models import Role
    from posttrain.platform.models.importer import import_model
    from posttrain.training.presets import get_preset

    url = f"sqlite:///{workdir / 'models.db'}"
    migrate.upgrade(url)
    row = import_model(
        Identity("bench", Role.admin), f"builtin:{get_preset(preset).model}", url=url, dest_root=workdir / "models"
    )
    rows = []
    for name in ABLATIONS:
        out = subprocess.run(
            [
                sys.executable,
                __file__,
                "--preset",
                preset,
                "--ablation-variant",
                name,
                "--model-dir",
                row.path,
                "--ablation-steps",
                str(steps),
                "--threads",
                str(threads),
            ],
            capture_output=True,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": str(threads)},
        )
        if out.returncode != 0:
            raise SystemExit(f"ablation variant {name!r} failed:\n{out.stderr[-3000:]}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    base = rows[0]
    print(
        json.dumps(
            {
                "figure": "learning-ablation",
                "preset": preset,
                "steps_per_variant": steps,
                "torch_threads": threads,
                "variants": {
                    r["variant"]: {
                        k: r[k]
                        for k in (
                            "step_s_mean",
                            "update_s_mean",
                            "update_s_per_useful_group",
                            "peak_rss_gb",
                            "groups_used",
                        )
                    }
                    for r in rows
                },
                "update_cost_vs_all_savings": {
                    r["variant"]: round(
                        r["update_s_per_useful_group"] / max(1e-9, base["update_s_per_useful_group"]), 2
                    )
                    for r in rows[1:]
                },
                "peak_rss_vs_all_savings": {
                    r["variant"]: round(r["peak_rss_gb"] / base["peak_rss_gb"], 2) for r in rows[1:]
                },
                "peer": {
                    "name": "all savings on",
                    "setting": "the same preset, model, seed and steps, in the same run",
                },
            }
        ),
        flush=True,
    )


def standard_error(before: float, after: float, n: int) -> float:
    """The unpaired standard error, in points, of the change between two pass rates on ``n`` tasks each: only where
    the per-task records that :func:`paired_points` pairs are missing (a figure says which it used)."""
    import math

    return round(100 * math.sqrt((before * (1 - before) + after * (1 - after)) / n), 2)


def own_tasks(record: dict) -> bool:
    """The evaluation's own held-out tasks (eval/pass@1's), not the general check's."""
    return not record["domain"].startswith("general/")


def general_tasks(record: dict) -> bool:
    return record["domain"].startswith("general/")


def unseen_function_tasks(record: dict) -> bool:
    """smollm2-repair's unseen-functions group: repair tasks held out by their function."""
    return record["domain"].startswith("repair.") and record.get("held_out_by") == "function"


def paired_points(after: dict, before: dict, keep: Callable[[dict], bool]) -> dict | None:
    """``after`` - ``before`` in points over the tasks ``keep`` picks, from the two parts' per-task records (the
    ``records`` file their evaluation kept): the mean per-task difference and its SE, clustered by each task's source
    (a repair task's function, a document). None when a part has no records (a part file from before they were kept)."""
    from posttrain.training.evaluate import paired_records

    def rows(part: dict) -> list[dict] | None:
        path = part.get("records")
        return [r for r in json.loads(Path(path).read_text()) if keep(r)] if path and Path(path).is_file() else None

    b, a = rows(after), rows(before)
    if a is None or b is None:
        return None
    if [r["task_id"] for r in a] != [r["task_id"] for r in b]:
        raise SystemExit(
            f"the evaluations in {before['records']} and {after['records']} did not answer the same tasks "
            f"({len(a)} and {len(b)} of them): evaluate both with the same --eval-tasks to compare them"
        )
    d = paired_records(a, b)
    return {
        "points": round(100 * d["delta"], 2),
        "se_points": round(100 * d["se"], 2),
        "tasks": d["tasks"],
        "clusters": d["clusters"],
        "se": "paired, clustered by source",
    }


def change_points(
    after: dict, before: dict, keep: Callable[[dict], bool], rate_after: float | None, rate_before: float | None, n: int
) -> dict | None:
    """:func:`paired_points`, or where a part kept no records the difference of the two rates with the unpaired SE,
    labelled so; None where a rate is missing."""
    paired = paired_points(after, before, keep)
    if paired is not None:
        return paired
    if rate_after is None or rate_before is None or not n:
        return None
    return {
        "points": round(100 * (rate_after - rate_before), 2),
        "se_points": standard_error(rate_before, rate_after, n),
        "tasks": n,
        "se": "unpaired (a part kept no per-task records)",
    }


class Jobs:
    """Jobs of one arm run through real workers in ``workdir``'s data directory (shared by every arm)."""

    def __init__(self, workdir: Path, threads: int) -> None:
        self.workdir, self.data = workdir, workdir / "data"
        self.env = {
            "POSTTRAIN_DATA_DIR": str(self.data),
            "POSTTRAIN_DATABASE_URL": f"sqlite:///{self.data / 'posttrain.db'}",
            "POSTTRAIN_WORKER_POLL_INTERVAL_S": "0.5",
            "OMP_NUM_THREADS": str(threads),
        }
        os.environ.update(self.env)
        from posttrain.platform.auth import Identity
        from posttrain.platform.db import migrate
        from posttrain.platform.db.models import Role

        self.data.mkdir(parents=True, exist_ok=True)
        migrate.upgrade(self.env["POSTTRAIN_DATABASE_URL"])
        self.identity = Identity("bench", Role.admin)

    def run(self, kind: str, config: dict, label: str) -> dict:
        """Submit one job, run a worker until the queue is empty (printing a GRPO run's reward per step), and
        return the job's result; exits naming the job's error when it fails."""
        import subprocess
        import time

        from sqlmodel import select

        from posttrain.platform.db.engine import session
        from posttrain.platform.db.models import JobStatus, Metric
        from posttrain.platform.jobs import queue

        job_id = queue.submit(self.identity, kind, config)
        worker = subprocess.Popen(
            [sys.executable, "-m", "posttrain.platform.cli", "worker", "--exit-when-idle"],
            env={**os.environ, **self.env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        printed, curve = 0, {}
        while True:
            done = worker.poll() is not None
            with session(read_only=True) as s:
                rows = s.exec(
                    select(Metric).where(
                        Metric.job_id == job_id, Metric.name.startswith("rollout/") | Metric.name.startswith("time/")
                    )
                ).all()
            for m in rows:
                curve.setdefault(m.step, {})[m.name] = m.value
            for step in sorted(k for k in curve if k > printed and "time/step_s" in curve[k]):
                print(
                    json.dumps(
                        {
                            "curve": label,
                            "step": step,
                            "reward_mean": round(curve[step]["rollout/reward_mean"], 4),
                            "groups_used": curve[step].get("rollout/groups_used"),
                            "step_s": round(curve[step]["time/step_s"], 2),
                        }
                    ),
                    flush=True,
                )
                printed = step
            if done:
                break
            time.sleep(5)
        job = queue.get_job(job_id)
        if job.status is not JobStatus.succeeded:
            raise SystemExit(f"{label}: the {kind} job ended {job.status.value}: {job.error} (log: {job.log_path})")
        return {
            **(job.result or {}),
            "job_id": job_id,
            "curve": [curve[k] for k in sorted(curve) if "time/step_s" in curve[k]],
        }

    def work(self) -> None:
        """A worker runs every queued job, then exits."""
        import subprocess

        subprocess.run(
            [sys.executable, "-m", "posttrain.platform.cli", "worker", "--exit-when-idle"],
            env={**os.environ, **self.env},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
        )

    def evaluate(self, preset: str, model: str, label: str, tasks: int | None) -> tuple[dict[str, float], str]:
        """The preset's held-out evaluation of ``model``: its report, and the file of its per-task records (which
        :func:`paired_points` pairs with another evaluation of the same tasks)."""
        config = {"preset": preset, "model": model, **({"tasks_per_domain": tasks} if tasks else {})}
        result = self.run("evaluate", config, label)
        return result["reports"][model], result["records"][model]


def build_documents(jobs: Jobs, preset: str) -> None:
    """A document preset's task set made as an operator would make it: its documents uploaded, preprocessed by the
    worker, one ``build_tasks`` job over them (nothing for a preset without documents)."""
    import glob
    import time

    from posttrain.platform.db.models import JobStatus
    from posttrain.platform.documents import add_document
    from posttrain.platform.jobs import queue
    from posttrain.training.presets import get_preset

    documents = get_preset(preset).documents
    if documents is None:
        return
    started = time.perf_counter()
    files = sorted({f for pattern in documents.paths for f in glob.glob(pattern)})
    if not files:
        raise SystemExit(f"preset {preset}: none of {documents.paths} exists (make system-deps installs them)")
    added = [add_document(jobs.identity, Path(f)) for f in files]
    jobs.work()
    ready = [a.document.id for a in added if queue.get_job(a.job_id).status is JobStatus.succeeded]
    built = jobs.run(
        "build_tasks",
        {"task_set": documents.task_set, "source": {"type": "documents", "document_ids": ready, **documents.source}},
        f"building task set {documents.task_set}",
    )
    print(
        json.dumps(
            {
                "documents": len(files),
                "preprocessed": len(ready),
                **{k: v for k, v in built.items() if k not in ("curve", "job_id")},
                "minutes": round((time.perf_counter() - started) / 60, 2),
            }
        ),
        flush=True,
    )


def print_tiny_run(preset: str, result: dict, minutes: float, sft_steps: int | None, workdir: Path) -> None:
    """The figure of a tiny-model preset's run: held-out pass@1 before GRPO (the SFT warm-up) and after, beside the
    SFT control continued from the same warm-up for as many steps."""
    from posttrain.training.presets import get_preset

    run = get_preset(preset)
    assert run.sft is not None and result.get("control_after") is not None  # a tiny preset warms up and has a control
    per_domain = result.get("comparison", {}).get("pass@1", {})
    print(
        json.dumps(
            {
                "figure": "learning",
                "preset": preset,
                "pass_before": round(result["pass_before"], 4),
                "pass_after": round(result["pass_after"], 4),
                "gain_points": result["gain_points"],
                "control_after": round(result["control_after"], 4),
                "gain_over_control_points": result["gain_over_control_points"],
                "eval_unseen_fraction": round(result["eval_unseen_fraction"], 4),
                "eval_tasks": result["eval_tasks"],
                "minutes": round(minutes, 2),
                "sft_steps": sft_steps or run.sft.max_steps,
                "grpo_steps": result["steps"],
                "domains": result["domains"],
                "difficulty": result["difficulty"],
                "per_domain": per_domain,
                "peer": {
                    "name": "SFT control",
                    "setting": f"SFT continued from the same warm-up checkpoint (model, optimizer, data position) for "
                    f"{result['steps']} extra steps, the same eval tasks",
                },
                "peak_rss_gb": result.get("peak_rss_gb"),
                "job_id": result["job_id"],
                "workdir": str(workdir),
            }
        ),
        flush=True,
    )


def run_as_job(preset: str, workdir: Path, sft: dict, grpo: dict, evaluation: dict, threads: int) -> None:
    """A preset's whole recipe as a ``train_preset`` job through a real worker, in a fresh data directory (the
    console's one-click demo, the one function that runs a preset's stages)."""
    import time

    from posttrain.platform.models.importer import import_model
    from posttrain.training.evaluate import general_config
    from posttrain.training.presets import get_preset

    run = get_preset(preset)
    jobs = Jobs(workdir, threads)
    config = {"preset": preset, "name": f"{preset}-bench", "sft": sft, "grpo": grpo, "eval": evaluation}
    if not isinstance(run.model, str):  # a tiny model the job builds, warmed up by SFT, beside its SFT control
        started = time.perf_counter()
        result = jobs.run("train_preset", config, "grpo")
        return print_tiny_run(preset, result, (time.perf_counter() - started) / 60, sft.get("max_steps"), workdir)
    row = import_model(jobs.identity, f"builtin:{run.model}", dest_root=jobs.data / "models")
    build_documents(jobs, preset)
    started = time.perf_counter()
    result = jobs.run("train_preset", config, "grpo")
    minutes = (time.perf_counter() - started) / 60
    steps = result["curve"]
    used = sum(p.get("rollout/groups_used", 0.0) for p in steps)
    before, after, n = result["pass_before"], result["pass_after"], result["eval_tasks"]
    general = general_config(run.eval) if result.get("general_before") is not None else None
    checked = len(general.domains) * general.tasks_per_domain if general is not None else 0
    # the job's arena pairs the two evaluations task by task (SE clustered by source); a job without one: unpaired
    arena = result.get("arena") or {}
    own, general_pair = arena.get("domains", {}).get("all"), arena.get("general")
    print(
        json.dumps(
            {
                "figure": FIGURES.get(preset, "learning-real")
                + ("-vllm" if grpo.get("rollout", {}).get("backend") == "vllm" else ""),
                "preset": preset,
                "rollout": grpo.get("rollout", {}).get("backend", run.grpo.rollout.backend),
                "device": grpo.get("device", run.grpo.device),
                "model": run.model,
                "model_params": (row.meta or {}).get("parameters"),
                "pass_before": round(before, 4),
                "pass_after": round(after, 4),
                "gain_points": result["gain_points"],
                "gain_se_points": round(100 * own["se"], 2) if own else standard_error(before, after, n),
                "gain_se": "paired, clustered by source" if own else "unpaired (the job kept no arena)",
                "eval_tasks": n,
                "eval_unseen_fraction": result["eval_unseen_fraction"],
                "general_before": result.get("general_before"),
                "general_after": result.get("general_after"),
                "general_change_points": round(100 * (result["general_after"] - result["general_before"]), 2)
                if result.get("general_before") is not None
                else None,
                "general_se_points": round(100 * general_pair["se"], 2)
                if general_pair
                else standard_error(result["general_before"], result["general_after"], checked)
                if checked
                else None,
                "general_se": "paired, clustered by source" if general_pair else "unpaired (the job kept no arena)",
                "minutes": round(minutes, 2),
                "steps": result["steps"],
                "peak_rss_gb": result.get("peak_rss_gb"),
                "step_s_mean": round(sum(p["time/step_s"] for p in steps) / max(1, len(steps)), 2),
                "update_s_per_useful_group": round(sum(p.get("time/update_s", 0.0) for p in steps) / max(1.0, used), 3),
                "groups_used_mean": round(used / max(1, len(steps)), 2),
                "torch_threads": threads,
                "per_domain": result.get("comparison", {}).get("pass@1", {}),
                "peer": {
                    "name": "the model before training",
                    "setting": "the same held-out tasks, greedy, in the same run",
                },
                "job_id": result["job_id"],
                "workdir": str(workdir),
            }
        ),
        flush=True,
    )


# --- arms: the repair preset's three, the broad preset's two ------------------------------------------------
# preset -> arm -> (the stage it starts from, whether it trains with GRPO or continues SFT, GRPO fields it sets)
ARMS: dict[str, dict[str, tuple[str, str, dict]]] = {
    "smollm2-repair": {
        "cold": ("base", "grpo", {}),  # GRPO from the model as it ships
        "sft": ("sft", "sft", {}),  # the SFT warm-up continued for as many steps as GRPO takes
        "sft-grpo": ("sft", "grpo", {}),  # GRPO from the SFT warm-up
    },
    "smollm2-broad": {  # the same model, seed, steps and trajectories; only the draws differ
        "uniform": ("base", "grpo", {"scheduler": BROAD_UNIFORM.model_dump()}),
        "signal": (
            "base",
            "grpo",
            {"scheduler": BROAD_SIGNAL.model_dump()},
        ),  # signal weights alone, at fixed difficulty
        "curriculum": ("base", "grpo", {}),  # the preset's: signal weights, stepped difficulty, revisits
    },
}
GROUPS = ("unseen_functions", "unseen_modules", "humaneval")  # the held-out groups of smollm2-repair's evaluation
EPISODE_FIGURES = ("turns", "tool_calls", "tool_errors", "tested_before_reply")


def held_out_groups(report: dict[str, float]) -> dict[str, dict[str, float]]:
    """pass@1, its standard error and the task count of each of :data:`GROUPS` from an evaluation report."""
    import math

    def group(pairs: list[tuple[float, float]]) -> dict[str, float]:
        n = sum(count for _, count in pairs)
        rate = sum(p * count for p, count in pairs) / n if n else float("nan")
        return {
            "pass": round(rate, 4),
            "se": round(math.sqrt(rate * (1 - rate) / n), 4) if n else float("nan"),
            "tasks": int(n),
        }

    def reasons(domain: str) -> list[tuple[float, float]]:
        prefix = f"eval/{domain}/held_out_by/"
        return [
            (report[k], report[k.removesuffix("pass@1") + "tasks"])
            for k in report
            if k.startswith(prefix) and k.endswith("/pass@1")
        ]

    domains = {k.split("/")[1] for k in report if k.count("/") >= 2 and k.split("/")[1].startswith("repair.")}
    return {
        "unseen_functions": group(
            [
                (report[k], report[k.removesuffix("pass@1") + "tasks"])
                for k in report
                if k.startswith("eval/repair.") and k.endswith("/held_out_by/function/pass@1")
            ]
        ),
        "unseen_modules": group(
            [
                (report[k], report[k.removesuffix("pass@1") + "tasks"])
                for k in report
                if k.startswith("eval/repair.") and "humaneval" not in k and k.endswith("/held_out_by/prompt/pass@1")
            ]
        ),
        "humaneval": group(reasons("repair.humaneval") if "repair.humaneval" in domains else []),
    }


def arm_figures(
    report: dict[str, float],
    before: dict[str, float] | None = None,
    tasks: int = 0,
    pair: Callable[[Callable[[dict], bool]], dict | None] | None = None,
) -> dict:
    """The repair arms' figures: pass@1 of each held-out group, the episodes, the general check (the arms are
    compared with each other, paired, when they are combined)."""
    groups = held_out_groups(report)
    return {
        "pass": {g: groups[g]["pass"] for g in GROUPS},
        "se": {g: groups[g]["se"] for g in GROUPS},
        "tasks": {g: groups[g]["tasks"] for g in GROUPS},
        "episodes": {f: round(report.get(f"eval/episodes/{f}", float("nan")), 3) for f in EPISODE_FIGURES},
        "general": report.get("general/pass@1"),
        "pass_by_kind": {  # each defect kind's domain (and HumanEval), every held-out group together
            key.split("/")[1]: round(value, 4)
            for key, value in sorted(report.items())
            if key.startswith("eval/repair.") and key.count("/") == 2 and key.endswith("/pass@1")
        },
    }


WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


def stage_weights(made: dict) -> Path:
    """The directory of a stage's weights: the SFT warm-up's checkpoint (which the ``sft`` arm continues and the
    ``sft-grpo`` arm's model was saved from), or the imported model's."""
    return Path(made["checkpoint"]) / "model" if made.get("checkpoint") else Path(made["path"])


def weights_digest(directory: Path) -> str:
    """SHA-256 over a model directory's weight files, names and bytes in name order: which weights an arm starts
    from, so that arms made from two warm-ups (a stage made again) are not combined as one comparison."""
    import hashlib

    files = (
        sorted(p for p in directory.iterdir() if p.is_file() and p.name.endswith(WEIGHT_SUFFIXES))
        if directory.is_dir()
        else []
    )
    if not files:
        raise SystemExit(
            f"no weight files ({', '.join('*' + s for s in WEIGHT_SUFFIXES)}) in {directory}: the stage's model "
            "is gone; delete its stages/*.json and run the part again to make the stage anew"
        )
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode() + b"\0")
        with file.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def stage(jobs: Jobs, preset: str, name: str, args: argparse.Namespace) -> dict:
    """A stage the arms share, made once in the workdir: ``base`` (the model imported and evaluated as it ships)
    or ``sft`` (demonstrations and the SFT warm-up)."""
    import time

    path = jobs.workdir / "stages" / f"{name}.json"
    if path.is_file():
        made = json.loads(path.read_text())
        if Path(made.get("checkpoint") or made.get("path") or "").exists():  # its model is still on this machine
            return made
    from posttrain.training.presets import get_preset

    run = get_preset(preset)
    started = time.perf_counter()
    if name == "base":
        from posttrain.platform.models.importer import import_model

        row = import_model(jobs.identity, f"builtin:{run.model}", dest_root=jobs.data / "models")
        build_documents(jobs, preset)  # the task set the arms train and are evaluated on, made once
        report, records = jobs.evaluate(preset, row.name, "evaluate the model as it ships", args.eval_tasks)
        out = {
            "model": row.name,
            "path": row.path,
            "params": (row.meta or {}).get("parameters"),
            "report": report,
            "records": records,
        }
    else:
        base = stage(jobs, preset, "base", args)
        steps = args.sft_steps or run.sft.max_steps
        # named apart from the sft arm's model (``{preset}-sft``), which continues it
        result = jobs.run(
            "train_sft",
            {
                "preset": preset,
                "model": base["model"],
                "register_as": f"{preset}-warmup",
                "max_steps": steps,
                "output_dir": str(jobs.data / "runs" / "sft"),
            },
            "SFT warm-up",
        )
        episodes = jobs.data / "runs" / "sft" / "demonstrations.jsonl"
        out = {
            "model": result["model"],
            "checkpoint": result["checkpoint"],
            "steps": result["steps"],
            "demonstrations": sum(1 for line in episodes.read_text().splitlines() if line.strip())
            if episodes.is_file()
            else 0,
        }
    out["weights_sha256"] = weights_digest(stage_weights(out))
    out["minutes"] = round((time.perf_counter() - started) / 60, 2)
    out["peak_rss_gb"] = peak_rss_gb()  # a part that reuses the stage still reports what making it took
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out))
    print(json.dumps({"stage": name, **{k: v for k, v in out.items() if k != "report"}}), flush=True)
    return out


def run_arm(preset: str, arm: str, args: argparse.Namespace) -> dict:
    """One arm from its stage: GRPO (``cold``, ``sft-grpo``) or SFT continued (``sft``) for the preset's GRPO steps,
    then the evaluation; written to ``<workdir>/arms/<arm>.json``. Made stages are reused, missing ones made."""
    import shutil
    import time

    from posttrain.training.presets import get_preset

    run = get_preset(preset)
    jobs = Jobs(args.workdir, args.threads)
    made = {s: (jobs.workdir / "stages" / f"{s}.json").is_file() for s in ("base", "sft")}
    start_from, trainer, fields = ARMS[preset][arm]
    base = stage(jobs, preset, "base", args)
    origin = stage(jobs, preset, start_from, args)
    start_weights = weights_digest(stage_weights(origin))  # the weights this arm starts from, as they are now
    started = time.perf_counter()
    grpo_steps = args.grpo_steps or run.grpo.max_steps
    out_dir = jobs.data / "runs" / f"arm-{arm}"  # job paths lie under the data directory
    if trainer == "grpo":
        result = jobs.run(
            "train_grpo",
            {
                "preset": preset,
                "model": origin["model"],
                "register_as": f"{preset}-{arm}",
                "max_steps": grpo_steps,
                "output_dir": str(out_dir),
                **fields,
            },
            f"{arm} GRPO",
        )
    else:  # the warm-up's checkpoint (model, optimizer, data position) and demonstrations, continued
        checkpoints = out_dir / "checkpoints"
        if not checkpoints.is_dir():
            checkpoints.mkdir(parents=True)
            shutil.copytree(origin["checkpoint"], checkpoints / Path(origin["checkpoint"]).name)
            for made_file in ("demonstrations.jsonl", "demonstrations.config.json"):
                shutil.copy(jobs.data / "runs" / "sft" / made_file, out_dir / made_file)
        result = jobs.run(
            "train_sft",
            {
                "preset": preset,
                "model": base["model"],
                "register_as": f"{preset}-{arm}",
                "max_steps": origin["steps"] + grpo_steps,
                "output_dir": str(out_dir),
            },
            f"{arm} SFT",
        )
    report, records = jobs.evaluate(preset, result["model"], f"evaluate {arm}", args.eval_tasks)
    minutes = (time.perf_counter() - started) / 60
    curve = result.get("curve", [])
    used = sum(p.get("rollout/groups_used", 0.0) for p in curve)
    signal = sum(p.get("rollout/groups_signal", 0.0) for p in curve)  # every group with a signal, not capped like used
    figures = {
        "arm": arm,
        "starts_from": start_from,
        "start_weights_sha256": start_weights,
        "trainer": trainer,
        "steps": grpo_steps,
        **ARM_FIGURES[preset](
            report,
            base["report"],
            args.eval_tasks or run.eval.tasks_per_domain,
            lambda keep: paired_points({"records": records}, base, keep),
        ),
        "records": records,
        "general_change": paired_points({"records": records}, base, general_tasks),  # against the model as it ships
        "minutes": round(minutes, 2),  # this arm's own training and evaluation
        "minutes_alone": round(
            minutes + base["minutes"] + (origin["minutes"] if start_from != "base" else 0.0), 2
        ),  # from nothing
        "stages_made_here": [s for s, was in made.items() if not was and (s == "base" or start_from == "sft")],
        "reward_curve": [round(p["rollout/reward_mean"], 4) for p in curve if "rollout/reward_mean" in p],
        # where the scheduler held each domain on the difficulty ladder, step by step, and its groups' signal rate then
        "ladder": {
            key.split("/")[1]: {
                "difficulty": [int(p[key]) for p in curve if key in p],
                "signal_rate": [
                    round(p.get(key.replace("/difficulty", "/signal_rate"), float("nan")), 3) for p in curve if key in p
                ],
            }
            for key in sorted({k for p in curve for k in p if k.startswith("sched/") and k.endswith("/difficulty")})
        },
        "groups_used_mean": round(used / len(curve), 2) if curve else None,
        # the share of the drawn groups whose rewards differed (the rest teach nothing), and what a useful one cost
        "signal_rate": round(signal / max(1.0, sum(p.get("rollout/groups", 0.0) for p in curve)), 4) if curve else None,
        "update_s_per_useful_group": round(sum(p.get("time/update_s", 0.0) for p in curve) / max(1.0, used), 3),
        "model": result["model"],
    }
    return write_part(jobs, arm, figures)


# --- a base model's stages: as it ships, after SFT, after GRPO -------------------------------------------------
STAGES = ("base", "sft", "grpo")  # gemma3-base-to-instruct's parts, each from the one before it
# a preset's parts, each runnable alone
PARTS = {**{preset: tuple(arms) for preset, arms in ARMS.items()}, "gemma3-base-to-instruct": STAGES}


def rate_figures(report: dict[str, float], key: str, n: int) -> dict[str, float]:
    import math

    p = report.get(key)
    return (
        {"pass_at_1": round(p, 4), "pass_at_1_se": round(math.sqrt(p * (1 - p) / n), 4)} if p is not None and n else {}
    )


def run_stage(preset: str, name: str, args: argparse.Namespace) -> dict:
    """One of :data:`STAGES`: the model as it ships (evaluated as a base model: in the completion format), the SFT
    warm-up evaluated, or GRPO from the warm-up evaluated; written to ``<workdir>/arms/<name>.json``. Made stages
    are reused, missing ones made (``minutes_alone``: this part from nothing)."""
    import time

    from posttrain.training.evaluate import all_eval_tasks, general_config
    from posttrain.training.presets import get_preset

    run = get_preset(preset)
    jobs = Jobs(args.workdir, args.threads)
    started = time.perf_counter()
    base = stage(jobs, preset, "base", args)
    if name == "base":
        model, report, records, minutes = base["model"], base["report"], base.get("records"), base["minutes"]
        alone = minutes
    else:
        sft = stage(jobs, preset, "sft", args)
        model, started = sft["model"], time.perf_counter()  # this part's own work starts here
        if name == "grpo":
            model = jobs.run(
                "train_grpo",
                {
                    "preset": preset,
                    "model": sft["model"],
                    "register_as": f"{preset}-grpo",
                    "max_steps": args.grpo_steps or run.grpo.max_steps,
                    "output_dir": str(jobs.data / "runs" / "grpo"),
                },
                "GRPO",
            )["model"]
        own = time.perf_counter()
        report, records = jobs.evaluate(preset, model, f"evaluate after {name.upper()}", args.eval_tasks)
        # sft: the warm-up's own minutes and its evaluation; grpo: GRPO and its evaluation. Alone: plus what it starts from
        minutes = (time.perf_counter() - own) / 60 + (sft["minutes"] if name == "sft" else (own - started) / 60)
        alone = minutes + base["minutes"] + (sft["minutes"] if name == "grpo" else 0.0)
    evaluation = type(run.eval).model_validate(
        {
            **run.eval.model_dump(exclude_unset=True),
            **({"tasks_per_domain": args.eval_tasks} if args.eval_tasks else {}),
        }
    )
    general = general_config(evaluation)
    figures = {
        "stage": name,
        "model": model,
        "records": records,
        **rate_figures(report, "eval/pass@1", len(all_eval_tasks(evaluation))),
        "general": rate_figures(
            report, "general/pass@1", len(general.domains) * general.tasks_per_domain if general else 0
        ),
        "per_domain": {
            k.split("/")[1]: round(v, 4)
            for k, v in report.items()
            if k.count("/") == 2 and k.endswith("/pass@1") and k.startswith("eval/")
        },
        "minutes": round(minutes, 2),
        "minutes_alone": round(alone, 2),
        **({"peak_rss_gb": sft.get("peak_rss_gb", 0.0)} if name == "sft" else {}),  # the SFT run it evaluates
    }
    return write_part(jobs, name, figures)


def combine_stages(preset: str, args: argparse.Namespace) -> None:
    """The stages' results in the workdir as one summary (``bench/results/learning-base-to-instruct.json``)."""
    found = {s: json.loads(p.read_text()) for s in STAGES if (p := args.workdir / "arms" / f"{s}.json").is_file()}
    if missing := [s for s in STAGES if s not in found]:
        raise SystemExit(
            f"stages {missing} have no result in {args.workdir / 'arms'}: run bench/learning.py --preset {preset} "
            f"--workdir {args.workdir} --arm NAME for each"
        )
    base, sft, grpo = (found[s] for s in STAGES)

    def gap(a: dict, b: dict) -> tuple[float, float, str]:
        """``a`` over ``b`` on the held-out tasks: paired task by task from the stages' records, else the two rates'
        SEs in quadrature (a stage recorded before records were kept), labelled unpaired."""
        paired = paired_points(a, b, own_tasks)
        if paired is not None:
            return paired["points"], paired["se_points"], paired["se"]
        return (
            round(100 * (a["pass_at_1"] - b["pass_at_1"]), 2),
            round(100 * (a["pass_at_1_se"] ** 2 + b["pass_at_1_se"] ** 2) ** 0.5, 2),
            "unpaired (a stage kept no records)",
        )

    (grpo_gain, grpo_se, grpo_kind), (sft_gain, sft_se, sft_kind) = gap(grpo, sft), gap(sft, base)
    print(
        json.dumps(
            {
                "figure": "learning-base-to-instruct",
                "preset": preset,
                "model": base["model"],
                "stages": {s: {k: v for k, v in f.items() if k not in ("stage",)} for s, f in found.items()},
                "sft_over_base_points": sft_gain,
                "sft_over_base_se_points": sft_se,
                "grpo_over_sft_points": grpo_gain,
                "grpo_over_sft_se_points": grpo_se,
                "se": {"sft_over_base": sft_kind, "grpo_over_sft": grpo_kind},
                "general_change": {
                    "sft_over_base": paired_points(sft, base, general_tasks),
                    "grpo_over_sft": paired_points(grpo, sft, general_tasks),
                },
                "goal_met": grpo_gain > 2 * grpo_se and sft_gain > 0,
                "minutes": round(sum(f["minutes"] for f in found.values()), 2),
                "peak_rss_gb": max(f["peak_rss_gb"] for f in found.values()),
                "peer": {
                    "name": "the stage before",
                    "setting": "the same held-out tasks, greedy, in the same workdir; the base "
                    "model in the plain completion format, the others in Gemma's template",
                },
                "workdir": str(args.workdir),
            }
        ),
        flush=True,
    )


def peak_rss_gb() -> float:
    """The largest resident set of this process and of the job processes it has waited for, GiB."""
    import resource

    return round(
        max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 2**20, 3
    )


def write_part(jobs: Jobs, name: str, figures: dict) -> dict:
    """A part's figures with this process tree's CPU-minutes and peak RSS (or the larger one a reused stage it evaluates
    reported), written to ``<workdir>/arms/<name>.json``
    and printed."""
    import resource

    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    figures |= {
        "cpu_minutes": round(sum(u.ru_utime + u.ru_stime for u in usage) / 60, 2),
        "peak_rss_gb": max(peak_rss_gb(), figures.get("peak_rss_gb", 0.0)),
    }
    path = jobs.workdir / "arms" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(figures))
    print(json.dumps(figures), flush=True)
    return figures


def domain_figures(
    report: dict[str, float],
    before: dict[str, float] | None = None,
    tasks: int = 0,
    pair: Callable[[Callable[[dict], bool]], dict | None] | None = None,
) -> dict:
    """The broad arms' figures: each domain's held-out pass@1 (``tasks`` a domain), and with the model as it
    ships (``before``) each domain's gain, whether it gained or lost beyond twice its standard error, and the mean
    gain over the domains with its standard error; the general check. ``pair(keep)`` gives the paired difference
    from the model as it ships over the tasks ``keep`` picks (:func:`paired_points`); without it (or without
    records) the SEs are the unpaired ones, and ``se`` says which."""
    import math

    def rates(r: dict[str, float]) -> dict[str, float]:
        return {
            k.split("/")[1]: v
            for k, v in r.items()
            if k.startswith("eval/") and k.count("/") == 2 and k.endswith("/pass@1")
        }

    after = rates(report)
    out: dict = {
        "pass": {d: round(p, 4) for d, p in after.items()},
        "general": report.get("general/pass@1"),
        "tasks_per_domain": tasks,
    }
    if before is None:
        return out
    was = rates(before)
    per = {}
    overall = pair(own_tasks) if pair is not None else None  # every own task, paired; None: no records to pair
    for d, p in after.items():
        found = pair(lambda r, d=d: r["domain"] == d) if overall is not None and pair is not None else None
        se = found["se_points"] / 100 if found else math.sqrt((p * (1 - p) + was[d] * (1 - was[d])) / tasks)
        gain = p - was[d]
        per[d] = {
            "before": round(was[d], 4),
            "after": round(p, 4),
            "gain_points": round(100 * gain, 2),
            "se_points": round(100 * se, 2),
            "beyond_noise": "gained" if gain > 2 * se else "lost" if gain < -2 * se else "",
        }
    gains = [f["gain_points"] for f in per.values()]
    mean = sum(gains) / len(gains)
    # the mean over the domains (equal tasks a domain: the mean per-task difference); its SE the paired one over every
    # task (clustered by source), else from the domains' own unpaired SEs as independent
    mean_se = overall["se_points"] if overall else math.sqrt(sum(f["se_points"] ** 2 for f in per.values())) / len(per)
    return out | {
        "per_domain": per,
        "mean_gain_points": round(mean, 2),
        "mean_gain_se_points": round(mean_se, 2),
        "se": "paired, clustered by source" if overall else "unpaired",
        "domains_gained": sum(f["beyond_noise"] == "gained" for f in per.values()),
        "domains_lost": sum(f["beyond_noise"] == "lost" for f in per.values()),
    }


ARM_FIGURES = {"smollm2-repair": arm_figures, "smollm2-broad": domain_figures}  # an arm's figures from its evaluation


def read_arms(preset: str, args: argparse.Namespace) -> tuple[dict[str, dict], dict]:
    """Every arm's result in the workdir and the base stage they start from; exits naming the arms not run yet."""
    found = {
        arm: json.loads(p.read_text()) for arm in ARMS[preset] if (p := args.workdir / "arms" / f"{arm}.json").is_file()
    }
    if missing := [arm for arm in ARMS[preset] if arm not in found]:
        raise SystemExit(
            f"arms {missing} have no result in {args.workdir / 'arms'}: run bench/learning.py --preset {preset} "
            f"--workdir {args.workdir} --arm NAME for each"
        )
    same_start(preset, found, args.workdir)
    return found, json.loads((args.workdir / "stages" / "base.json").read_text())


def same_start(preset: str, found: dict[str, dict], workdir: Path) -> None:
    """Exits unless the arms that start from one stage started from the same weights (``start_weights_sha256``, each
    arm's digest of them as it began) and from the weights that stage's record names, if it names any: arms whose
    warm-ups differ (a stage made again between them) are no paired comparison."""
    rerun = f"bench/learning.py --preset {preset} --workdir {workdir} --arm"
    if unknown := [arm for arm, f in found.items() if not f.get("start_weights_sha256")]:
        raise SystemExit(
            f"arms {unknown} record no start_weights_sha256 (their results in {workdir / 'arms'} predate it), "
            f"so whether they started from the same weights as the other arms is unknown: delete those files "
            f"and run each again ({rerun} NAME) from the stages in {workdir / 'stages'}"
        )
    by_stage: dict[str, list[str]] = {}
    for arm in found:
        by_stage.setdefault(ARMS[preset][arm][0], []).append(arm)
    for name, arms in by_stage.items():
        path = workdir / "stages" / f"{name}.json"
        recorded = json.loads(path.read_text()).get("weights_sha256") if path.is_file() else None
        first = arms[0]
        for arm in arms[1:]:
            if found[arm]["start_weights_sha256"] != found[first]["start_weights_sha256"]:
                raise SystemExit(
                    f"arms {first!r} and {arm!r} both start from stage {name!r} but from different weights: "
                    f"{first} from sha256 {found[first]['start_weights_sha256']}, {arm} from sha256 "
                    f"{found[arm]['start_weights_sha256']} (the stage was made again between them); their "
                    f"difference is no paired figure: run both from one {name} stage ({rerun} NAME)"
                )
        if recorded and recorded != found[first]["start_weights_sha256"]:
            raise SystemExit(
                f"stage {name!r} in {path} is sha256 {recorded}, but arms {arms} started from sha256 "
                f"{found[first]['start_weights_sha256']}: the stage was made again after them; run them again "
                f"from it ({rerun} NAME)"
            )


def combine_broad(preset: str, args: argparse.Namespace) -> None:
    """The broad preset's arms as one summary (``bench/results/learning-broad.json`` when recorded): the goals set the
    curriculum against uniform draws; the signal arm shows what signal weights alone did."""
    found, base = read_arms(preset, args)
    uniform, curriculum = found["uniform"], found["curriculum"]
    keys = (
        "signal_rate",
        "update_s_per_useful_group",
        "mean_gain_points",
        "mean_gain_se_points",
        "domains_gained",
        "domains_lost",
        "general",
        "general_change",
        "se",
        "steps",
        "minutes",
        "minutes_alone",
        "cpu_minutes",
        "peak_rss_gb",
        "reward_curve",
    )
    ratio = curriculum["signal_rate"] / uniform["signal_rate"] if uniform["signal_rate"] else float("inf")
    print(
        json.dumps(
            {
                "figure": "learning-broad",
                "preset": preset,
                "model": base["model"],
                "model_params": base["params"],
                "domains": len(curriculum["per_domain"]),
                "general_before": base["report"].get("general/pass@1"),
                "arms": {
                    arm: {k: f[k] for k in keys if k in f} | {"general_after": f["general"]} for arm, f in found.items()
                },
                "tasks_per_domain": curriculum["tasks_per_domain"],
                "per_domain": {
                    d: {
                        "before": f["before"],
                        "before_se_points": round(
                            100 * (f["before"] * (1 - f["before"]) / curriculum["tasks_per_domain"]) ** 0.5, 2
                        ),
                        **{arm: found[arm]["per_domain"][d]["after"] for arm in found},
                        **{f"{arm}_gain_points": found[arm]["per_domain"][d]["gain_points"] for arm in found},
                        **{f"{arm}_se_points": found[arm]["per_domain"][d]["se_points"] for arm in found},
                    }
                    for d, f in curriculum["per_domain"].items()
                },
                "signal_rate_ratio": round(ratio, 3),
                "goals": {
                    "signal_rate_ratio_at_least_1.3": ratio >= 1.3,
                    "curriculum_mean_gain_at_least_5_points": curriculum["mean_gain_points"] >= 5,
                    "curriculum_loses_no_more_domains": curriculum["domains_lost"] <= uniform["domains_lost"],
                },
                "minutes": round(base["minutes"] + sum(f["minutes"] for f in found.values()), 2),
                "peak_rss_gb": max(f["peak_rss_gb"] for f in found.values()),
                "peer": {
                    "name": "the uniform arm",
                    "setting": "uniform draws over the same domains at their fixed difficulty: the "
                    "same model, seed, steps and trajectories, the same held-out tasks",
                },
                "workdir": str(args.workdir),
            }
        ),
        flush=True,
    )


def combine_arms(preset: str, args: argparse.Namespace) -> None:
    """The repair arms' results in the workdir as one summary (``bench/results/learning-repair.json`` when recorded)."""
    found, base = read_arms(preset, args)
    sft = json.loads((args.workdir / "stages" / "sft.json").read_text())
    before = arm_figures(base["report"])
    a, b = found["sft-grpo"], found["sft"]
    # on the same unseen-function tasks: paired task by task, clustered by function; arms kept without records: unpaired
    paired = paired_points(a, b, unseen_function_tasks)
    gap = paired["points"] if paired else 100 * (a["pass"]["unseen_functions"] - b["pass"]["unseen_functions"])
    gap_se = (
        paired["se_points"]
        if paired
        else 100 * (a["se"]["unseen_functions"] ** 2 + b["se"]["unseen_functions"] ** 2) ** 0.5
    )
    minutes = base["minutes"] + sft["minutes"] + sum(arm["minutes"] for arm in found.values())
    peak = max(f["peak_rss_gb"] for f in found.values())  # GiB
    gained = gap >= 10 and gap > 2 * gap_se
    print(
        json.dumps(
            {
                "figure": "learning-repair",
                "preset": preset,
                "model": base["model"],
                "model_params": base["params"],
                "pass_before": before["pass"],
                "pass_before_se": before["se"],
                "eval_tasks": before["tasks"],
                "episodes_before": before["episodes"],
                "general_before": before["general"],
                "arms": {
                    arm: {
                        "pass_after": f["pass"],
                        "pass_after_se": f["se"],
                        "general_after": f["general"],
                        "episodes": f["episodes"],
                        "steps": f["steps"],
                        "minutes": f["minutes"],
                        "minutes_alone": f["minutes_alone"],
                        "cpu_minutes": f["cpu_minutes"],
                        "peak_rss_gb": f["peak_rss_gb"],
                        "reward_curve": f["reward_curve"],
                        "groups_used_mean": f["groups_used_mean"],
                        "start_weights_sha256": f["start_weights_sha256"],
                    }
                    for arm, f in found.items()
                },
                "general_after": {arm: f["general"] for arm, f in found.items()},
                "sft": {"demonstrations": sft["demonstrations"], "steps": sft["steps"], "minutes": sft["minutes"]},
                "sft_grpo_over_sft_unseen_functions_points": round(gap, 2),
                "gap_se_points": round(gap_se, 2),
                "gap_se": paired["se"] + f" ({paired['clusters']} functions)"
                if paired
                else "unpaired (the arms kept no records)",
                "general_change": {arm: f.get("general_change") for arm, f in found.items()},
                "goal_met": gained,
                "goals": {
                    "sft_grpo_over_sft_at_least_10_points_beyond_2_se": gained,
                    "arms_together_within_3_hours": minutes <= 180,
                    "peak_rss_within_8_gib": peak <= 8.0,
                    "each_arm_alone_within_75_minutes": all(f["minutes_alone"] <= 75 for f in found.values()),
                },
                "minutes": round(minutes, 2),
                "peak_rss_gb": peak,
                "peer": {
                    "name": "the SFT-only arm",
                    "setting": "the same warm-up (weights sha256 "
                    f"{a['start_weights_sha256'][:12]}, checked alike for both arms) continued for as many steps as GRPO "
                    "took, the same held-out tasks, greedy, in the same workdir",
                    "same_warm_up": True,
                },
                "workdir": str(args.workdir),
            }
        ),
        flush=True,
    )


# --- forgetting: each control against it, an arm from the same start -------------------------------------------
# preset -> (the stage its arms start from, the trainer of the stage they vary): the three presets that forgot most
FORGETTING = {
    "smollm2-repair": ("base", "sft"),
    "smollm2-broad": ("base", "grpo"),
    "gemma3-base-to-instruct": ("sft", "grpo"),
}
REPLAY_SHARE = 0.2  # of each step's rows (SFT) or prompts (GRPO), from the general domains' train split
KL_COEF = 0.05  # k3 to the start; verl's default is 0.001 and OpenRLHF's 0.01, over thousands of steps, not dozens
LORA = {"r": 16, "alpha": 32}
LORA_LR_FACTOR = 10  # LoRA takes about ten times full fine-tuning's learning rate ("LoRA Learns Less and Forgets Less")
SELF_GENERATED = {
    "samples": 2,
    "keep_per_task": 1,
    "max_new_tokens": 256,
}  # rejection sampling: the start's own successes
INTERPOLATION = {"alphas": [0.25, 0.5, 0.75, 1.0], "tasks_per_domain": 4, "difficulty": 2, "max_new_tokens": 48}
UNTOUCHED = {"tasks_per_domain": 24, "difficulty": 2, "max_new_tokens": 48}  # the untouched check (untouched_domains)
BOUNDS = {
    "general_drop_points": 2.0,
    "gain_kept": 0.8,
}  # a control keeps the general check within 2 points, 80% of the gain
# every arm trains with the preset's config less any control the preset itself takes (smollm2-broad replays): then its one
NO_CONTROL = {
    "sft": {"replay": None, "lora": None, "self_generated": None},
    "grpo": {"replay": None, "lora": None, "algorithm": {"kl_coef": 0.0}},
}


def forgetting_arms(preset: str) -> dict[str, dict]:
    """Each arm's fields over the preset's config of the stage it varies; ``interpolate`` interpolates the ``none``
    arm's model with the start (alpha picked on train-split validation tasks of the trained and the general domains)."""
    from posttrain.training.presets import get_preset

    run = get_preset(preset)
    trainer = FORGETTING[preset][1]
    lr = (run.sft if trainer == "sft" else run.grpo).optim.lr  # type: ignore[union-attr]
    arms: dict[str, dict] = {"none": {}, "replay": {"replay": {"share": REPLAY_SHARE}}}
    if trainer == "grpo":
        arms["kl"] = {"algorithm": {"kl_coef": KL_COEF}}
    if (
        trainer == "sft"
    ):  # the model's own passing answers or episodes beside (or for) the references ("Retaining by Doing")
        arms["self-generated"] = {"self_generated": SELF_GENERATED}
    arms["lora"] = {"lora": LORA, "optim": {"lr": lr * LORA_LR_FACTOR}}
    if trainer == "grpo":  # KL under LoRA: the reference is the model with its adapters off, no second copy (peak RSS)
        arms["lora-kl"] = arms["lora"] | arms["kl"]
    arms["interpolate"] = {}
    return arms


def forgetting_start(jobs: Jobs, preset: str, args: argparse.Namespace) -> dict:
    """The model the arms start from, evaluated once: the model as it ships, or the SFT stage (its evaluation kept
    beside it in ``stages/sft-evaluated.json``, made again if the stage's weights changed)."""
    if FORGETTING[preset][0] == "base":
        return stage(jobs, preset, "base", args)
    origin = stage(jobs, preset, "sft", args)
    path = jobs.workdir / "stages" / "sft-evaluated.json"
    if path.is_file() and (made := json.loads(path.read_text())).get("weights_sha256") == origin["weights_sha256"]:
        return made
    report, records = jobs.evaluate(preset, origin["model"], "evaluate the SFT stage", args.eval_tasks)
    made = {**origin, "report": report, "records": records}
    path.write_text(json.dumps(made))
    return made


def interpolation_validation(preset: str) -> dict:
    """What the interpolate arm picks alpha on (the ``interpolate_model`` job's fields): train-split tasks of the
    domains the preset trains and evaluates (procedural, with difficulty 2), put as the preset evaluates them (a
    multi-turn preset's as episodes of its environment, at its answer length: the pick sees the repair gain it
    would trade away), and beside them the general check's domains, one completion each (what training cost
    elsewhere). The eval split the arms are measured on is never used to pick."""
    from posttrain.platform.tasks.domains import get_domain
    from posttrain.training.config import GENERAL_DOMAINS
    from posttrain.training.presets import get_preset

    run = get_preset(preset)
    trained = {d.name for d in (run.grpo.domains if run.grpo is not None else [])}  # type: ignore[union-attr]
    domains = [
        d
        for d in run.eval.domains
        if d in trained and d not in run.eval.task_sets and get_domain(d).max_difficulty >= INTERPOLATION["difficulty"]
    ]
    environment = run.eval.environment
    return {
        **INTERPOLATION,
        "domains": domains,
        "general_domains": [d for d in GENERAL_DOMAINS if d not in domains],
        **(
            {"environment": environment.model_dump(), "max_new_tokens": run.eval.max_new_tokens}
            if environment is not None and environment.multi_turn
            else {}
        ),
    }


def untouched_domains(preset: str) -> list[str]:
    """A check beside the general check for the forgetting arms: replay rehearses the general check's own domains
    (their train split), so its general figure is partly what it rehearsed. These domains are none the preset trains
    or evaluates, none the general check or replay holds, nor a variant of one (``compare.is_greater.decimal`` beside
    ``compare.is_greater.int``): the first such domain with an eval split at the check's difficulty in each family
    but code and repair."""
    from posttrain.platform.tasks.domains import generate, get_domain, list_domains, list_families
    from posttrain.training.config import GENERAL_DOMAINS
    from posttrain.training.presets import get_preset

    def base(name: str) -> str:  # arith.add.int and arith.add.decimal are one skill; dates.weekday is its own
        return name.rsplit(".", 1)[0] if name.count(".") >= 2 else name

    run = get_preset(preset)
    taken = {base(d) for d in [*run.eval.domains, *GENERAL_DOMAINS]}
    chosen = []
    for family in list_families():
        if family in ("code", "repair"):
            continue
        for domain in sorted((d for d in list_domains() if d.family == family), key=lambda d: d.name):
            if base(domain.name) in taken or get_domain(domain.name).max_difficulty < UNTOUCHED["difficulty"]:
                continue
            try:
                generate(domain.name, 1, seed=0, difficulty=UNTOUCHED["difficulty"], split="eval")
            except Exception:  # noqa: BLE001 - no eval split at that difficulty: the next domain
                continue
            chosen.append(domain.name)
            break
    return chosen


def run_untouched(preset: str, args: argparse.Namespace) -> None:
    """``--untouched``: the start's and each finished arm's (or ``--arm``'s) greedy pass@1 on :func:`untouched_domains`,
    each kept once in ``<workdir>/arms/untouched-<arm>.json`` (``start`` for the start) with its per-task records."""
    jobs = Jobs(args.workdir, args.threads)
    start = forgetting_start(jobs, preset, args)
    models = {"start": start["model"]} | {
        arm: json.loads(path.read_text())["model"]
        for arm in forgetting_arms(preset)
        if (not args.arm or arm == args.arm) and (path := args.workdir / "arms" / f"forget-{arm}.json").is_file()
    }
    domains = untouched_domains(preset)
    for arm, model in models.items():
        path = args.workdir / "arms" / f"untouched-{arm}.json"
        if path.is_file():
            continue
        result = jobs.run(
            "evaluate",
            {"model": model, "domains": domains, "device": "cpu", "batch_size": 32, **UNTOUCHED},
            f"untouched check of {arm}",
        )
        made = {
            "arm": arm,
            "model": model,
            "domains": domains,
            "pass_at_1": result["reports"][model].get("eval/pass@1"),
            "records": result["records"][model],
        }
        path.write_text(json.dumps(made))
        print(json.dumps(made), flush=True)


def run_forgetting_arm(preset: str, arm: str, args: argparse.Namespace) -> dict:
    """One forgetting arm from the preset's start: its stage trained with one control (or none), or the ``none``
    arm interpolated with the start; evaluated on the preset's held-out tasks and the general check, each paired
    task by task with the start's evaluation. Written to ``<workdir>/arms/forget-<arm>.json``."""
    import shutil
    import time

    from posttrain.training.presets import get_preset

    run = get_preset(preset)
    jobs = Jobs(args.workdir, args.threads)
    start_name, trainer = FORGETTING[preset]
    start = forgetting_start(jobs, preset, args)
    start_weights = weights_digest(stage_weights(start))
    fields = forgetting_arms(preset)[arm]
    started = time.perf_counter()
    out_dir = jobs.data / "runs" / f"forget-{arm}"
    name = f"{preset}-forget-{arm}"
    if arm == "interpolate":
        none_path = jobs.workdir / "arms" / "forget-none.json"
        if not none_path.is_file():
            raise SystemExit(
                f"the interpolate arm interpolates the none arm's model: run bench/learning.py --forgetting "
                f"--preset {preset} --workdir {args.workdir} --arm none first"
            )
        result = jobs.run(
            "interpolate_model",
            {
                "a": start["model"],
                "b": json.loads(none_path.read_text())["model"],
                "name": name,
                "device": "cpu",
                **interpolation_validation(preset),
            },
            "interpolate",
        )
        fields, steps = (
            {"alpha": result["alpha"], "picked_on": "train-split validation tasks", "candidates": result["candidates"]},
            0,
        )
    elif trainer == "sft":
        steps = args.sft_steps or run.sft.max_steps  # type: ignore[union-attr]
        if not (out_dir / "demonstrations.jsonl").is_file():  # the demonstrations one arm made serve every arm (seeded)
            for made in sorted((jobs.data / "runs").glob("forget-*/demonstrations.jsonl")):
                out_dir.mkdir(parents=True, exist_ok=True)
                for file in ("demonstrations.jsonl", "demonstrations.config.json"):
                    shutil.copy(made.parent / file, out_dir / file)
                break
        result = jobs.run(
            "train_sft",
            {
                "preset": preset,
                "model": start["model"],
                "register_as": name,
                "max_steps": steps,
                "output_dir": str(out_dir),
                **NO_CONTROL["sft"],
                **fields,
            },
            f"{arm} SFT",
        )
    else:
        steps = args.grpo_steps or run.grpo.max_steps
        result = jobs.run(
            "train_grpo",
            {
                "preset": preset,
                "model": start["model"],
                "register_as": name,
                "max_steps": steps,
                "output_dir": str(out_dir),
                **NO_CONTROL["grpo"],
                **fields,
            },
            f"{arm} GRPO",
        )
    report, records = jobs.evaluate(preset, result["model"], f"evaluate {arm}", args.eval_tasks)
    part = {"records": records}
    figures = {
        "arm": arm,
        "controls": fields,
        "starts_from": start_name,
        "start_model": start["model"],
        "start_weights_sha256": start_weights,
        "trainer": "interpolation" if arm == "interpolate" else trainer,
        "steps": steps,
        "pass_at_1": report.get("eval/pass@1"),
        "general": report.get("general/pass@1"),
        "gain": paired_points(part, start, own_tasks),
        "general_change": paired_points(part, start, general_tasks),
        "records": records,
        "model": result["model"],
        "minutes": round((time.perf_counter() - started) / 60, 2),
        "reward_curve": [
            round(p["rollout/reward_mean"], 4) for p in result.get("curve", []) if "rollout/reward_mean" in p
        ],
    }
    return write_part(jobs, f"forget-{arm}", figures)


def forgetting_summary(preset: str, found: dict[str, dict], start: dict, settings: dict) -> dict:
    """The arms against the start and against the uncontrolled arm: each arm's paired gain and general-check change,
    whether it meets :data:`BOUNDS`, and the control a preset should take (the one that meets both with the most gain,
    else the one that keeps the most general check for the gain it keeps)."""
    none = found["none"]["gain"]
    arms = {}
    for arm, f in found.items():
        gain, general = f["gain"], f["general_change"]
        kept = gain["points"] / none["points"] if none["points"] > 0 else None
        within = general["points"] >= -BOUNDS["general_drop_points"]
        keeps = kept is not None and kept >= BOUNDS["gain_kept"]
        arms[arm] = {
            "controls": f["controls"],
            "gain_points": gain["points"],
            "gain_se_points": gain["se_points"],
            "general_change_points": general["points"],
            "general_se_points": general["se_points"],
            "pass_at_1": f["pass_at_1"],
            "general": f["general"],
            "gain_kept": round(kept, 3) if kept is not None else None,
            "general_within_bound": within,
            "gain_within_bound": keeps,
            "meets_bounds": within and keeps,
            "steps": f["steps"],
            "minutes": f["minutes"],
            "cpu_minutes": f["cpu_minutes"],
            "peak_rss_gb": f["peak_rss_gb"],
            "reward_curve": f.get("reward_curve", []),
        }
    for arm, f in found.items():  # the untouched check, where it was run (run_untouched) for the start and this arm
        if (change := f.get("untouched_change")) is not None:
            arms[arm] |= {
                "untouched_change_points": change["points"],
                "untouched_se_points": change["se_points"],
                "untouched": f["untouched"],
            }
    meeting = [a for a in arms if arms[a]["meets_bounds"] and a != "none"]
    if meeting:
        best, how = max(meeting, key=lambda a: arms[a]["gain_points"]), "meets both bounds with the most gain"
    else:  # the most general check kept per point of gain given up; an arm that loses the gain altogether is no remedy
        useful = [a for a in arms if a != "none" and arms[a]["gain_points"] > 0] or [a for a in arms if a != "none"]
        best = max(
            useful,
            key=lambda a: (
                (arms[a]["general_change_points"] - arms["none"]["general_change_points"])
                / max(1.0, arms["none"]["gain_points"] - arms[a]["gain_points"])
            ),
        )
        how = "no control meets both bounds: the best trade-off of general check kept for gain given up"
    failed = (
        []
        if meeting
        else [
            f"{a}: general {arms[a]['general_change_points']:+.1f} points (bound -{BOUNDS['general_drop_points']:g}), "
            f"gain kept {arms[a]['gain_kept'] if arms[a]['gain_kept'] is not None else 'n/a'} (bound {BOUNDS['gain_kept']:g})"
            for a in arms
            if a != "none"
        ]
    )
    return {
        "arms": arms,
        "best": best,
        "best_because": how,
        "bounds": BOUNDS,
        "bounds_failed": failed,
        "settings": settings,
        "start_pass": start["report"].get("eval/pass@1"),
        "start_general": start["report"].get("general/pass@1"),
    }


def combine_forgetting(preset: str, args: argparse.Namespace) -> None:
    """The forgetting arms in the workdir as one summary (``bench/results/forgetting-<preset>.json`` when recorded)."""
    names = list(forgetting_arms(preset))
    found = {a: json.loads(p.read_text()) for a in names if (p := args.workdir / "arms" / f"forget-{a}.json").is_file()}
    if missing := [a for a in names if a not in found]:
        raise SystemExit(
            f"forgetting arms {missing} have no result in {args.workdir / 'arms'}: run bench/learning.py "
            f"--forgetting --preset {preset} --workdir {args.workdir} --arm NAME for each"
        )
    if len({f["start_weights_sha256"] for f in found.values()}) != 1:
        raise SystemExit(
            f"the forgetting arms in {args.workdir / 'arms'} started from different weights: delete them and "
            "run each again from the same stage"
        )
    jobs = Jobs(args.workdir, args.threads)
    start = forgetting_start(jobs, preset, args)
    checked = {
        a: json.loads(p.read_text())
        for a in ["start", *names]
        if (p := args.workdir / "arms" / f"untouched-{a}.json").is_file()
    }
    if len(checked) == len(names) + 1:  # the untouched check of every arm, paired with the start's
        for arm in names:
            found[arm] |= {
                "untouched": checked[arm]["pass_at_1"],
                "untouched_change": paired_points(checked[arm], checked["start"], lambda record: True),
            }
    untouched = (
        {"domains": checked["start"]["domains"], "start": checked["start"]["pass_at_1"], **UNTOUCHED}
        if len(checked) == len(names) + 1
        else None
    )
    settings = {
        "replay_share": REPLAY_SHARE,
        "kl_coef": KL_COEF,
        "lora": LORA,
        "lora_lr_factor": LORA_LR_FACTOR,
        "self_generated": SELF_GENERATED,
        "interpolation": {k: v for k, v in interpolation_validation(preset).items() if k != "environment"},
    }
    start_name, trainer = FORGETTING[preset]
    print(
        json.dumps(
            {
                "figure": f"forgetting-{preset}",
                "preset": preset,
                "model": start["model"],
                "start": start_name,
                "trainer": trainer,
                **forgetting_summary(preset, found, start, settings),
                "untouched_check": untouched,
                "minutes": round(sum(f["minutes"] for f in found.values()), 2),
                "peak_rss_gb": max(f["peak_rss_gb"] for f in found.values()),
                "peer": {
                    "name": "the start and the uncontrolled arm",
                    "setting": f"every arm from the same weights (sha256 "
                    f"{found['none']['start_weights_sha256'][:12]}), the same held-out tasks and general check, greedy, each "
                    "paired task by task with the start's evaluation (SE clustered by source); an arm run in a copy of the workdir is "
                    "combined only when its start's digest is the same",
                },
                "workdir": str(args.workdir),
            }
        ),
        flush=True,
    )


def main() -> None:
    from posttrain.training.presets import get_preset

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu-demo")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--sft-steps", type=int, default=None)
    parser.add_argument("--grpo-steps", type=int, default=None)
    parser.add_argument("--grpo-lr", type=float, default=None)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the job (real-model presets)")
    parser.add_argument(
        "--eval-tasks", type=int, default=None, help="held-out tasks per domain (default: the preset's)"
    )
    parser.add_argument(
        "--rollout",
        choices=["sync", "vllm"],
        default=None,
        help="the rollout backend of a real-model preset (default: the preset's; vllm: colocated on a GPU host with the gpu extra, else its CPU server from make vllm)",
    )
    parser.add_argument(
        "--device", default=None, help="the learner's and the evaluations' device (default: the preset's)"
    )
    parser.add_argument(
        "--ablation", action="store_true", help="measure each saving of the GRPO step on its own instead"
    )
    parser.add_argument("--ablation-steps", type=int, default=3, help="GRPO steps per ablation variant")
    parser.add_argument("--ablation-variant", choices=list(ABLATIONS), help=argparse.SUPPRESS)  # one variant (a child)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument(
        "--arms",
        action="store_true",
        help="every part of the preset (smollm2-repair: the arms cold, "
        "sft, sft-grpo; smollm2-broad: uniform, signal, curriculum; gemma3-base-to-instruct: the stages base, "
        "sft, grpo), each in a process of its own, then their summary",
    )
    parser.add_argument(
        "--forgetting",
        action="store_true",
        help="the controls against forgetting, each an arm from the "
        "same start (smollm2-repair: its SFT stage; smollm2-broad: GRPO; gemma3-base-to-instruct: its GRPO "
        "stage): none, replay, kl (GRPO), self-generated (SFT), lora, lora-kl (GRPO), interpolate (of none); with "
        "--arm one of them, else "
        "all, then their summary",
    )
    parser.add_argument(
        "--arm",
        choices=sorted(
            {p for parts in PARTS.values() for p in parts}
            | {"none", "replay", "kl", "self-generated", "lora", "lora-kl", "interpolate"}
        ),
        help="one part; its result goes to <workdir>/arms/<part>.json",
    )
    parser.add_argument("--combine", action="store_true", help="the summary of the arms already run in --workdir")
    parser.add_argument(
        "--untouched",
        action="store_true",
        help="with --forgetting: the untouched check (domains nothing "
        "in the preset, the general check or replay holds) of the start and each arm run (or --arm), "
        "which --combine then pairs",
    )
    parser.add_argument(
        "--stage",
        choices=["base", "sft"],
        help="only make this stage the parts share in --workdir (base: "
        "the model as it ships, evaluated; sft: demonstrations and the SFT warm-up), or reuse it if made",
    )
    args = parser.parse_args()
    if args.forgetting:
        return forgetting_main(args)
    if args.arms or args.arm or args.combine or args.stage:
        import subprocess

        parts = PARTS.get(args.preset)
        if parts is None or (args.arm and args.arm not in parts):
            raise SystemExit(
                f"--arms/--arm/--combine: preset {args.preset} has no parts{' named ' + args.arm if parts else ''}; "
                + "; ".join(f"{p}: {', '.join(names)}" for p, names in PARTS.items())
            )

        args.workdir = args.workdir or Path(tempfile.gettempdir()) / f"posttrain-{args.preset}-arms"
        args.workdir.mkdir(parents=True, exist_ok=True)
        args.workdir.chmod(0o755)  # the episodes' sandboxes live under it: the sandbox uid must be able to enter it
        if args.stage:
            stage(Jobs(args.workdir, args.threads), args.preset, args.stage, args)
            return None
        if args.arm:
            (run_stage if parts is STAGES else run_arm)(args.preset, args.arm, args)
            return None
        if args.arms:
            passed = [a for a in sys.argv[1:] if a not in ("--arms",)]
            for part in parts:
                if not (args.workdir / "arms" / f"{part}.json").is_file():
                    subprocess.run(
                        [sys.executable, __file__, *passed, "--workdir", str(args.workdir), "--arm", part], check=True
                    )
        return {"gemma3-base-to-instruct": combine_stages, "smollm2-broad": combine_broad}.get(
            args.preset, combine_arms
        )(args.preset, args)
    if args.ablation_variant:
        print(
            json.dumps(
                ablation_variant(args.preset, args.ablation_variant, args.model_dir, args.ablation_steps, args.threads)
            )
        )
        return None
    if args.ablation:
        return run_ablation(
            args.preset,
            args.workdir or Path(tempfile.mkdtemp(prefix="posttrain-ablation-")),
            args.ablation_steps,
            args.threads,
        )
    sft = {"max_steps": args.sft_steps} if args.sft_steps else {}
    grpo = {k: v for k, v in (("max_steps", args.grpo_steps), ("lr", args.grpo_lr)) if v}
    workdir = args.workdir
    if workdir is None:
        workdir = Path(tempfile.mkdtemp(prefix="posttrain-learning-"))
        workdir.chmod(0o755)  # the tools preset's sandboxes live under it: the sandbox uid must be able to enter it
    evaluation = {"tasks_per_domain": args.eval_tasks} if args.eval_tasks else {}
    if not isinstance(get_preset(args.preset).model, str) and (args.rollout or args.device):
        raise SystemExit(f"--rollout and --device are for the real-model presets (smollm2-*), not {args.preset}")
    if args.rollout:
        grpo["rollout"] = {"backend": args.rollout}
    if args.device:
        grpo["device"] = evaluation["device"] = args.device
    run_as_job(args.preset, workdir, sft, grpo, evaluation, args.threads)
    sys.stdout.flush()


def forgetting_main(args: argparse.Namespace) -> None:
    """``--forgetting``: one arm (``--arm``), the untouched check (``--untouched``), the summary (``--combine``), or every
    arm not run yet, each in a process of its own, then the untouched check of each, then the summary."""
    import subprocess

    if args.preset not in FORGETTING:
        raise SystemExit(f"--forgetting runs on {', '.join(FORGETTING)}, not {args.preset}")
    arms = list(forgetting_arms(args.preset))
    if args.arm and args.arm not in arms:
        raise SystemExit(f"--forgetting --preset {args.preset} has the arms {', '.join(arms)}, not {args.arm}")
    args.workdir = args.workdir or Path(tempfile.gettempdir()) / f"posttrain-{args.preset}-forgetting"
    args.workdir.mkdir(parents=True, exist_ok=True)
    args.workdir.chmod(0o755)  # the episodes' sandboxes live under it: the sandbox uid must be able to enter it
    if args.untouched:
        run_untouched(args.preset, args)
        return
    if args.arm:
        run_forgetting_arm(args.preset, args.arm, args)
        return
    if not args.combine:
        passed = [a for a in sys.argv[1:] if a != "--workdir" and a != str(args.workdir)]
        for arm in arms:  # in order: interpolate takes the none arm's model
            if not (args.workdir / "arms" / f"forget-{arm}.json").is_file():
                subprocess.run(
                    [sys.executable, __file__, *passed, "--workdir", str(args.workdir), "--arm", arm], check=True
                )
        subprocess.run([sys.executable, __file__, *passed, "--workdir", str(args.workdir), "--untouched"], check=True)
    combine_forgetting(args.preset, args)


if __name__ == "__main__":
    main()
