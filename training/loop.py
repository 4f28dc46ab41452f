"""The GRPO training loop, synchronous or pipelined.

    result = train_grpo(GRPOConfig(model="path/to/model", domains=["str.copy.letters"], max_steps=100,
                                   pipeline=True, output_dir="runs/grpo1"))

Each step: get a batch of verified rollout groups -> drop groups whose rewards all agree ->
GRPO update -> publish the new weights to the rollout side -> metrics -> checkpoint.

Where the batch comes from is the only difference between the modes:

- :class:`SyncRollouts` samples with the learner's own model, verifies, and returns
  (on-policy, one thing at a time);
- :class:`PipelinedRollouts` (``pipeline``, ``rollout_processes: 0``) runs a rollout thread with
  its own copy of the policy that loads the latest published weights before each batch, submits
  every group to the verifier pool as soon as it is generated, and puts it into a bounded queue;
  the learner takes groups as soon as they are ready, drops those more than
  ``max_off_policy_steps`` policy versions old, and corrects the rest with the importance ratio
  against the behaviour log-probs recorded at generation;
- :class:`~posttrain.training.procs.ProcessRollouts` (``pipeline``, ``rollout_processes >= 1``,
  the default pipelined mode) does the same with rollout worker processes, each with its own torch
  threads, that load the published weights from shared memory; they sample no further ahead than
  the learner can take within the staleness bound (no sampling is wasted), and sampling never
  competes with the update for the learner's interpreter lock;
- :class:`~posttrain.training.distributed.RayRollouts` (``rollout_workers > 0``) does the same with
  rollout workers and verifiers as Ray actors on a cluster (``ray_address`` or POSTTRAIN_RAY_ADDRESS).

Every rollout worker (the thread, a process, a Ray actor) is a :class:`PolicySampler`, and every
pipelined source builds its step with :func:`assemble_batch`.

A resumed run restores model, optimizer, LR schedule, RNG and the task scheduler; in
pipelined mode trajectories in flight at the stop are not kept (they are regenerated).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from transformers import PreTrainedTokenizerBase

from posttrain.platform.verifiers import PoolConfig, TaskSpec, VerifierService
from posttrain.training.checkpoint import checkpoint_due
from posttrain.training.config import GRPOConfig
from posttrain.training.learner import DistContext, Learner, local_context, select_groups
from posttrain.training.modeling import PolicySource, frozen_copy, load_policy, snapshot_state
from posttrain.training.rollout import (
    RolloutGroup, SamplingConfig, Trajectory, collect_verification, generate_groups, submit_verification,
)
from posttrain.training.scheduler import Scheduler
from posttrain.training.sft import MetricsFn, StartFn, StopFn

GroupsFn = Callable[[int, list[RolloutGroup]], None]


@dataclass
class RolloutBatch:
    """Verified groups for one step plus what it took to get them."""

    groups: list[RolloutGroup] = field(default_factory=list)  # every verified group (for logs and the database)
    stale_dropped: int = 0
    generated_tokens: int = 0
    generation_s: float = 0.0
    queue_depth: int = 0
    extra: dict[str, float] = field(default_factory=dict)  # source-specific metrics


def _sampling(config: GRPOConfig) -> SamplingConfig:
    return SamplingConfig(max_new_tokens=config.max_new_tokens, temperature=config.temperature, top_p=config.top_p)


def _usable(group: RolloutGroup) -> bool:
    return group.infra_errors == 0


def _record(scheduler: Scheduler, group: RolloutGroup) -> None:
    if _usable(group):
        scheduler.record(group.task.domain, [bool(t.passed) for t in group.trajectories])


def has_signal(group: RolloutGroup) -> bool:
    rewards = group.rewards
    return _usable(group) and max(rewards) - min(rewards) > 1e-6


class RolloutSource(Protocol):
    def next_batch(self, version: int) -> RolloutBatch: ...
    def publish(self, model: torch.nn.Module, version: int) -> None: ...
    def close(self) -> None: ...


class SyncRollouts:
    """On-policy: generate with the learner's model, verify, return."""

    def __init__(self, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, scheduler: Scheduler,
                 service: VerifierService, executor: ThreadPoolExecutor, config: GRPOConfig) -> None:
        self.model, self.tokenizer, self.scheduler = model, tokenizer, scheduler
        self.service, self.executor, self.config = service, executor, config

    def next_batch(self, version: int) -> RolloutBatch:
        out = RolloutBatch()
        useful = 0
        for _ in range(self.config.max_rollout_batches_per_step):
            t0 = time.perf_counter()
            groups = generate_groups(self.model, self.tokenizer, self.scheduler.next_batch(), self.config.group_size,
                                     _sampling(self.config), policy_version=version)
            out.generation_s += time.perf_counter() - t0
            out.generated_tokens += sum(len(t.completion_ids) for g in groups for t in g.trajectories)
            for group in groups:
                submit_verification(self.executor, self.service, group, self.config.verifier_timeout_s)
            for group in groups:
                collect_verification(group)
                _record(self.scheduler, group)
            out.groups += groups
            useful += sum(has_signal(g) for g in groups)
            if useful >= self.config.scheduler.batch_size:
                break
        return out

    def publish(self, model: torch.nn.Module, version: int) -> None:
        pass  # same model object

    def close(self) -> None:
        pass


@dataclass
class Generated:
    """One generated batch as a rollout worker hands it to the learner (verification not yet collected)."""

    groups: list[RolloutGroup]
    version: int  # the policy version that generated them (the one the worker had loaded)
    tokens: int
    seconds: float


class PolicySampler:
    """A frozen copy of the policy that samples rollout groups and tags them with the policy version
    it holds: the body of every rollout worker (the rollout thread, a rollout process, a Ray actor)."""

    def __init__(self, policy: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, group_size: int,
                 sampling: SamplingConfig, version: int = -1) -> None:
        self.policy, self.tokenizer, self.group_size, self.sampling = policy, tokenizer, group_size, sampling
        self.policy.eval()
        self.policy.requires_grad_(False)
        self.version = version  # -1: not the learner's weights yet

    @classmethod
    def from_recipe(cls, recipe: str | tuple[Any, Any], group_size: int, sampling: SamplingConfig, device: str,
                    seed: int) -> PolicySampler:
        """A sampler in a worker of its own: the policy from a model directory or a shipped ``(model, tokenizer)``."""
        torch.manual_seed(seed)
        policy, tokenizer = load_policy(recipe if isinstance(recipe, str) else tuple(recipe), device=device)
        return cls(policy, tokenizer, group_size, sampling)

    def load(self, state: dict[str, torch.Tensor], version: int) -> None:
        self.policy.load_state_dict(state)
        self.version = version

    def sample(self, tasks: Sequence[TaskSpec]) -> Generated:
        started = time.perf_counter()
        groups = generate_groups(self.policy, self.tokenizer, tasks, self.group_size, self.sampling,
                                 policy_version=self.version)
        tokens = sum(len(t.completion_ids) for g in groups for t in g.trajectories)
        return Generated(groups, self.version, tokens, time.perf_counter() - started)


def assemble_batch(out: RolloutBatch, take: Callable[[], Generated], version: int, config: GRPOConfig,
                   scheduler: Scheduler) -> RolloutBatch:
    """Take produced batches until the step has ``batch_size`` groups with a learning signal (at most
    ``max_rollout_batches_per_step`` fresh batches): batches more than ``max_off_policy_steps`` policy
    versions old are dropped, the rest are scored and recorded in the scheduler."""
    useful = fresh = 0
    while useful < config.scheduler.batch_size and fresh < config.max_rollout_batches_per_step:
        item = take()
        if version - item.version > config.max_off_policy_steps:
            out.stale_dropped += len(item.groups)
            continue
        fresh += 1
        out.generated_tokens += item.tokens
        out.generation_s += item.seconds
        for group in item.groups:
            collect_verification(group)
            _record(scheduler, group)
        out.groups += item.groups
        useful += sum(has_signal(g) for g in item.groups)
    return out


class PipelinedRollouts:
    """A rollout thread with a policy snapshot feeding a bounded queue of verification-in-flight batches."""

    def __init__(self, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, scheduler: Scheduler,
                 service: VerifierService, executor: ThreadPoolExecutor, config: GRPOConfig, version: int) -> None:
        self.scheduler, self.service, self.executor, self.config = scheduler, service, executor, config
        self.sampler = PolicySampler(frozen_copy(model), tokenizer, config.group_size, _sampling(config), version)
        self._snapshot: tuple[int, dict[str, torch.Tensor]] | None = None
        self._lock = threading.Lock()
        self._queue: queue.Queue[Generated] = queue.Queue(maxsize=config.queue_size)
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="posttrain-rollout", daemon=True)
        self._thread.start()

    # --- rollout thread -------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                with self._lock:
                    snapshot, self._snapshot = self._snapshot, None
                if snapshot is not None:
                    self.sampler.load(snapshot[1], snapshot[0])
                item = self.sampler.sample(self.scheduler.next_batch())
                for group in item.groups:
                    submit_verification(self.executor, self.service, group, self.config.verifier_timeout_s)
                while not self._stop.is_set():
                    try:
                        self._queue.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
        except BaseException as exc:  # noqa: BLE001 - handed to the learner, which raises it
            self._error = exc

    # --- learner side ---------------------------------------------------------
    def publish(self, model: torch.nn.Module, version: int) -> None:
        """Offer the learner's new weights; the rollout thread loads them before its next batch."""
        state = snapshot_state(model)
        with self._lock:
            self._snapshot = (version, state)

    def _get(self) -> Generated:
        while True:
            if self._error is not None:
                raise RuntimeError(f"the rollout thread failed: {self._error!r}") from self._error
            try:
                return self._queue.get(timeout=0.2)
            except queue.Empty:
                if not self._thread.is_alive() and self._error is None:
                    raise RuntimeError("the rollout thread stopped") from None

    def next_batch(self, version: int) -> RolloutBatch:
        return assemble_batch(RolloutBatch(queue_depth=self._queue.qsize()), self._get, version, self.config, self.scheduler)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


@dataclass
class GRPOResult:
    steps: int
    checkpoint: Path | None
    metrics: list[dict[str, float]] = field(default_factory=list)
    model: torch.nn.Module | None = None
    resumed_from: int = 0  # the step of the checkpoint the run continued from (0: a fresh start)


def batch_metrics(batch: RolloutBatch, version: int, used: Sequence[RolloutGroup]) -> dict[str, float]:
    trajectories = [t for g in batch.groups for t in g.trajectories]
    rewards = [t.reward for t in trajectories if t.reward is not None]
    latencies = [g.verify_latency_s for g in batch.groups if g.verify_latency_s is not None]
    staleness = [version - g.policy_version for g in used] or [0]
    return {
        "rollout/reward_mean": sum(rewards) / max(1, len(rewards)),
        "rollout/pass_rate": sum(bool(t.passed) for t in trajectories) / max(1, len(trajectories)),
        "rollout/completion_len_mean": sum(len(t.completion_ids) for t in trajectories) / max(1, len(trajectories)),
        "rollout/truncated_frac": sum(not t.finished for t in trajectories) / max(1, len(trajectories)),
        "rollout/tokens_per_s": batch.generated_tokens / max(batch.generation_s, 1e-9),
        "rollout/groups": float(len(batch.groups)),
        "rollout/groups_used": float(len(used)),
        "rollout/groups_stale_dropped": float(batch.stale_dropped),
        "verifier/latency_s": sum(latencies) / max(1, len(latencies)),
        "verifier/infra_errors": float(sum(g.infra_errors for g in batch.groups)),
        "pipeline/queue_depth": float(batch.queue_depth),
        "pipeline/staleness_mean": sum(staleness) / len(staleness),
        "pipeline/staleness_max": float(max(staleness)),
    } | batch.extra


def time_step(metrics: dict[str, float], learn_started: float, last_end: float) -> float:
    """Add the step's wall time and the learner's busy fraction (update and publish over the whole
    step) to ``metrics``; return now, the end of this step."""
    now = time.perf_counter()
    metrics["pipeline/learner_busy_frac"] = (now - learn_started) / max(now - last_end, 1e-9)
    metrics["time/step_s"] = now - last_end
    return now


def draw_step(rollouts: RolloutSource, step: int, config: GRPOConfig
              ) -> tuple[RolloutBatch, list[Trajectory], list[float], dict[str, float]]:
    """A step's rollout batch, the trajectories and advantages of its groups with a learning signal
    (at most ``batch_size`` groups), and its rollout metrics."""
    batch = rollouts.next_batch(version=step)
    used = [g for g in batch.groups if has_signal(g)][: config.scheduler.batch_size]
    trajectories, advantages, _ = select_groups(used, config)
    return batch, trajectories, advantages, batch_metrics(batch, step, used)


@contextlib.contextmanager
def rollout_source(config: GRPOConfig, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, scheduler: Scheduler,
                   *, version: int, source: PolicySource, service: VerifierService | None = None) -> Iterator[RolloutSource]:
    """The rollout side ``config`` asks for, sampling from ``model``'s weights (published as ``version``),
    with its verifier pool (``service``, else one of its own) and everything closed afterwards.

    Ray actors (``rollout_workers``), rollout processes (``pipeline`` and ``rollout_processes``), a
    rollout thread (``pipeline``), or synchronous sampling with ``model`` itself. ``source`` is how a
    worker elsewhere builds its copy of the policy (a model directory, or a ``(model, tokenizer)`` pair).
    """
    own_service = service is None and not config.rollout_workers  # Ray rollouts verify on the cluster
    if own_service:
        service = VerifierService(PoolConfig(workers=config.verifier_workers))
    executor = ThreadPoolExecutor(max_workers=32, thread_name_prefix="posttrain-verify-wait")
    rollouts: RolloutSource | None = None
    try:
        if config.rollout_workers:
            from posttrain.training.distributed import RayRollouts  # ray is an optional extra

            rollouts = RayRollouts(model, tokenizer, scheduler, config, version=version, source=source)
        elif config.pipeline and config.rollout_processes:
            from posttrain.training.procs import ProcessRollouts  # it imports this module

            assert service is not None
            rollouts = ProcessRollouts(model, tokenizer, scheduler, service, executor, config, version=version, source=source)
        elif config.pipeline:
            assert service is not None
            rollouts = PipelinedRollouts(model, tokenizer, scheduler, service, executor, config, version=version)
        else:
            assert service is not None
            rollouts = SyncRollouts(model, tokenizer, scheduler, service, executor, config)
        yield rollouts
    finally:
        if rollouts is not None:
            rollouts.close()
        executor.shutdown(wait=False, cancel_futures=True)
        if own_service and service is not None:
            service.close()


def train_grpo(
    config: GRPOConfig,
    policy: PolicySource | None = None,
    *,
    scheduler: Scheduler | None = None,
    service: VerifierService | None = None,
    on_metrics: MetricsFn | None = None,
    on_groups: GroupsFn | None = None,
    should_stop: StopFn | None = None,
    on_start: StartFn | None = None,
    ctx: DistContext | None = None,
) -> GRPOResult:
    """GRPO in this process or, with ``ctx`` from :func:`posttrain.training.fsdp.process_group`, as one rank
    of an FSDP job: the same loop on every rank; rank 0 draws the rollouts and broadcasts the step's
    trajectories (``on_groups`` is called there only)."""
    ctx = ctx or local_context(config)
    learner = Learner(config, ctx, policy, reference=config.kl_coef > 0)
    result = GRPOResult(steps=learner.start, checkpoint=None, model=learner.model, resumed_from=learner.start)
    with contextlib.ExitStack() as stack:
        rollouts: RolloutSource | None = None
        if ctx.main:
            scheduler = scheduler or Scheduler(config.scheduler)
            scheduler.set_domains(config.domains)
            if learner.state:
                scheduler.load_state_dict(learner.state["scheduler"])
            source = policy if policy is not None else config.model
            assert source is not None and (rollout_policy := learner.rollout_policy()) is not None
            rollouts = stack.enter_context(rollout_source(config, rollout_policy, learner.tokenizer, scheduler,
                                                          version=learner.start, source=source, service=service))
        if on_start is not None:
            on_start(learner.start)
        last_end = time.perf_counter()
        for step in range(learner.start, config.max_steps):
            if should_stop is not None and should_stop():
                break
            batch, payload = None, [None, None, None]
            if rollouts is not None:
                batch, *payload = draw_step(rollouts, step, config)  # trajectories, advantages, rollout metrics
            trajectories, advantages, metrics = ctx.broadcast(payload)
            t_learn = time.perf_counter()
            metrics |= learner.grpo_update(trajectories, advantages) if trajectories else learner.skip_step()
            updated = learner.refresh_rollout_policy()  # every rank takes part when the learner is sharded
            if rollouts is not None and updated is not None:
                rollouts.publish(updated, version=step + 1)
            last_end = time_step(metrics, t_learn, last_end)
            result.metrics.append(metrics)
            result.steps = step + 1
            if on_groups is not None and batch is not None:
                on_groups(step + 1, batch.groups)
            if on_metrics is not None:
                on_metrics(step + 1, metrics)
            if checkpoint_due(config, step + 1):
                state = {"scheduler": scheduler.state_dict() if scheduler is not None else None, "data_position": step + 1}
                result.checkpoint = learner.save(step + 1, state) or result.checkpoint
    result.checkpoint = learner.last_checkpoint(result.checkpoint)
    return result
