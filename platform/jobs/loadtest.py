"""Drain a queue of trivial jobs with several real worker processes and measure it.

Used by ``bench/queue.py`` and by the tests that prove every job runs exactly
once and priorities are honoured under concurrency.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from sqlmodel import col, select

from posttrain.platform.auth import Identity
from posttrain.platform.db.engine import session
from posttrain.platform.db.models import Job, JobStatus, Role
from posttrain.platform.jobs import queue

LOADTEST = Identity("loadtest", Role.operator)  # who queues the load


@dataclass(frozen=True)
class DrainReport:
    jobs: int
    workers: int
    seconds: float
    claims_per_s: float
    succeeded: int
    executions: int  # lines in the mark file: how many times job code ran
    ran_more_than_once: int
    never_ran: int
    max_priority_inversion: int  # worst count of higher-priority jobs claimed after a lower one


def drain(
    url: str, data_dir: Path, *, jobs: int, workers: int, slots: int = 4, priorities: int = 5, seed: int = 0,
    timeout_s: float = 600.0,
) -> DrainReport:  # fmt: skip
    """Queue ``jobs`` no-op selftest jobs with random priorities and drain them with ``workers`` processes."""
    data_dir.mkdir(parents=True, exist_ok=True)
    marks = data_dir / "executions.txt"
    marks.unlink(missing_ok=True)
    rng = random.Random(seed)
    cfg = {"steps": 0, "sleep_s": 0, "mark_file": str(marks)}
    ids = queue.submit_many(
        LOADTEST, "selftest", [cfg] * jobs, [rng.randrange(priorities) for _ in range(jobs)], url=url
    )
    env = {
        **os.environ,
        "POSTTRAIN_DATABASE_URL": url,
        "POSTTRAIN_DATA_DIR": str(data_dir),
        "POSTTRAIN_LOG_LEVEL": "WARNING",
    }
    cmd = [sys.executable, "-m", "posttrain.platform.cli", "worker", "--exit-when-idle", "--cpu-slots", str(slots)]
    start = time.perf_counter()
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for _ in range(workers)]
    try:
        for p in procs:
            p.wait(timeout=timeout_s)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    seconds = time.perf_counter() - start
    failed = [p for p in procs if p.returncode != 0]
    if failed:
        raise RuntimeError(f"worker exited with {failed[0].returncode}: {failed[0].stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]

    with session(url, read_only=True) as s:
        rows = s.exec(select(Job).where(col(Job.id).in_(ids))).all()
    runs = Counter(int(line.split()[0]) for line in marks.read_text().splitlines()) if marks.exists() else Counter()
    by_claim = sorted(rows, key=lambda j: (j.claimed_at, j.id))
    worst = 0
    higher_later = Counter[int]()
    for job in reversed(by_claim):  # count higher-priority jobs claimed after each job
        worst = max(worst, sum(n for p, n in higher_later.items() if p > job.priority))
        higher_later[job.priority] += 1
    return DrainReport(
        jobs=jobs,
        workers=workers,
        seconds=seconds,
        claims_per_s=jobs / seconds,
        succeeded=sum(1 for j in rows if j.status is JobStatus.succeeded and j.attempts == 1),
        executions=sum(runs.values()),
        ran_more_than_once=sum(1 for n in runs.values() if n > 1),
        never_ran=sum(1 for i in ids if runs[i] == 0),
        max_priority_inversion=worst,
    )
