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
``pass_after``, ``gain_points``, ``gain_se_points`` (the standard error of the gain from the two
evaluations' pass rates), ``general_before``, ``general_after``, ``minutes``, ``steps``,
``peak_rss_gb`` (the job process: learner, rollouts and evaluation), the step's cost (``step_s_mean``,
``update_s_per_useful_group``, ``groups_used_mean``) and per-domain figures. The peer is the model
before training, evaluated on the same held-out tasks in the same run.

A tiny-model preset (``cpu-*``):
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
    config = get_preset(preset).grpo.updated(model=model_dir, output_dir=str(workdir), max_steps=steps, checkpoint_every=0,
                                              logprob_check={"every": 0}, **ABLATIONS[name])
    started = time.perf_counter()
    result = train_grpo(config)
    used = sum(m.get("rollout/groups_used", 0.0) for m in result.metrics)
    return {"variant": name, "steps": len(result.metrics), "minutes": round((time.perf_counter() - started) / 60, 2),
            "step_s_mean": round(sum(m["time/step_s"] for m in result.metrics) / len(result.metrics), 2),
            "update_s_mean": round(sum(m["time/update_s"] for m in result.metrics) / len(result.metrics), 2),
            "update_s_per_useful_group": round(sum(m["time/update_s"] for m in result.metrics) / max(1.0, used), 3),
            "groups_used": used, "trained_tokens": sum(m.get("train/tokens", 0.0) for m in result.metrics),
            "peak_rss_gb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)}


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
    row = import_model(Identity("bench", Role.admin), f"builtin:{get_preset(preset).model}", url=url, dest_root=workdir / "models")
    rows = []
    for name in ABLATIONS:
        out = subprocess.run([sys.executable, __file__, "--preset", preset, "--ablation-variant", name, "--model-dir", row.path,
                              "--ablation-steps", str(steps), "--threads", str(threads)],
                             capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": str(threads)})
        if out.returncode != 0:
            raise SystemExit(f"ablation variant {name!r} failed:\n{out.stderr[-3000:]}")
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    base = rows[0]
    print(json.dumps({
        "figure": "learning-ablation", "preset": preset, "steps_per_variant": steps, "torch_threads": threads,
        "variants": {r["variant"]: {k: r[k] for k in ("step_s_mean", "update_s_mean", "update_s_per_useful_group",
                                                     "peak_rss_gb", "groups_used")} for r in rows},
        "update_cost_vs_all_savings": {r["variant"]: round(r["update_s_per_useful_group"] / max(1e-9, base["update_s_per_useful_group"]), 2)
                                       for r in rows[1:]},
        "peak_rss_vs_all_savings": {r["variant"]: round(r["peak_rss_gb"] / base["peak_rss_gb"], 2) for r in rows[1:]},
        "peer": {"name": "all savings on", "setting": "the same preset, model, seed and steps, in the same run"},
    }), flush=True)


def standard_error(before: float, after: float, n: int) -> float:
    """The standard error, in points, of the change between two pass rates on the same ``n`` tasks."""
    import math

    return round(100 * math.sqrt((before * (1 - before) + after * (1 - after)) / n), 2)


class Jobs:
    """Jobs of one arm run through real workers in ``workdir``'s data directory (shared by every arm)."""

    def __init__(self, workdir: Path, threads: int) -> None:
        self.workdir, self.data = workdir, workdir / "data"
        self.env = {"POSTTRAIN_DATA_DIR": str(self.data), "POSTTRAIN_DATABASE_URL": f"sqlite:///{self.data / 'posttrain.db'}",
                    "POSTTRAIN_WORKER_POLL_INTERVAL_S": "0.5", "OMP_NUM_THREADS": str(threads)}
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
        worker = subprocess.Popen([sys.executable, "-m", "posttrain.platform.cli", "worker", "--exit-when-idle"],
                                  env={**os.environ, **self.env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        printed, curve = 0, {}
        while True:
            done = worker.poll() is not None
            with session(read_only=True) as s:
                rows = s.exec(select(Metric).where(Metric.job_id == job_id, Metric.name.startswith("rollout/")
                                                   | Metric.name.startswith("time/"))).all()
            for m in rows:
                curve.setdefault(m.step, {})[m.name] = m.value
            for step in sorted(k for k in curve if k > printed and "time/step_s" in curve[k]):
                print(json.dumps({"curve": label, "step": step, "reward_mean": round(curve[step]["rollout/reward_mean"], 4),
                                  "groups_used": curve[step].get("rollout/groups_used"),
                                  "step_s": round(curve[step]["time/step_s"], 2)}), flush=True)
                printed = step
            if done:
                break
            time.sleep(5)
        job = queue.get_job(job_id)
        if job.status is not JobStatus.succeeded:
            raise SystemExit(f"{label}: the {kind} job ended {job.status.value}: {job.error} (log: {job.log_path})")
        return {**(job.result or {}), "job_id": job_id, "curve": [curve[k] for k in sorted(curve) if "time/step_s" in curve[k]]}

    def work(self) -> None:
        """A worker runs every queued job, then exits."""
        import subprocess

        subprocess.run([sys.executable, "-m", "posttrain.platform.cli", "worker", "--exit-when-idle"], env={**os.environ, **self.env},
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)

    def evaluate(self, preset: str, model: str, label: str, tasks: int | None) -> dict[str, float]:
        config = {"preset": preset, "model": model, **({"tasks_per_domain": tasks} if tasks else {})}
        return self.run("evaluate", config, label)["reports"][model]


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
    built = jobs.run("build_tasks", {"task_set": documents.task_set, "source": {
        "type": "documents", "document_ids": ready, **documents.source}}, f"building task set {documents.task_set}")
    print(json.dumps({"documents": len(files), "preprocessed": len(ready), **{k: v for k, v in built.items() if k not in ("curve", "job_id")},
                      "minutes": round((time.perf_counter() - started) / 60, 2)}), flush=True)


def run_as_job(preset: str, workdir: Path, grpo: dict, evaluation: dict, threads: int) -> None:
    """A real-model preset as a ``train_preset`` job through a real worker, in a fresh data directory."""
    import time

    from posttrain.platform.models.importer import import_model
    from posttrain.training.evaluate import general_config
    from posttrain.training.presets import get_preset

    run = get_preset(preset)
    jobs = Jobs(workdir, threads)
    row = import_model(jobs.identity, f"builtin:{run.model}", dest_root=jobs.data / "models")
    build_documents(jobs, preset)
    started = time.perf_counter()
    result = jobs.run("train_preset", {"preset": preset, "name": f"{preset}-bench", "grpo": grpo, "eval": evaluation}, "grpo")
    minutes = (time.perf_counter() - started) / 60
    steps = result["curve"]
    used = sum(p.get("rollout/groups_used", 0.0) for p in steps)
    before, after, n = result["pass_before"], result["pass_after"], result["eval_tasks"]
    general = general_config(run.eval) if result.get("general_before") is not None else None
    general_tasks = len(general.domains) * general.tasks_per_domain if general is not None else 0
    print(json.dumps({
        "figure": FIGURES.get(preset, "learning-real") + ("-vllm" if grpo.get("rollout", {}).get("backend") == "vllm" else ""),
        "preset": preset, "rollout": grpo.get("rollout", {}).get("backend", run.grpo.rollout.backend),
        "device": grpo.get("device", run.grpo.device), "model": run.model, "model_params": (row.meta or {}).get("parameters"),
        "pass_before": round(before, 4), "pass_after": round(after, 4), "gain_points": result["gain_points"],
        "gain_se_points": standard_error(before, after, n), "eval_tasks": n, "eval_unseen_fraction": result["eval_unseen_fraction"],
        "general_before": result.get("general_before"), "general_after": result.get("general_after"),
        "general_change_points": round(100 * (result["general_after"] - result["general_before"]), 2)
        if result.get("general_before") is not None else None,
        "general_se_points": standard_error(result["general_before"], result["general_after"], general_tasks)
        if general_tasks else None,
        "minutes": round(minutes, 2), "steps": result["steps"], "peak_rss_gb": result.get("peak_rss_gb"),
        "step_s_mean": round(sum(p["time/step_s"] for p in steps) / max(1, len(steps)), 2),
        "update_s_per_useful_group": round(sum(p.get("time/update_s", 0.0) for p in steps) / max(1.0, used), 3),
        "groups_used_mean": round(used / max(1, len(steps)), 2), "torch_threads": threads,
        "per_domain": result.get("comparison", {}).get("pass@1", {}),
        "peer": {"name": "the model before training", "setting": "the same held-out tasks, greedy, in the same run"},
        "job_id": result["job_id"], "workdir": str(workdir),
    }), flush=True)


# --- arms: the repair preset's three, the broad preset's two ------------------------------------------------
# preset -> arm -> (the stage it starts from, whether it trains with GRPO or continues SFT, GRPO fields it sets)
ARMS: dict[str, dict[str, tuple[str, str, dict]]] = {
    "smollm2-repair": {
        "cold": ("base", "grpo", {}),      # GRPO from the model as it ships
        "sft": ("sft", "sft", {}),         # the SFT warm-up continued for as many steps as GRPO takes
        "sft-grpo": ("sft", "grpo", {}),   # GRPO from the SFT warm-up
    },
    "smollm2-broad": {  # the same model, seed, steps and trajectories; only the draws differ
        "uniform": ("base", "grpo", {"scheduler": BROAD_UNIFORM.model_dump()}),
        "signal": ("base", "grpo", {"scheduler": BROAD_SIGNAL.model_dump()}),  # signal weights alone, at fixed difficulty
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
        return {"pass": round(rate, 4), "se": round(math.sqrt(rate * (1 - rate) / n), 4) if n else float("nan"), "tasks": int(n)}

    def reasons(domain: str) -> list[tuple[float, float]]:
        prefix = f"eval/{domain}/held_out_by/"
        return [(report[k], report[k.removesuffix("pass@1") + "tasks"]) for k in report if k.startswith(prefix) and k.endswith("/pass@1")]

    domains = {k.split("/")[1] for k in report if k.count("/") >= 2 and k.split("/")[1].startswith("repair.")}
    return {
        "unseen_functions": group([(report[k], report[k.removesuffix("pass@1") + "tasks"])
                                   for k in report if k.startswith("eval/repair.") and k.endswith("/held_out_by/function/pass@1")]),
        "unseen_modules": group([(report[k], report[k.removesuffix("pass@1") + "tasks"]) for k in report
                                 if k.startswith("eval/repair.") and "humaneval" not in k and k.endswith("/held_out_by/prompt/pass@1")]),
        "humaneval": group(reasons("repair.humaneval") if "repair.humaneval" in domains else []),
    }


def arm_figures(report: dict[str, float], before: dict[str, float] | None = None, tasks: int = 0) -> dict:
    """The repair arms' figures: pass@1 of each held-out group, the episodes, the general check."""
    groups = held_out_groups(report)
    return {"pass": {g: groups[g]["pass"] for g in GROUPS}, "se": {g: groups[g]["se"] for g in GROUPS},
            "tasks": {g: groups[g]["tasks"] for g in GROUPS},
            "episodes": {f: round(report.get(f"eval/episodes/{f}", float("nan")), 3) for f in EPISODE_FIGURES},
            "general": report.get("general/pass@1")}


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
        report = jobs.evaluate(preset, row.name, "evaluate the model as it ships", args.eval_tasks)
        out = {"model": row.name, "path": row.path, "params": (row.meta or {}).get("parameters"), "report": report}
    else:
        base = stage(jobs, preset, "base", args)
        steps = args.sft_steps or run.sft.max_steps
        # named apart from the sft arm's model (``{preset}-sft``), which continues it
        result = jobs.run("train_sft", {"preset": preset, "model": base["model"], "register_as": f"{preset}-warmup", "max_steps": steps,
                                        "output_dir": str(jobs.data / "runs" / "sft")}, "SFT warm-up")
        episodes = jobs.data / "runs" / "sft" / "demonstrations.jsonl"
        out = {"model": result["model"], "checkpoint": result["checkpoint"], "steps": result["steps"],
               "demonstrations": sum(1 for line in episodes.read_text().splitlines() if line.strip()) if episodes.is_file() else 0}
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
    started = time.perf_counter()
    grpo_steps = args.grpo_steps or run.grpo.max_steps
    out_dir = jobs.data / "runs" / f"arm-{arm}"  # job paths lie under the data directory
    if trainer == "grpo":
        result = jobs.run("train_grpo", {"preset": preset, "model": origin["model"], "register_as": f"{preset}-{arm}",
                                         "max_steps": grpo_steps, "output_dir": str(out_dir), **fields}, f"{arm} GRPO")
    else:  # the warm-up's checkpoint (model, optimizer, data position) and demonstrations, continued
        checkpoints = out_dir / "checkpoints"
        if not checkpoints.is_dir():
            checkpoints.mkdir(parents=True)
            shutil.copytree(origin["checkpoint"], checkpoints / Path(origin["checkpoint"]).name)
            for made_file in ("demonstrations.jsonl", "demonstrations.config.json"):
                shutil.copy(jobs.data / "runs" / "sft" / made_file, out_dir / made_file)
        result = jobs.run("train_sft", {"preset": preset, "model": base["model"], "register_as": f"{preset}-{arm}",
                                        "max_steps": origin["steps"] + grpo_steps, "output_dir": str(out_dir)}, f"{arm} SFT")
    report = jobs.evaluate(preset, result["model"], f"evaluate {arm}", args.eval_tasks)
    minutes = (time.perf_counter() - started) / 60
    curve = result.get("curve", [])
    used = sum(p.get("rollout/groups_used", 0.0) for p in curve)
    signal = sum(p.get("rollout/groups_signal", 0.0) for p in curve)  # every group with a signal, not capped like used
    figures = {
        "arm": arm, "starts_from": start_from, "trainer": trainer, "steps": grpo_steps,
        **ARM_FIGURES[preset](report, base["report"], args.eval_tasks or run.eval.tasks_per_domain),
        "minutes": round(minutes, 2),  # this arm's own training and evaluation
        "minutes_alone": round(minutes + base["minutes"] + (origin["minutes"] if start_from != "base" else 0.0), 2),  # from nothing
        "stages_made_here": [s for s, was in made.items() if not was and (s == "base" or start_from == "sft")],
        "reward_curve": [round(p["rollout/reward_mean"], 4) for p in curve if "rollout/reward_mean" in p],
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
    return {"pass_at_1": round(p, 4), "pass_at_1_se": round(math.sqrt(p * (1 - p) / n), 4)} if p is not None and n else {}


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
        model, report, minutes = base["model"], base["report"], base["minutes"]
        alone = minutes
    else:
        sft = stage(jobs, preset, "sft", args)
        model, started = sft["model"], time.perf_counter()  # this part's own work starts here
        if name == "grpo":
            model = jobs.run("train_grpo", {"preset": preset, "model": sft["model"], "register_as": f"{preset}-grpo",
                                            "max_steps": args.grpo_steps or run.grpo.max_steps,
                                            "output_dir": str(jobs.data / "runs" / "grpo")}, "GRPO")["model"]
        own = time.perf_counter()
        report = jobs.evaluate(preset, model, f"evaluate after {name.upper()}", args.eval_tasks)
        # sft: the warm-up's own minutes and its evaluation; grpo: GRPO and its evaluation. Alone: plus what it starts from
        minutes = (time.perf_counter() - own) / 60 + (sft["minutes"] if name == "sft" else (own - started) / 60)
        alone = minutes + base["minutes"] + (sft["minutes"] if name == "grpo" else 0.0)
    evaluation = type(run.eval).model_validate({**run.eval.model_dump(exclude_unset=True),
                                                **({"tasks_per_domain": args.eval_tasks} if args.eval_tasks else {})})
    general = general_config(evaluation)
    figures = {
        "stage": name, "model": model, **rate_figures(report, "eval/pass@1", len(all_eval_tasks(evaluation))),
        "general": rate_figures(report, "general/pass@1", len(general.domains) * general.tasks_per_domain if general else 0),
        "per_domain": {k.split("/")[1]: round(v, 4) for k, v in report.items() if k.count("/") == 2 and k.endswith("/pass@1")
                       and k.startswith("eval/")},
        "minutes": round(minutes, 2), "minutes_alone": round(alone, 2),
        **({"peak_rss_gb": sft.get("peak_rss_gb", 0.0)} if name == "sft" else {}),  # the SFT run it evaluates
    }
    return write_part(jobs, name, figures)


def combine_stages(preset: str, args: argparse.Namespace) -> None:
    """The stages' results in the workdir as one summary (``bench/results/learning-base-to-instruct.json``)."""
    found = {s: json.loads(p.read_text()) for s in STAGES if (p := args.workdir / "arms" / f"{s}.json").is_file()}
    if missing := [s for s in STAGES if s not in found]:
        raise SystemExit(f"stages {missing} have no result in {args.workdir / 'arms'}: run bench/learning.py --preset {preset} "
                         f"--workdir {args.workdir} --arm NAME for each")
    base, sft, grpo = (found[s] for s in STAGES)

    def gap(a: dict, b: dict) -> tuple[float, float]:
        return (round(100 * (a["pass_at_1"] - b["pass_at_1"]), 2),
                round(100 * (a["pass_at_1_se"] ** 2 + b["pass_at_1_se"] ** 2) ** 0.5, 2))

    (grpo_gain, grpo_se), (sft_gain, sft_se) = gap(grpo, sft), gap(sft, base)
    print(json.dumps({
        "figure": "learning-base-to-instruct", "preset": preset, "model": base["model"],
        "stages": {s: {k: v for k, v in f.items() if k not in ("stage",)} for s, f in found.items()},
        "sft_over_base_points": sft_gain, "sft_over_base_se_points": sft_se,
        "grpo_over_sft_points": grpo_gain, "grpo_over_sft_se_points": grpo_se,
        "goal_met": grpo_gain > 2 * grpo_se and sft_gain > 0,
        "minutes": round(sum(f["minutes"] for f in found.values()), 2), "peak_rss_gb": max(f["peak_rss_gb"] for f in found.values()),
        "peer": {"name": "the stage before", "setting": "the same held-out tasks, greedy, in the same workdir; the base "
                                                        "model in the plain completion format, the others in Gemma's template"},
        "workdir": str(args.workdir),
    }), flush=True)


def peak_rss_gb() -> float:
    """The largest resident set of this process and of the job processes it has waited for, GiB."""
    import resource

    return round(max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 2**20, 3)


def write_part(jobs: Jobs, name: str, figures: dict) -> dict:
    """A part's figures with this process tree's CPU-minutes and peak RSS (or the larger one a reused stage it evaluates
    reported), written to ``<workdir>/arms/<name>.json``
    and printed."""
    import resource

    usage = [resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)]
    figures |= {"cpu_minutes": round(sum(u.ru_utime + u.ru_stime for u in usage) / 60, 2),
                "peak_rss_gb": max(peak_rss_gb(), figures.get("peak_rss_gb", 0.0))}
    path = jobs.workdir / "arms" / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(figures))
    print(json.dumps(figures), flush=True)
    return figures


def domain_figures(report: dict[str, float], before: dict[str, float] | None = None, tasks: int = 0) -> dict:
    """The broad arms' figures: each domain's held-out pass@1 (``tasks`` a domain), and with the model as it
    ships (``before``) each domain's gain, whether it gained or lost beyond twice its standard error, and the mean
    gain over the domains with its standard error; the general check."""
    import math

    def rates(r: dict[str, float]) -> dict[str, float]:
        return {k.split("/")[1]: v for k, v in r.items() if k.startswith("eval/") and k.count("/") == 2 and k.endswith("/pass@1")}

    after = rates(report)
    out: dict = {"pass": {d: round(p, 4) for d, p in after.items()}, "general": report.get("general/pass@1"),
                 "tasks_per_domain": tasks}
    if before is None:
        return out
    was = rates(before)
    per = {}
    for d, p in after.items():
        se = math.sqrt((p * (1 - p) + was[d] * (1 - was[d])) / tasks)
        gain = p - was[d]
        per[d] = {"before": round(was[d], 4), "after": round(p, 4), "gain_points": round(100 * gain, 2), "se_points": round(100 * se, 2),
                  "beyond_noise": "gained" if gain > 2 * se else "lost" if gain < -2 * se else ""}
    gains = [f["gain_points"] for f in per.values()]
    mean = sum(gains) / len(gains)
    # the mean over independent domains: its standard error from the domains' own
    mean_se = math.sqrt(sum(f["se_points"] ** 2 for f in per.values())) / len(per)
    return out | {"per_domain": per, "mean_gain_points": round(mean, 2), "mean_gain_se_points": round(mean_se, 2),
                  "domains_gained": sum(f["beyond_noise"] == "gained" for f in per.values()),
                  "domains_lost": sum(f["beyond_noise"] == "lost" for f in per.values())}


ARM_FIGURES = {"smollm2-repair": arm_figures, "smollm2-broad": domain_figures}  # an arm's figures from its evaluation


def read_arms(preset: str, args: argparse.Namespace) -> tuple[dict[str, dict], dict]:
    """Every arm's result in the workdir and the base stage they start from; exits naming the arms not run yet."""
    found = {arm: json.loads(p.read_text()) for arm in ARMS[preset] if (p := args.workdir / "arms" / f"{arm}.json").is_file()}
    if missing := [arm for arm in ARMS[preset] if arm not in found]:
        raise SystemExit(f"arms {missing} have no result in {args.workdir / 'arms'}: run bench/learning.py --preset {preset} "
                         f"--workdir {args.workdir} --arm NAME for each")
    return found, json.loads((args.workdir / "stages" / "base.json").read_text())


def combine_broad(preset: str, args: argparse.Namespace) -> None:
    """The broad preset's arms as one summary (``bench/results/learning-broad.json`` when recorded): the goals set the
    curriculum against uniform draws; the signal arm shows what signal weights alone did."""
    found, base = read_arms(preset, args)
    uniform, curriculum = found["uniform"], found["curriculum"]
    keys = ("signal_rate", "update_s_per_useful_group", "mean_gain_points", "mean_gain_se_points", "domains_gained",
            "domains_lost", "general", "steps", "minutes", "minutes_alone", "cpu_minutes", "peak_rss_gb", "reward_curve")
    ratio = curriculum["signal_rate"] / uniform["signal_rate"] if uniform["signal_rate"] else float("inf")
    print(json.dumps({
        "figure": "learning-broad", "preset": preset, "model": base["model"], "model_params": base["params"],
        "domains": len(curriculum["per_domain"]), "general_before": base["report"].get("general/pass@1"),
        "arms": {arm: {k: f[k] for k in keys if k in f} | {"general_after": f["general"]} for arm, f in found.items()},
        "tasks_per_domain": curriculum["tasks_per_domain"],
        "per_domain": {d: {"before": f["before"],
                           "before_se_points": round(100 * (f["before"] * (1 - f["before"]) / curriculum["tasks_per_domain"]) ** 0.5, 2),
                           **{arm: found[arm]["per_domain"][d]["after"] for arm in found},
                           **{f"{arm}_gain_points": found[arm]["per_domain"][d]["gain_points"] for arm in found},
                           **{f"{arm}_se_points": found[arm]["per_domain"][d]["se_points"] for arm in found}}
                       for d, f in curriculum["per_domain"].items()},
        "signal_rate_ratio": round(ratio, 3),
        "goals": {"signal_rate_ratio_at_least_1.3": ratio >= 1.3,
                  "curriculum_mean_gain_at_least_5_points": curriculum["mean_gain_points"] >= 5,
                  "curriculum_loses_no_more_domains": curriculum["domains_lost"] <= uniform["domains_lost"]},
        "minutes": round(base["minutes"] + sum(f["minutes"] for f in found.values()), 2),
        "peak_rss_gb": max(f["peak_rss_gb"] for f in found.values()),
        "peer": {"name": "the uniform arm", "setting": "uniform draws over the same domains at their fixed difficulty: the "
                                                      "same model, seed, steps and trajectories, the same held-out tasks"},
        "workdir": str(args.workdir),
    }), flush=True)


def combine_arms(preset: str, args: argparse.Namespace) -> None:
    """The repair arms' results in the workdir as one summary (``bench/results/learning-repair.json`` when recorded)."""
    found, base = read_arms(preset, args)
    sft = json.loads((args.workdir / "stages" / "sft.json").read_text())
    before = arm_figures(base["report"])
    a, b = found["sft-grpo"], found["sft"]
    gap = 100 * (a["pass"]["unseen_functions"] - b["pass"]["unseen_functions"])
    gap_se = 100 * (a["se"]["unseen_functions"] ** 2 + b["se"]["unseen_functions"] ** 2) ** 0.5
    minutes = base["minutes"] + sft["minutes"] + sum(arm["minutes"] for arm in found.values())
    peak = max(f["peak_rss_gb"] for f in found.values())  # GiB
    gained = gap >= 10 and gap > 2 * gap_se
    print(json.dumps({
        "figure": "learning-repair", "preset": preset, "model": base["model"], "model_params": base["params"],
        "pass_before": before["pass"], "pass_before_se": before["se"], "eval_tasks": before["tasks"],
        "episodes_before": before["episodes"], "general_before": before["general"],
        "arms": {arm: {"pass_after": f["pass"], "pass_after_se": f["se"], "general_after": f["general"],
                       "episodes": f["episodes"], "steps": f["steps"], "minutes": f["minutes"],
                       "minutes_alone": f["minutes_alone"], "cpu_minutes": f["cpu_minutes"], "peak_rss_gb": f["peak_rss_gb"],
                       "reward_curve": f["reward_curve"], "groups_used_mean": f["groups_used_mean"]} for arm, f in found.items()},
        "general_after": {arm: f["general"] for arm, f in found.items()},
        "sft": {"demonstrations": sft["demonstrations"], "steps": sft["steps"], "minutes": sft["minutes"]},
        "sft_grpo_over_sft_unseen_functions_points": round(gap, 2), "gap_se_points": round(gap_se, 2),
        "goal_met": gained,
        "goals": {"sft_grpo_over_sft_at_least_10_points_beyond_2_se": gained,
                  "arms_together_within_3_hours": minutes <= 180, "peak_rss_within_8_gib": peak <= 8.0,
                  "each_arm_alone_within_75_minutes": all(f["minutes_alone"] <= 75 for f in found.values())},
        "minutes": round(minutes, 2), "peak_rss_gb": peak,
        "peer": {"name": "the SFT-only arm", "setting": "the same warm-up continued for as many steps as GRPO took, "
                                                      "the same held-out tasks, greedy, in the same workdir"},
        "workdir": str(args.workdir),
    }), flush=True)


def main() -> None:
    from posttrain.training.demo import run_preset
    from posttrain.training.presets import get_preset

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="cpu-demo")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--sft-steps", type=int, default=None)
    parser.add_argument("--grpo-steps", type=int, default=None)
    parser.add_argument("--grpo-lr", type=float, default=None)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the job (real-model presets)")
    parser.add_argument("--eval-tasks", type=int, default=None, help="held-out tasks per domain (default: the preset's)")
    parser.add_argument("--rollout", choices=["sync", "vllm"], default=None,
                        help="the rollout backend of a real-model preset (default: the preset's; vllm: colocated on a GPU host with the gpu extra, else its CPU server from make vllm)")
    parser.add_argument("--device", default=None, help="the learner's and the evaluations' device (default: the preset's)")
    parser.add_argument("--ablation", action="store_true", help="measure each saving of the GRPO step on its own instead")
    parser.add_argument("--ablation-steps", type=int, default=3, help="GRPO steps per ablation variant")
    parser.add_argument("--ablation-variant", choices=list(ABLATIONS), help=argparse.SUPPRESS)  # one variant (a child)
    parser.add_argument("--model-dir", help=argparse.SUPPRESS)
    parser.add_argument("--arms", action="store_true", help="every part of the preset (smollm2-repair: the arms cold, "
                        "sft, sft-grpo; smollm2-broad: uniform, signal, curriculum; gemma3-base-to-instruct: the stages base, "
                        "sft, grpo), each in a process of its own, then their summary")
    parser.add_argument("--arm", choices=sorted({p for parts in PARTS.values() for p in parts}),
                        help="one part; its result goes to <workdir>/arms/<part>.json")
    parser.add_argument("--combine", action="store_true", help="the summary of the arms already run in --workdir")
    parser.add_argument("--stage", choices=["base", "sft"], help="only make this stage the parts share in --workdir (base: "
                        "the model as it ships, evaluated; sft: demonstrations and the SFT warm-up), or reuse it if made")
    args = parser.parse_args()
    if args.arms or args.arm or args.combine or args.stage:
        import subprocess

        parts = PARTS.get(args.preset)
        if parts is None or (args.arm and args.arm not in parts):
            raise SystemExit(f"--arms/--arm/--combine: preset {args.preset} has no parts{' named ' + args.arm if parts else ''}; "
                             + "; ".join(f"{p}: {', '.join(names)}" for p, names in PARTS.items()))

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
                    subprocess.run([sys.executable, __file__, *passed, "--workdir", str(args.workdir), "--arm", part], check=True)
        return {"gemma3-base-to-instruct": combine_stages, "smollm2-broad": combine_broad}.get(args.preset, combine_arms)(args.preset, args)
    if args.ablation_variant:
        print(json.dumps(ablation_variant(args.preset, args.ablation_variant, args.model_dir, args.ablation_steps, args.threads)))
        return None
    if args.ablation:
        return run_ablation(args.preset, args.workdir or Path(tempfile.mkdtemp(prefix="posttrain-ablation-")),
                            args.ablation_steps, args.threads)
    sft = {"max_steps": args.sft_steps} if args.sft_steps else {}
    grpo = {k: v for k, v in (("max_steps", args.grpo_steps), ("lr", args.grpo_lr)) if v}
    workdir = args.workdir
    if workdir is None:
        workdir = Path(tempfile.mkdtemp(prefix="posttrain-learning-"))
        workdir.chmod(0o755)  # the tools preset's sandboxes live under it: the sandbox uid must be able to enter it
    if isinstance(get_preset(args.preset).model, str):
        evaluation = {"tasks_per_domain": args.eval_tasks} if args.eval_tasks else {}
        if args.rollout:
            grpo["rollout"] = {"backend": args.rollout}
        if args.device:
            grpo["device"] = evaluation["device"] = args.device
        return run_as_job(args.preset, workdir, grpo, evaluation, args.threads)
    if args.rollout or args.device:
        raise SystemExit(f"--rollout and --device are for the real-model presets (smollm2-*), not {args.preset}")

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
