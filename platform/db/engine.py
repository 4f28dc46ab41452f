"""The database engine and the one session factory.

SQLite (the default) runs in WAL mode with a busy timeout; write transactions
begin ``IMMEDIATE`` so two writers queue on the lock instead of failing with
"database is locked" halfway through. PostgreSQL is used through psycopg 3.

Passwords never leave this module in clear: :func:`redact` renders a URL with
the password masked, and connection failures are re-raised as
:class:`DatabaseUnavailable` with the redacted URL only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from sqlalchemy import event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, InterfaceError, OperationalError
from sqlmodel import Session, create_engine

from posttrain.platform.settings import get_settings

SQLITE_BUSY_TIMEOUT_MS = 30_000
RETRY_TIMEOUT_S = 60.0

log = logging.getLogger(__name__)
T = TypeVar("T")


class DatabaseUnavailable(RuntimeError):
    """The database cannot be reached or opened; the message holds a redacted URL."""


def redact(url: str) -> str:
    """The URL with any password replaced by ``***``."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return re.sub(r"(//[^:/@]*:)[^@]*@", r"\1***@", url)


def scrub(text: str, url: str) -> str:
    """Remove the password of ``url`` from an error text (drivers sometimes echo it)."""
    try:
        password = make_url(url).password
    except ArgumentError:
        password = None
    if password:
        text = text.replace(str(password), "***")
    return text


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record) -> None:
        # Let SQLAlchemy, not the driver, decide when transactions begin.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn) -> None:
        mode = conn.get_execution_options().get("sqlite_begin", "IMMEDIATE")
        conn.exec_driver_sql(f"BEGIN {mode}")


def make_engine(url: str) -> Engine:
    """Create an engine for ``url`` (SQLite file or PostgreSQL)."""
    if is_sqlite(url):
        db_path = make_url(url).database
        if db_path and db_path != ":memory:":
            Path(db_path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
            pool_size=5,
            max_overflow=10,
        )
        _configure_sqlite(engine)
        return engine
    return create_engine(
        url,
        pool_pre_ping=True,
        pool_size=5,
        max_overflow=5,
        connect_args={"connect_timeout": 5, "application_name": "posttrain"},
    )


_engines: dict[tuple[str, int], Engine] = {}
_engines_lock = threading.Lock()


def get_engine(url: str | None = None) -> Engine:
    """The process's engine for ``url`` (default: the configured database).

    Engines are kept per process id, so a forked child never shares the
    parent's pooled connections.
    """
    key = (url or get_settings().resolved_database_url, os.getpid())
    engine = _engines.get(key)
    if engine is None:
        with _engines_lock:
            engine = _engines.get(key)
            if engine is None:
                engine = _engines[key] = make_engine(key[0])
    return engine


def reset_engines() -> None:
    """Forget cached engines: after the settings changed, or first thing in a forked child.

    Engines inherited from a parent process are neither closed nor freed: their
    connections belong to the parent, and finalising them here would close the
    parent's SQLite handles or end its PostgreSQL sessions. They stay referenced
    until the child exits (job processes end with ``os._exit``).
    """
    with _engines_lock:
        for (_, pid), engine in _engines.items():
            if pid == os.getpid():
                engine.dispose()
            else:
                _inherited.append(engine)
        _engines.clear()


_inherited: list[Engine] = []


@contextlib.contextmanager
def session(url: str | None = None, *, read_only: bool = False) -> Iterator[Session]:
    """One transaction: commit on success, roll back on error.

    ``read_only`` begins a deferred transaction on SQLite so readers never take
    the write lock; elsewhere it changes nothing.
    """
    engine = get_engine(url)
    try:
        conn = engine.connect()
    except OperationalError as exc:
        raise unavailable(engine.url.render_as_string(hide_password=False), exc) from None
    if read_only:
        conn = conn.execution_options(sqlite_begin="DEFERRED")
    try:
        with Session(bind=conn, expire_on_commit=False) as s:
            with s.begin():
                yield s
    finally:
        conn.close()


def unavailable(url: str, exc: BaseException) -> DatabaseUnavailable:
    detail = str(getattr(exc, "orig", exc) or exc).strip().splitlines()
    reason = scrub(detail[0] if detail else type(exc).__name__, url)
    return DatabaseUnavailable(
        f"cannot reach the database at {redact(url)}: {reason}. "
        "Check POSTTRAIN_DATABASE_URL and that the server is running."
    )


def check_connection(url: str | None = None) -> None:
    """Open and close one connection, raising :class:`DatabaseUnavailable` on failure."""
    engine = get_engine(url)
    try:
        with engine.connect():
            pass
    except OperationalError as exc:
        raise unavailable(engine.url.render_as_string(hide_password=False), exc) from None


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` means the database was briefly out of reach (a server restart, a dropped
    connection, a busy SQLite file), so the same transaction may simply be tried again."""
    if isinstance(exc, DatabaseUnavailable):
        return True
    if isinstance(exc, DBAPIError) and "disk is full" in str(exc.orig):  # SQLite's file system is full: not brief
        return False
    return isinstance(exc, (OperationalError, InterfaceError)) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    )


def retry_transient(fn: Callable[[], T], *, what: str = "a database call", timeout_s: float = RETRY_TIMEOUT_S) -> T:
    """``fn()`` (one whole transaction, safe to repeat), tried again with backoff while the database
    is out of reach, for up to ``timeout_s``; other errors, and the last transient one, propagate."""
    deadline = time.monotonic() + timeout_s
    delay = 0.1
    while True:
        try:
            return fn()
        except Exception as exc:
            if not is_transient(exc) or time.monotonic() + delay > deadline:
                raise
            reason = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [type(exc).__name__])[0]
            log.warning("%s failed, retrying in %.1fs: the database is out of reach (%s)", what, delay, reason[:300])
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
