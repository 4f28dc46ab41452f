"""The estimate before launch: an ``estimate`` job times a run's stages in miniature on this host, through the real
worker, and the run that follows takes about what it said. (The browser test checks the one-click demo on the real
model against its estimate within 30%.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import OPERATOR, run_worker_until_idle
from test_training_tiny import tiny_policy_dir

from posttrain.platform.db.models import JobStatus
from posttrain.platform.jobs import queue
from posttrain.platform.jobs.registry import JobConfigError, read_result, validate_config
from posttrain.platform.models.registry import register_model

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def grpo_run(**overrides: object) -> dict[str, object]:
    return {
        "model": "tiny",
        "domains": ["format.to_hex"],
        "scheduler": {"batch_size": 2, "seed": 0},
        "group_size": 4,
        "max_new_tokens": 6,
        "max_steps": 24,
        "checkpoint_every": 8,
        "max_rollout_batches_per_step": 1,
        "device": "cpu",
        "verifier_workers": 1,
        **overrides,
    }


def test_an_estimate_times_the_runs_stages_and_the_run_takes_about_that(
    platform_env: dict[str, str], tmp_path: Path
) -> None:
    register_model(OPERATOR, "tiny", tiny_policy_dir(tmp_path / "tiny"))
    config = grpo_run()
    # steps of a fraction of a second: five measured, so that one interrupted step does not set the figure
    estimate_id = queue.submit(OPERATOR, "estimate", {"kind": "train_grpo", "config": config, "calibration_steps": 5})
    stored = queue.get_job(estimate_id).config
    # the run's config as the run's job stores it: the console finds a run's estimate by equality
    assert stored["config"] == validate_config("train_grpo", config).model_dump(mode="json")
    run_worker_until_idle(platform_env)
    job = queue.get_job(estimate_id)
    assert job.status is JobStatus.succeeded, job.error
    estimate = read_result("estimate", job.result)
    assert [s.stage for s in estimate.stages] == ["job", "grpo", "register"]  # type: ignore[attr-defined]
    grpo = estimate.stages[1]  # type: ignore[attr-defined]
    assert (
        "24 steps x" in grpo.how and "5 measured after a warm-up step" in grpo.how and "3 checkpoints x" in grpo.how
    ), grpo.how
    # one rollout batch a step: 24 steps x 2 prompts x 4 samples, at most 6 tokens each
    assert estimate.steps == 24 and estimate.trajectories == 24 * 2 * 4  # type: ignore[attr-defined]
    assert 0 < estimate.generated_tokens <= estimate.trajectories * 6  # type: ignore[attr-defined]
    assert estimate.wall_s == pytest.approx(sum(s.seconds for s in estimate.stages))  # type: ignore[attr-defined]

    run_id = queue.submit(OPERATOR, "train_grpo", config)
    run_worker_until_idle(platform_env)
    run = queue.get_job(run_id)
    assert run.status is JobStatus.succeeded and run.started_at and run.finished_at
    actual = (run.finished_at - run.started_at).total_seconds()
    ratio = estimate.wall_s / actual  # type: ignore[attr-defined]
    print(
        f"estimate {estimate.wall_s:.1f} s, actual {actual:.1f} s, ratio {ratio:.2f}",
        [(s.stage, round(s.seconds, 1), s.how) for s in estimate.stages],
    )  # type: ignore[attr-defined]
    # a run of a few seconds, where the process's start weighs most: the right size, not the 30% the demo holds
    assert 0.3 < ratio < 4, (estimate.stages, actual)  # type: ignore[attr-defined]


def test_a_bad_run_config_is_refused_at_submit_and_an_unknown_model_fails_once(platform_env: dict[str, str]) -> None:
    with pytest.raises(JobConfigError, match=r"the run's config: .*max_steps"):
        queue.submit(OPERATOR, "estimate", {"kind": "train_grpo", "config": grpo_run(max_steps=-1)})
    with pytest.raises(JobConfigError, match="kind"):
        queue.submit(OPERATOR, "estimate", {"kind": "evaluate", "config": {}})
    assert queue.list_jobs() == []
    job_id = queue.submit(OPERATOR, "estimate", {"kind": "train_grpo", "config": grpo_run(model="no-such-model")})
    run_worker_until_idle(platform_env)
    job = queue.get_job(job_id)
    assert job.status is JobStatus.failed and job.attempts == 1  # bad input: not retried
    assert "'no-such-model' is neither a registered model name nor a model directory" in (job.error or "")


def test_cli_estimate_queues_the_job_and_refuses_a_bad_config(platform_env: dict[str, str]) -> None:
    cli = [sys.executable, "-m", "posttrain.platform.cli", "jobs", "estimate", "train_grpo"]
    out = subprocess.run(
        [*cli, "--config", json.dumps(grpo_run()), "--no-wait"],
        env=platform_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    (job,) = queue.list_jobs(kind="estimate")
    assert f"queued estimate job {job.id}" in out.stdout and job.config["kind"] == "train_grpo"
    bad = subprocess.run(
        [*cli, "--config", json.dumps(grpo_run(group_size=0)), "--no-wait"],
        env=platform_env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode != 0 and "group_size" in bad.stdout + bad.stderr
    assert len(queue.list_jobs(kind="estimate")) == 1
