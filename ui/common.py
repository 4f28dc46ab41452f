"""Helpers shared by the console's pages."""

from __future__ import annotations

import streamlit as st

from posttrain.platform.auth import Identity
from posttrain.platform.db.engine import DatabaseUnavailable
from posttrain.platform.db.models import JobStatus, Role
from posttrain.platform.settings import SettingsError

IDENTITY_KEY = "identity"

def status_label(status: JobStatus) -> str:
    """A job status as shown in tables and metrics (plain words: they render in any font)."""
    return status.value


def current_identity() -> Identity | None:
    identity = st.session_state.get(IDENTITY_KEY)
    return identity if isinstance(identity, Identity) else None


def can(role: Role) -> bool:
    """Whether the logged-in user has at least ``role`` (checked again wherever an action runs)."""
    identity = current_identity()
    return identity is not None and identity.can(role)


def username() -> str:
    identity = current_identity()
    return identity.username if identity else "anonymous"


def require_login() -> Identity:
    """Stop the page unless somebody is logged in (pages are only reachable through the login)."""
    identity = current_identity()
    if identity is None:
        st.warning("Log in to use the console.")
        st.stop()
    assert identity is not None
    return identity


def guard_platform() -> bool:
    """Require a login, then check settings and database; show a clear error instead of a traceback."""
    from posttrain.platform.db import migrate

    require_login()
    try:
        if not migrate.is_up_to_date():
            st.error("The database schema is not up to date: run `posttrain db upgrade` (make run does it).")
            return False
    except (DatabaseUnavailable, SettingsError) as exc:
        st.error(str(exc))
        return False
    return True


FLASH_KEY = "flash"


def flash(message: str) -> None:
    """Show ``message`` as a success note after the rerun that follows (the page then shows the change)."""
    st.session_state[FLASH_KEY] = message
    st.rerun()


def show_flash() -> None:
    message = st.session_state.pop(FLASH_KEY, None)
    if message:
        st.success(message)
