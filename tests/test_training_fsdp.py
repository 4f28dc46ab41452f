"""The multi-process learner (FSDP2 under torchrun, gloo on CPU), SFT and GRPO: the same losses and
weights as one process, checkpoints that resume across process counts, and the train_sft and
train_grpo jobs with ``nproc_per_node: 2`` through a real worker."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import LOWERCASE_CHECK, OPERATOR, start_worker, stop_worker
from safetensors.torch import load_file
from sqlmodel import select
from test_training_tiny import tiny_policy_dir

from posttrain.platform.db.engine import session
from posttrain.platform.db.models import JobStatus, Metric, Trajectory
from posttrain.platform.jobs import queue
from posttrain.platform.models.registry import get_model, lineage, register_model
from posttrain.platform.verifiers import TaskSpec
from posttrain.training import fsdp
from posttrain.training.checkpoint import list_checkpoints
from posttrain.training.config import GRPOConfig, SFTConfig
from posttrain.training.loop import train_grpo
from posttrain.training.scheduler import DomainSpec, SchedulerConfig
from posttrain.training.sft import train_sft

pytestmark = pytest.mark.slow

STEPS = 6
# 3 rows a step in micro-batches of 1: one process runs 3 accumulated passes; on 2 ranks rank 0
# trains rows 0 and 2, rank 1 row 1 and a weight-0 pass (every rank runs the same collectives)
SFT = {
    "domains": ["str.copy.letters"],
    "tasks_per_domain": 48,
    "lr": 3e-3,
    "micro_batch_size": 1,
    "grad_accum_steps": 3,
    "max_seq_len": 128,
    "max_steps": STEPS,
    "checkpoint_every": 2,
    "keep_checkpoints": 3,
    "device": "cpu",
}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_policy_dir(tmp_path_factory.mktemp("fsdp") / "tiny")


@pytest.fixture(scope="module")
def reference(tiny_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The single-process run: per-step losses, checkpoints every 2 steps, final weights."""
    out = tmp_path_factory.mktemp("single")
    result = train_sft(SFTConfig(model=str(tiny_dir), output_dir=str(out), **SFT))
    assert result.steps == STEPS
    return {
        "losses": [m["train/loss"] for m in result.metrics],
        "out": out,
        "weights": _weights(out / "checkpoints" / f"step_{STEPS:08d}" / "model"),
    }


def _weights(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(model_dir / "model.safetensors")


def _assert_same_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert set(got) == set(want)  # tied embeddings written once, as one process writes them
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, atol=1e-4, rtol=1e-4, msg=name)


def _processes_mentioning(marker: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if marker.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def test_two_processes_resume_a_single_process_checkpoint_and_one_process_resumes_theirs(
    tiny_dir: Path, reference: dict[str, Any], tmp_path: Path
) -> None:
    losses = reference["losses"]
    # 1 process -> 2: continue the single-process run from its step-2 checkpoint on two FSDP ranks
    two = tmp_path / "two"
    shutil.copytree(reference["out"] / "checkpoints" / "step_00000002", two / "checkpoints" / "step_00000002")
    seen: list[tuple[int, float]] = []
    result = fsdp.launch(
        SFTConfig(model=str(tiny_dir), output_dir=str(two), nproc_per_node=2, **SFT),
        on_metrics=lambda step, m: seen.append((step, m["train/loss"])),
    )
    assert result.resumed_from == 2 and result.steps == STEPS and result.model is None
    assert [step for step, _ in seen] == [3, 4, 5, 6]  # each step once, in order
    assert [loss for _, loss in seen] == pytest.approx(losses[2:], rel=1e-5)
    assert set(result.metrics[0]) == {"train/loss", "train/lr", "train/grad_norm", "train/tokens", "train/tokens_per_s"}
    assert [p.name for p in list_checkpoints(two / "checkpoints")] == [
        "step_00000002",
        "step_00000004",
        "step_00000006",
    ]
    assert result.checkpoint == two / "checkpoints" / "step_00000006"
    _assert_same_weights(_weights(result.checkpoint / "model"), reference["weights"])
    assert not _processes_mentioning(str(two)), "a torchrun process outlived its run"

    # 2 processes -> 1: the FSDP checkpoint (gathered full state, optimizer indexed as in one process)
    one = tmp_path / "one"
    shutil.copytree(two / "checkpoints" / "step_00000004", one / "checkpoints" / "step_00000004")
    resumed = train_sft(SFTConfig(model=str(tiny_dir), output_dir=str(one), **SFT))
    assert resumed.resumed_from == 4 and resumed.steps == STEPS
    assert [m["train/loss"] for m in resumed.metrics] == pytest.approx(losses[4:], rel=1e-5)

    # the final model loads as the job registers it
    model = fsdp.trained_model(SFTConfig(model=str(tiny_dir), **SFT), result.checkpoint)
    _assert_same_weights({k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}, reference["weights"])


def test_a_failing_rank_fails_the_launch_and_a_stop_ends_every_process(tiny_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="nproc_per_node"):
        SFTConfig(nproc_per_node=0)
    bad = SFTConfig(
        model=str(tiny_dir),
        output_dir=str(tmp_path / "bad"),
        nproc_per_node=1,
        **{**SFT, "domains": ["no.such.domain"]},
    )
    with pytest.raises(ValueError, match="needs output_dir"):
        fsdp.check_launch(bad.model_copy(update={"output_dir": None}))
    # one process keeps this cheap: the error is the rank's own, whatever the count
    with pytest.raises(
        fsdp.DistributedRunError, match=r"(?s)1-process FSDP learner failed.*unknown domain 'no.such.domain'"
    ):
        fsdp.launch(bad)

    # should_stop: torchrun is stopped at once, its ranks (each in a session of its own) with it,
    # and what was done is returned
    out = tmp_path / "stopped"
    config = SFTConfig(
        model=str(tiny_dir),
        output_dir=str(out),
        nproc_per_node=1,
        **{**SFT, "max_steps": 10_000, "checkpoint_every": 0},
    )
    seen: list[int] = []
    result = fsdp.launch(config, on_metrics=lambda step, m: seen.append(step), should_stop=lambda: bool(seen))
    assert 1 <= result.steps < 10_000 and seen == list(range(1, result.steps + 1))
    assert not list_checkpoints(out / "checkpoints")
    assert not _processes_mentioning(str(out)), "a rank outlived the stopped run"


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_train_sft_job_with_two_processes_through_the_worker(
    platform_env: dict[str, str], db_url: str, tiny_dir: Path, reference: dict[str, Any]
) -> None:
    register_model(OPERATOR, "tiny", tiny_dir)
    job_id = queue.submit(
        OPERATOR, "train_sft", {**SFT, "model": "tiny", "register_as": "tiny-fsdp", "nproc_per_node": 2}
    )
    worker = start_worker(platform_env, "--exit-when-idle")
    try:
        assert worker.wait(timeout=240) == 0
    finally:
        stop_worker(worker)
    job = queue.get_job(job_id)
    assert job.status is JobStatus.succeeded, job.error
    result = job.result or {}
    assert result["steps"] == STEPS and result["resumed_from"] == 0 and result["model"] == "tiny-fsdp"
    assert result["checkpoint"].endswith(f"step_{STEPS:08d}")
    # every step's metrics exactly once, and the losses of one process
    with session(db_url, read_only=True) as s:
        rows = s.exec(select(Metric).where(Metric.job_id == job_id)).all()
    per_name: dict[str, list[int]] = {}
    for m in rows:
        per_name.setdefault(m.name, []).append(m.step)
    assert set(per_name) == {"train/loss", "train/lr", "train/grad_norm", "train/tokens", "train/tokens_per_s"}
    assert all(sorted(steps) == list(range(1, STEPS + 1)) for steps in per_name.values()), per_name
    losses = sorted((m.step, m.value) for m in rows if m.name == "train/loss")
    assert [v for _, v in losses] == pytest.approx(reference["losses"], rel=1e-5)
    # the final model: registered with its lineage, the weights one process trains
    produced = get_model("tiny-fsdp")
    assert produced.produced_by_job_id == job_id
    assert [m.name for m in lineage("tiny-fsdp")] == ["tiny-fsdp", "tiny"]
    assert (Path(produced.path) / "tokenizer.json").is_file()
    _assert_same_weights(_weights(Path(produced.path)), reference["weights"])
    assert not _processes_mentioning(str(Path(job.log_path or "").parent / "run")), (
        "a torchrun process outlived its job"
    )


# --- GRPO -----------------------------------------------------------------------------------------
GRPO_STEPS = 3


def _grpo(tiny_dir: Path, out: Path, **overrides: Any) -> GRPOConfig:
    tasks = [
        TaskSpec(domain="lower", prompt=f"Write lowercase {i}", verifier=LOWERCASE_CHECK, task_id=f"l{i}")
        for i in range(8)
    ]
    # 2 prompts x 4 samples a step in micro-batches of 1: one process runs 8 passes, each of 2 ranks 4
    base: dict[str, Any] = dict(
        model=str(tiny_dir),
        output_dir=str(out),
        domains=[DomainSpec(name="lower", tasks=tasks)],
        scheduler=SchedulerConfig(batch_size=2, seed=0),
        group_size=4,
        max_new_tokens=6,
        lr=1e-3,
        kl_coef=0.05,
        max_steps=GRPO_STEPS,
        micro_batch_size=1,
        device="cpu",
        checkpoint_every=1,
        keep_checkpoints=5,
        verifier_workers=1,
        trajectories_per_step=8,
    )
    return GRPOConfig(**(base | overrides))


GRPO_COMPARED = (
    "train/loss",
    "train/kl",
    "train/ratio_mean",
    "train/grad_norm",
    "train/tokens",
    "rollout/reward_mean",
    "rollout/groups_used",
)


@pytest.fixture(scope="module")
def grpo_reference(tiny_dir: Path, lowercase_plugin: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("grpo-single")
    result = train_grpo(_grpo(tiny_dir, out))
    assert result.steps == GRPO_STEPS and all(m["rollout/groups_used"] > 0 for m in result.metrics)
    return {"metrics": result.metrics, "weights": _weights(out / "checkpoints" / f"step_{GRPO_STEPS:08d}" / "model")}


def test_grpo_on_two_processes_trains_as_one_process_and_resumes_across_process_counts(
    tiny_dir: Path, grpo_reference: dict[str, Any], tmp_path: Path
) -> None:
    """Rank 0 samples what one process samples (same seed, same weights); the sharded update, KL
    to a sharded reference model included, gives one process's losses and weights; a 2-process
    checkpoint resumes on 1 process."""
    want = grpo_reference["metrics"]
    seen: list[tuple[int, dict[str, float]]] = []
    two = tmp_path / "run"
    result = fsdp.launch(
        _grpo(tiny_dir, two, max_steps=2, nproc_per_node=2), on_metrics=lambda step, m: seen.append((step, m))
    )
    assert result.steps == 2 and result.resumed_from == 0 and result.model is None
    assert [step for step, _ in seen] == [1, 2]
    for (step, got), ref in zip(seen, want):
        for key in GRPO_COMPARED:
            assert got[key] == pytest.approx(ref[key], rel=1e-4, abs=1e-6), (step, key)
        assert 0 < got["pipeline/learner_busy_frac"] <= 1
    assert result.checkpoint == two / "checkpoints" / "step_00000002"
    assert not _processes_mentioning(str(two)), "a torchrun process outlived its run"

    # 2 processes -> 1: the last step on one process, from the FSDP checkpoint (task scheduler included)
    resumed = train_grpo(_grpo(tiny_dir, two))
    assert resumed.resumed_from == 2 and resumed.steps == GRPO_STEPS
    for key in GRPO_COMPARED:
        assert resumed.metrics[0][key] == pytest.approx(want[2][key], rel=1e-4, abs=1e-6), key
    _assert_same_weights(_weights(two / "checkpoints" / f"step_{GRPO_STEPS:08d}" / "model"), grpo_reference["weights"])


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_train_grpo_job_with_two_processes_through_the_worker(
    platform_env: dict[str, str], db_url: str, tiny_dir: Path, lowercase_plugin: Path, tmp_path: Path
) -> None:
    register_model(OPERATOR, "tiny", tiny_dir)
    config = _grpo(tiny_dir, tmp_path / "unused", max_steps=2, nproc_per_node=2).model_dump(mode="json")
    config |= {"model": "tiny", "register_as": "tiny-grpo-fsdp", "output_dir": None}
    job_id = queue.submit(OPERATOR, "train_grpo", config)
    worker = start_worker(platform_env, "--exit-when-idle")  # the verifier plugin: on PYTHONPATH
    try:
        assert worker.wait(timeout=300) == 0
    finally:
        stop_worker(worker)
    job = queue.get_job(job_id)
    assert job.status is JobStatus.succeeded, job.error
    assert (job.result or {})["steps"] == 2 and job.result["model"] == "tiny-grpo-fsdp"
    with session(db_url, read_only=True) as s:
        metrics = s.exec(select(Metric).where(Metric.job_id == job_id, Metric.name == "train/loss")).all()
        trajectories = s.exec(select(Trajectory).where(Trajectory.job_id == job_id)).all()
    assert sorted(m.step for m in metrics) == [1, 2]
    assert sorted({t.step for t in trajectories}) == [1, 2] and len(trajectories) == 16  # 8 a step, written by rank 0
    assert all(t.domain == "lower" and 0 <= t.reward <= 1 for t in trajectories)
    produced = get_model("tiny-grpo-fsdp")
    assert produced.produced_by_job_id == job_id and (Path(produced.path) / "model.safetensors").is_file()
    assert not _processes_mentioning(str(Path(job.log_path or "").parent / "run")), (
        "a torchrun process outlived its job"
    )
