"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:

    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("ts", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.Column("username", sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
        sa.Column("action", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("target", sqlmodel.sql.sqltypes.AutoString(length=512), nullable=False),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_audit_log_action"), ["action"], unique=False)
        batch_op.create_index(batch_op.f("ix_audit_log_ts"), ["ts"], unique=False)

    op.create_table(
        "document",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("sha256", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("filename", sqlmodel.sql.sqltypes.AutoString(length=512), nullable=False),
        sa.Column("kind", sqlmodel.sql.sqltypes.AutoString(length=32), nullable=False),
        sa.Column("size_bytes", sa.Integer(), nullable=False),
        sa.Column("storage_path", sqlmodel.sql.sqltypes.AutoString(length=1024), nullable=False),
        sa.Column(
            "status",
            sa.Enum("uploaded", "processing", "ready", "failed", name="documentstatus", native_enum=False, length=16),
            nullable=False,
        ),
        sa.Column("error", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("page_count", sa.Integer(), nullable=False),
        sa.Column("meta", sa.JSON(), nullable=False),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.Column("updated_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("document", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_document_sha256"), ["sha256"], unique=True)
        batch_op.create_index(batch_op.f("ix_document_status"), ["status"], unique=False)

    op.create_table(
        "domain",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sqlmodel.sql.sqltypes.AutoString(length=256), nullable=False),
        sa.Column("family", sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
        sa.Column("description", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("weight", sa.Float(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("difficulty", sa.Integer(), nullable=False),
        sa.Column("params", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("domain", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_domain_name"), ["name"], unique=True)

    op.create_table(
        "job",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("kind", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column(
            "status",
            sa.Enum(
                "queued",
                "running",
                "succeeded",
                "failed",
                "cancelled",
                "interrupted",
                name="jobstatus",
                native_enum=False,
                length=16,
            ),
            nullable=False,
        ),
        sa.Column("cpu_slots", sa.Integer(), nullable=False),
        sa.Column("gpu_slots", sa.Integer(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("timeout_s", sa.Float(), nullable=True),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.Column("not_before", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.Column("claimed_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True),
        sa.Column("started_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True),
        sa.Column("finished_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True),
        sa.Column("heartbeat_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True),
        sa.Column("worker_id", sqlmodel.sql.sqltypes.AutoString(length=256), nullable=True),
        sa.Column("host", sqlmodel.sql.sqltypes.AutoString(length=256), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("proc_started", sa.Float(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("log_path", sqlmodel.sql.sqltypes.AutoString(length=1024), nullable=True),
        sa.Column("progress", sa.Float(), nullable=True),
        sa.Column("progress_message", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("checkpoint", sa.JSON(), nullable=True),
        sa.Column("result", sa.JSON(), nullable=True),
        sa.Column("error", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("error_cause", sqlmodel.sql.sqltypes.AutoString(length=32), nullable=True),
        sa.Column("submitted_by", sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.create_index("ix_job_claim", ["status", "priority", "id"], unique=False)
        batch_op.create_index(batch_op.f("ix_job_kind"), ["kind"], unique=False)

    op.create_table(
        "sandbox_pool",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
        sa.Column("backend", sqlmodel.sql.sqltypes.AutoString(length=32), nullable=False),
        sa.Column("host", sqlmodel.sql.sqltypes.AutoString(length=256), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("busy", sa.Integer(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("updated_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("sandbox_pool", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_sandbox_pool_name"), ["name"], unique=True)

    op.create_table(
        "task_set",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sqlmodel.sql.sqltypes.AutoString(length=256), nullable=False),
        sa.Column("description", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("source", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("task_set", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_task_set_name"), ["name"], unique=True)

    op.create_table(
        "user",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("username", sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
        sa.Column("password_hash", sqlmodel.sql.sqltypes.AutoString(length=512), nullable=False),
        sa.Column(
            "role", sa.Enum("viewer", "operator", "admin", name="role", native_enum=False, length=16), nullable=False
        ),
        sa.Column("disabled", sa.Boolean(), nullable=False),
        sa.Column("failed_logins", sa.Integer(), nullable=False),
        sa.Column("locked_until", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.Column("last_login_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("user", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_user_username"), ["username"], unique=True)

    op.create_table(
        "worker",
        sa.Column("id", sqlmodel.sql.sqltypes.AutoString(length=256), nullable=False),
        sa.Column("host", sqlmodel.sql.sqltypes.AutoString(length=256), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("cpu_slots", sa.Integer(), nullable=False),
        sa.Column("gpu_slots", sa.Integer(), nullable=False),
        sa.Column("started_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.Column("heartbeat_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.Column("stopped_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "artifact",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("kind", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("path", sqlmodel.sql.sqltypes.AutoString(length=1024), nullable=False),
        sa.Column("sha256", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True),
        sa.Column("size_bytes", sa.Integer(), nullable=False),
        sa.Column("meta", sa.JSON(), nullable=False),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["job.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("artifact", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_artifact_job_id"), ["job_id"], unique=False)

    op.create_table(
        "chunk",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("document_id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("text", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("heading_path", sa.JSON(), nullable=False),
        sa.Column("provenance", sa.JSON(), nullable=False),
        sa.Column("token_count", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["document_id"], ["document.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("document_id", "seq"),
    )
    with op.batch_alter_table("chunk", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_chunk_document_id"), ["document_id"], unique=False)

    op.create_table(
        "metric",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("name", sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("ts", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("job_id", "step", "name"),
    )
    with op.batch_alter_table("metric", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_metric_job_id"), ["job_id"], unique=False)

    op.create_table(
        "model",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sqlmodel.sql.sqltypes.AutoString(length=256), nullable=False),
        sa.Column("path", sqlmodel.sql.sqltypes.AutoString(length=1024), nullable=False),
        sa.Column("architecture", sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
        sa.Column("base_model_id", sa.Integer(), nullable=True),
        sa.Column("produced_by_job_id", sa.Integer(), nullable=True),
        sa.Column("meta", sa.JSON(), nullable=False),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["base_model_id"],
            ["model.id"],
        ),
        sa.ForeignKeyConstraint(
            ["produced_by_job_id"],
            ["job.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("model", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_model_name"), ["name"], unique=True)

    op.create_table(
        "page",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("document_id", sa.Integer(), nullable=False),
        sa.Column("page_no", sa.Integer(), nullable=False),
        sa.Column("width", sa.Float(), nullable=False),
        sa.Column("height", sa.Float(), nullable=False),
        sa.Column("source", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("text", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("markdown", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("layout", sa.JSON(), nullable=False),
        sa.Column("image_path", sqlmodel.sql.sqltypes.AutoString(length=1024), nullable=True),
        sa.Column("visual_tokens", sa.Integer(), nullable=True),
        sa.Column("token_counts", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["document_id"], ["document.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("document_id", "page_no"),
    )
    with op.batch_alter_table("page", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_page_document_id"), ["document_id"], unique=False)

    op.create_table(
        "task",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("task_set_id", sa.Integer(), nullable=False),
        sa.Column("domain_id", sa.Integer(), nullable=False),
        sa.Column("prompt", sa.JSON(), nullable=False),
        sa.Column("verifier_kind", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("verifier_spec", sa.JSON(), nullable=False),
        sa.Column("reference", sqlmodel.sql.sqltypes.AutoString(), nullable=True),
        sa.Column("split", sa.Enum("train", "eval", name="split", native_enum=False, length=16), nullable=False),
        sa.Column("provenance", sa.JSON(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("passes", sa.Integer(), nullable=False),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["domain_id"],
            ["domain.id"],
        ),
        sa.ForeignKeyConstraint(["task_set_id"], ["task_set.id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("task", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_task_domain_id"), ["domain_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_task_split"), ["split"], unique=False)
        batch_op.create_index(batch_op.f("ix_task_task_set_id"), ["task_set_id"], unique=False)

    op.create_table(
        "deployment",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("tier", sqlmodel.sql.sqltypes.AutoString(length=32), nullable=False),
        sa.Column("engine", sqlmodel.sql.sqltypes.AutoString(length=32), nullable=False),
        sa.Column("profile", sa.JSON(), nullable=False),
        sa.Column("url", sqlmodel.sql.sqltypes.AutoString(length=512), nullable=False),
        sa.Column("status", sqlmodel.sql.sqltypes.AutoString(length=32), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("healthy", sa.Boolean(), nullable=False),
        sa.Column("last_health_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["job.id"],
        ),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["model.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("deployment", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_deployment_model_id"), ["model_id"], unique=False)

    op.create_table(
        "trajectory",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("task_id", sa.Integer(), nullable=True),
        sa.Column("domain", sqlmodel.sql.sqltypes.AutoString(length=256), nullable=False),
        sa.Column("prompt", sa.JSON(), nullable=False),
        sa.Column("completion", sqlmodel.sql.sqltypes.AutoString(), nullable=False),
        sa.Column("tool_calls", sa.JSON(), nullable=False),
        sa.Column("reward", sa.Float(), nullable=False),
        sa.Column("verdict", sa.JSON(), nullable=False),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["job_id"], ["job.id"], ondelete="CASCADE"),
        sa.ForeignKeyConstraint(
            ["task_id"],
            ["task.id"],
        ),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("trajectory", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_trajectory_job_id"), ["job_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_trajectory_step"), ["step"], unique=False)


def downgrade() -> None:

    with op.batch_alter_table("trajectory", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_trajectory_step"))
        batch_op.drop_index(batch_op.f("ix_trajectory_job_id"))

    op.drop_table("trajectory")
    with op.batch_alter_table("deployment", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_deployment_model_id"))

    op.drop_table("deployment")
    with op.batch_alter_table("task", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_task_task_set_id"))
        batch_op.drop_index(batch_op.f("ix_task_split"))
        batch_op.drop_index(batch_op.f("ix_task_domain_id"))

    op.drop_table("task")
    with op.batch_alter_table("page", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_page_document_id"))

    op.drop_table("page")
    with op.batch_alter_table("model", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_model_name"))

    op.drop_table("model")
    with op.batch_alter_table("metric", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_metric_job_id"))

    op.drop_table("metric")
    with op.batch_alter_table("chunk", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_chunk_document_id"))

    op.drop_table("chunk")
    with op.batch_alter_table("artifact", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_artifact_job_id"))

    op.drop_table("artifact")
    op.drop_table("worker")
    with op.batch_alter_table("user", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_user_username"))

    op.drop_table("user")
    with op.batch_alter_table("task_set", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_task_set_name"))

    op.drop_table("task_set")
    with op.batch_alter_table("sandbox_pool", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sandbox_pool_name"))

    op.drop_table("sandbox_pool")
    with op.batch_alter_table("job", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_job_kind"))
        batch_op.drop_index("ix_job_claim")

    op.drop_table("job")
    with op.batch_alter_table("domain", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_domain_name"))

    op.drop_table("domain")
    with op.batch_alter_table("document", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_document_status"))
        batch_op.drop_index(batch_op.f("ix_document_sha256"))

    op.drop_table("document")
    with op.batch_alter_table("audit_log", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_audit_log_ts"))
        batch_op.drop_index(batch_op.f("ix_audit_log_action"))

    op.drop_table("audit_log")
