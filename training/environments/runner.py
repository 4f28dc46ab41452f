"""Episodes of an environment as rollout groups: many at once against one batching engine, each with a
sandbox of its own from the warm pool.

    runner = EpisodeRunner(environment, engine, config.environment, service, group_size=8, seed=0)
    groups = runner.groups(tasks)          # group_size scored episodes of each task
    runner.close()

Per episode: acquire a sandbox (when the environment needs one) -> ``environment.rollout`` -> its
rubric (``environment.score``, the sandbox still lent) -> release (the pool wipes it). An episode
whose sandbox failed (an infrastructure failure, in the rollout or in the rubric) is redone up to
``infra_retries`` times and, failing still, kept unscored; an environment that raises fails its
episode (``environment_error``, its name and error in the episode), never the run. The pool holds
``concurrency`` sandboxes, as many as episodes run at once.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from posttrain.platform import metric_names as names
from posttrain.platform.sandbox import Sandbox, make_pool
from posttrain.platform.settings import get_settings
from posttrain.platform.verifiers import TaskSpec, Verdict, VerifierService
from posttrain.training.config import EnvironmentConfig
from posttrain.training.environments.base import Environment, Episode
from posttrain.training.inference import InferenceEngine
from posttrain.training.rollout import RolloutGroup, Trajectory


class EpisodeRunner:
    def __init__(
        self,
        environment: Environment,
        engine: InferenceEngine,
        env_config: EnvironmentConfig,
        service: VerifierService,
        *,
        group_size: int,
        seed: int = 0,
        pool: Any = None,
    ) -> None:
        self.environment, self.env_config, self.service, self.group_size = environment, env_config, service, group_size
        self.client = engine.batcher(seed=seed)
        self._own_pool = pool is None and environment.needs_sandbox
        self.pool = open_pool(self.env_config.concurrency) if self._own_pool else pool
        self._threads = ThreadPoolExecutor(
            max_workers=self.env_config.concurrency, thread_name_prefix="posttrain-episode"
        )
        self.on_close: list[Callable[[], None]] = []  # what the runner's owner closes with it (an engine of its own)

    def groups(self, tasks: Sequence[TaskSpec]) -> list[RolloutGroup]:
        n = self.group_size
        futures = [[self._threads.submit(self.episode, task) for _ in range(n)] for task in tasks]
        groups = []
        for task, members in zip(tasks, futures):
            episodes = [f.result() for f in members]
            group = RolloutGroup(
                task=task,
                trajectories=[trajectory(e) for e in episodes],
                policy_version=min(e.policy_version for e in episodes),
            )
            group.infra_errors = sum(not e.scored for e in episodes)  # a verdict that failed made its episode unscored
            elapsed = [e.verdict.elapsed_s or 0.0 for e in episodes if e.verdict is not None]
            group.verify_latency_s = max(elapsed, default=0.0)
            groups.append(group)
        self.client.forget_prefixes()  # these episodes are over: their last turns' KV would sit through the update
        return groups

    def episode(self, task: TaskSpec) -> Episode:
        """One scored episode of ``task`` (or an unscored one that says why)."""
        attempts = self.env_config.infra_retries + 1
        for attempt in range(1, attempts + 1):
            episode = self._attempt(task)
            episode.attempts = attempt
            if episode.stop_reason != "infrastructure_failure":
                return episode
        return episode

    def _attempt(self, task: TaskSpec) -> Episode:
        name = self.environment.name
        try:
            with self._sandbox() as sandbox:
                try:
                    episode = self.environment.rollout(self.client, task, sandbox)
                except Exception as exc:  # noqa: BLE001 - a plugin's fault fails its episode, not the run
                    return _failed(
                        task,
                        self.client.version,
                        "environment_error",
                        f"environment {name!r} raised {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}",
                    )
                if episode.stop_reason is None:
                    episode.end("max_turns")
                if episode.scored:
                    episode.verdict = self._score(episode, sandbox)
                    if episode.verdict.is_infra_error:
                        episode.end(
                            "infrastructure_failure",
                            answer=episode.answer,
                            error=f"the rubric could not score it: {episode.verdict.infra_error}",
                        )
                return episode
        except Exception as exc:  # noqa: BLE001 - no sandbox to be had: an infrastructure failure
            return _failed(
                task, self.client.version, "infrastructure_failure", f"no sandbox: {type(exc).__name__}: {exc}"
            )

    def _score(self, episode: Episode, sandbox: Sandbox | None) -> Verdict:
        try:
            return self.environment.score(episode, self.service, sandbox)
        except Exception as exc:  # noqa: BLE001
            return Verdict.infra(f"environment {self.environment.name!r} could not score: {type(exc).__name__}: {exc}")

    @contextlib.contextmanager
    def _sandbox(self) -> Iterator[Sandbox | None]:
        if not self.environment.needs_sandbox:
            yield None
            return
        with self.pool.acquire() as sandbox:
            yield sandbox

    def close(self) -> None:
        self._threads.shutdown(wait=True, cancel_futures=True)
        self.client.close()
        if self._own_pool and self.pool is not None:
            self.pool.close()
        for close in self.on_close:
            close()


def open_pool(size: int) -> Any:
    """A sandbox pool of ``size`` from the platform's sandbox settings (local, or on Ray when configured)."""
    settings = get_settings()
    return make_pool(settings.sandbox.model_copy(update={"pool_size": size}), settings.data_dir, settings.ray_address)


def _failed(task: TaskSpec, version: int, reason: Any, error: str) -> Episode:
    return Episode(task=task, prompt_ids=[], policy_version=version).end(reason, error=error)


def trajectory(episode: Episode) -> Trajectory:
    """The trajectory the learner trains on: the whole episode after the prompt, the environment's tokens masked."""
    verdict = episode.verdict
    scored = episode.scored and verdict is not None  # an infrastructure verdict left it unscored (EpisodeRunner)
    return Trajectory(
        prompt_ids=episode.prompt_ids,
        completion_ids=episode.token_ids,
        behaviour_logprobs=episode.logprobs,
        text=episode.answer or "",
        finished=episode.finished,
        loss_mask=episode.loss_mask,
        episode=episode,
        reward=verdict.score if scored and verdict is not None else None,
        passed=verdict.passed if scored and verdict is not None else None,
        verdict=verdict,
    )


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Per-step figures of an environment's episodes (the names in :mod:`posttrain.platform.metric_names`)."""
    if not episodes:
        return {}
    calls = [c for e in episodes for c in e.tool_calls]
    n = len(episodes)
    return {
        names.ENV_TURNS_MEAN: sum(e.policy_turns for e in episodes) / n,
        names.ENV_TOOL_CALLS_MEAN: len(calls) / n,
        names.ENV_TOOL_ERRORS: float(sum(c.failed for c in calls)),
        names.ENV_TOOL_LATENCY_S: sum(c.elapsed_s for c in calls) / max(1, len(calls)),
        names.ENV_EPISODE_S: sum(e.elapsed_s for e in episodes) / n,
        names.ENV_INFRA_REDONE: float(sum(e.attempts - 1 for e in episodes)),
        names.ENV_UNSCORED: float(sum(not e.scored for e in episodes)),
        names.ENV_ANSWERED_FRAC: sum(e.stop_reason == "answer" for e in episodes) / n,
    }


def stored_episode(episode: Episode) -> dict[str, Any]:
    """What the database keeps of an episode beside its prompt and answer: every turn after the prompt."""
    return {
        "turns": [t.stored() for t in episode.turns],
        "stop_reason": episode.stop_reason,
        "error": episode.error,
        "attempts": episode.attempts,
        "elapsed_s": round(episode.elapsed_s, 4),
        "policy_tokens": sum(episode.loss_mask),
        "environment_tokens": len(episode.loss_mask) - sum(episode.loss_mask),
    }
