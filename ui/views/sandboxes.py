"""Sandboxes: every pool's state, a snippet runner, and call latency histograms."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pandas as pd
import streamlit as st
from sqlmodel import col, select

from posttrain.platform.db.engine import session
from posttrain.platform.db.models import SandboxPool as SandboxPoolRow
from posttrain.platform.db.models import utcnow
from posttrain.platform.sandbox.snippet import run_snippet
from posttrain.platform.sandbox.status import default_name, publish
from posttrain.platform.db.models import Role
from posttrain.ui.common import can, console_pool, guard_platform, me

LIVE_WITHIN = timedelta(seconds=60)

st.title("Sandboxes")
st.caption(
    "Isolated environments for tool calls and unit tests. Each process that uses a pool "
    "(training runs, verifiers, this console) reports it here."
)
if not guard_platform():
    st.stop()


def pool_rows() -> list[SandboxPoolRow]:
    with session(read_only=True) as s:
        return list(s.exec(select(SandboxPoolRow).order_by(col(SandboxPoolRow.updated_at).desc())).all())


def limits_summary(status: dict) -> str:
    """What the pool's host cannot enforce (its "weaker: ..." lines), or that every limit holds."""
    limits = status.get("limits") or {}
    weaker = [f"{part}: {line}" for part, line in limits.items() if line.startswith("weaker")]
    return "; ".join(weaker) if weaker else "all enforced" if limits else ""


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
        table.append(
            {
                "pool": r.name,
                "backend": r.backend,
                "live": now - r.updated_at < LIVE_WITHIN,
                "size": r.size,
                "ready": status.get("ready", 0),
                "busy": r.busy,
                "failures": r.failures,
                "infra failures": status.get("infra_failures", 0),
                "episodes": status.get("episodes", 0),
                "calls": status.get("calls", 0),
                "call p50 ms": round(latency.get("call_p50", 0.0), 2),
                "call p99 ms": round(latency.get("call_p99", 0.0), 2),
                "acquire p50 ms": round(latency.get("acquire_p50", 0.0), 3),
                "last error": status.get("last_error", ""),
                "limits": limits_summary(status),
                "updated": r.updated_at,
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
        edges = np.histogram_bin_edges(np.log10(np.clip(ms.to_numpy(), 1e-3, None)), bins=20)
        counts, _ = np.histogram(np.log10(np.clip(ms.to_numpy(), 1e-3, None)), bins=edges)
        hist = pd.DataFrame({"ms (bin start)": [f"{10**e:.2f}" for e in edges[:-1]], "calls": counts})
        st.bar_chart(hist, x="ms (bin start)", y="calls")
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
        publish(console_pool(), default_name("console"))

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
