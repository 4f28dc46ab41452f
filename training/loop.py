"""The GRPO training loop: one loop, the same in one process and on every rank of an FSDP job.

    result = train_grpo(GRPOConfig(model="path/to/model", domains=["str.copy.letters"], max_steps=100,
                                   rollout={"backend": "process", "workers": 1}, output_dir="runs/grpo1"))

Read :func:`train_grpo` top to bottom. The learner (model, optimizer, schedule, KL reference;
resumed from the latest checkpoint; sharded when world > 1) and, on rank 0, the task scheduler and
the rollout backend ``rollout.backend`` names (:mod:`posttrain.training.rollouts`). Each step:
rank 0 takes a batch of verified rollout groups and keeps the groups whose rewards differ (their
trajectories and group-normalised advantages) -> a broadcast when world > 1 -> the GRPO update
(the importance ratio against the behaviour log-probs recorded at sampling corrects for the
policy versions a pipelined backend lags by) -> the new weights to the rollout backend ->
metrics -> checkpoint.

A resumed run restores model, optimizer, LR schedule, RNG and the task scheduler; trajectories in
flight at the stop are not kept (they are regenerated).
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from posttrain.platform import metric_names as names
from posttrain.platform.verifiers import VerifierService
from posttrain.training.checkpoint import checkpoint_due
from posttrain.training.config import GRPOConfig
from posttrain.training.environments.runner import episode_metrics
from posttrain.training.learner import Learner, TrainResult, select_groups
from posttrain.training.logprob_check import check_logprob_mismatch, measure_logprob_mismatch
from posttrain.training.modeling import PolicySource, peak_rss_bytes
from posttrain.training.rollout import RolloutGroup, Trajectory
from posttrain.training.rollouts import RolloutBackend, RolloutBatch, has_signal, open_rollouts
from posttrain.training.scheduler import DomainSpec, Scheduler, resolve_domains
from posttrain.training.sft import MetricsFn, StartFn, StopFn
from posttrain.training.sharding import DistContext, local_context

GroupsFn = Callable[[int, list[RolloutGroup]], None]


def reward_se(groups: Sequence[RolloutGroup]) -> float:
    """The standard error of a step's mean reward over its prompts: the spread of the groups' mean rewards over the
    root of their number (a prompt's samples are one cluster: they share its difficulty). 0 with one group."""
    means = [sum(g.rewards) / len(g.rewards) for g in groups if g.trajectories]
    if len(means) < 2:
        return 0.0
    centre = sum(means) / len(means)
    return math.sqrt(sum((m - centre) ** 2 for m in means) / (len(means) - 1) / len(means))


def sampled_nll(trajectories: Sequence[Trajectory]) -> float:
    """The mean -log p of the tokens the policy sampled (its own tokens: a multi-turn episode's environment tokens
    are masked out): a Monte Carlo estimate of its per-token entropy at the sampling temperature."""
    total, count = 0.0, 0
    for t in trajectories:
        mask = t.loss_mask or [1] * len(t.behaviour_logprobs)
        for logprob, own in zip(t.behaviour_logprobs, mask):
            if own:
                total, count = total - logprob, count + 1
    return total / max(1, count)


def batch_metrics(batch: RolloutBatch, version: int, used: Sequence[RolloutGroup]) -> dict[str, float]:
    trajectories = [t for g in batch.groups for t in g.trajectories]
    rewards = [t.reward for t in trajectories if t.reward is not None]
    latencies = [g.verify_latency_s for g in batch.groups if g.verify_latency_s is not None]
    staleness = [version - g.policy_version for g in used] or [0]
    return (
        {
            names.REWARD_MEAN: sum(rewards) / max(1, len(rewards)),
            names.REWARD_SE: reward_se(batch.groups),
            names.SAMPLED_NLL: sampled_nll(trajectories),
            names.PASS_RATE: sum(bool(t.passed) for t in trajectories) / max(1, len(trajectories)),
            names.COMPLETION_LEN_MEAN: sum(len(t.completion_ids) for t in trajectories) / max(1, len(trajectories)),
            names.TRUNCATED_FRAC: sum(not t.finished for t in trajectories) / max(1, len(trajectories)),
            names.ROLLOUT_TOKENS_PER_S: batch.generated_tokens / max(batch.generation_s, 1e-9),
            names.GROUPS: float(len(batch.groups)),
            names.GROUPS_USED: float(len(used)),
            names.GROUPS_SIGNAL: float(sum(has_signal(g) for g in batch.groups)),
            names.GROUPS_STALE_DROPPED: float(batch.stale_dropped),
            names.VERIFIER_LATENCY_S: sum(latencies) / max(1, len(latencies)),
            names.VERIFIER_INFRA_ERRORS: float(sum(g.infra_errors for g in batch.groups)),
            names.QUEUE_DEPTH: float(batch.queue_depth),
            names.STALENESS_MEAN: sum(staleness) / len(staleness),
            names.STALENESS_MAX: float(max(staleness)),
        }
        | episode_metrics([t.episode for t in trajectories if t.episode is not None])
        | batch.extra
    )


def time_step(metrics: dict[str, float], learn_started: float, last_end: float) -> float:
    """Add the step's wall time and the learner's busy fraction (update and publish over the whole
    step) to ``metrics``; return now, the end of this step."""
    now = time.perf_counter()
    metrics[names.LEARNER_BUSY_FRAC] = (now - learn_started) / max(now - last_end, 1e-9)
    metrics[names.UPDATE_S] = now - learn_started
    metrics[names.STEP_S] = now - last_end
    return now


def draw_step(
    rollouts: RolloutBackend, step: int, config: GRPOConfig
) -> tuple[RolloutBatch, list[Trajectory], list[float], dict[str, float]]:
    """A step's rollout batch, the trajectories and advantages of its groups with a learning signal
    (at most ``batch_size`` groups), and its rollout metrics."""
    batch = rollouts.next_batch(version=step)
    used = [g for g in batch.groups if has_signal(g) or not config.algorithm.skip_zero_signal][
        : config.scheduler.batch_size
    ]
    trajectories, advantages, _ = select_groups(used, config)
    return batch, trajectories, advantages, batch_metrics(batch, step, used)


def check_due(config: GRPOConfig, step: int) -> bool:
    return bool(config.logprob_check.every) and step % config.logprob_check.every == 0


def check_logprobs(learner: Learner, batch: RolloutBatch, step: int, config: GRPOConfig) -> dict[str, float]:
    """Rescore the step's completions sampled with the learner's current weights (version ``step``) and
    compare with the behaviour log-probs the engine recorded; raise past the tolerance (rank 0)."""
    check = config.logprob_check
    fresh = [t for g in batch.groups if g.policy_version == step for t in g.trajectories if t.completion_ids]
    policy = learner.rollout_policy()
    if not fresh or policy is None:
        return {}
    mismatch = measure_logprob_mismatch(
        policy,
        fresh[: check.trajectories],
        pad_id=learner.tokenizer.pad_token_id,
        temperature=config.sampling.temperature,
        bf16=learner.ctx.amp,
    )
    check_logprob_mismatch(mismatch, check)
    return mismatch.metrics(names.LOGPROB_PREFIX)


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
) -> TrainResult:
    """GRPO in this process or, with ``ctx`` from :func:`posttrain.training.sharding.process_group`, as one rank
    of an FSDP job: the same loop on every rank; rank 0 draws the rollouts and broadcasts the step's
    trajectories (``on_groups`` is called there only)."""
    ctx = ctx or local_context(config)
    learner = Learner(config, ctx, policy, reference=config.algorithm.kl_coef > 0)
    result = TrainResult(steps=learner.start, checkpoint=None, model=learner.model, resumed_from=learner.start)
    with contextlib.ExitStack() as stack:
        rollouts: RolloutBackend | None = None
        domains: Sequence[str | DomainSpec] = ()
        if ctx.main:
            scheduler = scheduler or Scheduler(config.scheduler)
            domains = resolve_domains(config.domains, config.task_set)
            scheduler.set_domains(domains, config.prompt_format)
            if config.replay is not None:
                scheduler.set_replay(config.replay.domains, config.replay.difficulty, config.replay.share)
            if learner.state:
                scheduler.load_state_dict(learner.state["scheduler"])
            source = policy if policy is not None else config.model
            assert source is not None and (rollout_policy := learner.rollout_policy()) is not None
            rollouts = stack.enter_context(
                open_rollouts(
                    config,
                    rollout_policy,
                    learner.tokenizer,
                    scheduler,
                    version=learner.start,
                    source=source,
                    service=service,
                )
            )
        if on_start is not None:
            on_start(learner.start)
        last_end = time.perf_counter()
        for step in range(learner.start, config.max_steps):
            if should_stop is not None and should_stop():
                break
            batch = None
            payload: list[Any] = [None, None, None]
            if rollouts is not None:
                batch, *payload = draw_step(rollouts, step, config)  # trajectories, advantages, rollout metrics
            if batch is not None and check_due(config, step):  # the engine samples what the learner scores
                payload[2] |= check_logprobs(learner, batch, step, config)
            trajectories, advantages, metrics = ctx.broadcast(payload)
            metrics[names.PEAK_RSS_ROLLOUT_GB] = peak_rss_bytes() / 2**30
            if ctx.main and scheduler is not None:
                metrics[names.TASKS_SKIPPED_QUIET] = float(scheduler.skipped)
            if ctx.main and scheduler is not None and len(domains) > 1:  # per domain: draw share, pass and signal rates
                metrics |= scheduler.metrics()
            t_learn = time.perf_counter()
            metrics |= learner.grpo_update(trajectories, advantages) if trajectories else learner.skip_step()
            updated = learner.refresh_rollout_policy()  # every rank takes part when the learner is sharded
            if rollouts is not None and updated is not None:
                rollouts.publish(updated, version=step + 1)
            last_end = time_step(metrics, t_learn, last_end)
            metrics[names.PEAK_RSS_GB] = peak_rss_bytes() / 2**30
            result.metrics.append(metrics)
            result.steps = step + 1
            if on_groups is not None and batch is not None:
                on_groups(step + 1, batch.groups)
            if on_metrics is not None:
                on_metrics(step + 1, metrics)
            if checkpoint_due(config, step + 1):
                state = {
                    "scheduler": scheduler.state_dict() if scheduler is not None else None,
                    "data_position": step + 1,
                }
                result.checkpoint = learner.save(step + 1, state) or result.checkpoint
    result.checkpoint = learner.last_checkpoint(result.checkpoint)
    return result
