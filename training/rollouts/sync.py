"""``rollout: {backend: sync}``: sample with the learner's own model (through the embedded inference
engine; a multi-turn environment's episodes through its runner), verify, return (on-policy)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, cast

import torch

from posttrain.training.inference import EmbeddedRolloutEngine, InferenceEngine
from posttrain.training.rollout import collect_verification, submit_verification
from posttrain.training.rollouts.base import (
    RolloutBatch,
    RolloutSetup,
    generated_tokens,
    has_signal,
    open_episodes,
    record,
    sample_groups,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class SyncRollouts:
    """On-policy: sample through ``engine`` (default: the embedded engine on the learner's own model),
    verify, return; extra draws replace groups without a learning signal (``max_rollout_batches_per_step``), each
    as many prompts as the step still lacks groups with a signal, so none is sampled only to be left out."""

    def __init__(self, setup: RolloutSetup, engine: InferenceEngine | None = None) -> None:
        assert setup.service is not None and setup.executor is not None
        self.setup = setup
        policy = cast("PreTrainedModel", setup.model)  # a peft model under LoRA, which passes for one
        self.engine = engine or EmbeddedRolloutEngine(policy, setup.tokenizer, version=setup.version)
        self.episodes = open_episodes(setup.config, self.engine, setup.tokenizer, setup.service)

    def next_batch(self, version: int) -> RolloutBatch:
        s, config = self.setup, self.setup.config
        assert s.executor is not None and s.service is not None  # checked in __init__
        out = RolloutBatch()
        useful = 0
        for _ in range(config.algorithm.max_rollout_batches_per_step):
            t0 = time.perf_counter()
            groups = sample_groups(
                self.engine,
                self.episodes,
                s.tokenizer,
                s.scheduler.next_batch(config.scheduler.batch_size - useful),
                config.algorithm.group_size,
                config.sampling,
            )
            out.generation_s += time.perf_counter() - t0
            out.generated_tokens += generated_tokens(groups)
            for group in groups:
                submit_verification(s.executor, s.service, group, config.verifier_timeout_s)
            for group in groups:
                collect_verification(group)
                record(s.scheduler, group)
            out.groups += groups
            useful += sum(has_signal(g) for g in groups)
            if useful >= config.scheduler.batch_size:
                break
        return out

    def publish(self, model: torch.nn.Module, version: int) -> None:
        self.engine.version = version  # the learner's own model: the new weights are in it already

    def close(self) -> None:
        if self.episodes is not None:
            self.episodes.close()
