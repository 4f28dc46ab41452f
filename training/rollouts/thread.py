"""``rollout: {backend: thread}``: a rollout thread in the learner's process with its own copy of the policy.

The thread loads the latest published weights before each batch, submits every group to the verifier
pool as soon as it is generated and hands the batch to the learner; it starts a batch only while fewer
are out than :func:`~posttrain.training.rollouts.base.in_flight_limit` allows, so nothing it samples
goes stale before the learner takes it. It shares the interpreter lock and torch's threads with the
update (the process backend does not).
"""

from __future__ import annotations

import threading

import torch

from posttrain.training.config import ThreadRollout
from posttrain.training.modeling import frozen_copy, snapshot_state
from posttrain.training.rollout import submit_verification
from posttrain.training.rollouts.base import (
    PolicySampler,
    ReadyBatches,
    RolloutBatch,
    RolloutSetup,
    assemble_batch,
    in_flight_limit,
    open_episodes,
)


class ThreadRollouts:
    """A rollout thread with a policy snapshot feeding verification-in-flight batches to the learner."""

    def __init__(self, setup: RolloutSetup) -> None:
        assert (
            isinstance(setup.config.rollout, ThreadRollout) and setup.service is not None and setup.executor is not None
        )
        self.setup, self.bound = setup, setup.config.rollout
        config = setup.config
        self.sampler = PolicySampler(
            frozen_copy(setup.model), setup.tokenizer, config.algorithm.group_size, config.sampling, setup.version
        )
        self.sampler.episodes = open_episodes(config, self.sampler.engine, setup.tokenizer, setup.service)
        self._snapshot: tuple[int, dict[str, torch.Tensor]] | None = None
        self.ready = ReadyBatches("the rollout thread", lambda: self._thread.is_alive())
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="posttrain-rollout", daemon=True)
        self._thread.start()

    # --- rollout thread -------------------------------------------------------
    def _may_sample(self) -> bool:
        return len(self.ready) < in_flight_limit(self.bound, self.ready.waiting, self.bound.queue_size)

    def _run(self) -> None:
        s = self.setup
        assert s.executor is not None and s.service is not None  # checked in __init__
        try:
            while not self._stop.is_set():
                with self.ready.cond:
                    if not self.ready.cond.wait_for(lambda: self._stop.is_set() or self._may_sample(), timeout=0.2):
                        continue
                    snapshot, self._snapshot = self._snapshot, None
                if self._stop.is_set():
                    return
                if snapshot is not None:
                    self.sampler.load(snapshot[1], snapshot[0])
                item = self.sampler.sample(s.scheduler.next_batch())
                for group in item.groups:
                    submit_verification(s.executor, s.service, group, s.config.verifier_timeout_s)
                self.ready.put(item)
        except BaseException as exc:  # noqa: BLE001 - handed to the learner, which raises it
            self.ready.fail(exc)

    # --- learner side ---------------------------------------------------------
    def publish(self, model: torch.nn.Module, version: int) -> None:
        """Offer the learner's new weights; the rollout thread loads them before its next batch."""
        state = snapshot_state(model)
        with self.ready.cond:
            self._snapshot = (version, state)

    def next_batch(self, version: int) -> RolloutBatch:
        out = RolloutBatch(queue_depth=len(self.ready))
        return assemble_batch(out, self.ready.take, version, self.setup.config, self.setup.scheduler)

    def close(self) -> None:
        self._stop.set()
        with self.ready.cond:
            self.ready.cond.notify_all()
        self._thread.join(timeout=60)
        self.sampler.close()
