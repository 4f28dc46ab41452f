"""What every rollout backend shares: the batch it hands the learner, the sampler its workers run, and the
staleness rules (which batches the learner takes, and how many may be out at once)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from posttrain.platform.verifiers import TaskSpec, VerifierService
from posttrain.training.config import GRPOConfig, PipelinedRollout, SamplingConfig
from posttrain.training.environments import load_environment
from posttrain.training.environments.runner import EpisodeRunner
from posttrain.training.inference import EmbeddedRolloutEngine, InferenceEngine, rollout_groups
from posttrain.training.modeling import PolicySource, load_policy
from posttrain.training.rollout import RolloutGroup, collect_verification
from posttrain.training.scheduler import Scheduler

if TYPE_CHECKING:
    from posttrain.training.environments.runner import EpisodeRunner


@dataclass
class RolloutBatch:
    """Verified groups for one step plus what it took to get them."""

    groups: list[RolloutGroup] = field(default_factory=list)  # every verified group (for logs and the database)
    stale_dropped: int = 0
    generated_tokens: int = 0
    generation_s: float = 0.0
    queue_depth: int = 0
    extra: dict[str, float] = field(default_factory=dict)  # backend-specific metrics


class RolloutBackend(Protocol):
    """Where a GRPO run's rollouts come from: verified groups for a step, the learner's new weights in."""

    def next_batch(self, version: int) -> RolloutBatch: ...
    def publish(self, model: torch.nn.Module, version: int) -> None: ...
    def close(self) -> None: ...


@dataclass
class RolloutSetup:
    """What a backend is built from: the policy the rollouts start from (``model``, published as
    ``version``; ``source`` is how a worker elsewhere builds its copy: a model directory or a
    ``(model, tokenizer)`` pair), the task scheduler, the config, and a verifier pool with an executor
    that waits on it (None for a backend that verifies elsewhere)."""

    model: torch.nn.Module
    tokenizer: PreTrainedTokenizerBase
    scheduler: Scheduler
    config: GRPOConfig
    version: int
    source: PolicySource
    service: VerifierService | None = None
    executor: ThreadPoolExecutor | None = None


def usable(group: RolloutGroup) -> bool:
    return group.infra_errors == 0


def record(scheduler: Scheduler, group: RolloutGroup) -> None:
    """Fold a verified group's results into the scheduler's pass and signal rates (not when verification failed)."""
    if usable(group):
        scheduler.record(
            group.task.domain,
            [bool(t.passed) for t in group.trajectories],
            rewards=group.rewards,
            task_id=group.task.task_id,
        )


def has_signal(group: RolloutGroup) -> bool:
    rewards = group.rewards
    return usable(group) and max(rewards) - min(rewards) > 1e-6


@dataclass
class Generated:
    """One generated batch as a rollout worker hands it to the learner (verification not yet collected)."""

    groups: list[RolloutGroup]
    version: int  # the policy version that generated them (the one the worker had loaded)
    tokens: int
    seconds: float


class PolicySampler:
    """A frozen copy of the policy behind an inference engine that samples rollout groups and tags them
    with the policy version it holds: the body of every rollout worker (the rollout thread, a rollout
    process, a Ray actor)."""

    def __init__(
        self,
        policy: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        group_size: int,
        sampling: SamplingConfig,
        version: int = -1,
    ) -> None:
        self.policy, self.tokenizer, self.group_size, self.sampling = policy, tokenizer, group_size, sampling
        self.policy.eval()
        self.policy.requires_grad_(False)
        # a peft model under LoRA, which passes for one
        self.engine = EmbeddedRolloutEngine(cast(PreTrainedModel, policy), tokenizer, version=version)
        self.episodes: EpisodeRunner | None = None  # set by open_episodes for a multi-turn environment

    @property
    def version(self) -> int:
        """The policy version of the weights it holds (-1: not the learner's weights yet)."""
        return self.engine.version

    @version.setter
    def version(self, value: int) -> None:
        self.engine.version = value

    @classmethod
    def from_recipe(
        cls, recipe: str | tuple[Any, Any], group_size: int, sampling: SamplingConfig, device: str, seed: int
    ) -> PolicySampler:
        """A sampler in a worker of its own: the policy from a model directory or a shipped ``(model, tokenizer)``."""
        torch.manual_seed(seed)
        policy, tokenizer = load_policy(recipe if isinstance(recipe, str) else tuple(recipe), device=device)
        return cls(policy, tokenizer, group_size, sampling)

    def load(self, state: dict[str, torch.Tensor], version: int) -> None:
        self.engine.load_weights(state, version)

    def sample(self, tasks: Sequence[TaskSpec]) -> Generated:
        started = time.perf_counter()
        groups = sample_groups(self.engine, self.episodes, self.tokenizer, tasks, self.group_size, self.sampling)
        return Generated(groups, self.version, generated_tokens(groups), time.perf_counter() - started)

    def close(self) -> None:
        if self.episodes is not None:
            self.episodes.close()


def open_episodes(
    config: GRPOConfig, engine: InferenceEngine, tokenizer: PreTrainedTokenizerBase, service: VerifierService | None
) -> EpisodeRunner | None:
    """The episode runner of ``config.environment`` over ``engine`` (None for ``single_turn``, whose
    rollouts the engine batches itself); raises EnvironmentLoadError when the environment does not load."""
    if not config.environment.multi_turn:
        return None

    environment = load_environment(config.environment, tokenizer, config.sampling)
    return EpisodeRunner(
        environment,
        engine,
        config.environment,
        service or VerifierService(),
        group_size=config.algorithm.group_size,
        seed=config.seed,
    )


def sample_groups(
    engine: InferenceEngine,
    episodes: EpisodeRunner | None,
    tokenizer: PreTrainedTokenizerBase,
    tasks: Sequence[TaskSpec],
    group_size: int,
    sampling: SamplingConfig,
) -> list[RolloutGroup]:
    """``group_size`` rollouts of each task: episodes of the environment, else single completions."""
    if episodes is not None:
        return episodes.groups(tasks)
    return rollout_groups(engine, tokenizer, tasks, group_size, sampling)


def generated_tokens(groups: Sequence[RolloutGroup]) -> int:
    """Tokens the policy sampled (an episode's environment tokens not counted)."""
    return sum(
        len(t.completion_ids) if t.loss_mask is None else sum(t.loss_mask) for g in groups for t in g.trajectories
    )


class ReadyBatches:
    """Generated batches waiting for the learner, put here by a backend's own thread (the rollout thread, a
    pump), and whether the learner waits for one (what :func:`in_flight_limit` reads). ``producer`` names
    that thread in errors; ``alive`` says whether it still runs."""

    def __init__(self, producer: str, alive: Callable[[], bool]) -> None:
        self.items: deque[Generated] = deque()
        self.cond = threading.Condition()
        self.waiting = False
        self.error: BaseException | None = None
        self._producer, self._alive = producer, alive

    def __len__(self) -> int:
        return len(self.items)

    def put(self, item: Generated) -> None:
        with self.cond:
            self.items.append(item)
            self.cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        """The producer failed: the learner raises ``exc`` when it next waits."""
        with self.cond:
            self.error = exc
            self.cond.notify_all()

    def take(self, on_waiting: Callable[[], None] = lambda: None) -> Generated:
        """The oldest ready batch, waiting for one (``on_waiting`` runs once the learner counts as waiting)."""
        with self.cond:
            self.waiting = True
            on_waiting()
            self.cond.notify_all()  # one more batch may be out now
            try:
                while not self.items:
                    if self.error is not None:
                        raise RuntimeError(f"{self._producer} failed: {self.error}") from self.error
                    if not self._alive():
                        raise RuntimeError(f"{self._producer} stopped")
                    self.cond.wait(timeout=0.2)
                return self.items.popleft()
            finally:
                self.waiting = False


def in_flight_limit(bound: PipelinedRollout, waiting: bool, capacity: int) -> int:
    """How many batches may be out (asked for and not yet taken) now.

    A batch asked for now gets the latest published weights or newer ones, and the learner takes
    batches in order, at least one per step: while it waits for a batch, the ``n``-th batch out is
    taken ``n - 1`` steps later at most; otherwise (it updates, or has what it needs) ``n`` steps
    later. So with ``max_off_policy_steps + 1`` batches out while it waits and
    ``max_off_policy_steps`` otherwise, none goes stale before it is taken: no sampling is spent on
    batches the learner would drop, on cores the learner needs (``max_off_policy_steps: 0``: nothing
    is sampled during an update, the next batch needs its weights). ``capacity`` (what the backend
    can hold: its workers and its queue) bounds it too."""
    return min(bound.max_off_policy_steps + (1 if waiting else 0), capacity)


def assemble_batch(
    out: RolloutBatch, take: Callable[[], Generated], version: int, config: GRPOConfig, scheduler: Scheduler
) -> RolloutBatch:
    """Take produced batches until the step has ``batch_size`` groups with a learning signal (at most
    ``max_rollout_batches_per_step`` fresh batches): batches more than ``max_off_policy_steps`` policy
    versions old are dropped (with :func:`in_flight_limit` none should be), the rest are scored and
    recorded in the scheduler."""
    assert isinstance(config.rollout, PipelinedRollout)
    useful = fresh = 0
    while useful < config.scheduler.batch_size and fresh < config.algorithm.max_rollout_batches_per_step:
        item = take()
        if version - item.version > config.rollout.max_off_policy_steps:
            out.stale_dropped += len(item.groups)
            continue
        fresh += 1
        out.generated_tokens += item.tokens
        out.generation_s += item.seconds
        for group in item.groups:
            collect_verification(group)
            record(scheduler, group)
        out.groups += item.groups
        useful += sum(has_signal(g) for g in item.groups)
    return out
