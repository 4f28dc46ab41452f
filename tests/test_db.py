"""The database layer on both backends: migrations, every table, WAL, redaction."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect, text
from sqlmodel import SQLModel, select

from posttrain.platform.db import migrate
from posttrain.platform.db.engine import DatabaseUnavailable, check_connection, get_engine, redact, session
from posttrain.platform.db.models import (
    Artifact,
    AuditLog,
    Chunk,
    Deployment,
    Document,
    Domain,
    Job,
    JobStatus,
    Metric,
    Model,
    Page,
    Role,
    SandboxPool,
    Task,
    TaskSet,
    Trajectory,
    User,
    Worker,
)


def test_migration_creates_every_table(db_url: str) -> None:
    assert migrate.is_up_to_date(db_url)
    names = set(inspect(get_engine(db_url)).get_table_names())
    assert {t.name for t in SQLModel.metadata.sorted_tables} <= names
    assert "alembic_version" in names


def test_models_match_migrations(db_url: str) -> None:
    """Autogenerate against the migrated database finds nothing to do."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext

    with get_engine(db_url).connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn, opts={"compare_type": False}), SQLModel.metadata)
    assert diff == []


def test_downgrade_and_upgrade_again(db_url: str) -> None:
    migrate.downgrade(db_url, "base")
    assert migrate.current_revision(db_url) is None
    assert "job" not in inspect(get_engine(db_url)).get_table_names()
    migrate.upgrade(db_url)
    assert migrate.is_up_to_date(db_url)


def test_whole_domain_round_trip(db_url: str) -> None:
    with session(db_url) as s:
        user = User(username="ada", password_hash="x", role=Role.admin)
        doc = Document(sha256="a" * 64, filename="r.pdf", kind="pdf", meta={"title": "R"})
        ts = TaskSet(name="set")
        dom = Domain(name="arith.add.d1", family="arith")
        job = Job(kind="selftest", config={"steps": 1})
        s.add_all([user, doc, ts, dom, job])
        s.flush()
        page = Page(document_id=doc.id, page_no=0, text="hello", layout={"blocks": [[0, 0, 1, 1]]})
        chunk = Chunk(document_id=doc.id, seq=0, text="hello", heading_path=["A"], provenance=[{"page": 0}])
        task = Task(task_set_id=ts.id, domain_id=dom.id, prompt=[{"role": "user", "content": "1+1"}],
                    verifier_kind="exact", verifier_spec={}, reference="2")  # fmt: skip
        base = Model(name="tiny", path="/m/tiny", architecture="Qwen2ForCausalLM")
        s.add_all([page, chunk, task, base])
        s.flush()
        tuned = Model(name="tiny-grpo", path="/m/t2", base_model_id=base.id, produced_by_job_id=job.id)
        s.add(tuned)
        s.flush()
        s.add_all([
            Deployment(model_id=tuned.id, tier="fast", profile={"max_model_len": 2048}),
            SandboxPool(name="default", size=4),
            Metric(job_id=job.id, step=1, name="reward", value=0.5),
            Trajectory(job_id=job.id, step=1, task_id=task.id, completion="2", reward=1.0, verdict={"passed": True}),
            Artifact(job_id=job.id, kind="checkpoint", path="/c/1"),
            AuditLog(username="ada", action="login"),
            Worker(id="h:1:0", host="h", pid=1),
        ])  # fmt: skip
    with session(db_url, read_only=True) as s:
        assert s.exec(select(User)).one().role is Role.admin
        assert s.exec(select(Job)).one().status is JobStatus.queued
        assert s.exec(select(Page)).one().layout == {"blocks": [[0, 0, 1, 1]]}
        assert s.exec(select(Model).where(Model.name == "tiny-grpo")).one().base_model_id is not None
        assert s.exec(select(Trajectory)).one().verdict == {"passed": True}
        assert s.exec(select(Document)).one().created_at.tzinfo is not None


def test_metric_steps_are_unique(db_url: str) -> None:
    from sqlalchemy.exc import IntegrityError

    with session(db_url) as s:
        job = Job(kind="selftest")
        s.add(job)
        s.flush()
        job_id = job.id
        s.add(Metric(job_id=job_id, step=1, name="loss", value=1.0))
    with pytest.raises(IntegrityError):
        with session(db_url) as s:
            s.add(Metric(job_id=job_id, step=1, name="loss", value=2.0))
    with session(db_url, read_only=True) as s:
        assert [m.value for m in s.exec(select(Metric))] == [1.0]


def test_sqlite_runs_in_wal_mode(sqlite_url: str) -> None:
    with get_engine(sqlite_url).connect() as conn:
        assert conn.execute(text("PRAGMA journal_mode")).scalar() == "wal"


def test_password_never_appears_in_errors() -> None:
    url = "postgresql+psycopg://alice:s3cretpw@127.0.0.1:1/nowhere"
    assert "s3cretpw" not in redact(url) and "***" in redact(url)
    with pytest.raises(DatabaseUnavailable) as info:
        check_connection(url)
    message = str(info.value)
    assert "s3cretpw" not in message
    assert "127.0.0.1:1" in message and "POSTTRAIN_DATABASE_URL" in message
