"""The console's pages as a newcomer meets them (issue 35), run by Streamlit's AppTest against a real database.

AppTest runs a page the way a browser's page load or click does; conftest's ``browser_timers`` records what each
run sends (the tab's icon, the timers of ``st.fragment(run_every=...)``) and fires those timers as a browser left
open on a page does. :func:`x_axis_order` reads a chart the way Vega-Lite draws its x axis.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from datetime import timedelta
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
from conftest import OPERATOR, REPO_ROOT, login_as
from sqlmodel import select
from streamlit.testing.v1 import AppTest

from posttrain.platform.db.engine import session
from posttrain.platform.db.models import Deployment, Model, SandboxPool, utcnow
from posttrain.platform.jobs import queue
from posttrain.platform.models.importer import DEFAULT_MODEL
from posttrain.platform.tasks.domains import list_domains, list_families

VIEWS = REPO_ROOT / "ui" / "views"


def vega_charts(at: AppTest) -> list[tuple[dict[str, Any], pd.DataFrame]]:
    """Each Vega-Lite chart on the page (st.bar_chart, st.altair_chart, ...) as (spec, its data)."""
    charts = []
    for chart in at.get("vega_lite_chart"):
        frames = [pa.ipc.open_stream(d.data.data).read_all().to_pandas() for d in chart.proto.datasets]
        if chart.proto.HasField("data") and chart.proto.data.data:
            frames.append(pa.ipc.open_stream(chart.proto.data.data).read_all().to_pandas())
        charts.append((json.loads(chart.proto.spec), frames[0] if frames else pd.DataFrame()))
    return charts


def x_axis_order(spec: dict[str, Any], frame: pd.DataFrame) -> list[Any]:
    """The x values left to right, as Vega-Lite draws them: a quantitative axis by number; a discrete one by
    its ``sort`` (a list: that order; null: the data's order; by default ascending, which for text is
    the text's order, so "42.30" comes before "5.98")."""
    x = spec["encoding"]["x"]
    values = list(dict.fromkeys(frame[x["field"]]))
    if x.get("type") == "quantitative":
        return sorted(values, key=float)
    order = x.get("sort", "ascending")
    if order is None:
        return values
    if isinstance(order, list):
        return [v for v in order if v in values] + [v for v in values if v not in order]
    if order in ("ascending", "descending"):
        return sorted(values, reverse=order == "descending")
    raise AssertionError(f"x sort {order!r}: teach x_axis_order how Vega-Lite draws it")


# --- Overview ----------------------------------------------------------------------------------------------


def test_overview_empty_says_so_in_words_and_tells_how_to_chat(platform_env: dict[str, str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    at = login_as(AppTest.from_file(str(VIEWS / "overview.py"), default_timeout=30)).run()
    assert not at.exception
    assert not vega_charts(at)  # no jobs: words, not an empty chart with a lone 0.000000 tick
    assert any(c.value.startswith("No jobs yet") for c in at.caption)
    assert any("No training run is running" in c.value for c in at.caption)
    assert any(c.value == "No failed jobs." for c in at.caption)
    labels = [m.label for m in at.metric]
    assert len(labels) == 6 and "Deployments up" in labels
    assert max(map(len, labels)) <= len(
        "Sandboxes busy"
    )  # the longest label that showed whole ("Deployments heal…" did not)
    assert any(f"{DEFAULT_MODEL} is not registered" in c.value and "make run" in c.value for c in at.caption)

    with session() as s:  # what `make run` leaves: the built-in model registered, nothing deployed
        s.add(Model(name=DEFAULT_MODEL, path=str(tmp_path)))
    at.run()
    assert any(f"{DEFAULT_MODEL} is registered but not deployed: deploy it on Models & Serving to chat" in i.value
               for i in at.info)  # fmt: skip

    with session() as s:
        model = s.exec(select(Model).where(Model.name == DEFAULT_MODEL)).one()
        s.add(Deployment(model_id=model.id, tier="standard", url="http://127.0.0.1:9", status="running", healthy=True))
    at.run()
    assert not at.info and any("deployed (standard tier): chat with it" in s.value for s in at.success)


def test_overview_jobs_chart_counts_whole_jobs(platform_env: dict[str, str]) -> None:
    queue.submit(OPERATOR, "selftest", {"steps": 1})
    at = login_as(AppTest.from_file(str(VIEWS / "overview.py"), default_timeout=30)).run()
    assert not at.exception
    ((spec, frame),) = vega_charts(at)
    assert dict(zip(frame["status"], frame["jobs"]))["queued"] == 1
    assert spec["encoding"]["y"]["axis"]["format"] == "d"  # ticks 0, 1: no 0.2 jobs
    assert not any(c.value.startswith("No jobs yet") for c in at.caption)


# --- Sandboxes ---------------------------------------------------------------------------------------------


def pool_row(name: str, *, size: int = 1, ready: int = 1, busy: int = 0, starting: int = 0, failures: int = 0,
             last_error: str = "", ago_s: float = 0.0, calls: list[float] | None = None, host: str = "") -> SandboxPool:  # fmt: skip
    """A pool's row as ``posttrain.platform.sandbox.status.publish`` writes it."""
    status = {"backend": "bwrap", "size": size, "ready": ready, "busy": busy, "starting": starting,
              "failures": failures, "infra_failures": 0, "episodes": len(calls or []), "calls": len(calls or []),
              "last_error": last_error, "latency_ms": {}, "limits": {},
              "recent_calls": [{"tool": "python", "status": "ok", "ms": ms, "at": 0.0} for ms in calls or []]}  # fmt: skip
    return SandboxPool(name=name, backend="bwrap", host=host or socket.gethostname(), size=size, busy=busy, failures=failures,
                       config={"status": status, "limits": {}}, updated_at=utcnow() - timedelta(seconds=ago_s))  # fmt: skip


def ended_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_sandboxes_page_says_what_each_pool_does_and_sorts_latency_bins_by_number(platform_env: dict[str, str]) -> None:
    host, me = socket.gethostname(), os.getpid()
    calls = [5.98, 6.70, 6.70, 42.30, 47.46, 53.26, 53.26, 53.26]  # the bins: as text, 42.30 < 5.98
    gone = ended_pid()
    with session() as s:
        s.add(pool_row(f"verify@{host}:{me}", size=2, ready=2, calls=calls))
        s.add(pool_row(f"train@{host}:{me}", size=2, ready=1, busy=1))
        s.add(pool_row(f"warm@{host}:{me}", size=2, ready=0, starting=2))
        s.add(pool_row(f"broken@{host}:{me}", ready=0, starting=1, failures=3,
                       last_error="sandbox 0 did not start: bwrap: setting up uid map: Permission denied"))  # fmt: skip
        s.add(pool_row(f"closed@{host}:{me}", ready=0))
        s.add(pool_row(f"grpo@{host}:{gone}", ago_s=300))
        s.add(pool_row(f"stuck@{host}:{me}", ago_s=300))
        s.add(pool_row("far@gpu-node-7:4242", ago_s=300, host="gpu-node-7"))
    at = login_as(AppTest.from_file(str(VIEWS / "sandboxes.py"), default_timeout=60)).run()
    assert not at.exception
    frame = at.dataframe[0].value.set_index("pool")
    state = {name.split("@")[0]: (row["state"], row["doing"]) for name, row in frame.iterrows()}
    assert state["verify"] == ("idle", "2 of 2 sandboxes warm and free; each is wiped and restarted after its episode")
    assert state["train"] == ("busy", "1 of 2 sandboxes running an episode, 1 warm and free")
    assert state["warm"][0] == "starting" and state["warm"][1].startswith("2 of 2 sandboxes starting")
    assert state["broken"] == ("failed", "no sandbox is up, the pool keeps retrying: "
                                         "sandbox 0 did not start: bwrap: setting up uid map: Permission denied")  # fmt: skip
    assert state["closed"] == ("closed", "the pool was closed; its sandboxes were reclaimed")
    assert state["grpo"][0] == "closed" and "its process ended 5 min ago" in state["grpo"][1]
    assert state["stuck"] == ("silent", "no report since 5 min ago, though its process still runs: it may be stuck")
    assert state["far"] == ("silent", "no report since 5 min ago: its process on gpu-node-7 ended or is stuck")
    assert "live" not in frame.columns  # a ticked box said nothing about what the pool does

    ((spec, bins),) = vega_charts(at)
    order = x_axis_order(spec, bins)
    assert [float(v) for v in order] == sorted(float(v) for v in order)  # 5.98, 6.7, ..., 42.3, 47.5, ..., 53.3
    assert float(order[0]) == pytest.approx(5.98, abs=0.01) and len(order) == 20
    counts = dict(zip(bins[spec["encoding"]["x"]["field"]], bins["calls"]))
    assert sum(counts.values()) == len(calls) and counts[order[0]] == 1 and counts[order[-1]] == 3
    assert any(c.value.startswith("8 calls from 5.98 ms to 53.26 ms") for c in at.caption)


# --- Tasks -------------------------------------------------------------------------------------------------


def test_task_count_follows_the_build_form_as_it_is_edited(platform_env: dict[str, str]) -> None:
    at = login_as(AppTest.from_file(str(VIEWS / "tasks.py"), default_timeout=60)).run()
    assert not at.exception
    family = list_families()[0]
    domains = list_domains(family)
    held_out = [d for d in domains if d.held_out_level() is not None]  # auto: each domain at its lowest such level
    fields = [at.multiselect(key="build_families"), at.number_input(key="build_per_domain"),
              at.number_input(key="build_eval_per_domain"), at.select_slider(key="build_difficulty")]  # fmt: skip
    # A browser sends a form's values only when it is submitted: anything the count depends on must be
    # outside the form, or the count keeps the values of the last submit while the screen shows others.
    assert [f.form_id for f in fields] == ["", "", "", ""]

    def count() -> str:
        return next(c.value for c in at.caption if "domains selected" in c.value)

    assert count().startswith(f"{len(domains)} domains selected, {len(domains) * 32 + len(held_out) * 8} tasks.")
    at.number_input(key="build_per_domain").set_value(8).run()
    at.number_input(key="build_eval_per_domain").set_value(4).run()
    assert count().startswith(f"{len(domains)} domains selected, {len(domains) * 8 + len(held_out) * 4} tasks.")
    assert not queue.list_jobs()  # editing builds nothing

    at.button(key="FormSubmitter:build_procedural-Build").click().run()
    (job,) = queue.list_jobs()
    assert job.config["source"]["per_domain"] == 8 and job.config["source"]["eval_per_domain"] == 4


# --- every page: no request leaves the machine -------------------------------------------------------------


def test_tab_icon_is_served_by_the_console(platform_env: dict[str, str], browser_timers) -> None:  # type: ignore[no-untyped-def]
    at = login_as(AppTest.from_file(str(REPO_ROOT / "ui" / "app.py"), default_timeout=30)).run()
    assert not at.exception and at.title[0].value == "Overview"
    icon = browser_timers.favicon()
    # ":material/...:" makes the browser fetch fonts.gstatic.com/.../24px.svg (net::ERR_NAME_NOT_RESOLVED
    # without internet), and an emoji is a box without a colour-emoji font: an image the console serves.
    assert not icon.startswith(":") and "://" not in icon and icon.endswith(".png"), icon


def test_console_sends_no_usage_statistics() -> None:
    """``streamlit run ui/app.py`` from the repository root reads .streamlit/config.toml; ``posttrain console``
    passes the option itself."""
    from posttrain.platform.cli import console_command

    shown = subprocess.run(
        [sys.executable, "-c", "from streamlit import config; print(config.get_option('browser.gatherUsageStats'))"],
        cwd=REPO_ROOT, capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    assert shown.stdout.strip() == "False", shown.stderr
    command = console_command("127.0.0.1", 8501)
    assert command[command.index("--browser.gatherUsageStats") + 1] == "false"
