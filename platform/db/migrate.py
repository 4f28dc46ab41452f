"""Schema migrations with Alembic, driven from Python (no alembic.ini needed).

``posttrain db upgrade`` and ``make run`` call :func:`upgrade`.
"""

from __future__ import annotations

import functools
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.exc import OperationalError

from posttrain.platform.db.engine import get_engine, unavailable

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    return cfg


def head_revision() -> str | None:
    return ScriptDirectory.from_config(alembic_config()).get_current_head()


def current_revision(url: str | None = None) -> str | None:
    engine = get_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    except OperationalError as exc:
        raise unavailable(engine.url.render_as_string(hide_password=False), exc) from None


def _run(url: str | None, fn, *args: str) -> None:
    engine = get_engine(url)
    cfg = alembic_config()
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            fn(cfg, *args)
    except OperationalError as exc:
        raise unavailable(engine.url.render_as_string(hide_password=False), exc) from None


def upgrade(url: str | None = None, revision: str = "head") -> None:
    """Bring the database at ``url`` (default: the configured one) up to ``revision``."""
    _run(url, command.upgrade, revision)


def downgrade(url: str | None = None, revision: str = "base") -> None:
    _run(url, command.downgrade, revision)


def autogenerate(message: str, url: str, rev_id: str | None = None) -> None:
    """Write a new revision (id ``rev_id``, e.g. ``0003``) from the difference between the models and
    ``url``, a database at the current head (developers only; tidy the file it writes by hand)."""
    _run(url, functools.partial(command.revision, autogenerate=True, rev_id=rev_id), message)


def is_up_to_date(url: str | None = None) -> bool:
    return current_revision(url) == head_revision()
