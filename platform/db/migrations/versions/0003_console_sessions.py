"""console sessions: logins kept across reloads and tabs (a signed cookie names one; its handoff code hashed)

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "console_session",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("username", sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.Column("expires_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.Column("revoked_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True),
        sa.Column("handoff_sha256", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True),
        sa.Column("handoff_expires_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("console_session", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_console_session_username"), ["username"], unique=False)
        batch_op.create_index(batch_op.f("ix_console_session_revoked_at"), ["revoked_at"], unique=False)
        batch_op.create_index(batch_op.f("ix_console_session_handoff_sha256"), ["handoff_sha256"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("console_session", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_console_session_handoff_sha256"))
        batch_op.drop_index(batch_op.f("ix_console_session_revoked_at"))
        batch_op.drop_index(batch_op.f("ix_console_session_username"))
    op.drop_table("console_session")
