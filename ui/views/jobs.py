"""Jobs: the queue with live status, submit a selftest job, cancel, read logs."""

from __future__ import annotations

import streamlit as st

from posttrain.platform.db.models import JobStatus, Role
from posttrain.platform.display import utc_text
from posttrain.platform.jobs import queue
from posttrain.platform.jobs.registry import JobConfigError
from posttrain.ui.common import can, fields_table, guard_platform, me, plain_table, status_label, yaml_block

PAGE_SIZE = 25

st.title("Jobs")
st.caption("Every long action runs as a job in the worker, outside the console: closing this tab never stops one.")

if not guard_platform():
    st.stop()


@st.fragment(run_every="2s")
def live_queue() -> None:
    counts = queue.count_by_status()
    cols = st.columns(len(counts))
    for col, (name, n) in zip(cols, counts.items()):
        col.metric(status_label(JobStatus(name)), n)

    filter_col, page_col = st.columns([3, 1])
    chosen = filter_col.multiselect(
        "Status", [s.value for s in JobStatus], default=[], key="jobs_status_filter", placeholder="all statuses"
    )
    total = sum(n for name, n in counts.items() if not chosen or name in chosen)
    pages = max(1, -(-total // PAGE_SIZE))
    page = page_col.number_input("Page", min_value=1, max_value=pages, value=1, step=1, key="jobs_page")
    jobs = []
    for status in [JobStatus(c) for c in chosen] or [None]:
        jobs.extend(queue.list_jobs(status=status, limit=PAGE_SIZE * int(page)))
    jobs.sort(key=lambda j: j.id or 0, reverse=True)
    jobs = jobs[PAGE_SIZE * (int(page) - 1) : PAGE_SIZE * int(page)]
    if not jobs:
        st.info("No jobs yet. Submit one below, or launch work from the other pages.")
        return
    plain_table(
        [
            {
                "id": j.id,
                "kind": j.kind,
                "status": status_label(j.status),
                "priority": j.priority,
                "attempt": f"{j.attempts}/{j.max_attempts}",
                "progress": j.progress or 0.0,
                "message": queue.why_waiting(j) if j.status is JobStatus.queued else j.progress_message or None,
                "created": j.created_at,
                "finished": j.finished_at,
                "by": j.submitted_by,
                "error": j.error,
            }
            for j in jobs
        ],  # fmt: skip
        long={"message": "medium", "error": "large"},
        column_config={
            "progress": st.column_config.ProgressColumn("progress", min_value=0.0, max_value=1.0, format="percent")
        },
    )


live_queue()

st.subheader("Submit a selftest job")
with st.form("submit_selftest"):
    c1, c2, c3 = st.columns(3)
    steps = c1.number_input("Steps", min_value=0, max_value=100_000, value=10, key="selftest_steps")
    sleep_s = c2.number_input("Seconds per step", min_value=0.0, max_value=60.0, value=0.5)
    priority = c3.number_input("Priority (higher runs first)", min_value=-100, max_value=100, value=0)
    if st.form_submit_button("Submit", type="primary", disabled=not can(Role.operator)):
        try:
            job_id = queue.submit(
                me(), "selftest", {"steps": int(steps), "sleep_s": float(sleep_s)}, priority=int(priority)
            )
            st.success(f"Queued job {job_id}.")
        except (JobConfigError, PermissionError) as exc:
            st.error(str(exc))

st.subheader("Inspect a job")
job_id = st.number_input("Job id", min_value=1, step=1, value=None, key="inspect_job_id", placeholder="job id")


@st.fragment(run_every="2s")
def job_detail(job_id: int) -> None:
    try:
        job = queue.get_job(job_id)
    except queue.JobNotFound as exc:
        st.warning(str(exc))
        return
    st.markdown(
        f"**Job {job.id}** · `{job.kind}` · {status_label(job.status)} · attempt {job.attempts}/{job.max_attempts}"
    )
    times = [("submitted", job.created_at), ("started", job.started_at), ("finished", job.finished_at)]
    st.caption(
        " · ".join(f"{what} {utc_text(when)}" for what, when in times if when is not None) + f" · by {job.submitted_by}"
    )
    if (waits := queue.why_waiting(job)) is not None:
        st.info(f"Queued: {waits[0].upper()}{waits[1:]}.")
    if job.progress is not None:
        st.progress(job.progress, text=job.progress_message or None)
    elif job.progress_message:
        st.caption(job.progress_message)
    if job.error:
        st.error(f"{job.error_cause or 'error'} (exit code {job.exit_code}): {job.error}")
    if job.result:
        fields_table(job.result)
    if job.status in (JobStatus.queued, JobStatus.running) and not job.cancel_requested and can(Role.operator):
        if st.button("Cancel job", key=f"cancel_{job.id}"):
            try:
                queue.cancel(me(), job.id)
            except PermissionError as exc:
                st.error(str(exc))
            else:
                st.rerun(scope="fragment")
    elif job.cancel_requested and job.status == JobStatus.running:
        st.info("Stop requested; the worker stops it within the grace period.")
    with st.expander("Config"):
        yaml_block(job.config)
    st.caption("Log (last 200 lines)")
    st.code(queue.read_log(job, 200) or "(no output yet)", language="log")


if job_id:
    job_detail(int(job_id))
