"""The console's pages, run by Streamlit's AppTest against a real database."""

from __future__ import annotations

from pathlib import Path

from conftest import OPERATOR, REPO_ROOT, login_as, wait_for
from streamlit.testing.v1 import AppTest

from posttrain.platform.db.models import JobStatus
from posttrain.platform.jobs import queue

JOBS_PAGE = str(REPO_ROOT / "ui" / "views" / "jobs.py")


def test_jobs_page_lists_submits_and_cancels(platform_env: dict[str, str]) -> None:
    done = queue.submit(OPERATOR, "selftest", {"steps": 1})
    queue.claim("w", 1, 0)
    queue.finish(done, queue.Outcome(exit_code=1, error="boom: it broke", cause="error"))

    at = login_as(AppTest.from_file(JOBS_PAGE, default_timeout=30)).run()
    assert not at.exception
    assert at.title[0].value == "Jobs"
    counts = {m.label: m.value for m in at.metric}
    assert counts["failed"] == "1"
    frame = at.dataframe[0].value
    assert list(frame["id"]) == [done] and "boom: it broke" in frame["error"].iloc[0]

    at.number_input(key="selftest_steps").set_value(3)
    at.button[0].click().run()  # the form submit button
    assert not at.exception
    assert any("Queued job" in s.value for s in at.success)
    new = queue.list_jobs(limit=1)[0]
    assert new.kind == "selftest" and new.config["steps"] == 3 and new.status is JobStatus.queued

    at.number_input(key="inspect_job_id").set_value(new.id).run()
    assert any(f"Job {new.id}" in md.value for md in at.markdown)
    at.button(key=f"cancel_{new.id}").click().run()
    assert queue.get_job(new.id).status is JobStatus.cancelled


def test_app_shell_opens_on_overview(platform_env: dict[str, str]) -> None:
    at = login_as(AppTest.from_file(str(REPO_ROOT / "ui" / "app.py"), default_timeout=30)).run()
    assert not at.exception
    assert at.title[0].value == "Overview"


def test_overview_counts_and_failures(platform_env: dict[str, str]) -> None:
    ok = queue.submit(OPERATOR, "selftest", {"steps": 1})
    bad = queue.submit(OPERATOR, "selftest", {"steps": 1})
    queue.claim("w", 2, 0)
    queue.claim("w", 2, 0)
    queue.finish(bad, queue.Outcome(exit_code=-9, error="killed by SIGKILL", cause="oom"))
    at = login_as(AppTest.from_file(str(REPO_ROOT / "ui" / "views" / "overview.py"), default_timeout=30)).run()
    assert not at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Jobs running"] == "1" and metrics["Jobs failed"] == "1"
    assert any(f"Job {bad} · selftest · oom · exit -9" in e.label for e in at.expander)
    assert ok != bad


def test_page_explains_missing_schema(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from posttrain.platform.db.engine import reset_engines
    from posttrain.platform.settings import get_settings

    monkeypatch.setenv("POSTTRAIN_DATABASE_URL", f"sqlite:///{tmp_path / 'blank.db'}")
    get_settings.cache_clear()
    reset_engines()
    at = login_as(AppTest.from_file(JOBS_PAGE, default_timeout=30)).run()
    assert "posttrain db upgrade" in at.error[0].value
    get_settings.cache_clear()


def test_sandboxes_page_runs_snippet_and_shows_pool(platform_env: dict[str, str], monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import os
    import shutil
    import tempfile

    from posttrain.platform.settings import get_settings

    # Sandboxes run as an unprivileged uid when the host is root: their root must be traversable.
    root = tempfile.mkdtemp(prefix="posttrain-console-sbx-")
    os.chmod(root, 0o755)
    monkeypatch.setenv("POSTTRAIN_SANDBOX__ROOT_DIR", root)
    get_settings.cache_clear()
    try:
        at = login_as(AppTest.from_file(str(REPO_ROOT / "ui" / "views" / "sandboxes.py"), default_timeout=60)).run()
        assert not at.exception
        assert "No sandbox pool has reported yet" in at.info[0].value
        at.text_area(key="snippet_code").set_value("x = 6 * 7\nprint('answer', x)")
        at.button(key="snippet_run").click().run()
        assert not at.exception
        assert at.success and at.success[0].value.startswith("ok in")
        assert any("answer 42" in c.value for c in at.code)
        # the same page, no reload: the panel lists the console's pool, back in the pool after the snippet
        assert not any("No sandbox pool has reported yet" in i.value for i in at.info)
        row = at.dataframe[0].value.iloc[0]
        assert row["pool"].startswith("console@") and row["calls"] >= 1 and row["episodes"] >= 1
        assert (row["state"], row["ready"], row["size"]) == ("idle", 1, 1), row.to_dict()
        assert any("Call latency" in s.value for s in at.subheader) and at.get("vega_lite_chart")

        # and it goes on reporting while the console has it, so it never looks dead a minute later
        from sqlmodel import select

        from posttrain.platform.db.engine import session
        from posttrain.platform.db.models import SandboxPool

        def reported_at():  # type: ignore[no-untyped-def]
            with session(read_only=True) as s:
                return s.exec(select(SandboxPool.updated_at).where(SandboxPool.name == row["pool"])).one()

        first = reported_at()
        wait_for(lambda: reported_at() > first, timeout=30, message="the console's pool reporting again")
    finally:
        import streamlit as st

        st.cache_resource.clear()  # closes the console's pool (on_release)
        shutil.rmtree(root, ignore_errors=True)
