"""A deployment takes a serving slot of its own, not a CPU slot: deployments and a training run share a 2-core host,
and a job that waits says why."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import OPERATOR, start_worker, stop_worker, wait_for

from posttrain.platform.db.engine import session
from posttrain.platform.db.models import JobStatus
from posttrain.platform.db.models import Worker as WorkerRow
from posttrain.platform.jobs import queue
from posttrain.platform.models.registry import register_model
from posttrain.platform.serving.jobs import registered_deployments
from posttrain.platform.settings import get_settings


@pytest.fixture
def tiny(tmp_path: Path) -> str:
    from posttrain.platform.models import TinyModelSpec, build_tiny_model

    path = build_tiny_model(
        tmp_path / "tiny",
        TinyModelSpec(hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=128),
    )
    register_model(OPERATOR, "tiny", path)
    return "tiny"


def test_a_deployment_takes_a_serving_slot_and_a_waiting_job_says_why(
    platform_env: dict[str, str], tiny: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    training = queue.submit(OPERATOR, "selftest", {"steps": 1})
    deploy = queue.submit(OPERATOR, "deploy", {"model": tiny, "tier": "fast"})
    second = queue.submit(OPERATOR, "selftest", {"steps": 1})
    assert queue.why_waiting(queue.get_job(second)) == (
        "no worker is running: `posttrain up` (or `posttrain worker`) starts one"
    )
    with session() as s:  # a worker of one CPU slot, as the claims below are made for
        s.add(WorkerRow(id="w", host="here", pid=1, cpu_slots=1))
    assert queue.claim("w", 1, 0, 1).id == training  # type: ignore[union-attr]
    # its one CPU slot is taken: the deployment still starts, in a serving slot; the second CPU job waits, and says why
    assert queue.claim("w", 0, 0, 1).id == deploy  # type: ignore[union-attr]
    assert queue.claim("w", 0, 0, 0) is None
    assert (
        queue.why_waiting(queue.get_job(second))
        == f"waiting for a CPU slot: the 1 are held by jobs #{training} (selftest)"
    )
    # with every serving slot held, a deployment waits and names the deployments holding them; a freed CPU slot goes
    # to the CPU job, never to a deployment
    monkeypatch.setenv("POSTTRAIN_WORKER_SERVING_SLOTS", "1")
    get_settings.cache_clear()
    third = queue.submit(OPERATOR, "deploy", {"model": tiny, "tier": "standard"})
    assert (
        queue.why_waiting(queue.get_job(third))
        == f"waiting for a serving slot: the 1 are held by deployment jobs #{deploy}"
    )
    assert queue.claim("w", 1, 0, 0).id == second  # type: ignore[union-attr]
    assert queue.get_job(third).status is JobStatus.queued


def test_two_deployments_and_a_training_run_share_a_one_slot_worker(platform_env: dict[str, str], tiny: str) -> None:
    """The acceptance on a 2-core host: with one CPU slot, a long CPU job and two deployments all run at once."""
    long_job = queue.submit(OPERATOR, "selftest", {"steps": 600, "sleep_s": 0.1})
    deployments = [queue.submit(OPERATOR, "deploy", {"model": tiny, "tier": tier}) for tier in ("fast", "standard")]
    worker = start_worker({**platform_env, "POSTTRAIN_WORKER_CPU_SLOTS": "1"})
    try:
        wait_for(
            lambda: len([d for d in registered_deployments() if d.healthy]) == 2,
            timeout=240,
            message="both deployments healthy",
        )
        assert queue.get_job(long_job).status is JobStatus.running  # the CPU job ran all along beside them
        assert all(queue.get_job(d).status is JobStatus.running for d in deployments)
    finally:
        for job in (long_job, *deployments):
            queue.cancel(OPERATOR, job)
        wait_for(
            lambda: all(queue.get_job(j).status.finished for j in (long_job, *deployments)),
            timeout=90,
            message="all stopped",
        )
        stop_worker(worker)
