"""What a running job sees: its config, a logger, progress, checkpoints, metrics.

A :class:`JobContext` lives inside the job's own process. Database writes are
one short transaction each, retried while the database is briefly out of reach
(a server restart); progress is throttled so a tight loop does not
flood the database.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from sqlalchemy import update
from sqlmodel import col, select

from posttrain.platform.auth import Identity, job_identity
from posttrain.platform.db.engine import retry_transient, session
from posttrain.platform.db.models import Job, JobStatus, Metric
from posttrain.platform.settings import Settings

PROGRESS_MIN_INTERVAL_S = 0.5


class JobStopped(Exception):
    """Raised by :meth:`JobContext.check_stop` after the job was asked to stop."""


class JobContext:
    def __init__(
        self,
        job_id: int,
        kind: str,
        config: BaseModel,
        attempt: int,
        checkpoint: dict[str, Any] | None,
        workdir: Path,
        settings: Settings,
        *,
        url: str | None = None,
    ) -> None:
        self.job_id = job_id
        self.kind = kind
        self.config = config
        self.attempt = attempt
        self.checkpoint = checkpoint
        self.workdir = workdir
        self.settings = settings
        self.url = url or settings.resolved_database_url
        self.log = logging.getLogger(f"posttrain.job.{job_id}")
        self._stop = threading.Event()
        self._last_progress = 0.0

    @property
    def identity(self) -> Identity:
        """Who the job acts as in the platform's actions (registering what it built, ...)."""
        return job_identity(self.job_id)

    # --- stopping ---------------------------------------------------------------
    def request_stop(self) -> None:
        self._stop.set()

    @property
    def should_stop(self) -> bool:
        return self._stop.is_set()

    def check_stop(self) -> None:
        if self._stop.is_set():
            raise JobStopped(f"job {self.job_id} was asked to stop")

    def sleep(self, seconds: float) -> None:
        """Sleep, waking early (and raising :class:`JobStopped`) when asked to stop."""
        if self._stop.wait(seconds):
            self.check_stop()

    # --- reporting --------------------------------------------------------------
    def progress(self, fraction: float | None, message: str = "", *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_progress < PROGRESS_MIN_INTERVAL_S:
            return
        self._last_progress = now
        value = None if fraction is None else max(0.0, min(1.0, float(fraction)))

        def write() -> None:
            with session(self.url) as s:
                # only while it runs: a late report never replaces the message its end left (queue.final_message)
                s.exec(
                    update(Job)
                    .where(col(Job.id) == self.job_id, col(Job.status) == JobStatus.running)
                    .values(progress=value, progress_message=message[:500])
                )

        retry_transient(write, what="recording progress")

    def save_checkpoint(self, state: dict[str, Any]) -> None:
        """Persist small resumable state (JSON); big state goes to files under ``workdir``."""
        json.dumps(state)  # fail here, not in the database driver, if it is not JSON

        def write() -> None:
            with session(self.url) as s:
                s.exec(update(Job).where(col(Job.id) == self.job_id).values(checkpoint=state))

        retry_transient(write, what="saving the checkpoint")
        self.checkpoint = state

    def log_metrics(self, step: int, values: dict[str, float]) -> None:
        """Record metrics for ``step``; re-logging a step after a resume replaces it, never duplicates.
        Every write here is one transaction, retried while the database is briefly out of reach."""

        def write() -> None:
            with session(self.url) as s:
                existing = {
                    m.name: m
                    for m in s.exec(select(Metric).where(Metric.job_id == self.job_id, Metric.step == step)).all()
                }
                for name, value in values.items():
                    row = existing.get(name)
                    if row is None:
                        s.add(Metric(job_id=self.job_id, step=step, name=name, value=float(value)))
                    else:
                        row.value = float(value)
                        s.add(row)

        retry_transient(write, what=f"logging the metrics of step {step}")
