"""Rollout throughput: the inference engine path against today's ``generate_groups``, in one run.

    .venv/bin/python bench/rollout.py [--model smollm2-135m-instruct | tiny | DIR] [--group 8]
        [--max-new-tokens 128] [--rounds 3] [--threads 1] [--domains arith.mul.int,code.add,...] [--engine vllm]

Both peers sample GRPO rollout groups from the same model object, the same prompts (one task
from each of a mix of platform task domains, chosen because their completions end at very
different lengths) and the same sampling (temperature 1.0, full distribution, ``--group``
completions a prompt, ``--max-new-tokens``), with the same torch thread count:

- engine: :func:`posttrain.training.inference.rollout_groups` through an
  ``EmbeddedRolloutEngine``, serving's continuous-batching decode loop: each prompt prefilled
  once and its KV cache repeated for its group, finished rows leaving the batch as they finish;
- generate (the peer): :func:`posttrain.training.rollout.generate_groups`, one batched Hugging Face
  ``generate`` with each prompt's KV cache prefilled once for its group, which keeps finished rows
  in the batch until the longest completion ends.

After a warm-up call of each, the peers alternate, engine then generate, for ``--rounds`` rounds
(so load on a shared machine hits both); each round draws new samples (seeded per round). A
trajectory is one completion. Prints one JSON object per peer per round, then the summary
(``figure: rollout``) with ``engine_traj_per_s``, ``generate_traj_per_s``, ``speedup``, token
counts, the completion-length spread of each peer, and the engine's behaviour log-probs against
the learner's recomputation on some of its trajectories (``logprob_mismatch``).

``--engine vllm`` adds vLLM (``VLLMServerEngine``: vLLM from its own environment, ``make vllm``, in a process of its
own, float32, ``--threads`` cores) to the rounds beside the embedded engine, and before every round updates the
learner (a small random step on every weight, a stand-in for an optimizer step) and pushes the new weights into vLLM
through its workers' reload, timed (``vllm_sync_seconds``: the file in shared memory and the reload); the summary adds
``vllm_traj_per_s``, ``vllm_vs_engine`` and vLLM's behaviour log-probs against the learner's after the last update
(``vllm_logprob_mismatch``).

``--model`` (default ``smollm2-135m-instruct``): a registered model, a model directory, or a
built-in name, imported for the run when it is not registered; when the built-in wheel is not
installed, or with ``--model tiny``, a random-init tiny model (whose completions rarely stop
early, so both peers decode nearly every row to the end: labelled in the summary).
"""

from __future__ import annotations

import os
import sys

# bench/ holds files named like standard modules (queue.py): keep it off the import path.
if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    sys.path.pop(0)

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from posttrain.platform.engines.vllm import VllmProfile  # noqa: E402
from posttrain.platform.verifiers import TaskSpec  # noqa: E402
from posttrain.training.inference import EmbeddedRolloutEngine, rollout_groups  # noqa: E402
from posttrain.training.logprob_check import measure_logprob_mismatch  # noqa: E402
from posttrain.training.rollout import RolloutGroup, SamplingConfig, generate_groups  # noqa: E402
from posttrain.training.vllm_engines import VLLMServerEngine  # noqa: E402

# one task each: short answers (month names, yes/no, unit conversions) next to code and chatty arithmetic
DOMAINS = ("dates.month_name", "dates.leap_year", "units.km_to_m", "compare.larger.int", "dates.add_days",
           "code.add", "arith.mul.int", "code.fizzbuzz")  # fmt: skip
REAL_MODEL = "smollm2-135m-instruct"


def model_dir(ref: str, tmp: Path) -> tuple[str, str]:
    """(path, name) of ``ref``: ``tiny`` builds one; a directory is itself; a name is the registered
    model, else the built-in imported for this run, else (no built-in wheel) the tiny model."""
    from posttrain.platform.auth import Identity
    from posttrain.platform.db.models import Role
    from posttrain.platform.engines import ModelDirError
    from posttrain.platform.models import TinyModelSpec, build_tiny_model
    from posttrain.platform.models.importer import BUILTIN_PREFIX, import_model
    from posttrain.platform.models.registry import get_model

    if ref != "tiny" and Path(ref).is_dir():
        return str(Path(ref).resolve()), Path(ref).name
    name = ref.removeprefix(BUILTIN_PREFIX)
    if ref != "tiny":
        try:
            return get_model(name).path, name
        except Exception:  # not registered, or no platform database here
            from posttrain.platform.db import migrate

            url = f"sqlite:///{tmp / 'bench.db'}"
            migrate.upgrade(url)
            try:
                return import_model(
                    Identity("bench", Role.operator), f"{BUILTIN_PREFIX}{name}", url=url, dest_root=tmp / "models"
                ).path, name
            except ModelDirError as exc:
                print(f"{ref}: {exc}; measuring the tiny model instead", file=sys.stderr)
    return str(build_tiny_model(tmp / "tiny", TinyModelSpec())), "tiny"


def tasks_of(domains: list[str], seed: int) -> list[TaskSpec]:
    from posttrain.platform.tasks.domains import generate

    return [generate(name, 1, seed=seed)[0] for name in domains]


def timed(run: Callable[[int], list[RolloutGroup]], seed: int) -> tuple[list[RolloutGroup], float]:
    start = time.perf_counter()
    groups = run(seed)
    return groups, time.perf_counter() - start


def lengths(groups: list[RolloutGroup]) -> list[int]:
    return [len(t.completion_ids) for g in groups for t in g.trajectories]


def spread(all_groups: list[list[RolloutGroup]]) -> dict[str, float]:
    """Completion lengths over every round: mean, quartiles, extremes, the share that stopped early."""
    ls = [n for groups in all_groups for n in lengths(groups)]
    q = statistics.quantiles(ls, n=4)
    finished = [t.finished for groups in all_groups for g in groups for t in g.trajectories]
    return {"mean": round(statistics.fmean(ls), 1), "min": min(ls), "p25": q[0], "p50": q[1], "p75": q[2],
            "max": max(ls), "finished_share": round(sum(finished) / len(finished), 3)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        default=REAL_MODEL,
        help=f"a registered model, a model directory, a built-in name, or tiny (default: {REAL_MODEL})",
    )
    parser.add_argument("--domains", default=",".join(DOMAINS), help="comma-separated task domains, one prompt each")
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads, the same for both peers")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--check-trajectories", type=int, default=8, help="engine trajectories whose log-probs the learner recomputes"
    )
    parser.add_argument(
        "--engine",
        choices=["embedded", "vllm"],
        default="embedded",
        help="vllm: add vLLM rollouts with a weight update before every round",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    domains = [d for d in args.domains.split(",") if d]
    sampling = SamplingConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature)

    tmp = tempfile.TemporaryDirectory(
        prefix="posttrain-bench-rollout-"
    )  # vLLM reads the model directory: kept to the end
    t0 = time.perf_counter()
    path, name = model_dir(args.model, Path(tmp.name))
    ready_s = time.perf_counter() - t0
    engine = EmbeddedRolloutEngine.from_dir(path)
    model, tokenizer, tasks = engine.model, engine.tokenizer, tasks_of(domains, args.seed)
    peers: dict[str, Callable[[int], list[RolloutGroup]]] = {
        "engine": lambda r: rollout_groups(engine, tokenizer, tasks, args.group, sampling, seed=r),
        "generate": lambda r: (torch.manual_seed(r), generate_groups(model, tokenizer, tasks, args.group, sampling))[1],
    }
    vllm: VLLMServerEngine | None = None
    if args.engine == "vllm":
        started = time.perf_counter()
        vllm = VLLMServerEngine(path, args=VllmProfile.for_rollouts(path, dtype="float32", device="cpu", enforce_eager=True,
                                                                    cpu_threads=args.threads, seed=args.seed))  # fmt: skip
        vllm_ready_s = time.perf_counter() - started
        peers["vllm"] = lambda r: rollout_groups(vllm, tokenizer, tasks, args.group, sampling, seed=r)  # type: ignore[union-attr]
    warm = SamplingConfig(max_new_tokens=4, temperature=args.temperature)
    for peer in peers:
        (rollout_groups(vllm if peer == "vllm" else engine, tokenizer, tasks[:1], 2, warm, seed=0) if peer != "generate"
         else generate_groups(model, tokenizer, tasks[:1], 2, warm))  # fmt: skip
    seconds = {p: 0.0 for p in peers}
    runs: dict[str, list[list[RolloutGroup]]] = {p: [] for p in peers}
    sync_s: list[float] = []
    for r in range(args.rounds):
        if vllm is not None:  # an update: the learner's weights move, and go to vLLM before it samples again
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter.add_(1e-3 * torch.randn_like(parameter))
            engine.version = r + 1
            started = time.perf_counter()
            vllm.load_weights(model.state_dict(), r + 1)
            sync_s.append(time.perf_counter() - started)
        for peer, run in peers.items():
            groups, elapsed = timed(run, args.seed * 1000 + r)
            seconds[peer] += elapsed
            runs[peer].append(groups)
            ls = lengths(groups)
            print(json.dumps({"figure": "rollout_round", "peer": peer, "round": r, "seconds": round(elapsed, 2),
                              "trajectories": len(ls), "tokens": sum(ls), "traj_per_s": round(len(ls) / elapsed, 3),
                              "tokens_per_s": round(sum(ls) / elapsed, 1)}), flush=True)  # fmt: skip

    checked = [t for g in runs["engine"][-1] for t in g.trajectories][: args.check_trajectories]
    mismatch = measure_logprob_mismatch(model, checked, pad_id=engine.pad_token_id, temperature=args.temperature)
    traj = {p: sum(len(lengths(g)) for g in runs[p]) for p in peers}
    tokens = {p: sum(sum(lengths(g)) for g in runs[p]) for p in peers}
    rate = {p: traj[p] / seconds[p] for p in peers}
    print(json.dumps({
        "figure": "rollout", "model": name, "model_params": sum(p.numel() for p in model.parameters()),
        "model_ready_seconds": round(ready_s, 1),
        "engine_traj_per_s": round(rate["engine"], 3), "generate_traj_per_s": round(rate["generate"], 3),
        "speedup": round(rate["engine"] / rate["generate"], 3),
        "engine_tokens_per_s": round(tokens["engine"] / seconds["engine"], 1),
        "generate_tokens_per_s": round(tokens["generate"] / seconds["generate"], 1),
        "engine_tokens": tokens["engine"], "generate_tokens": tokens["generate"],
        "engine_seconds": round(seconds["engine"], 1), "generate_seconds": round(seconds["generate"], 1),
        "trajectories_per_peer": traj["engine"], "prompts": len(tasks), "group": args.group,
        "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "threads": args.threads,
        "rounds": args.rounds, "domains": domains,
        "engine_lengths": spread(runs["engine"]), "generate_lengths": spread(runs["generate"]),
        "logprob_mismatch": {"trajectories": len(checked)} | {k: float(f"{v:.3g}") for k, v in mismatch.metrics("").items()},
        "note": "random-init tiny model: completions rarely stop early" if name == "tiny" else None,
        **(vllm_summary(vllm, runs, seconds, rate, sync_s, vllm_ready_s, model, engine.pad_token_id, args) if vllm else {}),
        "peer": {"name": "generate_groups: one batched Hugging Face generate, each prompt prefilled once for its group",
                 "threads": args.threads, "rounds": args.rounds, "warmup": "one 4-token call of each",
                 "order": f"{', then '.join(peers)} in every round, the same prompts and sampling"},
    }), flush=True)  # fmt: skip
    if vllm is not None:
        vllm.close()
    tmp.cleanup()


def vllm_summary(
    vllm: VLLMServerEngine,
    runs: dict[str, list[list[RolloutGroup]]],
    seconds: dict[str, float],
    rate: dict[str, float],
    sync_s: list[float],
    ready_s: float,
    model,
    pad_id: int,
    args,
) -> dict[str, object]:
    """vLLM beside the embedded engine: its rate, each update's sync time, its log-probs after the last update."""
    checked = [t for g in runs["vllm"][-1] for t in g.trajectories][: args.check_trajectories]
    mismatch = measure_logprob_mismatch(model, checked, pad_id=pad_id, temperature=args.temperature)
    tokens = sum(sum(lengths(g)) for g in runs["vllm"])
    return {
        "vllm_traj_per_s": round(rate["vllm"], 3), "vllm_vs_engine": round(rate["vllm"] / rate["engine"], 3),
        "vllm_tokens_per_s": round(tokens / seconds["vllm"], 1), "vllm_seconds": round(seconds["vllm"], 1),
        "vllm_ready_seconds": round(ready_s, 1), "vllm_threads": args.threads,
        "vllm_sync_seconds": [round(s, 2) for s in sync_s], "vllm_sync_seconds_mean": round(statistics.fmean(sync_s), 2),
        "vllm_reload_seconds": [round(s, 2) for s in vllm.sync_seconds],
        "vllm_lengths": spread(runs["vllm"]),
        "vllm_logprob_mismatch": {"trajectories": len(checked), "after_update": vllm.version}
        | {k: float(f"{v:.3g}") for k, v in mismatch.metrics("").items()},
    }  # fmt: skip


if __name__ == "__main__":
    main()
