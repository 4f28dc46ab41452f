"""GRPO rollouts on a Ray cluster: rollout worker actors and verifier actors.

    train_grpo(GRPOConfig(model="/shared/models/base", domains=["str.copy.letters"],
                          rollout={"backend": "ray", "workers": 4, "verifier_actors": 2,
                                   "address": "ray://head:10001"}))   # or POSTTRAIN_RAY_ADDRESS

:class:`RayRollouts` is the ``ray`` rollout backend (:mod:`posttrain.training.rollouts`), with the
contract and the staleness accounting of the others:

- ``workers`` :class:`RolloutWorker` actors each hold a frozen copy of the policy (loaded
  from the model directory, or shipped through the object store when the learner's model has no
  directory of its own, e.g. with LoRA) and turn a task batch into rollout groups, token ids and
  behaviour log-probs included;
- after every update the learner puts the new weights into the object store once (``ray.put``)
  and hands the reference, tagged with the policy version, to a small
  :class:`~posttrain.training.rollouts.ray_actors.WeightStore` actor;
  each worker loads the latest weights before its next batch and tags its groups with the version
  it really loaded;
- every generated batch's tasks and completion texts go straight from the worker (object
  reference to object reference, not through the learner) to one of ``verifier_actors``
  :class:`~posttrain.training.rollouts.ray_actors.VerifierActor` actors, each running an ordinary
  :class:`~posttrain.platform.verifiers.VerifierService`: the same checks, timeouts and
  infrastructure-error verdicts as in one process;
- the learner keeps up to ``workers + queue_size`` batches outstanding, and no more than can be taken
  within the staleness bound (:func:`~posttrain.training.rollouts.base.in_flight_limit`), two per worker at
  most (one sampling, one queued, so a worker never waits for the learner), takes verified batches
  in the order they were asked for as soon as they are ready, and drops those more than
  ``max_off_policy_steps`` versions old, exactly as the pipelined loop does.

An actor that dies (killed, out of memory, node lost) is replaced: a lost rollout worker's task
batches go to its successor, a lost verifier's batches are checked again by its successor (or
become infrastructure errors after a second loss). An exception raised inside an actor, such as a
task with an unknown verifier kind, is a configuration error and fails the run.

Requirements: ``ray`` on the driver and the nodes, ``posttrain`` installed on the nodes, and the
model directory readable at the same path on every node (else pass the model object). ``ray`` is
imported only when this module is used.
"""

from __future__ import annotations

import contextlib
import functools
import os
import time
from collections import Counter, deque
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    import ray
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "rollout: {backend: ray} runs rollouts on Ray, which is not installed: pip install 'posttrain[ray]' "
        "(or choose another rollout backend)"
    ) from exc
import torch
from ray.exceptions import (
    GetTimeoutError,
    NodeDiedError,
    ObjectLostError,
    RayActorError,
    RayError,
    RayTaskError,
    WorkerCrashedError,
)

from posttrain.platform import metric_names as names
from posttrain.platform.settings import get_settings
from posttrain.platform.verifiers import TaskSpec, Verdict
from posttrain.training.config import RayRollout
from posttrain.training.modeling import frozen_copy, snapshot_state
from posttrain.training.rollout import RolloutGroup, SamplingConfig
from posttrain.training.rollouts.base import (
    Generated,
    PolicySampler,
    RolloutBatch,
    RolloutSetup,
    assemble_batch,
    in_flight_limit,
)
from posttrain.training.rollouts.ray_actors import ToVerify, VerifierActor, WeightStore, infra_verdicts

ACTOR_NAMESPACE = "posttrain"  # the sandbox pools' namespace too
START_TIMEOUT_S = 600.0  # actors import torch and load the model before they answer
RPC_TIMEOUT_S = 30.0
VERIFY_MARGIN_S = 30.0  # added to the worst case of a batch's checks before the learner gives up on it
DEFAULT_CHECK_S = 60.0  # a check's limit when the config sets none (the kinds' own defaults are lower)
BATCHES_PER_WORKER = 2  # one sampling, one queued behind it
# what an actor's death, not the work it was given, looks like: the work is done again elsewhere
_LOST = (RayActorError, ObjectLostError, WorkerCrashedError, NodeDiedError)


# ===================================================================== actors
class RolloutWorker:
    """A :class:`~posttrain.training.rollouts.base.PolicySampler` in a Ray actor: before each batch it loads the latest
    weights the learner put into the object store."""

    def __init__(
        self,
        recipe: str | tuple[Any, Any],
        store: Any,
        group_size: int,
        sampling: SamplingConfig,
        device: str,
        seed: int,
    ) -> None:
        self.sampler = PolicySampler.from_recipe(recipe, group_size, sampling, device, seed)
        self.store = store

    def ready(self) -> int:
        return os.getpid()

    def loaded_version(self) -> int:
        return self.sampler.version

    def _sync_weights(self) -> None:
        latest = ray.get(self.store.latest.options(max_task_retries=-1).remote(), timeout=RPC_TIMEOUT_S)
        if latest is None or latest[0] == self.sampler.version:
            return  # a restarted store knows nothing until the next publish: keep these weights
        version, (ref,) = latest
        self.sampler.load(ray.get(ref), version)

    def generate(self, tasks: Sequence[TaskSpec]) -> tuple[Generated, ToVerify]:
        """The groups, and (a second object, for a verifier) each group's task and completion texts."""
        self._sync_weights()
        generated = self.sampler.sample(tasks)
        return generated, [(g.task, [t.text for t in g.trajectories]) for g in generated.groups]


@functools.cache
def _remote(cls: type) -> Any:
    return ray.remote(cls)


# ===================================================================== learner side
@dataclass
class _Flight:
    """One task batch on its way: sampling on a worker, then checking on a verifier."""

    tasks: list[TaskSpec]
    slot: int
    incarnation: int
    generated: Any  # ObjectRef[Generated]
    to_verify: Any  # ObjectRef[ToVerify]
    verified: Any = None  # ObjectRef[list[list[Verdict]]]
    verifier_slot: int = 0
    verifier_incarnation: int = 0
    verify_attempts: int = 0
    result: Generated | None = None  # set once sampling is done
    deadline: float = float("inf")


@dataclass
class _Slot:
    actor: Any
    incarnation: int = 0
    name: str = ""


@dataclass
class RayStats:
    replaced_workers: int = 0
    replaced_verifiers: int = 0
    requeued_batches: int = 0
    publish_s: float = 0.0


class RayRollouts:
    """Rollout workers and verifiers as Ray actors; see the module docstring."""

    def __init__(self, setup: RolloutSetup) -> None:
        config, model, tokenizer, source, version = (
            setup.config,
            setup.model,
            setup.tokenizer,
            setup.source,
            setup.version,
        )
        if not isinstance(config.rollout, RayRollout):
            raise ValueError("RayRollouts needs rollout: {backend: ray}")
        self.bound = spec = config.rollout
        self.scheduler, self.config = setup.scheduler, config
        self.stats = RayStats()
        self._flights: list[_Flight] = []
        self._retry: deque[list[TaskSpec]] = deque()
        self._workers: list[_Slot] = []
        self._verifiers: list[_Slot] = []
        self._next_verifier = 0
        self._waiting = False  # the learner waits for a batch
        self._max_replacements = max(4, 2 * (spec.workers + spec.verifier_actors))
        self._closed = False
        self._owns_ray = False
        self.run_id = os.urandom(4).hex()
        address = spec.address or get_settings().ray_address
        cpus = spec.workers + spec.verifier_actors  # one each
        if not ray.is_initialized():
            # a Ray started here (no address) gets enough logical CPUs for the actors even on a small host
            local: dict[str, Any] = {} if address else {"num_cpus": max(os.cpu_count() or 1, cpus)}
            ray.init(
                address=address or None,
                namespace=ACTOR_NAMESPACE,
                log_to_driver=False,
                configure_logging=False,
                **local,
            )
            self._owns_ray = True
        try:
            self._check_resources(cpus, spec.workers * spec.worker_gpus)
            self._store = (
                _remote(WeightStore)
                .options(num_cpus=0, max_restarts=-1, name=f"posttrain-weights-{self.run_id}")
                .remote()
            )
            self._put_weights(model, version)
            if isinstance(source, (str, Path)) and config.lora is None and config.chat_template is None:
                self._recipe: Any = str(Path(source).resolve())
            else:  # no directory holds these weights' architecture (a given model, LoRA) or the run's template: ship the model
                self._recipe = ray.put((frozen_copy(model).to("cpu"), tokenizer))
            self._workers = [self._spawn_worker(i, 0) for i in range(spec.workers)]
            self._verifiers = [self._spawn_verifier(i, 0) for i in range(spec.verifier_actors)]
            self._wait_ready()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------ actors
    @staticmethod
    def _check_resources(cpus: float, gpus: float) -> None:
        """Fail now, not after a long wait for actors that can never be placed."""
        have = ray.cluster_resources()
        if have.get("CPU", 0) < cpus or have.get("GPU", 0) < gpus:
            raise ValueError(
                f"the Ray cluster has {have.get('CPU', 0):g} CPUs and {have.get('GPU', 0):g} GPUs; the run's actors need "
                f"{cpus:g} CPUs (one per rollout worker and per verifier actor) and {gpus:g} GPUs "
                "(workers * worker_gpus): lower rollout_workers / verifier_actors (rollout.workers / "
                "rollout.verifier_actors) or add nodes"
            )

    def _spawn_worker(self, slot: int, incarnation: int) -> _Slot:
        name = f"posttrain-rollout-{self.run_id}-{slot}.{incarnation}"
        gpus = self.bound.worker_gpus
        actor = (
            _remote(RolloutWorker)
            .options(num_cpus=1, num_gpus=gpus, max_restarts=0, name=name)
            .remote(
                self._recipe,
                self._store,
                self.config.algorithm.group_size,
                self.config.sampling,
                "cuda" if gpus > 0 else "cpu",
                self.config.seed + 1 + slot + 1000 * incarnation,
            )
        )
        return _Slot(actor, incarnation, name)

    def _spawn_verifier(self, slot: int, incarnation: int) -> _Slot:
        name = f"posttrain-verifier-{self.run_id}-{slot}.{incarnation}"
        actor = (
            _remote(VerifierActor)
            .options(num_cpus=1, max_restarts=0, max_concurrency=8, name=name)
            .remote(self.config.verifier_workers)
        )
        return _Slot(actor, incarnation, name)

    def _wait_ready(self) -> None:
        slots = [*self._workers, *self._verifiers]
        refs = [s.actor.ready.remote() for s in slots]
        try:
            ray.get(refs, timeout=START_TIMEOUT_S)
        except (RayError, GetTimeoutError) as exc:
            raise RuntimeError(f"the Ray rollout actors did not start: {_first_line(exc)}") from exc

    def _replace(self, slots: list[_Slot], slot: int, incarnation: int, what: str, exc: BaseException) -> None:
        """Replace the actor in ``slot`` if it is still the one that failed (once per death)."""
        if slots[slot].incarnation != incarnation:
            return
        self.stats.replaced_workers += what == "rollout worker"
        self.stats.replaced_verifiers += what == "verifier"
        if self.stats.replaced_workers + self.stats.replaced_verifiers > self._max_replacements:
            raise RuntimeError(
                f"Ray {what}s keep dying ({self._max_replacements} replaced); the last: {_first_line(exc)}"
            ) from exc
        with contextlib.suppress(RayError):
            ray.kill(slots[slot].actor, no_restart=True)
        spawn = self._spawn_worker if slots is self._workers else self._spawn_verifier
        slots[slot] = spawn(slot, incarnation + 1)

    # ------------------------------------------------------------ dispatch
    def _verify(self, flight: _Flight) -> None:
        slot = self._next_verifier % len(self._verifiers)
        self._next_verifier += 1
        verifier = self._verifiers[slot]
        flight.verifier_slot, flight.verifier_incarnation = slot, verifier.incarnation
        flight.verify_attempts += 1
        # the generated batch goes from the worker to the verifier directly; the learner only keeps the reference
        flight.verified = verifier.actor.verify.remote(flight.to_verify, self.config.verifier_timeout_s)

    def _fill(self) -> None:
        """Keep every worker busy, up to the bound on outstanding batches."""
        while len(self._flights) < in_flight_limit(
            self.bound, self._waiting, len(self._workers) + self.bound.queue_size
        ):
            busy = Counter(f.slot for f in self._flights if f.result is None)
            slot = min(range(len(self._workers)), key=lambda s: busy[s])
            if busy[slot] >= BATCHES_PER_WORKER:
                return
            tasks = self._retry.popleft() if self._retry else list(self.scheduler.next_batch())
            worker = self._workers[slot]
            generated, to_verify = worker.actor.generate.options(num_returns=2).remote(tasks)
            flight = _Flight(tasks, slot, worker.incarnation, generated, to_verify)
            self._verify(flight)
            self._flights.append(flight)

    def _poll(self, timeout: float) -> None:
        """Wait until some batch finished sampling or checking (or ``timeout``), then note what sampled."""
        sampling = [f for f in self._flights if f.result is None]
        waiting = [f.generated for f in sampling] + [f.verified for f in self._flights if f.result is not None]
        if waiting:
            ray.wait(waiting, num_returns=1, timeout=timeout)
        if sampling:
            ready, _ = ray.wait([f.generated for f in sampling], num_returns=len(sampling), timeout=0)
            done = set(ready)
            for flight in sampling:
                if flight.generated in done:
                    self._sampled(flight)

    def _sampled(self, flight: _Flight) -> None:
        try:
            result: Generated = ray.get(flight.generated, timeout=RPC_TIMEOUT_S)
        except _LOST as exc:  # the worker died (killed, out of memory, node lost): its successor redoes the batch
            self._flights.remove(flight)
            self._replace(self._workers, flight.slot, flight.incarnation, "rollout worker", exc)
            self._retry.append(flight.tasks)
            self.stats.requeued_batches += 1
            return
        except RayError as exc:  # what the worker raised: a bug or a bad input, not a lost actor
            raise RuntimeError(f"a Ray rollout worker failed: {_first_line(exc)}") from exc
        now = time.monotonic()
        for group in result.groups:
            group.created_at = now  # the worker's clock means nothing here
        flight.result = result
        completions = sum(len(g.trajectories) for g in result.groups)
        flight.deadline = now + VERIFY_MARGIN_S + (self.config.verifier_timeout_s or DEFAULT_CHECK_S) * completions

    def _checked(self) -> tuple[_Flight, list[list[Verdict]]] | None:
        """The oldest sampled batch whose verdicts are in, if any."""
        sampled = [f for f in self._flights if f.result is not None]
        if not sampled:
            return None
        ready, _ = ray.wait([f.verified for f in sampled], num_returns=len(sampled), timeout=0)
        done = set(ready)
        for flight in sampled:
            assert flight.result is not None
            if flight.verified in done:
                try:
                    return flight, ray.get(flight.verified, timeout=RPC_TIMEOUT_S)
                except _LOST as exc:  # the verifier died: check again on its successor, once
                    self._replace(self._verifiers, flight.verifier_slot, flight.verifier_incarnation, "verifier", exc)
                    if flight.verify_attempts < 2:
                        self._verify(flight)
                        continue
                    return flight, _groups_infra(
                        flight.result.groups, f"the verifier actor was lost twice: {_first_line(exc)}"
                    )
                except RayError as exc:  # e.g. a task with an unknown verifier kind: the operator must fix it
                    raise RuntimeError(f"verification on Ray failed: {_first_line(exc)}") from exc
            if time.monotonic() > flight.deadline:
                ray.cancel(flight.verified)
                return flight, _groups_infra(flight.result.groups, "verification on Ray did not answer in time")
        return None

    def _take(self) -> Generated:
        self._waiting = True  # one more batch may be out while the learner waits
        try:
            while True:
                self._fill()
                checked = self._checked()
                if checked is not None:
                    flight, verdicts = checked
                    self._flights.remove(flight)
                    assert flight.result is not None
                    for group, row in zip(flight.result.groups, verdicts):
                        group.verify_futures = [_done(v) for v in row]
                    return flight.result
                self._poll(timeout=0.5)
        finally:
            self._waiting = False
            self._fill()

    # ------------------------------------------------------------ the loop's interface
    def next_batch(self, version: int) -> RolloutBatch:
        self._fill()
        self._poll(timeout=0)
        out = RolloutBatch(queue_depth=sum(f.result is not None for f in self._flights))
        assemble_batch(out, self._take, version, self.config, self.scheduler)
        out.extra = {
            names.BATCHES_IN_FLIGHT: float(len(self._flights)),
            names.PUBLISH_S: self.stats.publish_s,
            names.ACTORS_REPLACED: float(self.stats.replaced_workers + self.stats.replaced_verifiers),
            names.BATCHES_REDONE: float(self.stats.requeued_batches),
        }
        return out

    def publish(self, model: torch.nn.Module, version: int) -> None:
        """Put the new weights into the object store once; each worker loads them before its next batch."""
        started = time.perf_counter()
        self._put_weights(model, version)
        self.stats.publish_s = time.perf_counter() - started

    def _put_weights(self, model: torch.nn.Module, version: int) -> None:
        ref = ray.put(snapshot_state(model))
        ray.get(self._store.put.options(max_task_retries=-1).remote(version, [ref]), timeout=START_TIMEOUT_S)

    def worker_versions(self) -> list[int]:
        """The policy version each rollout worker has loaded (-1: none yet)."""
        return list(ray.get([s.actor.loaded_version.remote() for s in self._workers], timeout=RPC_TIMEOUT_S))

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._flights.clear()
        closing = [s.actor.close.remote() for s in self._verifiers]  # their process pools stop with them
        with contextlib.suppress(RayError, GetTimeoutError):
            ray.wait(closing, num_returns=len(closing), timeout=RPC_TIMEOUT_S)
        for slot in [*self._workers, *self._verifiers]:
            with contextlib.suppress(RayError):
                ray.kill(slot.actor, no_restart=True)
        if getattr(self, "_store", None) is not None:
            with contextlib.suppress(RayError):
                ray.kill(self._store, no_restart=True)
        if self._owns_ray:
            ray.shutdown()


def _done(verdict: Verdict) -> Future[Verdict]:
    future: Future[Verdict] = Future()
    future.set_result(verdict)
    return future


def _groups_infra(groups: Sequence[RolloutGroup], message: str) -> list[list[Verdict]]:
    return infra_verdicts([(g.task, [t.text for t in g.trajectories]) for g in groups], message)


def _first_line(exc: BaseException, limit: int = 500) -> str:
    """One line that says what went wrong: what the actor raised, not Ray's wrapper around it."""
    cause = getattr(exc, "cause", None) if isinstance(exc, RayTaskError) else None
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {_first_line(cause, limit)}"[:limit]
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    if isinstance(exc, RayError) and len(lines) > 1:  # a traceback as text: its last line names the error
        return lines[-1].strip()[:limit]
    return (lines[0] if lines else type(exc).__name__)[:limit]
