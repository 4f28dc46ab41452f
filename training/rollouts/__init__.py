"""Rollout backends: where a GRPO run's rollouts are sampled and verified, chosen by ``rollout.backend``.

    GRPOConfig(..., rollout={"backend": "process", "workers": 2, "max_off_policy_steps": 1})

=========  =========================================================================================
backend    what samples
=========  =========================================================================================
sync       the learner's own model, then verification, then the update (on-policy, in lock-step)
thread     a rollout thread in the learner's process with its own copy of the policy
process    local rollout worker processes fed from shared-memory weights (:mod:`.process`)
ray        rollout worker and verifier actors on a Ray cluster (:mod:`.ray`)
vllm       vLLM in the learner's process on its GPU, weights pushed after every update (:mod:`.vllm`)
=========  =========================================================================================

Every backend has the :class:`~posttrain.training.rollouts.base.RolloutBackend` contract
(``next_batch(version)``, ``publish(model, version)``, ``close()``), is built from one
:class:`~posttrain.training.rollouts.base.RolloutSetup`, and tags every group with the policy version
that sampled it; every one samples through an inference engine
(:mod:`posttrain.training.inference`: the embedded engine, or vLLM); the pipelined ones take batches with
:func:`~posttrain.training.rollouts.base.assemble_batch` and keep no more out than the staleness bound
lets the learner take (:func:`~posttrain.training.rollouts.base.in_flight_limit`).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import torch
from transformers import PreTrainedTokenizerBase

from posttrain.platform.verifiers import PoolConfig, VerifierService
from posttrain.training.config import GRPOConfig
from posttrain.training.modeling import PolicySource
from posttrain.training.rollouts.base import RolloutBackend, RolloutBatch, RolloutSetup, has_signal
from posttrain.training.scheduler import Scheduler

# backend name -> (module, class, whether it verifies in this process); modules load on use (ray is optional)
BACKENDS: dict[str, tuple[str, str, bool]] = {
    "sync": ("posttrain.training.rollouts.sync", "SyncRollouts", True),
    "thread": ("posttrain.training.rollouts.thread", "ThreadRollouts", True),
    "process": ("posttrain.training.rollouts.process", "ProcessRollouts", True),
    "ray": ("posttrain.training.rollouts.ray", "RayRollouts", False),  # verifier actors on the cluster
    "vllm": ("posttrain.training.rollouts.vllm", "VLLMRollouts", True),
}


def backend_class(name: str) -> Callable[[RolloutSetup], RolloutBackend]:
    module, cls, _ = BACKENDS[name]
    return getattr(importlib.import_module(module), cls)


@contextlib.contextmanager
def open_rollouts(
    config: GRPOConfig,
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    scheduler: Scheduler,
    *,
    version: int,
    source: PolicySource,
    service: VerifierService | None = None,
) -> Iterator[RolloutBackend]:
    """The backend ``config.rollout`` names, sampling from ``model``'s weights (published as ``version``),
    with its verifier pool (``service``, else one of its own when it verifies here), closed afterwards."""
    local_verifier = BACKENDS[config.rollout.backend][2]
    own_service = service is None and local_verifier
    if own_service:
        service = VerifierService(PoolConfig(workers=config.verifier_workers))
    executor = ThreadPoolExecutor(max_workers=32, thread_name_prefix="posttrain-verify-wait")
    rollouts: RolloutBackend | None = None
    try:
        setup = RolloutSetup(
            model,
            tokenizer,
            scheduler,
            config,
            version,
            source,
            service if local_verifier else None,
            executor if local_verifier else None,
        )
        rollouts = backend_class(config.rollout.backend)(setup)
        yield rollouts
    finally:
        if rollouts is not None:
            rollouts.close()
        executor.shutdown(wait=False, cancel_futures=True)
        if own_service and service is not None:
            service.close()


__all__ = ["BACKENDS", "RolloutBackend", "RolloutBatch", "RolloutSetup", "backend_class", "has_signal", "open_rollouts"]
