"""The command line: clear one-line errors that change nothing, and the happy path."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import OPERATOR
from posttrain.platform.jobs import queue
from test_jobs import job_count


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
    worker = cli(platform_env, "worker", "--exit-when-idle")
    assert worker.returncode == 0, worker.stderr
    followed = cli(platform_env, "jobs", "logs", "1", "--follow")
    assert followed.returncode == 0 and "job 1 succeeded" in followed.stdout
    listed = cli(platform_env, "jobs", "list")
    assert "selftest" in listed.stdout and "succeeded" in listed.stdout
    shown = cli(platform_env, "jobs", "show", "1")
    assert '"counter": 2' in shown.stdout
    second = queue.submit(OPERATOR, "selftest", {"steps": 1})
    cancelled = cli(platform_env, "jobs", "cancel", str(second))
    assert cancelled.returncode == 0 and "cancelled" in cancelled.stdout
