"""Alembic environment: runs migrations on the connection that posttrain passes in."""

from __future__ import annotations

from alembic import context
from sqlmodel import SQLModel

import posttrain.platform.db.models  # noqa: F401  (registers every table on SQLModel.metadata)

config = context.config
target_metadata = SQLModel.metadata


def run_migrations_online() -> None:
    connection = config.attributes["connection"]
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():  # pragma: no cover - posttrain always migrates online
    raise SystemExit("posttrain runs migrations online only: use `posttrain db upgrade`")
run_migrations_online()
