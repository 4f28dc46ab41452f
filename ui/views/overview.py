"""Overview: the state of the platform at a glance, live."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from posttrain.platform.overview import read_overview
from posttrain.ui.common import guard_platform

st.title("Overview")
if not guard_platform():
    st.stop()


@st.fragment(run_every="3s")
def live() -> None:
    o = read_overview()
    c = st.columns(6)
    c[0].metric("Jobs running", o.jobs["running"], help=f"{o.jobs['queued']} queued")
    c[1].metric("Jobs failed", o.jobs["failed"])
    c[2].metric("Documents", sum(o.documents.values()), help=", ".join(f"{k} {v}" for k, v in o.documents.items()))
    c[3].metric("Tasks", o.tasks, help=f"over {o.domains} domains")
    c[4].metric("Deployments healthy", f"{o.deployments_healthy}/{o.deployments}", help=f"{o.models} models registered")
    c[5].metric("Sandboxes busy", f"{o.sandboxes_busy}/{o.sandboxes}", help=f"{o.pools_live} live pools")

    st.subheader("Training runs")
    if o.runs:
        st.dataframe(
            pd.DataFrame(
                [
                    {
                        "job": r.job_id, "kind": r.kind, "step": r.step, "progress": r.progress or 0.0,
                        "reward": r.metrics.get("reward_mean"), "loss": r.metrics.get("loss"),
                        "tokens/s": r.metrics.get("rollout_tokens_per_s"), "status": r.message,
                    }
                    for r in o.runs
                ]  # fmt: skip
            ),
            hide_index=True,
            width="stretch",
            column_config={"progress": st.column_config.ProgressColumn(min_value=0.0, max_value=1.0, format="percent")},
        )
    else:
        st.caption("No training run is running.")

    st.subheader("Jobs by status")
    st.bar_chart(pd.DataFrame({"status": list(o.jobs), "jobs": list(o.jobs.values())}), x="status", y="jobs")

    st.subheader("Recent failures")
    if not o.failures:
        st.caption("No failed jobs.")
    for job in o.failures:
        with st.expander(f"Job {job.id} · {job.kind} · {job.error_cause or 'error'} · exit {job.exit_code}"):
            st.write(job.error or "")
            st.caption("Open it on the Jobs page for the last 200 lines of its log.")


live()
