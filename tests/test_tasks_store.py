"""Task sets in the database, the build_tasks job, and the Tasks page."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import OPERATOR, REPO_ROOT, login_as, start_worker
from streamlit.testing.v1 import AppTest

from posttrain.platform.db.models import JobStatus
from posttrain.platform.jobs import queue
from posttrain.platform.jobs.registry import JobConfigError
from posttrain.platform.tasks import store
from posttrain.platform.tasks.domains import generate, list_domains, prompt_space
from posttrain.platform.verifiers import verify


def test_round_trip_and_statistics(platform_env: dict[str, str]) -> None:
    specs = generate("arith.add.int", 4, seed=3) + generate("arith.add.int", 2, seed=4, difficulty=2, split="eval")
    store.save_tasks("s1", specs, source="procedural")
    loaded = store.load_tasks(task_set="s1")
    assert [t.spec.prompt for t in loaded] == [s.prompt for s in specs]
    assert [t.spec.task_id for t in loaded] == [s.task_id for s in specs]
    assert verify(loaded[0].spec, loaded[0].spec.reference or "").score == 1.0
    store.record_results([(loaded[0].id, True), (loaded[1].id, False), (loaded[0].id, True)])
    (stats,) = store.domain_stats()
    assert (stats.tasks, stats.train, stats.eval, stats.attempts, stats.passes) == (6, 4, 2, 3, 2)
    assert len(store.load_tasks(split="eval")) == 2


def test_build_tasks_job_end_to_end(platform_env: dict[str, str], tmp_path: Path) -> None:
    good = queue.submit(
        OPERATOR,
        "build_tasks",
        {
            "task_set": "arith",
            "source": {"type": "procedural", "families": ["arithmetic"], "per_domain": 2, "eval_per_domain": 1},
        },
    )
    bad_file = (
        Path(platform_env["POSTTRAIN_DATA_DIR"]) / "uploads" / "bad.jsonl"
    )  # job configs name files in the data dir
    bad_file.parent.mkdir(parents=True)
    bad_file.write_text(json.dumps({"prompt": "hi", "answer": "x", "verifier": {"kind": "numeric", "spec": {}}}) + "\n")
    bad = queue.submit(OPERATOR, "build_tasks", {"task_set": "bad", "source": {"type": "jsonl", "path": str(bad_file)}})
    proc = start_worker(platform_env, "--exit-when-idle")
    assert proc.wait(timeout=120) == 0
    job = queue.get_job(good)
    assert job.status is JobStatus.succeeded, job.error
    result = job.result or {}
    # the default difficulty, auto: each domain at the lowest level that holds out an eval split, so single-digit
    # arithmetic (too few prompts to hold any out) is built at level 2 and evaluated there
    arithmetic = list_domains("arithmetic")
    assert not prompt_space("arith.add.int", 1).has_held_out_split and result["levels"]["arith.add.int"] == 2
    assert result["levels"] == {d.name: d.held_out_level() or 1 for d in arithmetic}
    # a domain that holds out no split at any level (powers: a handful of prompts) is named and gets none
    never = sorted(d.name for d in arithmetic if d.held_out_level() is None)
    assert never and result["domains_without_eval_split"] == never
    assert result["tasks"] == 3 * result["domains"] - len(never) and result["domains"] >= 10
    failed = queue.get_job(bad)
    assert failed.status is JobStatus.failed and failed.error_cause == "bad_input"
    assert "line 1" in (failed.error or "")
    assert [ts.name for ts, _ in store.task_sets()] == ["arith"]  # the bad import stored nothing


def test_build_tasks_config_is_validated_at_submit(platform_env: dict[str, str]) -> None:
    with pytest.raises(JobConfigError, match="name at least one domain or family"):
        queue.submit(OPERATOR, "build_tasks", {"task_set": "x", "source": {"type": "procedural"}})
    with pytest.raises(JobConfigError, match="source"):
        queue.submit(OPERATOR, "build_tasks", {"task_set": "x", "source": {"type": "csv"}})


def test_tasks_page_browse_and_try_verifier(platform_env: dict[str, str]) -> None:
    store.save_tasks("demo", generate("arith.add.int", 3, seed=1), source="procedural")
    at = login_as(AppTest.from_file(str(REPO_ROOT / "ui" / "views" / "tasks.py"), default_timeout=60)).run()
    assert not at.exception
    assert "No preprocessed documents yet" in at.info[0].value
    frames = [d.value for d in at.dataframe]
    assert any("demo" in set(f.get("task set", [])) for f in frames)
    assert any("arith.add.int" in set(f.get("domain", [])) for f in frames)
    task = store.load_tasks(task_set="demo")[0]
    at.selectbox(key="browse_task").set_value(task.id).run()
    at.text_area(key="try_answer").set_value(task.spec.reference or "")
    at.button(key="try_verify").click().run()
    assert at.success and "score 1.00" in at.success[-1].value
    at.text_area(key="try_answer").set_value("definitely wrong")
    at.button(key="try_verify").click().run()
    assert at.warning and "not passed" in at.warning[-1].value

    at.multiselect(key="build_families").set_value(["strings"])
    at.text_input(key="build_set_name").set_value("from-console")
    at.button(key="FormSubmitter:build_procedural-Build").click().run()
    # the form says at which level each domain is built (auto), and which get no eval tasks at any, and why
    never = [d.name for d in list_domains("strings") if d.held_out_level() is None]
    caption = next(c.value for c in at.caption if "domains selected" in c.value)
    assert "Each at the lowest level that holds out an eval split: " in caption
    assert never and f"{len(never)} of them have too few distinct prompts at any difficulty" in caption
    assert never[0] in caption
    job = queue.list_jobs(limit=1)[0]
    assert job.kind == "build_tasks" and job.config["source"]["families"] == ["strings"]
    assert job.config["source"]["difficulty"] == "auto"
    # a fixed difficulty: the domains too small to hold out a split there are named
    at.select_slider(key="build_difficulty").set_value(1).run()
    small = [d.name for d in list_domains("strings") if not d.prompt_space(1).has_held_out_split]
    caption = next(c.value for c in at.caption if "domains selected" in c.value)
    assert len(small) > len(never) and f"{len(small)} of them have too few distinct prompts at difficulty 1" in caption
