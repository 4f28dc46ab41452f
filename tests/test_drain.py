"""Many worker processes drain a big queue: every job exactly once, priorities honoured."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import _truncate_pg
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
