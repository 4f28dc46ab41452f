"""Overview: the state of the platform at a glance, live."""

from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st
from sqlmodel import col, select

from posttrain.platform.db.engine import session
from posttrain.platform.db.models import Deployment, JobStatus
from posttrain.platform.jobs import queue
from posttrain.platform.models.importer import DEFAULT_MODEL
from posttrain.platform.models.registry import ModelNotFound, get_model
from posttrain.platform.overview import Overview, read_overview
from posttrain.ui.common import guard_platform

st.title("Overview")
if not guard_platform():
    st.stop()


def metrics(o: Overview) -> None:
    """Six figures in two rows of three, with labels short enough to show whole in a narrow column."""
    top, bottom = st.columns(3), st.columns(3)
    top[0].metric("Jobs running", o.jobs["running"], help=f"{o.jobs['queued']} queued")
    top[1].metric("Jobs failed", o.jobs["failed"])
    top[2].metric("Documents", sum(o.documents.values()), help=", ".join(f"{k} {v}" for k, v in o.documents.items()))
    bottom[0].metric("Tasks", o.tasks, help=f"over {o.domains} domains")
    bottom[1].metric("Deployments up", f"{o.deployments_healthy}/{o.deployments}",
                     help=f"healthy deployments of all deployments; {o.models} models registered")  # fmt: skip
    bottom[2].metric("Sandboxes busy", f"{o.sandboxes_busy}/{o.sandboxes}", help=f"{o.pools_live} live pools")


def builtin_model() -> None:
    """Whether the built-in model (``make run`` registers it) can be chatted with, and if not, what to do."""
    try:
        model = get_model(DEFAULT_MODEL)
    except ModelNotFound:
        st.caption(f"The built-in model {DEFAULT_MODEL} is not registered: `posttrain models import "
                   f"builtin:{DEFAULT_MODEL}` registers it (make run does).")  # fmt: skip
        return
    live = ("starting", "running", "unhealthy")
    with session(read_only=True) as s:
        deployments = list(
            s.exec(select(Deployment).where(Deployment.model_id == model.id, col(Deployment.status).in_(live)))
        )
    healthy = sorted({d.tier for d in deployments if d.status == "running" and d.healthy})
    if healthy:
        st.success(f"The built-in model {DEFAULT_MODEL} is deployed ({', '.join(healthy)} tier): chat with it in the "
                   "playground on Models & Serving.")  # fmt: skip
        return
    if any(d.status == "starting" for d in deployments):
        st.info(f"The built-in model {DEFAULT_MODEL} is starting; once it is up, chat with it on Models & Serving.")
        return
    if deployments:
        st.warning(f"The built-in model {DEFAULT_MODEL} is deployed but does not answer its health checks: see its "
                   "deployment on Models & Serving.")  # fmt: skip
        return
    waiting = [j for status in (JobStatus.queued, JobStatus.running) for j in queue.list_jobs(status=status, kind="deploy")
               if (j.config or {}).get("model") == DEFAULT_MODEL]  # fmt: skip
    if waiting:
        st.info(f"The built-in model {DEFAULT_MODEL} is being deployed (job {waiting[0].id}); once it is up, chat with "
                "it on Models & Serving.")  # fmt: skip
        return
    st.info(
        f"The built-in model {DEFAULT_MODEL} is registered but not deployed: deploy it on Models & Serving to chat."
    )


def jobs_by_status(jobs: dict[str, int]) -> None:
    if not sum(jobs.values()):
        st.caption("No jobs yet. Uploading a document, building tasks, training and deploying each run as a job.")
        return
    frame = pd.DataFrame({"status": list(jobs), "jobs": list(jobs.values())})
    st.altair_chart(
        alt.Chart(frame)
        .mark_bar()
        .encode(
            x=alt.X("status:N", sort=list(jobs), title="status"),
            y=alt.Y("jobs:Q", title="jobs", axis=alt.Axis(tickMinStep=1, format="d")),
            tooltip=["status:N", "jobs:Q"],
        ),
        width="stretch",
    )


@st.fragment(run_every="3s")
def live() -> None:
    o = read_overview()
    metrics(o)
    builtin_model()

    st.subheader("Training runs")
    if o.runs:
        st.dataframe(
            pd.DataFrame(
                [
                    {
                        "job": r.job_id,
                        "kind": r.kind,
                        "step": r.step,
                        "progress": r.progress or 0.0,
                        "reward": r.metrics.get("reward_mean"),
                        "loss": r.metrics.get("loss"),
                        "tokens/s": r.metrics.get("rollout_tokens_per_s"),
                        "status": r.message,
                    }
                    for r in o.runs
                ]  # fmt: skip
            ),
            hide_index=True,
            width="stretch",
            column_config={"progress": st.column_config.ProgressColumn(min_value=0.0, max_value=1.0, format="percent")},
        )
    else:
        st.caption("No training run is running. Start one on the Training page.")

    st.subheader("Jobs by status")
    jobs_by_status(o.jobs)

    st.subheader("Recent failures")
    if not o.failures:
        st.caption("No failed jobs.")
    for job in o.failures:
        with st.expander(f"Job {job.id} · {job.kind} · {job.error_cause or 'error'} · exit {job.exit_code}"):
            st.write(job.error or "")
            st.caption("Open it on the Jobs page for the last 200 lines of its log.")


live()
