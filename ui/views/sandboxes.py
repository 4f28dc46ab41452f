"""Sandboxes: every pool's state, a snippet runner, and call latency histograms."""

from __future__ import annotations

import re
import socket
from datetime import datetime, timedelta
from pathlib import Path

import altair as alt
import numpy as np
import pandas as pd
import streamlit as st
from sqlmodel import col, select

from posttrain.platform.db.engine import session
from posttrain.platform.db.models import Role, utcnow
from posttrain.platform.db.models import SandboxPool as SandboxPoolRow
from posttrain.platform.sandbox.snippet import run_snippet
from posttrain.platform.sandbox.status import StatusPublisher, default_name, publish
from posttrain.platform.settings import get_settings
from posttrain.ui.common import can, console_pool, guard_platform, me

LIVE_WITHIN = timedelta(seconds=60)  # a pool that has not reported for this long is not running any more
REPORT_EVERY_S = 5.0  # how often the console reports its own pool once it has one
HISTOGRAM_BINS = 20

st.title("Sandboxes")
st.caption(
    "Isolated environments for tool calls and unit tests. Each process that uses a pool "
    "(training runs, verifiers, this console) reports it here."
)
if not guard_platform():
    st.stop()


@st.cache_resource(show_spinner=False, on_release=lambda publisher: publisher.stop())
def console_reporter() -> StatusPublisher:
    """Reports the console's own pool every few seconds for as long as the console has it, so the
    table below says what it is doing instead of showing the one report a snippet left behind."""
    url = get_settings().resolved_database_url
    return StatusPublisher(console_pool(), default_name("console"), interval_s=REPORT_EVERY_S, url=url).start()


def pool_rows() -> list[SandboxPoolRow]:
    with session(read_only=True) as s:
        return list(s.exec(select(SandboxPoolRow).order_by(col(SandboxPoolRow.updated_at).desc())).all())


def limits_summary(status: dict) -> str:
    """What the pool's host cannot enforce (its "weaker: ..." lines), or that every limit holds."""
    limits = status.get("limits") or {}
    weaker = [f"{part}: {line}" for part, line in limits.items() if line.startswith("weaker")]
    return "; ".join(weaker) if weaker else "all enforced" if limits else ""


def ago(delta: timedelta) -> str:
    seconds = max(delta.total_seconds(), 0.0)
    if seconds < 120:
        return f"{seconds:.0f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def process_ended(row: SandboxPoolRow) -> bool | None:
    """Whether the process that owns the pool (its name ends in ``@host:pid``) has ended; None when it runs
    on another machine (or has another name), where only its reports can tell."""
    found = re.search(r"@(?P<host>[^:@]+):(?P<pid>\d+)$", row.name)
    if found is None or (row.host or found["host"]) != socket.gethostname():
        return None
    return not Path(f"/proc/{found['pid']}").exists()


def pool_state(row: SandboxPoolRow, now: datetime) -> tuple[str, str]:
    """What the pool is doing, as (state, what it means), from its last report:
    idle, busy, starting, failed, closed, or silent (no report for a minute, its process still there)."""
    status = (row.config or {}).get("status", {})
    size, busy = row.size, row.busy
    ready = int(status.get("ready", 0))
    starting = int(status.get("starting", max(size - ready - busy, 0)))
    error = status.get("last_error", "")
    plural = "" if size == 1 else "es"
    if now - row.updated_at >= LIVE_WITHIN:
        ended, since = process_ended(row), ago(now - row.updated_at)
        if ended:
            return "closed", f"its process ended {since}; its sandboxes were reclaimed"
        if ended is None:
            return (
                "silent",
                f"no report since {since}: its process on {row.host or 'another machine'} ended or is stuck",
            )
        return "silent", f"no report since {since}, though its process still runs: it may be stuck"
    if size and not (ready or busy or starting):
        return "closed", "the pool was closed; its sandboxes were reclaimed"
    if busy:
        return "busy", f"{busy} of {size} sandbox{plural} running an episode, {ready} warm and free"
    if starting and not ready and row.failures and error:
        return "failed", f"no sandbox is up, the pool keeps retrying: {error}"
    if starting:
        return "starting", (
            f"{starting} of {size} sandbox{plural} starting, or being wiped after an episode; {ready} warm and free"
        )
    note = f"; {row.failures} failure(s) so far, the last: {error}" if row.failures and error else ""
    return (
        "idle",
        f"{ready} of {size} sandbox{plural} warm and free; each is wiped and restarted after its episode{note}",
    )


def bin_labels(starts: list[float]) -> list[str]:
    """Bin starts in ms with as few digits as keep them apart (so no two bins share a label)."""
    for digits in range(3, 10):
        labels = [f"{v:.{digits}g}" if v < 1000 else f"{v:,.0f}" for v in starts]
        if len(set(labels)) == len(labels):
            return labels
    return [repr(v) for v in starts]


def latency_histogram(ms: pd.Series) -> alt.Chart:
    """Call durations in log-spaced bins, drawn left to right in numeric order (the axis is ordered by
    the bins' start in ms, not by their labels as text)."""
    logs = np.log10(np.clip(ms.to_numpy(dtype=float), 1e-3, None))
    edges = np.histogram_bin_edges(logs, bins=HISTOGRAM_BINS)
    counts, _ = np.histogram(logs, bins=edges)
    starts, ends = [float(10**e) for e in edges[:-1]], [float(10**e) for e in edges[1:]]
    labels = bin_labels(starts)
    hist = pd.DataFrame({"ms (bin start)": labels, "from ms": starts, "to ms": ends, "calls": counts})
    return (
        alt.Chart(hist)
        .mark_bar()
        .encode(
            x=alt.X("ms (bin start):O", sort=labels, title="call duration, ms (bin start, log-spaced bins)"),
            y=alt.Y("calls:Q", title="calls", axis=alt.Axis(tickMinStep=1, format="d")),
            tooltip=[alt.Tooltip("from ms:Q", format=".3f"), alt.Tooltip("to ms:Q", format=".3f"), "calls:Q"],
        )
    )


@st.fragment(run_every="3s")
def pools_panel() -> None:
    rows = pool_rows()
    if not rows:
        st.info("No sandbox pool has reported yet. Run a snippet below, or start a job that uses sandboxes.")
        return
    now = utcnow()
    table = []
    for r in rows:
        status = r.config.get("status", {})
        latency = status.get("latency_ms", {})
        state, doing = pool_state(r, now)
        table.append(
            {
                "pool": r.name,
                "state": state,
                "doing": doing,
                "backend": r.backend,
                "size": r.size,
                "ready": status.get("ready", 0),
                "busy": r.busy,
                "starting": status.get("starting", 0),
                "failures": r.failures,
                "infra failures": status.get("infra_failures", 0),
                "episodes": status.get("episodes", 0),
                "calls": status.get("calls", 0),
                "call p50 ms": round(latency.get("call_p50", 0.0), 2),
                "call p99 ms": round(latency.get("call_p99", 0.0), 2),
                "acquire p50 ms": round(latency.get("acquire_p50", 0.0), 3),
                "last error": status.get("last_error", ""),
                "limits": limits_summary(status),
                "last report": ago(now - r.updated_at),
            }
        )
    st.dataframe(pd.DataFrame(table), hide_index=True, width="stretch")

    calls = [c for r in rows for c in r.config.get("status", {}).get("recent_calls", [])]
    if calls:
        st.subheader("Call latency (recent calls, all pools)")
        frame = pd.DataFrame(calls)
        tools = sorted(frame["tool"].unique())
        chosen = st.selectbox("Tool", ["all", *tools], key="latency_tool")
        ms = frame["ms"] if chosen == "all" else frame.loc[frame["tool"] == chosen, "ms"]
        st.altair_chart(latency_histogram(ms), width="stretch")
        st.caption(
            f"{len(ms)} call{'' if len(ms) == 1 else 's'} from {ms.min():.2f} ms to {ms.max():.2f} ms, "
            f"in {HISTOGRAM_BINS} log-spaced bins."
        )
        by_status = frame.groupby("status").size().rename("calls")
        st.caption("Outcomes: " + ", ".join(f"{k} {v}" for k, v in by_status.items()))


pools_panel()

st.subheader("Run a snippet")
tool = st.radio("Tool", ["python", "bash"], horizontal=True, key="snippet_tool")
code = st.text_area(
    "Code" if tool == "python" else "Command",
    value="import sys\nprint(sys.version)" if tool == "python" else "uname -a; id; ls -la /",
    height=140,
    key="snippet_code",
)
if not can(Role.operator):
    st.caption("Running snippets needs the operator role.")
if st.button("Run in a sandbox", type="primary", key="snippet_run", disabled=not can(Role.operator)):
    try:
        result = run_snippet(me(), console_pool, tool, code)
    except PermissionError as exc:
        st.error(str(exc))
    except Exception as exc:  # the pool could not start or lend a sandbox: show why, keep the page alive
        st.error(f"The sandbox could not run the snippet: {exc}")
    else:
        st.session_state["snippet_result"] = result
        pool = console_pool()
        pool.wait_ready(timeout=5)  # the sandbox is wiped after the snippet: report it back in the pool, not half-way
        publish(pool, default_name("console"))
        console_reporter()  # from now on the console's pool reports itself while the console has it
        st.rerun()  # the pool table above was drawn before the snippet ran: draw it again with the pool in it

result = st.session_state.get("snippet_result")
if result is not None:
    (st.success if result.ok else st.warning)(f"{result.status.value} in {result.duration_ms:.2f} ms")
    if result.stdout:
        st.code(result.stdout, language="text")
    if result.stderr:
        st.code(result.stderr, language="text")
    if result.value is not None:
        st.code(repr(result.value), language="python")
    if result.error is not None:
        st.code(result.error.traceback or f"{result.error.type}: {result.error.message}", language="text")
    if result.detail:
        st.caption(result.detail)
