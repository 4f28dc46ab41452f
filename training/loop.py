"""The GRPO training loop, synchronous or pipelined.

    result = train_grpo(GRPOConfig(model="path/to/model", domains=["str.copy.letters"], max_steps=100,
                                   pipeline=True, output_dir="runs/grpo1"))

Each step: get a batch of verified rollout groups -> drop groups whose rewards all agree ->
GRPO update -> publish the new weights to the rollout side -> metrics -> checkpoint.

Where the batch comes from is the only difference between the modes:

- :class:`SyncRollouts` samples with the learner's own model, verifies, and returns
  (on-policy, one thing at a time);
- :class:`PipelinedRollouts` runs a rollout thread with its own copy of the policy that
  loads the latest published weights before each batch, submits every group to the
  verifier pool as soon as it is generated, and puts it into a bounded queue; the learner
  takes groups as soon as they are ready, drops those more than ``max_off_policy_steps``
  policy versions old, and corrects the rest with the importance ratio against the
  behaviour log-probs recorded at generation;
- :class:`~posttrain.training.distributed.RayRollouts` (``rollout_workers > 0``) does the same with
  rollout workers and verifiers as Ray actors on a cluster (``ray_address`` or POSTTRAIN_RAY_ADDRESS).

A resumed run restores model, optimizer, LR schedule, RNG and the task scheduler; in
pipelined mode trajectories in flight at the stop are not kept (they are regenerated).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import torch
from transformers import PreTrainedTokenizerBase

from posttrain.platform.verifiers import PoolConfig, VerifierService
from posttrain.training.checkpoint import checkpoint_due, load_latest_checkpoint, save_checkpoint
from posttrain.training.config import GRPOConfig
from posttrain.training.learner import grpo_update, select_groups
from posttrain.training.modeling import PolicySource, frozen_copy, load_policy, resolve_device, snapshot_state
from posttrain.training.optim import apply_lora, make_lr_scheduler, make_optimizer
from posttrain.training.rollout import RolloutGroup, SamplingConfig, collect_verification, generate_groups, submit_verification
from posttrain.training.scheduler import Scheduler

MetricsFn = Callable[[int, dict[str, float]], None]
GroupsFn = Callable[[int, list[RolloutGroup]], None]
StopFn = Callable[[], bool]


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


def _has_signal(group: RolloutGroup) -> bool:
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
            useful += sum(_has_signal(g) for g in groups)
            if useful >= self.config.scheduler.batch_size:
                break
        return out

    def publish(self, model: torch.nn.Module, version: int) -> None:
        pass  # same model object

    def close(self) -> None:
        pass


@dataclass
class _Produced:
    groups: list[RolloutGroup]
    version: int  # the policy version that generated them
    tokens: int
    seconds: float


class Produced(Protocol):
    """A generated, verification-in-flight batch as a rollout source hands it to the learner."""

    groups: list[RolloutGroup]
    version: int
    tokens: int
    seconds: float


def assemble_batch(out: RolloutBatch, take: Callable[[], Produced], version: int, config: GRPOConfig,
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
        useful += sum(_has_signal(g) for g in item.groups)
    return out


class PipelinedRollouts:
    """A rollout thread with a policy snapshot feeding a bounded queue of verification-in-flight batches."""

    def __init__(self, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, scheduler: Scheduler,
                 service: VerifierService, executor: ThreadPoolExecutor, config: GRPOConfig, version: int) -> None:
        self.tokenizer, self.scheduler, self.service, self.executor, self.config = tokenizer, scheduler, service, executor, config
        self.policy = frozen_copy(model)
        self._snapshot: tuple[int, dict[str, torch.Tensor]] | None = None
        self._version = version
        self._lock = threading.Lock()
        self._queue: queue.Queue[_Produced] = queue.Queue(maxsize=config.queue_size)
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
                    self._version = snapshot[0]
                    self.policy.load_state_dict(snapshot[1])
                t0 = time.perf_counter()
                groups = generate_groups(self.policy, self.tokenizer, self.scheduler.next_batch(), self.config.group_size,
                                         _sampling(self.config), policy_version=self._version)
                seconds = time.perf_counter() - t0
                for group in groups:
                    submit_verification(self.executor, self.service, group, self.config.verifier_timeout_s)
                item = _Produced(groups, self._version, sum(len(t.completion_ids) for g in groups for t in g.trajectories), seconds)
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

    def _get(self) -> _Produced:
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


def train_grpo(
    config: GRPOConfig,
    policy: PolicySource | None = None,
    *,
    scheduler: Scheduler | None = None,
    service: VerifierService | None = None,
    on_metrics: MetricsFn | None = None,
    on_groups: GroupsFn | None = None,
    should_stop: StopFn | None = None,
) -> GRPOResult:
    device = resolve_device(config.device)
    torch.manual_seed(config.seed)
    source = policy if policy is not None else config.model
    if source is None:
        raise ValueError("no model: set GRPOConfig.model to a model directory or pass a (model, tokenizer) pair")
    model, tokenizer = load_policy(source, device=device)
    if config.lora is not None:
        model = apply_lora(model, config.lora)
    ref_model = frozen_copy(model) if config.kl_coef > 0 else None
    scheduler = scheduler or Scheduler(config.scheduler)
    scheduler.set_domains(config.domains)
    optimizer = make_optimizer(model, config)
    lr_scheduler = make_lr_scheduler(optimizer, config)

    ckpt_root = Path(config.output_dir) / "checkpoints" if config.output_dir else None
    start = 0
    if ckpt_root is not None and config.resume and (loaded := load_latest_checkpoint(ckpt_root, model, optimizer, lr_scheduler)):
        state = loaded[1]
        start = int(state["step"])
        scheduler.load_state_dict(state["scheduler"])

    own_service = service is None and not config.rollout_workers  # Ray rollouts verify on the cluster
    if own_service:
        service = VerifierService(PoolConfig(workers=config.verifier_workers))
    executor = ThreadPoolExecutor(max_workers=32, thread_name_prefix="posttrain-verify-wait")
    rollouts: RolloutSource
    if config.rollout_workers:
        from posttrain.training.distributed import RayRollouts  # ray is an optional extra

        rollouts = RayRollouts(model, tokenizer, scheduler, config, version=start, source=source)
    elif config.pipeline:
        assert service is not None
        rollouts = PipelinedRollouts(model, tokenizer, scheduler, service, executor, config, version=start)
    else:
        assert service is not None
        rollouts = SyncRollouts(model, tokenizer, scheduler, service, executor, config)
    result = GRPOResult(steps=start, checkpoint=None, model=model, resumed_from=start)
    last_end = time.perf_counter()
    try:
        for step in range(start, config.max_steps):
            if should_stop is not None and should_stop():
                break
            batch = rollouts.next_batch(version=step)
            used = [g for g in batch.groups if _has_signal(g)][: config.scheduler.batch_size]
            trajectories, advantages, _ = select_groups(used, config)
            t_learn = time.perf_counter()
            metrics = batch_metrics(batch, step, used)
            if trajectories:
                metrics |= grpo_update(model, ref_model, optimizer, lr_scheduler, trajectories, advantages, config, tokenizer.pad_token_id)
            else:
                lr_scheduler.step()  # keep the schedule in step with the step count
            rollouts.publish(model, version=step + 1)
            now = time.perf_counter()
            metrics["pipeline/learner_busy_frac"] = (now - t_learn) / max(now - last_end, 1e-9)
            metrics["time/step_s"] = now - last_end
            last_end = now
            result.metrics.append(metrics)
            result.steps = step + 1
            if on_groups is not None:
                on_groups(step + 1, batch.groups)
            if on_metrics is not None:
                on_metrics(step + 1, metrics)
            if ckpt_root is not None and checkpoint_due(config, step + 1):
                result.checkpoint = save_checkpoint(
                    ckpt_root, step + 1, model, tokenizer, optimizer, lr_scheduler,
                    {"scheduler": scheduler.state_dict(), "data_position": step + 1}, keep=config.keep_checkpoints,
                )
    finally:
        rollouts.close()
        executor.shutdown(wait=False, cancel_futures=True)
        if own_service and service is not None:
            service.close()
    return result
