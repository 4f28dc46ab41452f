"""Persistence: SQLModel tables, the engine and session factory, migrations."""

from posttrain.platform.db.engine import DatabaseUnavailable, get_engine, redact, session
from posttrain.platform.db.models import JobStatus, utcnow

__all__ = ["DatabaseUnavailable", "JobStatus", "get_engine", "redact", "session", "utcnow"]
