"""Helpers shared by the console's pages."""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Iterable
from typing import Any

import streamlit as st
import yaml
from sqlalchemy.exc import SQLAlchemyError

from posttrain.platform import sessions
from posttrain.platform.auth import Identity, refresh_identity
from posttrain.platform.db import migrate
from posttrain.platform.db.engine import DatabaseUnavailable
from posttrain.platform.db.models import JobStatus, Role
from posttrain.platform.display import field_rows, shown
from posttrain.platform.jobs import queue
from posttrain.platform.sandbox import SandboxPool, make_pool, parse_tool_calls
from posttrain.platform.settings import SettingsError, get_settings

IDENTITY_KEY = "identity"
SESSION_KEY = "console_session"  # the id of the session the browser's cookie names (posttrain.platform.sessions)
FOLLOW_EVERY = "2s"  # how often a page that shows unfinished work checks whether it moved on


@st.fragment(run_every=FOLLOW_EVERY)
def _follow(key: str, state: Callable[[], Hashable], note: Callable[[], None] | None) -> None:
    if st.session_state.get(key) != (now := state()):
        st.session_state[key] = now
        st.rerun(scope="app")
    if note is not None:
        note()


def follow(
    key: str,
    state: Callable[[], Hashable],
    *,
    active: bool,
    drawn: Hashable = None,
    note: Callable[[], None] | None = None,
) -> None:
    """Keep the page in step with the work it shows, driven by that work's state rather than a timer on the page:
    while it shows unfinished work (``active``: a job queued or running, a document being preprocessed), every
    :data:`FOLLOW_EVERY` a small fragment reads ``state()`` again, a cheap fingerprint of what the page draws (the
    jobs' ids and statuses, say), and when it moved on from ``drawn`` (what the page was drawn with; default:
    ``state()`` now, so call this before the page reads what it draws) the whole page runs again: a finished
    build's domains, a healthy deployment, a new export appear with no navigation. ``note`` draws a line inside the
    fragment, redrawn at each check. Call it on every run, following or not: it always holds its place on the page,
    so the elements after it keep theirs (a browser shows an element that moved twice until the run ends)."""
    holder = st.container()
    if not active:
        return
    st.session_state[key] = state() if drawn is None else drawn
    with holder:
        _follow(key, state, note)


def job_states(kinds: Iterable[str], limit: int = 10) -> tuple[tuple[int, str], ...]:
    """The ids and statuses of the latest jobs of ``kinds``: what a page following those jobs compares."""
    return tuple((int(j.id or 0), j.status.value) for kind in kinds for j in queue.list_jobs(kind=kind, limit=limit))


def unfinished(states: Iterable[tuple[int, str]]) -> bool:
    """Whether a job of ``states`` (:func:`job_states`) is queued or running."""
    return any(status in ("queued", "running") for _, status in states)


def status_label(status: JobStatus) -> str:
    """A job status as shown in tables and metrics (plain words: they render in any font)."""
    return status.value


def current_identity() -> Identity | None:
    """The logged-in identity; anything else in its place (a dict, a string, an unknown role) is nobody."""
    identity = st.session_state.get(IDENTITY_KEY)
    if (
        not isinstance(identity, Identity)
        or not isinstance(identity.role, Role)
        or not isinstance(identity.username, str)
    ):
        return None
    return identity


def refreshed_identity() -> Identity | None:
    """The session's identity checked against the database once per run: a user disabled since the
    login is logged out, a changed role applies at once, and a console session ended elsewhere (logout in
    another tab, a password change) ends here too."""
    identity = current_identity()
    if identity is None:
        st.session_state.pop(IDENTITY_KEY, None)
        return None

    try:
        fresh = refresh_identity(identity)
        sid = st.session_state.get(SESSION_KEY)
        if fresh is not None and sid is not None and not sessions.live(sid):  # logged out in another tab, or ended
            fresh = None
    except (DatabaseUnavailable, SettingsError, SQLAlchemyError):
        return identity  # no database or no schema yet: the page explains that itself
    if fresh is None:
        st.session_state.pop(IDENTITY_KEY, None)
        st.session_state.pop(SESSION_KEY, None)
    elif fresh != identity:
        st.session_state[IDENTITY_KEY] = fresh
    return fresh


def can(role: Role) -> bool:
    """Whether the logged-in user has at least ``role``: what a page shows and enables. The platform's
    action checks the role again (``posttrain.platform.auth.action``); a page never decides alone."""
    identity = current_identity()
    return identity is not None and identity.can(role)


def me() -> Identity:
    """The logged-in identity, which every platform action takes first (pages run only after the login)."""
    return require_login()


def require_login() -> Identity:
    """Stop the page unless somebody is logged in (pages are only reachable through the login)."""
    identity = refreshed_identity()
    if identity is None:
        st.warning("Log in to use the console.")
        st.stop()
    assert identity is not None
    return identity


def guard_platform() -> bool:
    """Require a login, then check settings and database; show a clear error instead of a traceback."""
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
    """The note :func:`flash` left, in a place the page always holds (the elements after it keep theirs)."""
    holder = st.empty()
    message = st.session_state.pop(FLASH_KEY, None)
    if message:
        holder.success(message)


JOB_COLUMNS = ("id", "kind", "status", "priority", "attempt", "progress", "message", "by", "created", "error")


def job_table(jobs: list, columns: tuple[str, ...] = JOB_COLUMNS) -> None:
    """Jobs as a table with a progress bar and UTC timestamps (the Jobs and Training pages)."""
    import pandas as pd  # heavy: only where a table is drawn

    rows = [
        {
            "id": j.id,
            "kind": j.kind,
            "status": status_label(j.status),
            "priority": j.priority,
            "attempt": f"{j.attempts}/{j.max_attempts}",
            "progress": j.progress or 0.0,
            "message": j.progress_message,
            "by": j.submitted_by,
            "created": j.created_at,
            "error": j.error or "",
        }  # fmt: skip
        for j in jobs
    ]
    st.dataframe(
        pd.DataFrame(rows, columns=list(columns)),
        hide_index=True,
        width="stretch",
        column_config={
            "progress": st.column_config.ProgressColumn("progress", min_value=0.0, max_value=1.0, format="percent"),
            "created": st.column_config.DatetimeColumn("created (UTC)", format="YYYY-MM-DD HH:mm:ss"),
        },
    )


def fields_table(data: dict) -> None:
    """A result, verdict or provenance as a two-column table: no raw dict on any page."""
    import pandas as pd  # heavy: only where a table is drawn

    st.dataframe(pd.DataFrame(field_rows(data), columns=["field", "value"]), hide_index=True, width="stretch")


def yaml_block(data: object) -> None:
    """A config as the YAML an operator would write."""
    st.code(yaml.safe_dump(data, sort_keys=False, allow_unicode=True), language="yaml")


@st.cache_resource(show_spinner="Starting the console's sandbox…", on_release=lambda pool: pool.close())
def console_pool() -> SandboxPool:
    """The console process's own one-sandbox pool: the snippet runner's and the playground's tool calls."""
    settings = get_settings()
    config = settings.sandbox.model_copy(update={"pool_size": 1})
    return make_pool(config, settings.data_dir, settings.ray_address)  # type: ignore[return-value]


def show_message(message: dict[str, Any]) -> None:
    """One message of an agent exchange as it comes: the model's words and its tool calls (a message's
    ``tool_calls``, or Hermes ``<tool_call>`` blocks in its text), or a call's output."""
    if message["role"] == "tool":
        st.caption(f"{message.get('name') or 'tool'} output")
        st.code(message["content"] or "(no output)", language="text")
        return
    parsed = parse_tool_calls(message)
    if parsed.content.strip():
        st.markdown(parsed.content)
    for call in parsed.calls:
        st.caption(f"calls {call.name or 'a tool'}" + (f" (not run: {call.error})" if call.error else ""))
        st.code(json.dumps(call.arguments, ensure_ascii=False), language="json")


# --- plain values in tables (issue 35): one time format, no "None", no raw dicts (posttrain.platform.display) ---


def cell(value: Any) -> Any:
    """One value as a table cell: numbers and flags stay as they are (they sort and tick), the rest as
    :func:`~posttrain.platform.display.shown` (a time in UTC, a mapping as one line, nothing as a dash)."""
    if isinstance(value, (bool, int, float)):
        return value
    return shown(value)


def plain_table(
    rows: list[dict[str, Any]],
    *,
    columns: list[str] | None = None,
    long: dict[str, str] | None = None,
    column_config: dict[str, Any] | None = None,
    key: str | None = None,
) -> None:
    """Rows of values as a table that fits the page: every value through :func:`cell`, the table as wide as the
    page (``width="stretch"``) and scrolling sideways when its columns are wider; ``long`` sizes its long text
    columns (``{"details": "large"}``) so one long path or message does not push the others out of view."""
    import pandas as pd  # heavy: only where a table is drawn

    frame = pd.DataFrame([{name: cell(value) for name, value in row.items()} for row in rows], columns=columns)
    config: dict[str, Any] = {
        name: st.column_config.TextColumn(name, width=size) for name, size in (long or {}).items()
    }
    config.update(column_config or {})
    st.dataframe(frame, hide_index=True, width="stretch", column_config=config, key=key)


def beyond_noise(row: dict[str, Any]) -> str:
    """A per-domain difference read against its 95% interval: gained or lost beyond noise, or within it."""
    return "▲ gained" if row["ci_low"] > 0 else "▼ lost" if row["ci_high"] < 0 else "within noise"


def per_domain_results(arena: dict[str, Any], key: str) -> None:
    """Two models on the same held-out tasks (a run's before and after, or the Compare tab's A and B): one row per
    domain sorted by the difference, each with its 95% interval and marked where it gained or lost beyond noise,
    then the tasks whose verdict flipped, the answers side by side: first those of the domains that lost."""
    import pandas as pd  # heavy: only where a table is drawn

    a_name, b_name = arena["a"], arena["b"]
    rows = sorted(((d, r) for d, r in arena["domains"].items() if d != "all"), key=lambda item: -item[1]["delta"])
    rows += [("all", arena["domains"]["all"])] if "all" in arena["domains"] else []
    marks = {d: beyond_noise(r) for d, r in rows}
    lost = [d for d, r in rows if d != "all" and marks[d] == "▼ lost"]
    gained = sum(marks[d] == "▲ gained" for d, _ in rows if d != "all")
    general = sum(d.startswith("general/") for d, _ in rows)
    st.caption(
        f"{len(rows) - ('all' in arena['domains']) - general} domains"
        + (f" and the general check's {general} (general/...: domains the run never trained on)" if general else "")
        + f": {gained} gained and {len(lost)} lost beyond noise (the 95% interval of the paired difference clear "
        "of zero), sorted by the difference; all: the evaluation's own tasks"
    )
    if check := arena.get("general"):
        st.caption(
            f"General check over its {check['tasks']} tasks: {a_name} {check['a']:.1%} → {b_name} {check['b']:.1%}, "
            f"{100 * check['delta']:+.1f} ± {100 * check['se']:.1f} points (paired SE), {beyond_noise(check)}"
        )
    st.dataframe(pd.DataFrame([
        {"domain": d, "tasks": r["tasks"], a_name: r["a"], b_name: r["b"], "difference": r["delta"],
         "paired SE": r.get("se"), "95% CI": f"{r['ci_low']:+.1%} .. {r['ci_high']:+.1%}", "": marks[d],
         "wins/ties/losses": f"{r['wins']}/{r['ties']}/{r['losses']}"}
        for d, r in rows
    ]), hide_index=True, width="stretch", key=f"{key}_table", column_config={
        a_name: st.column_config.NumberColumn(format="percent"), b_name: st.column_config.NumberColumn(format="percent"),
        "difference": st.column_config.NumberColumn(format="percent"),
        "paired SE": st.column_config.NumberColumn(format="percent", help="the standard error of the per-task differences, "
                                                   "clustered by source where tasks share one (a document, a function)")})  # fmt: skip
    differ = arena["disagreements"]
    st.caption(f"{arena['disagreements_total']} tasks where they disagree" +
               (f" ({len(differ)} kept: every one of the domains that lost first)" if len(differ) < arena["disagreements_total"]
                else ""))  # fmt: skip
    if differ:
        flipped = sorted({d["domain"] for d in differ}, key=lambda d: (d not in lost, d))
        options = ["(all)", *flipped]
        domain = st.selectbox(
            "Flipped tasks in",
            options,
            key=f"{key}_flipped",
            index=1 if lost and lost[0] in flipped else 0,
            format_func=lambda d: f"{d} (lost)" if d in lost else d,
        )
        shown_rows = [d for d in differ if domain == "(all)" or d["domain"] == domain]
        st.dataframe(pd.DataFrame([
            {"domain": d["domain"], "prompt": d["prompt"], "reference": d["reference"],
             f"{a_name}": ("✓ " if d["a_passed"] else "✗ ") + d["a"], f"{b_name}": ("✓ " if d["b_passed"] else "✗ ") + d["b"]}
            for d in shown_rows
        ]), hide_index=True, width="stretch", key=f"{key}_flips")  # fmt: skip
