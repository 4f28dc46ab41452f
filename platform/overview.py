"""One read of the platform's state for the console's first screen (and the CLI)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import func
from sqlmodel import col, select

from posttrain.platform.db.engine import session
from posttrain.platform.db.models import (
    Deployment,
    Document,
    DocumentStatus,
    Domain,
    Job,
    JobStatus,
    Metric,
    Model,
    SandboxPool,
    Task,
    utcnow,
)
from posttrain.platform.jobs.queue import count_by_status

TRAINING_KINDS = ("train_sft", "train_grpo", "train_preset")
LIVE_POOL_WINDOW = timedelta(seconds=60)


@dataclass(frozen=True)
class RunSummary:
    job_id: int
    kind: str
    progress: float | None
    message: str
    step: int | None
    metrics: dict[str, float]


@dataclass(frozen=True)
class Overview:
    jobs: dict[str, int]
    documents: dict[str, int]
    tasks: int
    domains: int
    models: int
    deployments: int
    deployments_healthy: int
    pools_live: int
    sandboxes: int
    sandboxes_busy: int
    runs: list[RunSummary] = field(default_factory=list)
    failures: list[Job] = field(default_factory=list)


def _count(s, model, *where) -> int:
    return int(s.exec(select(func.count()).select_from(model).where(*where)).one())


def read_overview(*, failures: int = 10, url: str | None = None) -> Overview:
    jobs = count_by_status(url=url)
    now = utcnow()
    with session(url, read_only=True) as s:
        docs = {st.value: 0 for st in DocumentStatus}
        for status, n in s.exec(select(Document.status, func.count()).group_by(Document.status)).all():
            docs[DocumentStatus(status).value] = int(n)
        pools = [p for p in s.exec(select(SandboxPool)).all() if now - p.updated_at < LIVE_POOL_WINDOW]
        running = s.exec(
            select(Job).where(col(Job.kind).in_(TRAINING_KINDS), Job.status == JobStatus.running).order_by(col(Job.id))
        ).all()
        runs = []
        for job in running:
            assert job.id is not None  # a stored job
            last = s.exec(select(func.max(Metric.step)).where(Metric.job_id == job.id)).one()
            values = {}
            if last is not None:
                values = {
                    m.name: m.value for m in s.exec(select(Metric).where(Metric.job_id == job.id, Metric.step == last))
                }
            runs.append(RunSummary(int(job.id), job.kind, job.progress, job.progress_message, last, values))
        recent_failures = list(
            s.exec(
                select(Job).where(Job.status == JobStatus.failed).order_by(col(Job.finished_at).desc()).limit(failures)
            ).all()
        )
        return Overview(
            jobs=jobs,
            documents=docs,
            tasks=_count(s, Task),
            domains=_count(s, Domain),
            models=_count(s, Model),
            deployments=_count(s, Deployment),
            deployments_healthy=_count(s, Deployment, col(Deployment.healthy).is_(True)),
            pools_live=len(pools),
            sandboxes=sum(p.size for p in pools),
            sandboxes_busy=sum(p.busy for p in pools),
            runs=runs,
            failures=recent_failures,
        )
