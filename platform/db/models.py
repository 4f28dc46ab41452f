"""SQLModel tables for every object the platform knows.

Designed up front so that each part fills its tables rather than inventing its
own: documents and pages (preprocess), task sets, domains and tasks (tasks and
verifiers), models and deployments (serving), sandbox pools, jobs and workers
(the job system), run metrics and trajectories (training), artifacts, users and
an audit log (console). Free-form, part-specific data lives in JSON columns.
Schema changes go through Alembic migrations in ``migrations/versions``.
"""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, Column, Index, UniqueConstraint
from sqlalchemy import Enum as SAEnum
from sqlmodel import Field, SQLModel


def utcnow() -> datetime:
    """Now, timezone-aware in UTC (the columns store and return UTC)."""
    return datetime.now(UTC)


def _enum(enum_cls: type[enum.Enum], default: Any, **kwargs: Any) -> Any:
    """An enum stored as a plain VARCHAR (no database enum type to migrate)."""
    return Field(default=default, sa_type=SAEnum(enum_cls, native_enum=False, length=16), **kwargs)


def _json(default: Any = None) -> Any:
    factory = (lambda: {}) if default is None else default
    return Field(default_factory=factory, sa_column=Column(JSON, nullable=False))


# --- users and audit ----------------------------------------------------------------


class Role(str, enum.Enum):
    viewer = "viewer"
    operator = "operator"
    admin = "admin"


class User(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    username: str = Field(index=True, unique=True, max_length=128)
    password_hash: str = Field(default="", max_length=512)
    role: Role = _enum(Role, Role.viewer)
    disabled: bool = False
    failed_logins: int = 0
    locked_until: datetime | None = None
    created_at: datetime = Field(default_factory=utcnow)
    last_login_at: datetime | None = None


class AuditLog(SQLModel, table=True):
    __tablename__ = "audit_log"
    id: int | None = Field(default=None, primary_key=True)
    ts: datetime = Field(default_factory=utcnow, index=True)
    username: str = Field(default="system", max_length=128)
    action: str = Field(max_length=64, index=True)
    target: str = Field(default="", max_length=512)
    details: dict[str, Any] = _json()


class ApiKey(SQLModel, table=True):
    """A key for the OpenAI-compatible API (posttrain.platform.api_keys): only a hash of its secret is kept."""

    __tablename__ = "api_key"
    id: int | None = Field(default=None, primary_key=True)
    key_id: str = Field(
        index=True, unique=True, max_length=32, description="public part: the key reads pt-<key_id>_<secret>"
    )
    name: str = Field(max_length=128)
    secret_sha256: str = Field(max_length=64, description="hex SHA-256 of the secret part")
    models: list[str] = _json(list)  # the models it may call; empty: every model
    created_by: str = Field(max_length=128)
    created_at: datetime = Field(default_factory=utcnow)
    last_used_at: datetime | None = None
    revoked_at: datetime | None = Field(default=None, index=True)
    revoked_by: str | None = Field(default=None, max_length=128)


class ConsoleSession(SQLModel, table=True):
    """A console login kept across reloads and tabs (:mod:`posttrain.platform.sessions`): the browser holds a signed,
    expiring HttpOnly cookie naming it; the one-time code that turns a login into that cookie is kept only hashed."""

    __tablename__ = "console_session"
    id: int | None = Field(default=None, primary_key=True)
    username: str = Field(index=True, max_length=128)
    created_at: datetime = Field(default_factory=utcnow)
    expires_at: datetime
    revoked_at: datetime | None = Field(default=None, index=True)
    handoff_sha256: str | None = Field(default=None, max_length=64, index=True)
    handoff_expires_at: datetime | None = None


# --- documents ----------------------------------------------------------------------


class DocumentStatus(str, enum.Enum):
    uploaded = "uploaded"
    processing = "processing"
    ready = "ready"
    failed = "failed"


class Document(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    sha256: str = Field(index=True, unique=True, max_length=64)
    filename: str = Field(max_length=512)
    kind: str = Field(default="", max_length=32, description="sniffed type: pdf, png, jpeg, tiff, ...")
    size_bytes: int = 0
    storage_path: str = Field(default="", max_length=1024)
    status: DocumentStatus = _enum(DocumentStatus, DocumentStatus.uploaded, index=True)
    error: str | None = None
    page_count: int = 0
    meta: dict[str, Any] = _json()
    created_at: datetime = Field(default_factory=utcnow)
    updated_at: datetime = Field(default_factory=utcnow)


class Page(SQLModel, table=True):
    __table_args__ = (UniqueConstraint("document_id", "page_no"),)
    id: int | None = Field(default=None, primary_key=True)
    document_id: int = Field(foreign_key="document.id", index=True, ondelete="CASCADE")
    page_no: int = Field(description="0-based page index within the document")
    width: float = 0.0
    height: float = 0.0
    source: str = Field(default="text", max_length=16, description="text, ocr or image")
    text: str = ""
    markdown: str = ""
    layout: dict[str, Any] = _json()
    image_path: str | None = Field(default=None, max_length=1024)
    visual_tokens: int | None = None
    token_counts: dict[str, Any] = _json()


class Chunk(SQLModel, table=True):
    __table_args__ = (UniqueConstraint("document_id", "seq"),)
    id: int | None = Field(default=None, primary_key=True)
    document_id: int = Field(foreign_key="document.id", index=True, ondelete="CASCADE")
    seq: int
    text: str = ""
    heading_path: list[str] = _json(list)
    provenance: list[dict[str, Any]] = _json(list)
    token_count: int = 0


# --- tasks --------------------------------------------------------------------------


class TaskSet(SQLModel, table=True):
    __tablename__ = "task_set"
    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(index=True, unique=True, max_length=256)
    description: str = ""
    source: str = Field(default="", max_length=64, description="documents, jsonl, humaneval, procedural")
    created_at: datetime = Field(default_factory=utcnow)


class Domain(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(index=True, unique=True, max_length=256)
    family: str = Field(default="", max_length=128)
    description: str = ""
    weight: float = 1.0
    priority: int = 0
    difficulty: int = 1
    params: dict[str, Any] = _json()


class Split(str, enum.Enum):
    train = "train"
    eval = "eval"


class Task(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    task_set_id: int = Field(foreign_key="task_set.id", index=True, ondelete="CASCADE")
    domain_id: int = Field(foreign_key="domain.id", index=True)
    prompt: list[dict[str, Any]] = _json(list)
    verifier_kind: str = Field(max_length=64)
    verifier_spec: dict[str, Any] = _json()
    reference: str | None = None
    split: Split = _enum(Split, Split.train, index=True)
    provenance: dict[str, Any] = _json()
    attempts: int = 0
    passes: int = 0
    created_at: datetime = Field(default_factory=utcnow)


# --- models, deployments, sandboxes ---------------------------------------------------


class Model(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(index=True, unique=True, max_length=256)
    path: str = Field(max_length=1024, description="Hugging Face-layout model directory")
    architecture: str = Field(default="", max_length=128)
    base_model_id: int | None = Field(default=None, foreign_key="model.id")
    produced_by_job_id: int | None = Field(default=None, foreign_key="job.id")
    meta: dict[str, Any] = _json()
    created_at: datetime = Field(default_factory=utcnow)


class Deployment(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    model_id: int = Field(foreign_key="model.id", index=True)
    tier: str = Field(default="standard", max_length=32)
    engine: str = Field(default="embedded", max_length=32, description="embedded or vllm")
    profile: dict[str, Any] = _json()
    url: str = Field(default="", max_length=512)
    status: str = Field(default="pending", max_length=32)
    job_id: int | None = Field(default=None, foreign_key="job.id")
    healthy: bool = False
    last_health_at: datetime | None = None
    created_at: datetime = Field(default_factory=utcnow)


class SandboxPool(SQLModel, table=True):
    __tablename__ = "sandbox_pool"
    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(index=True, unique=True, max_length=128)
    backend: str = Field(default="bwrap", max_length=32)
    host: str = Field(default="", max_length=256)
    size: int = 0
    busy: int = 0
    failures: int = 0
    config: dict[str, Any] = _json()
    updated_at: datetime = Field(default_factory=utcnow)


# --- jobs ---------------------------------------------------------------------------


class JobStatus(str, enum.Enum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"
    interrupted = "interrupted"

    @property
    def finished(self) -> bool:
        return self in (JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled, JobStatus.interrupted)


class Job(SQLModel, table=True):
    __table_args__ = (Index("ix_job_claim", "status", "priority", "id"),)
    id: int | None = Field(default=None, primary_key=True)
    kind: str = Field(max_length=64, index=True)
    config: dict[str, Any] = _json()
    priority: int = 0
    status: JobStatus = _enum(JobStatus, JobStatus.queued)
    cpu_slots: int = 1
    gpu_slots: int = 0
    attempts: int = 0
    max_attempts: int = 3
    timeout_s: float | None = Field(default=None, description="wall-clock limit of one attempt")
    created_at: datetime = Field(default_factory=utcnow)
    not_before: datetime = Field(default_factory=utcnow, description="retry backoff: not claimed earlier")
    claimed_at: datetime | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    heartbeat_at: datetime | None = None
    worker_id: str | None = Field(default=None, max_length=256)
    host: str | None = Field(default=None, max_length=256)
    pid: int | None = None
    proc_started: float | None = Field(default=None, description="process create time, to tell a reused pid")
    exit_code: int | None = None
    cancel_requested: bool = False
    log_path: str | None = Field(default=None, max_length=1024)
    progress: float | None = None
    progress_message: str = ""
    checkpoint: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    result: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON, nullable=True))
    error: str | None = None
    error_cause: str | None = Field(
        default=None, max_length=32, description="oom, timeout, bad_input, transient, infrastructure, error, cancelled"
    )
    submitted_by: str = Field(default="system", max_length=128)


class Worker(SQLModel, table=True):
    id: str = Field(primary_key=True, max_length=256, description="host:pid")
    host: str = Field(max_length=256)
    pid: int
    cpu_slots: int = 0
    gpu_slots: int = 0
    started_at: datetime = Field(default_factory=utcnow)
    heartbeat_at: datetime = Field(default_factory=utcnow)
    stopped_at: datetime | None = None


# --- training output ----------------------------------------------------------------


class Metric(SQLModel, table=True):
    __table_args__ = (UniqueConstraint("job_id", "step", "name"),)
    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id", index=True, ondelete="CASCADE")
    step: int
    name: str = Field(max_length=128)
    value: float
    ts: datetime = Field(default_factory=utcnow)


class Trajectory(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    job_id: int = Field(foreign_key="job.id", index=True, ondelete="CASCADE")
    step: int = Field(index=True)
    task_id: int | None = Field(default=None, foreign_key="task.id")
    domain: str = Field(default="", max_length=256)
    prompt: list[dict[str, Any]] = _json(list)
    completion: str = ""
    tool_calls: list[dict[str, Any]] = _json(list)
    reward: float = 0.0
    verdict: dict[str, Any] = _json()
    created_at: datetime = Field(default_factory=utcnow)


class Artifact(SQLModel, table=True):
    id: int | None = Field(default=None, primary_key=True)
    job_id: int | None = Field(default=None, foreign_key="job.id", index=True)
    kind: str = Field(max_length=64, description="checkpoint, model, report, screenshot, ...")
    path: str = Field(max_length=1024)
    sha256: str | None = Field(default=None, max_length=64)
    size_bytes: int = 0
    meta: dict[str, Any] = _json()
    created_at: datetime = Field(default_factory=utcnow)
