"""The job queue: submit, claim, cancel, finish and recover, each one transaction.

Claiming takes the highest-priority, oldest queued job that fits the free
resource slots. On PostgreSQL the candidate row is locked with
``FOR UPDATE SKIP LOCKED`` so concurrent workers never claim the same job; on
SQLite the whole claim is one ``BEGIN IMMEDIATE`` transaction, which holds the
single write lock.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

import psutil
from sqlalchemy import func, update
from sqlmodel import col, select

from posttrain.platform.auth import Identity, action
from posttrain.platform.db.engine import session
from posttrain.platform.db.models import AuditLog, Job, JobStatus, Role, utcnow
from posttrain.platform.db.models import Worker as WorkerRow
from posttrain.platform.jobs.registry import JobConfigError, get_kind, serving_kinds, validate_config
from posttrain.platform.settings import get_settings

HOSTNAME = socket.gethostname()


class JobNotFound(LookupError):
    pass


def _job(s, job_id: int) -> Job:
    job = s.get(Job, job_id)
    if job is None:
        raise JobNotFound(f"no job with id {job_id}; `posttrain jobs list` shows the jobs there are")
    return job


PRIORITIES = range(-1_000_000, 1_000_001)  # what a job's priority may be (the column is a 32-bit integer)


def check_priority(priority: Any) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int) or priority not in PRIORITIES:
        raise JobConfigError(f"priority {priority!r} is out of range; give a whole number from {PRIORITIES.start} "
                             f"to {PRIORITIES.stop - 1} (higher runs first)")  # fmt: skip
    return priority


@action("job.submit", Role.operator)
def submit(
    identity: Identity,
    kind: str,
    config: dict[str, Any] | None = None,
    *,
    priority: int = 0,
    max_attempts: int | None = None,
    timeout_s: float | None = None,
    url: str | None = None,
) -> int:
    """Validate and enqueue a job submitted by ``identity``; returns its id. Nothing is written when
    validation fails."""
    job_kind = get_kind(kind)
    validated = validate_config(kind, config)
    check_priority(priority)
    admitted = job_kind.admit(identity, validated, url) if job_kind.admit is not None else []
    with session(url) as s:
        job = Job(
            kind=kind,
            config=validated.model_dump(mode="json"),
            priority=priority,
            cpu_slots=job_kind.cpu_slots,
            gpu_slots=job_kind.gpu_slots,
            max_attempts=max_attempts or job_kind.max_attempts,
            timeout_s=timeout_s,
            submitted_by=identity.username,
        )
        s.add(job)
        s.flush()
        s.add(AuditLog(username=identity.username, action="job.submit", target=f"job:{job.id}", details={"kind": kind}))
        s.add_all(
            AuditLog(username=identity.username, action=a.action, target=a.target, details={"job": job.id, **a.details})
            for a in admitted
        )
        assert job.id is not None
        return job.id


@action("job.submit_many", Role.operator)
def submit_many(
    identity: Identity, kind: str, configs: list[dict[str, Any]], priorities: list[int], *, url: str | None = None
) -> list[int]:
    """Enqueue many jobs of one kind in one transaction (bulk loads, benchmarks, tests)."""
    job_kind = get_kind(kind)
    validated = [validate_config(kind, cfg) for cfg in configs]
    if job_kind.admit is not None and any(job_kind.admit(identity, v, url) for v in validated):
        raise JobConfigError(f"{kind} jobs that override a check are submitted one at a time (each audited)")
    rows = [
        Job(
            kind=kind,
            config=v.model_dump(mode="json"),
            priority=check_priority(prio),
            cpu_slots=job_kind.cpu_slots,
            gpu_slots=job_kind.gpu_slots,
            max_attempts=job_kind.max_attempts,
            submitted_by=identity.username,
        )
        for v, prio in zip(validated, priorities, strict=True)
    ]
    with session(url) as s:
        s.add_all(rows)
        s.flush()
        s.add(AuditLog(username=identity.username, action="job.submit_many", target=kind, details={"jobs": len(rows)}))
        return [r.id for r in rows if r.id is not None]


def claim(worker_id: str, free_cpu: int, free_gpu: int, free_serving: int = 0, *, url: str | None = None) -> Job | None:
    """Atomically take the best queued job that fits (a serving kind's job only into a free serving slot); it comes
    back marked running."""
    now = utcnow()
    with session(url) as s:
        stmt = (
            select(Job)
            .where(
                Job.status == JobStatus.queued,
                col(Job.not_before) <= now,
                col(Job.cpu_slots) <= free_cpu,
                col(Job.gpu_slots) <= free_gpu,
            )
            .order_by(col(Job.priority).desc(), col(Job.id).asc())
            .limit(1)
            .with_for_update(skip_locked=True)
        )
        if free_serving <= 0:
            stmt = stmt.where(col(Job.kind).not_in(serving_kinds()))
        job = s.exec(stmt).first()
        if job is None:
            return None
        # Stamped now that the claim holds its lock (SQLite's write lock, PostgreSQL's row lock), not
        # when the call began: a worker that waited for the lock behind others would otherwise date
        # its claim before theirs, and the claim order read back from claimed_at would show
        # priority inversions that never happened.
        claimed = utcnow()
        job.status = JobStatus.running
        job.attempts += 1
        job.claimed_at = claimed
        job.started_at = claimed
        job.heartbeat_at = claimed
        job.finished_at = None
        job.worker_id = worker_id
        job.host = HOSTNAME
        job.pid = None
        job.proc_started = None
        job.exit_code = None
        job.error = None
        job.error_cause = None
        s.add(job)
        s.flush()
        s.refresh(job)
        return job


def record_process(job_id: int, pid: int, proc_started: float, log_path: str, *, url: str | None = None) -> None:
    with session(url) as s:
        s.exec(update(Job).where(col(Job.id) == job_id).values(pid=pid, proc_started=proc_started, log_path=log_path))


def heartbeat(job_ids: list[int], *, url: str | None = None) -> None:
    if not job_ids:
        return
    with session(url) as s:
        s.exec(
            update(Job)
            .where(col(Job.id).in_(job_ids), col(Job.status) == JobStatus.running)
            .values(heartbeat_at=utcnow())
        )


def cancel_requested(job_ids: list[int], *, url: str | None = None) -> set[int]:
    if not job_ids:
        return set()
    with session(url, read_only=True) as s:
        rows = s.exec(select(Job.id).where(col(Job.id).in_(job_ids), col(Job.cancel_requested).is_(True)))
        return {int(cast(int, r)) for r in rows}  # primary keys: never None


CANCELLED_QUEUED = "cancelled before it started"
MESSAGE_MAX = 500  # the progress_message a job reports is cut to this length too (JobContext.progress)


def took(seconds: float) -> str:
    """A duration as people read it: ``41 s``, ``3 min 20 s``, ``2 h 5 min``."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def final_message(job: Job, now: datetime) -> str:
    """The progress message a job keeps once its attempt has ended: how it ended, in place of the last
    thing it reported while running ("7/8 pages" on a job that succeeded says nothing true any more)."""
    ran = f" after {took((now - job.started_at).total_seconds())}" if job.started_at is not None else ""
    if job.status == JobStatus.succeeded:
        text = (
            f"succeeded in {took((now - job.started_at).total_seconds())}"
            if job.started_at is not None
            else "succeeded"
        )
    elif job.status == JobStatus.failed:
        text = f"failed{ran}: {job.error or 'no cause recorded'}"
    elif job.status == JobStatus.cancelled:
        text = job.error if job.error == CANCELLED_QUEUED else f"cancelled{ran}"
    elif job.status == JobStatus.interrupted:
        text = job.error or "interrupted: the worker running it stopped"
    elif job.status == JobStatus.queued:  # an attempt ended and another follows
        text = f"queued again for attempt {job.attempts + 1} of {job.max_attempts}, after: {job.error or 'an interruption'}"
    else:
        text = job.progress_message
    return text[:MESSAGE_MAX]


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended, as the worker saw it."""

    exit_code: int | None
    result: dict[str, Any] | None = None
    error: str | None = None
    cause: str | None = None  # oom, timeout, bad_input, disk_full, transient, infrastructure, error
    interrupted: bool = False  # stopped by the platform (shutdown, lost worker), not by the job


def finish(
    job_id: int,
    outcome: Outcome,
    *,
    expected_worker: str | None = None,
    backoff_s: float = 2.0,
    url: str | None = None,
) -> JobStatus | None:
    """Record the end of an attempt and decide what comes next; returns the new status.

    With ``expected_worker``, nothing happens (None is returned) unless the job
    is still running under that worker: a recovered job is never finished twice.
    """
    now = utcnow()
    with session(url) as s:
        job = _job(s, job_id)
        if expected_worker is not None and (job.status != JobStatus.running or job.worker_id != expected_worker):
            return None
        kind = get_kind(job.kind)
        job.exit_code = outcome.exit_code
        job.heartbeat_at = now
        job.pid = None
        job.proc_started = None
        if job.cancel_requested:
            status = JobStatus.cancelled
            job.error = "cancelled by request"
            job.error_cause = "cancelled"
        elif outcome.interrupted:
            status = JobStatus.queued if kind.resumable and job.attempts < job.max_attempts else JobStatus.interrupted
            job.error = outcome.error or "interrupted: the worker running it stopped"
            job.error_cause = "infrastructure"
        elif outcome.exit_code == 0:
            status = JobStatus.succeeded
            job.result = outcome.result
            job.error = None
            job.error_cause = None
            job.progress = 1.0
        else:
            # a full disk stays full until someone frees it: retrying would only burn the attempts
            worth_retrying = outcome.cause == "transient" or (
                kind.retryable and outcome.cause not in ("bad_input", "timeout", "disk_full")
            )
            retry = worth_retrying and job.attempts < job.max_attempts
            status = JobStatus.queued if retry else JobStatus.failed
            job.error = outcome.error or f"exited with code {outcome.exit_code}"
            job.error_cause = outcome.cause or "error"
        job.status = status
        if status == JobStatus.queued:
            delay = 0.0 if outcome.interrupted else backoff_s * (2 ** max(0, job.attempts - 1))
            job.not_before = now + timedelta(seconds=delay)
            job.finished_at = None
        else:
            job.finished_at = now
        job.progress_message = final_message(job, now)
        s.add(job)
        if outcome.interrupted:
            s.add(
                AuditLog(
                    action="job.interrupted", target=f"job:{job_id}", details={"requeued": status == JobStatus.queued}
                )
            )
        return status


@action("job.cancel", Role.operator)
def cancel(identity: Identity, job_id: int, *, url: str | None = None) -> JobStatus:
    """Cancel a job: a queued one at once; a running one is stopped by its worker."""
    with session(url) as s:
        job = _job(s, job_id)
        if job.status == JobStatus.queued:
            job.status = JobStatus.cancelled
            job.finished_at = utcnow()
            job.error = CANCELLED_QUEUED
            job.error_cause = "cancelled"
            job.progress_message = final_message(job, job.finished_at)
        elif job.status == JobStatus.running:
            job.cancel_requested = True
        s.add(job)
        s.add(AuditLog(username=identity.username, action="job.cancel", target=f"job:{job_id}"))
        return job.status


def process_alive(pid: int | None, proc_started: float | None) -> bool:
    """Whether ``pid`` is still the process that started at ``proc_started`` (zombies count as alive:
    their parent has yet to reap them)."""
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        return proc_started is None or abs(proc.create_time() - proc_started) < 0.5
    except psutil.Error:
        return False


def kill_process_group(pid: int | None, proc_started: float | None, timeout_s: float = 5.0) -> None:
    """SIGKILL the process group led by ``pid`` (when it is still the process that started at
    ``proc_started``) and wait until its leader is gone or a zombie."""
    if not process_alive(pid, proc_started):
        return
    assert pid is not None
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return
        except psutil.Error:
            return
        time.sleep(0.01)


def make_worker_id() -> str:
    """``host:pid:start`` names a worker process unambiguously, even after pid reuse."""
    me = psutil.Process()
    return f"{HOSTNAME}:{me.pid}:{me.create_time():.2f}"


def worker_alive(worker_id: str | None) -> bool | None:
    """True/False for a worker on this host; None when it ran elsewhere (only heartbeats tell)."""
    if not worker_id:
        return None
    host, _, rest = worker_id.partition(":")
    if host != HOSTNAME:
        return None
    pid_text, _, started = rest.partition(":")
    try:
        return process_alive(int(pid_text), float(started) if started else None)
    except ValueError:
        return None


def recover_orphans(stale_after_s: float, *, exclude_worker: str | None = None, url: str | None = None) -> list[int]:
    """Find running jobs whose worker is gone and re-queue (resumable kinds) or mark them interrupted.

    A running job is orphaned when the worker that claimed it ran on this host
    and is dead, or when its heartbeat is older than ``stale_after_s``. A job
    process never outlives its worker (it gets SIGTERM when the worker dies),
    so a live worker is the one to reap its own jobs.
    """
    now = utcnow()
    with session(url, read_only=True) as s:
        running = s.exec(select(Job).where(Job.status == JobStatus.running)).all()
    orphans: list[Job] = []
    for job in running:
        if exclude_worker is not None and job.worker_id == exclude_worker:
            continue
        heartbeat = job.heartbeat_at or job.claimed_at or now
        stale = (now - heartbeat).total_seconds() > stale_after_s
        if stale or worker_alive(job.worker_id) is False:
            orphans.append(job)
    recovered: list[int] = []
    for job in orphans:
        assert job.id is not None
        if job.host == HOSTNAME:
            # Its process may outlive its worker (it ignores SIGTERM, or is still stopping): end it
            # before the job is queued again, so two attempts never run at once.
            kill_process_group(job.pid, job.proc_started)
        status = finish(
            job.id,
            Outcome(exit_code=None, interrupted=True, error=f"interrupted: worker {job.worker_id} was lost"),
            expected_worker=job.worker_id,
            url=url,
        )
        if status is not None:
            recovered.append(job.id)
    return recovered


def get_job(job_id: int, *, url: str | None = None) -> Job:
    with session(url, read_only=True) as s:
        return _job(s, job_id)


def list_jobs(
    *,
    status: JobStatus | None = None,
    kind: str | None = None,
    limit: int = 50,
    offset: int = 0,
    url: str | None = None,
) -> list[Job]:
    with session(url, read_only=True) as s:
        stmt = select(Job)
        if status is not None:
            stmt = stmt.where(Job.status == status)
        if kind is not None:
            stmt = stmt.where(Job.kind == kind)
        return list(s.exec(stmt.order_by(col(Job.id).desc()).offset(offset).limit(limit)).all())


def queued_count(*, url: str | None = None) -> int:
    """Jobs waiting to run, including those waiting out a retry backoff."""
    with session(url, read_only=True) as s:
        return int(s.exec(select(func.count()).select_from(Job).where(Job.status == JobStatus.queued)).one())


def count_by_status(*, url: str | None = None) -> dict[str, int]:
    with session(url, read_only=True) as s:
        rows = s.exec(select(Job.status, func.count()).group_by(Job.status)).all()
    counts = {st.value: 0 for st in JobStatus}
    for st, n in rows:
        counts[JobStatus(st).value] = int(n)
    return counts


def read_log(job: Job, tail_lines: int | None = 200) -> str:
    if not job.log_path:
        return ""
    try:
        with open(job.log_path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        return ""
    text = data.decode("utf-8", errors="replace")
    if tail_lines is None:
        return text
    return "\n".join(text.splitlines()[-tail_lines:])


def why_waiting(job: Job, *, url: str | None = None) -> str | None:
    """Why queued ``job`` has not started, in words: its retry backoff, no worker, every slot it could take held (by
    which jobs), or the jobs ahead of it (None: it is not queued)."""
    if job.status is not JobStatus.queued:
        return None
    settings = get_settings()
    now = utcnow()
    if job.not_before > now:
        return f"waiting out its retry backoff, {took((job.not_before - now).total_seconds())} more"
    alive_since = now - timedelta(seconds=settings.heartbeat_timeout_s)
    with session(url, read_only=True) as s:
        workers = s.exec(
            select(WorkerRow).where(col(WorkerRow.stopped_at).is_(None), col(WorkerRow.heartbeat_at) >= alive_since)
        ).all()
        running = s.exec(select(Job).where(Job.status == JobStatus.running).order_by(col(Job.id))).all()
        ahead = s.exec(
            select(func.count())
            .select_from(Job)
            .where(
                Job.status == JobStatus.queued,
                col(Job.not_before) <= now,
                (col(Job.priority) > job.priority) | ((col(Job.priority) == job.priority) & (col(Job.id) < job.id)),
            )
        ).one()
    if not workers:
        return "no worker is running: `posttrain up` (or `posttrain worker`) starts one"
    serving = serving_kinds()
    if job.kind in serving:
        capacity, held = len(workers) * settings.worker_serving_slots, [j for j in running if j.kind in serving]
        if len(held) >= capacity:
            names = ", ".join(f"#{j.id}" for j in held)
            return f"waiting for a serving slot: the {capacity} are held by deployment jobs {names}"
    else:
        capacity, held = sum(w.cpu_slots for w in workers), [j for j in running if j.cpu_slots > 0]
        if sum(j.cpu_slots for j in held) + job.cpu_slots > capacity:
            names = ", ".join(f"#{j.id} ({j.kind})" for j in held)
            return f"waiting for a CPU slot: the {capacity} are held by jobs {names}"
    if ahead:
        return f"waiting behind {ahead} queued job{'s' * (ahead != 1)} of higher or equal priority"
    return "next in line: a worker takes it at its next poll"
