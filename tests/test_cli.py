"""The command line: clear one-line errors that change nothing, and the happy path."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import OPERATOR
from test_jobs import job_count

from posttrain.platform.jobs import queue


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "posttrain.platform.cli", *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["jobs", "submit", "selftest", "--config", '{"steps": "x"}'], "invalid config for job kind 'selftest': steps"),
        (["jobs", "submit", "selftest", "--config", "{steps: 1"], "--config is not valid JSON"),
        (["jobs", "submit", "warp-drive"], "unknown job kind 'warp-drive'"),
        (["jobs", "show", "999999"], "no job with id 999999"),
    ],
)
def test_user_errors_are_one_clear_line_and_write_nothing(
    platform_env: dict[str, str], db_url: str, args: list[str], expected: str
) -> None:
    before = job_count(db_url)
    line = one_error_line(cli(platform_env, *args))
    assert expected in line
    assert job_count(db_url) == before


def test_invalid_setting_is_one_clear_line(platform_env: dict[str, str], db_url: str) -> None:
    before = job_count(db_url)
    line = one_error_line(cli({**platform_env, "POSTTRAIN_WORKER_CPU_SLOTS": "-3"}, "jobs", "submit", "selftest"))
    assert "POSTTRAIN_WORKER_CPU_SLOTS" in line and "greater than or equal to 1" in line
    assert job_count(db_url) == before


def test_unreachable_database_is_one_clear_line_without_password(platform_env: dict[str, str]) -> None:
    env = {**platform_env, "POSTTRAIN_DATABASE_URL": "postgresql+psycopg://bob:hunter2pw@127.0.0.1:1/posttrain"}
    result = cli(env, "jobs", "submit", "selftest")
    line = one_error_line(result)
    assert "cannot reach the database at postgresql+psycopg://bob:***@127.0.0.1:1/posttrain" in line
    assert "hunter2pw" not in result.stderr + result.stdout


def test_unmigrated_database_says_run_upgrade(tmp_path) -> None:  # type: ignore[no-untyped-def]
    env = {"POSTTRAIN_DATABASE_URL": f"sqlite:///{tmp_path / 'empty.db'}", "POSTTRAIN_DATA_DIR": str(tmp_path)}
    line = one_error_line(cli(env, "jobs", "list"))
    assert "has no posttrain schema: run `posttrain db upgrade`" in line


def test_submit_follow_list_show_cancel(platform_env: dict[str, str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    cfg = tmp_path / "job.yaml"
    cfg.write_text("steps: 2\nsleep_s: 0.05\n")
    submitted = cli(platform_env, "jobs", "submit", "selftest", "--config-file", str(cfg), "--priority", "3")
    assert submitted.returncode == 0 and "queued job 1" in submitted.stdout
    waiting = json.loads(cli(platform_env, "jobs", "show", "1", "--json").stdout)["waiting"]
    assert waiting == "no worker is running: `posttrain up` (or `posttrain worker`) starts one", waiting
    worker = cli(platform_env, "worker", "--exit-when-idle")
    assert worker.returncode == 0, worker.stderr
    followed = cli(platform_env, "jobs", "logs", "1", "--follow")
    assert followed.returncode == 0 and "job 1 succeeded" in followed.stdout
    listed = cli(platform_env, "jobs", "list")
    assert "selftest" in listed.stdout and "succeeded" in listed.stdout
    shown = cli(platform_env, "jobs", "show", "1")
    assert '"counter": 2' in shown.stdout
    lines = shown.stdout.splitlines()  # piped: id, kind and status lead, and no line is the whole config on one row
    assert [line.split()[0] for line in lines[:3]] == ["id", "kind", "status"] and lines[1].split()[1] == "selftest"
    assert max(map(len, lines)) < 200, max(lines, key=len)
    whole = json.loads(cli(platform_env, "jobs", "show", "1", "--json").stdout)
    assert (
        list(whole)[:3] == ["id", "kind", "status"]
        and whole["status"] == "succeeded"
        and whole["result"]["counter"] == 2
    )
    second = queue.submit(OPERATOR, "selftest", {"steps": 1})
    cancelled = cli(platform_env, "jobs", "cancel", str(second))
    assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout


LONG_NAME = "smollm2-135m-instruct-tuned-on-the-operations-manual-v2"


def test_every_list_prints_json_and_whole_rows_when_piped(platform_env: dict[str, str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Issue 35, item 16: each list command takes --json (every column, JSON types, ISO 8601 times), and a
    table written to a pipe is never cut at 80 columns ("smollm2-135m-inst…")."""
    import io
    from datetime import datetime

    from conftest import ADMIN
    from PIL import Image

    from posttrain.platform.api_keys import create_key, shown
    from posttrain.platform.auth import create_user
    from posttrain.platform.db.models import Role
    from posttrain.platform.documents import add_document
    from posttrain.platform.models import TinyModelSpec, build_tiny_model
    from posttrain.platform.models.registry import register_model

    model_dir = build_tiny_model(
        tmp_path / ("a-deliberately-long-folder-name-" * 3) / LONG_NAME,
        TinyModelSpec(hidden_size=64, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=128),
    )
    register_model(OPERATOR, LONG_NAME, model_dir)
    job_id = queue.submit(OPERATOR, "selftest", {"steps": 1})
    key = create_key(ADMIN, "ci-bot").key
    create_user(ADMIN, "alice", "correct horse battery", Role.operator)
    image = io.BytesIO()
    Image.new("RGB", (32, 32), "white").save(image, format="PNG")
    document = add_document(
        OPERATOR, image.getvalue(), filename="a-scanned-page-with-a-long-name-from-the-archive.png"
    ).document

    def listed(*args: str) -> list[dict]:
        result = cli(platform_env, *args, "--json")
        assert result.returncode == 0, result.stderr
        rows = json.loads(result.stdout)
        assert isinstance(rows, list) and all(isinstance(r, dict) for r in rows)
        return rows

    (model,) = listed("models", "list")
    assert model["name"] == LONG_NAME and model["path"] == str(model_dir) and model["from_job"] is None
    assert model["base"] is None and datetime.fromisoformat(model["registered_at"]).tzinfo is not None
    job = next(j for j in listed("jobs", "list") if j["id"] == job_id)
    assert job["kind"] == "selftest" and job["status"] == "queued" and job["progress"] is None
    assert job["attempts"] == 0 and job["max_attempts"] == 3 and job["error"] is None
    assert datetime.fromisoformat(job["created_at"]) <= datetime.fromisoformat(listed("jobs", "list")[0]["created_at"])
    (doc,) = listed("docs", "list")
    assert doc["id"] == document.id and doc["filename"] == "a-scanned-page-with-a-long-name-from-the-archive.png"
    assert (
        isinstance(doc["page_count"], int)
        and isinstance(doc["size_bytes"], int)
        and doc["status"] == document.status.value
    )
    (found,) = listed("keys", "list")
    assert found["key"] == shown(key.key_id) and found["models"] == [] and found["revoked_at"] is None
    assert datetime.fromisoformat(found["created_at"]).tzinfo is not None
    alice = next(u for u in listed("users", "list") if u["username"] == "alice")
    assert alice == {
        "username": "alice",
        "role": "operator",
        "disabled": False,
        "failed_logins": 0,
        "locked_until": None,
        "last_login_at": None,
        "created_at": alice["created_at"],
    }
    kinds = {k["kind"]: k for k in listed("jobs", "kinds")}
    assert kinds["selftest"]["resumable"] is True and kinds["selftest"]["cpu_slots"] == 1

    table = cli(platform_env, "models", "list")  # stdout is a pipe here
    assert table.returncode == 0, table.stderr
    assert "…" not in table.stdout
    (row,) = [line for line in table.stdout.splitlines() if LONG_NAME in line and str(model_dir) in line]
    assert len(row) > 200 and "None" not in row  # the whole row on one line; no job: an empty cell
    docs = cli(platform_env, "docs", "list").stdout
    assert "a-scanned-page-with-a-long-name-from-the-archive.png" in docs and "…" not in docs
    shown_job = [line for line in cli(platform_env, "jobs", "list").stdout.splitlines() if " selftest " in line]
    assert len(shown_job) == 1 and re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", shown_job[0])
