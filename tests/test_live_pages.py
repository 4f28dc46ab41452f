"""Pages that follow the jobs they show: opened while a job is queued, left alone while it runs, they show its
outcome when their timers fire (conftest's ``browser_timers``), with no navigation and no reload; a page with
nothing unfinished on it sets no timer."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import (
    OPERATOR,
    REPO_ROOT,
    login_as,
    run_worker_until_idle,
    start_worker,
    stop_worker,
    wait_deployed,
    wait_for,
)
from streamlit.testing.v1 import AppTest

from posttrain.platform.db.models import JobStatus
from posttrain.platform.jobs import queue
from posttrain.platform.models.registry import register_model

VIEWS = REPO_ROOT / "ui" / "views"


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from posttrain.platform.models import TinyModelSpec, build_tiny_model

    return build_tiny_model(
        tmp_path_factory.mktemp("m") / "tiny",
        TinyModelSpec(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128),
    )


def test_the_domains_table_shows_a_build_when_it_ends(platform_env: dict[str, str], browser_timers) -> None:  # type: ignore[no-untyped-def]
    at = login_as(AppTest.from_file(str(VIEWS / "tasks.py"), default_timeout=120)).run()
    assert not at.exception and not browser_timers.timed  # nothing to follow: no timer on the page
    source = {"type": "procedural", "domains": ["arith.add.int", "str.reverse.letters"], "per_domain": 4}
    queue.submit(OPERATOR, "build_tasks", {"task_set": "live", "source": source})
    at = login_as(AppTest.from_file(str(VIEWS / "tasks.py"), default_timeout=120)).run()
    assert not at.exception and any("No task sets yet" in i.value for i in at.info)
    assert browser_timers.timed  # a build is queued: the page follows it

    run_worker_until_idle(platform_env)
    at = browser_timers.tick(at)
    frames = [d.value for d in at.dataframe]
    assert any("live" in set(f.get("task set", [])) for f in frames), frames
    domains = next(f for f in frames if "domain" in f)
    assert set(domains["domain"]) == {"arith.add.int", "str.reverse.letters"} and domains["eval"].min() > 0


def test_the_exports_list_shows_an_export_when_it_ends(
    platform_env: dict[str, str], tiny_model: Path, browser_timers
) -> None:  # type: ignore[no-untyped-def]
    register_model(OPERATOR, "mine", tiny_model)
    queue.submit(OPERATOR, "export_model", {"model": "mine", "format": "hf"})
    at = login_as(AppTest.from_file(str(VIEWS / "models.py"), default_timeout=120)).run()
    assert not at.exception and any(c.value.startswith("No exports yet") for c in at.caption)

    run_worker_until_idle(platform_env)
    at = browser_timers.tick(at)
    assert not any(c.value.startswith("No exports yet") for c in at.caption)
    assert any(c.value.startswith("vllm serve ") for c in at.code), [c.value for c in at.code]


def test_the_playground_offers_a_deployment_once_it_is_healthy(
    platform_env: dict[str, str], tiny_model: Path, browser_timers
) -> None:  # type: ignore[no-untyped-def]
    register_model(OPERATOR, "mine", tiny_model)
    job = queue.submit(OPERATOR, "deploy", {"model": "mine", "tier": "fast"})
    at = login_as(AppTest.from_file(str(VIEWS / "models.py"), default_timeout=120)).run()
    assert not at.exception and any(c.value == "Deploy a model to chat with it here." for c in at.caption)

    worker = start_worker(platform_env)
    try:
        wait_deployed(job)
        at = browser_timers.tick(at)
        assert not any(c.value == "Deploy a model to chat with it here." for c in at.caption)
        (label,) = at.multiselect(key="pg_targets").options
        assert label.startswith("mine · fast on embedded"), label
    finally:
        queue.cancel(OPERATOR, job)
        wait_for(lambda: queue.get_job(job).status is JobStatus.cancelled, timeout=60, message="deploy cancelled")
        stop_worker(worker)
