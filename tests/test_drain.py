"""Many worker processes drain a big queue: every job exactly once, priorities honoured."""

from __future__ import annotations

from datetime import UTC
from pathlib import Path

import pytest
from conftest import OPERATOR, _truncate_pg

from posttrain.platform.jobs.loadtest import drain

pytestmark = pytest.mark.slow


def _check(report, jobs: int, workers: int, slots: int) -> None:  # type: ignore[no-untyped-def]
    assert report.succeeded == jobs, report
    assert report.executions == jobs and report.never_ran == 0 and report.ran_more_than_once == 0, report
    # A claim can only skip rows that other workers hold locked at that moment.
    assert report.max_priority_inversion <= workers * slots, report


def test_four_workers_drain_2000_jobs_on_postgres(pg_url: str, tmp_path: Path) -> None:
    _truncate_pg(pg_url)
    report = drain(pg_url, tmp_path, jobs=2000, workers=4, slots=4)
    _check(report, 2000, 4, 4)


def test_three_workers_drain_300_jobs_on_sqlite(sqlite_url: str, tmp_path: Path) -> None:
    report = drain(sqlite_url, tmp_path, jobs=300, workers=3, slots=4)
    _check(report, 300, 3, 4)


def test_a_claim_is_dated_when_it_holds_the_lock(sqlite_url: str) -> None:
    """On SQLite claims queue on the write lock. A claim that waited must be dated after the lock was
    released, not when the call began: a stale date sorts it before claims it came after, which read
    back as the priority inversions this suite once measured (14 against a bound of 12 under load;
    every job is queued before the drain, so in true claim order there are none on SQLite)."""
    import sqlite3
    import threading
    import time

    from posttrain.platform.db.models import utcnow
    from posttrain.platform.jobs import queue

    queue.submit(OPERATOR, "selftest", {"steps": 0}, url=sqlite_url)
    holder = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another writer holds the lock
    claimed: dict[str, object] = {}
    claimer = threading.Thread(target=lambda: claimed.update(job=queue.claim("w1", 4, 0, url=sqlite_url)))
    claimer.start()
    time.sleep(0.5)
    released = utcnow()
    holder.execute("ROLLBACK")
    claimer.join(timeout=30)
    holder.close()
    job = claimed["job"]
    assert job is not None
    stamp = job.claimed_at if job.claimed_at.tzinfo else job.claimed_at.replace(tzinfo=UTC)  # type: ignore[union-attr]
    assert stamp >= released, (stamp, released)
