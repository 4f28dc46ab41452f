"""Sandbox benchmark: warm pool vs. a fresh ``bwrap ... python3 -c`` per call.

Run: ``.venv/bin/python bench/sandbox.py [--pool-size 4] [--calls 2000] [--seconds 10]``.
Prints one JSON object per figure (with the peer's figure beside it), then one
summary object on the last line, with ``peer`` (the peer's setting). Both sides
get the same warm-up (``--warmup`` calls, untimed) and the same concurrency for
the episode rate (``--threads``).
"""

from __future__ import annotations

import sys
from pathlib import Path

# Running `python bench/sandbox.py` puts bench/ first on sys.path, where a sibling
# script (bench/queue.py) would shadow the standard library's module of that name.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from posttrain.platform.sandbox import SandboxConfig, SandboxPool  # noqa: E402
from posttrain.platform.sandbox.backends import bwrap_argv, run_as, sandbox_env  # noqa: E402
from posttrain.platform.sandbox.pool import percentile  # noqa: E402

TRIVIAL = "x = 1"


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def stats(samples: list[float]) -> dict[str, float]:
    return {"p50": round(percentile(samples, 0.5), 3), "p99": round(percentile(samples, 0.99), 3), "n": len(samples)}


def emit(obj: dict[str, object]) -> None:
    print(json.dumps(obj), flush=True)


def fresh_call(config: SandboxConfig, server: Path, work: Path, code: str) -> None:
    """The common way: one new bubblewrap sandbox and interpreter per tool call."""
    argv = bwrap_argv(config, server, work, [config.python_executable, "-c", code])
    owner = run_as(config)
    subprocess.run(
        argv,
        check=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=60,
        env=sandbox_env("/work", "/tmp"),
        user=owner[0] if owner else None,
        group=owner[1] if owner else None,
        extra_groups=[] if owner else None,
    )


def episodes_for(seconds: float, threads: int, episode: callable) -> float:  # type: ignore[valid-type]
    done = [0] * threads
    stop = time.monotonic() + seconds

    def loop(i: int) -> None:
        while time.monotonic() < stop:
            episode()
            done[i] += 1

    workers = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    started = time.monotonic()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return round(sum(done) / (time.monotonic() - started) * 60, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool-size", type=int, default=4)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--acquires", type=int, default=300)
    parser.add_argument("--fresh", type=int, default=40)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=2, help="concurrent episodes (the host has 2 cores)")
    parser.add_argument("--warmup", type=int, default=50, help="untimed calls before timing, each side")
    args = parser.parse_args()

    data_dir = Path(tempfile.mkdtemp(prefix="posttrain-bench-sandbox-"))
    data_dir.chmod(0o755)
    config = SandboxConfig(pool_size=args.pool_size)
    try:
        with SandboxPool(config, data_dir=data_dir) as pool:
            # 1. acquire from a warm pool
            acquire = []
            for _ in range(args.acquires):
                pool.wait_ready(30)
                t = time.perf_counter()
                sandbox = pool.checkout()
                acquire.append(ms(time.perf_counter() - t))
                pool.release(sandbox)
            acquire_s = stats(acquire)
            emit({"figure": "acquire_ms", **acquire_s, "goal_p50_below": 1.0})

            # 2. round trip of a trivial python tool call
            with pool.acquire() as sandbox:
                for _ in range(args.warmup):
                    sandbox.run_python(TRIVIAL)
                trips = []
                for _ in range(args.calls):
                    t = time.perf_counter()
                    result = sandbox.run_python(TRIVIAL)
                    trips.append(ms(time.perf_counter() - t))
                    assert result.ok, result

            # 3. the peer: a fresh bwrap + python3 -c per call, same sandbox flags
            work = data_dir / "fresh-work"
            work.mkdir()
            owner = run_as(config)
            if owner:
                os.chown(work, *owner)
            server = pool.directory / "server.py"
            for _ in range(args.warmup):
                fresh_call(config, server, work, TRIVIAL)
            fresh = []
            for _ in range(args.fresh):
                t = time.perf_counter()
                fresh_call(config, server, work, TRIVIAL)
                fresh.append(ms(time.perf_counter() - t))
            trip_s, fresh_s = stats(trips), stats(fresh)
            speedup = round(fresh_s["p50"] / trip_s["p50"], 1)
            emit(
                {
                    "figure": "roundtrip_ms",
                    **trip_s,
                    "peer_fresh_bwrap_p50": fresh_s["p50"],
                    "goal_p50_max": 5.0,
                    "goal_p99_max": 20.0,
                }
            )
            emit({"figure": "fresh_bwrap_python_ms", **fresh_s, "peer_warm_pool_p50": trip_s["p50"]})
            emit({"figure": "speedup", "value": speedup, "goal_min": 15.0})

            # 4. sustained episodes per minute: acquire, 3 python calls and a file write, release
            def warm_episode() -> None:
                with pool.acquire() as sb:
                    sb.write_file("sol.py", "def f(x):\n    return 2 * x\n")
                    sb.run_python("from sol import f")
                    sb.run_python("y = f(21)")
                    assert sb.run_python("y").value == "42"

            def fresh_episode() -> None:
                for code in ("def f(x): return 2 * x", "y = 42", "print(42)", "print(42)"):
                    fresh_call(config, server, work, code)

            pool.wait_ready(30)
            warm_rate = episodes_for(args.seconds, args.threads, warm_episode)
            fresh_seconds = max(args.seconds / 2, 3.0)
            fresh_rate = episodes_for(fresh_seconds, args.threads, fresh_episode)
            emit(
                {
                    "figure": "episodes_per_min",
                    "value": warm_rate,
                    "peer_fresh_bwrap": fresh_rate,
                    "threads": args.threads,
                    "cpus": os.cpu_count(),
                }
            )
            status = pool.status()
        peer = {
            "name": "a fresh bwrap + python3 -c per call, same sandbox flags",
            "warmup_calls": args.warmup,
            "calls": args.fresh,
            "episode_threads": args.threads,
            "episode_seconds": fresh_seconds,
        }
        emit(
            {
                "figure": "sandbox",
                "acquire_p50_ms": acquire_s["p50"],
                "acquire_p99_ms": acquire_s["p99"],
                "roundtrip_p50_ms": trip_s["p50"],
                "roundtrip_p99_ms": trip_s["p99"],
                "fresh_p50_ms": fresh_s["p50"],
                "fresh_p99_ms": fresh_s["p99"],
                "speedup": speedup,
                "episodes_per_min": warm_rate,
                "fresh_episodes_per_min": fresh_rate,
                "backend": config.backend,
                "pool_size": config.pool_size,
                "failures": status.failures,
                "calls": args.calls,
                "warmup_calls": args.warmup,
                "episode_threads": args.threads,
                "episode_seconds": args.seconds,
                "peer": peer,
            }
        )
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
