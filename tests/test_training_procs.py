"""Pipelined GRPO with rollout worker processes (``rollout_processes``) fed from shared-memory weights.

The tasks are checked by a verifier kind registered here that gives partial credit (the share of
lowercase letters), so a random tiny model gets rewards with variance; it runs in the learner's
verifier service, as every check of this backend does. Worker processes are found as children of
the test process; every test ends with none of them left.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import torch
from test_training_tiny import tiny_policy_dir

from posttrain.platform.verifiers import BaseSpec, TaskSpec, Verdict, VerifierKind, VerifierService, register_verifier
from posttrain.platform.verifiers.pool import PoolConfig
from posttrain.training.config import GRPOConfig
from posttrain.training.learner import completion_batch, completion_logprobs
from posttrain.training.loop import train_grpo
from posttrain.training.modeling import load_policy
from posttrain.training.rollout import RolloutGroup, SamplingConfig
from posttrain.training.rollouts.base import PolicySampler, RolloutSetup
from posttrain.training.rollouts.process import ProcessRollouts, SharedWeights, thread_split
from posttrain.training.scheduler import DomainSpec, Scheduler, SchedulerConfig


def _lowercase_share(spec: BaseSpec, completion: str, task: TaskSpec) -> Verdict:
    share = sum(c.islower() for c in completion) / max(1, len(completion))
    return Verdict.of_score(share, threshold=0.5)


register_verifier(
    VerifierKind(name="test_procs_lowercase", spec_model=BaseSpec, check=_lowercase_share, isolation="thread"),
    replace=True,
)

TASKS = [
    TaskSpec(domain="lower", prompt=f"Write lowercase {i}", verifier={"kind": "test_procs_lowercase"}, task_id=f"l{i}")
    for i in range(8)
]
DOMAINS = [DomainSpec(name="lower", tasks=TASKS)]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_policy_dir(tmp_path_factory.mktemp("grpo-procs") / "tiny")


@pytest.fixture(scope="module")
def service() -> Iterator[VerifierService]:
    with VerifierService(PoolConfig(workers=1)) as svc:
        yield svc


def _config(**overrides: object) -> GRPOConfig:
    base: dict[str, object] = dict(
        domains=DOMAINS,
        scheduler=SchedulerConfig(batch_size=2, seed=0),
        group_size=4,
        max_new_tokens=6,
        lr=1e-3,
        max_steps=3,
        micro_batch_size=4,
        device="cpu",
        pipeline=True,
        rollout_processes=1,
        queue_size=2,
    )
    return GRPOConfig(**(base | overrides))


def _children() -> set[int]:
    """This process's descendants, less multiprocessing's own helpers (the resource tracker and the fork
    server: one per process, shared by every run and stopped when it exits)."""
    found = set()
    for child in psutil.Process().children(recursive=True):
        try:
            helper = child.ppid() == os.getpid() and any(
                name in " ".join(child.cmdline()) for name in ("resource_tracker", "forkserver")
            )
            if not helper and child.status() != psutil.STATUS_ZOMBIE:
                found.add(child.pid)
        except psutil.NoSuchProcess:
            continue
    return found


def _assert_gone(pids: set[int]) -> None:
    deadline = time.monotonic() + 10
    while pids & _children() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not pids & _children(), f"rollout worker processes left behind: {pids & _children()}"


def test_a_reader_never_keeps_weights_overwritten_during_its_copy(tiny_dir: Path) -> None:
    """The sequence lock, in one process: two publishes land while a worker copies the latest slot."""
    import multiprocessing

    model, tokenizer = load_policy(tiny_dir)
    weights = SharedWeights(model.state_dict(), multiprocessing.get_context("spawn").Lock())
    states = [{k: torch.full_like(v, float(i)) for k, v in model.state_dict().items()} for i in range(4)]
    weights.publish(states[1], version=1)

    class Racing(PolicySampler):
        copies = 0

        def load(self, state: dict[str, torch.Tensor], version: int) -> None:
            super().load(state, version)
            Racing.copies += 1
            if Racing.copies == 1:  # the learner publishes twice while this copy was made: its slot was rewritten
                weights.publish(states[2], version=2)
                weights.publish(states[3], version=3)

    sampler = Racing(load_policy(tiny_dir)[0], tokenizer, 2, SamplingConfig())
    weights.load_latest(sampler)
    assert sampler.version == 3 and Racing.copies == 2
    assert all(torch.equal(v, torch.full_like(v, 3.0)) for v in sampler.policy.state_dict().values())
    weights.load_latest(sampler)  # nothing new: no copy
    assert Racing.copies == 2 and weights.latest_version() == 3


def test_thread_split_gives_each_side_its_share() -> None:
    assert thread_split(_config(), cores=2) == (1, 1)
    assert thread_split(_config(), cores=16) == (8, 8)
    assert thread_split(_config(rollout_processes=3), cores=16) == (4, 4)
    assert thread_split(_config(rollout_threads=2, learner_threads=3), cores=2) == (2, 3)


def test_workers_sample_with_the_published_weights_and_tag_the_version(
    tiny_dir: Path, service: VerifierService
) -> None:
    model, tokenizer = load_policy(tiny_dir)
    scheduler = Scheduler(SchedulerConfig(batch_size=2, seed=0))
    scheduler.set_domains(DOMAINS)
    config = _config(max_rollout_batches_per_step=1, max_off_policy_steps=0, temperature=0.7)
    before = _children()
    threads = torch.get_num_threads()
    # a (model, tokenizer) pair: no directory holds the policy, so the worker gets a copy of the model
    with ThreadPoolExecutor(8) as executor:
        rollouts = ProcessRollouts(
            RolloutSetup(model, tokenizer, scheduler, config, 0, (model, tokenizer), service, executor)
        )
        try:
            assert torch.get_num_threads() == rollouts.learner_threads
            pids = _children() - before
            assert len(pids) == 1 and pids == set(rollouts.worker_pids())
            first = rollouts.next_batch(version=0)
            assert [g.policy_version for g in first.groups] == [0, 0] and rollouts.worker_versions() == [0]
            batches = {}
            for version in (1, 2):
                with torch.no_grad():  # a policy the directory does not hold
                    for p in model.parameters():
                        p.add_(torch.randn_like(p) * 0.2)
                rollouts.publish(model, version=version)
                batches[version] = rollouts.next_batch(version=version)  # older batches in the queue are dropped
                assert [g.policy_version for g in batches[version].groups] == [version, version]
                assert rollouts.worker_versions() == [version]
            assert sum(b.stale_dropped for b in [first, *batches.values()]) == 0  # nothing sampled ahead went stale
            # the worker sampled with the published weights: the learner reproduces its log-probs (ratio 1)
            flat = [t for g in batches[2].groups for t in g.trajectories]
            for t in flat:
                assert t.text == tokenizer.decode(t.completion_ids, skip_special_tokens=True)
                assert len(t.behaviour_logprobs) == len(t.completion_ids) and t.verdict is not None
                assert t.reward == pytest.approx(sum(c.islower() for c in t.text) / max(1, len(t.text)))
            tokens = completion_batch(flat, [0.0] * len(flat), tokenizer.pad_token_id)
            with torch.no_grad():
                learner = completion_logprobs(model, tokens, torch.device("cpu"), 0.7) * tokens.mask
                original = completion_logprobs(load_policy(tiny_dir)[0], tokens, torch.device("cpu"), 0.7) * tokens.mask
            torch.testing.assert_close(learner, tokens.old_logprobs, atol=1e-4, rtol=1e-4)
            assert (original - tokens.old_logprobs).abs().max() > 1e-2  # the directory's weights would not match
            # a worker that keeps dying fails the run with a clear error (here: no replacement allowed)
            rollouts._max_replacements = 0
            os.kill(rollouts.worker_pids()[0], signal.SIGKILL)
            with pytest.raises(RuntimeError, match="rollout worker processes keep dying .* killed by SIGKILL"):
                for version in range(3, 10):
                    rollouts.next_batch(version=version)
        finally:
            rollouts.close()
    _assert_gone(pids)
    assert torch.get_num_threads() == threads  # the learner's setting is given back


def test_a_failing_worker_fails_the_run_with_its_traceback(
    tiny_dir: Path, service: VerifierService, tmp_path: Path
) -> None:
    model, tokenizer = load_policy(tiny_dir)
    scheduler = Scheduler(SchedulerConfig(batch_size=2, seed=0))
    scheduler.set_domains(DOMAINS)
    before = _children()
    with ThreadPoolExecutor(8) as executor:
        rollouts = ProcessRollouts(
            RolloutSetup(model, tokenizer, scheduler, _config(), 0, tmp_path / "not-a-model", service, executor)
        )
        try:
            pids = _children() - before
            with pytest.raises(RuntimeError, match="(?s)rollout worker process .* failed.*not a model directory"):
                rollouts.next_batch(version=0)
        finally:
            rollouts.close()
    _assert_gone(pids)


def test_process_backend_trains_and_replaces_a_killed_worker(tiny_dir: Path, service: VerifierService) -> None:
    seen: dict[int, dict[str, float]] = {}
    versions: dict[int, list[int]] = {}
    killed: list[int] = []
    workers_at: dict[int, set[int]] = {}
    before = _children()

    def on_groups(step: int, groups: list[RolloutGroup]) -> None:
        versions[step] = [g.policy_version for g in groups]

    def on_metrics(step: int, metrics: dict[str, float]) -> None:
        seen[step] = metrics
        workers_at[step] = _children() - before - set(service.worker_pids)
        if step == 1:  # mid-run, with batches in flight
            killed.extend(workers_at[1])
            for pid in killed:
                os.kill(pid, signal.SIGKILL)

    result = train_grpo(
        _config(max_steps=5, max_off_policy_steps=1),
        str(tiny_dir),
        service=service,
        on_metrics=on_metrics,
        on_groups=on_groups,
    )
    assert result.steps == 5 and sorted(seen) == [1, 2, 3, 4, 5] and len(killed) == 1
    for step, metrics in seen.items():
        assert all(torch.isfinite(torch.tensor(v)) for v in metrics.values()), step
        assert metrics["pipeline/staleness_max"] <= 1
        assert all(step - 1 - v <= 1 for v in versions[step]), (step, versions[step])  # step's version is step - 1
        assert 0 < metrics["pipeline/learner_busy_frac"] <= 1 and metrics["rollout/tokens_per_s"] > 0
    assert any(m["rollout/groups_used"] > 0 for m in seen.values())
    assert max(max(v) for v in versions.values()) >= 3, versions  # the worker loaded the learner's updates
    assert sum(m["rollout/groups_stale_dropped"] for m in seen.values()) == 0  # the workers never ran too far ahead
    assert seen[5]["pipeline/workers_replaced"] == 1
    assert len(workers_at[5]) == 1 and not workers_at[5] & set(killed)  # a successor, the same number of workers
    _assert_gone(workers_at[5] | set(killed))


def test_rollout_processes_0_keeps_the_rollout_thread(tiny_dir: Path, service: VerifierService) -> None:
    """The thread backend runs in the learner's process and, like the others, keeps no more out than the
    staleness bound lets the learner take: nothing it samples is dropped."""
    seen: dict[int, dict[str, float]] = {}
    before = _children()
    result = train_grpo(
        _config(rollout_processes=0, max_steps=4, max_off_policy_steps=0, queue_size=3),
        str(tiny_dir),
        service=service,
        on_metrics=seen.__setitem__,
    )
    assert result.steps == 4 and not _children() - before - set(service.worker_pids)  # no worker process
    assert all(m["pipeline/staleness_max"] == 0 for m in seen.values())
    assert sum(m["rollout/groups_stale_dropped"] for m in seen.values()) == 0
