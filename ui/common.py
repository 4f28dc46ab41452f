"""Helpers shared by the console's pages."""

from __future__ import annotations

import streamlit as st

from posttrain.platform.db.engine import DatabaseUnavailable
from posttrain.platform.db.models import JobStatus
from posttrain.platform.settings import SettingsError

STATUS_ICONS = {
    JobStatus.queued: "⏳",
    JobStatus.running: "▶️",
    JobStatus.succeeded: "✅",
    JobStatus.failed: "❌",
    JobStatus.cancelled: "⛔",
    JobStatus.interrupted: "⚠️",
}


def status_label(status: JobStatus) -> str:
    return f"{STATUS_ICONS.get(status, '')} {status.value}"


def guard_platform() -> bool:
    """Check settings and database once per run; show a clear error instead of a traceback."""
    from posttrain.platform.db import migrate

    try:
        if not migrate.is_up_to_date():
            st.error("The database schema is not up to date: run `posttrain db upgrade` (make run does it).")
            return False
    except (DatabaseUnavailable, SettingsError) as exc:
        st.error(str(exc))
        return False
    return True
