"""``rollout: {backend: vllm}``: on-policy rollouts through vLLM in the learner's process, on its GPU.

    GRPOConfig(model="runs/sft/model", domains=[...], rollout={"backend": "vllm", "gpu_memory_utilization": 0.4})

The lock-step loop of the sync backend with a :class:`~posttrain.training.inference.VLLMRolloutEngine`
instead of the embedded engine: vLLM loads the policy from its model directory, samples every group
with ``n = group_size`` (prefix caching shares each prompt), and after every update the learner's
weights are pushed into it (the engine's in-process weight path, else its workers' reload, else a
saved directory it reloads) and tagged with the new policy version. The loop's log-prob check
(``logprob_check``) compares vLLM's recorded log-probs with the learner's every step. vLLM is the
``gpu`` extra; without a GPU this backend cannot run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from posttrain.training.config import VLLMRollout
from posttrain.training.inference import VLLMEngineArgs, VLLMRolloutEngine
from posttrain.training.rollouts.base import RolloutSetup
from posttrain.training.rollouts.sync import SyncRollouts


class VLLMRollouts(SyncRollouts):
    """Sync rollouts through an in-process vLLM engine; see the module docstring. ``llm_class`` and
    ``sampling_params_class`` replace vLLM's (tests)."""

    def __init__(self, setup: RolloutSetup, *, llm_class: Any = None, sampling_params_class: Any = None) -> None:
        spec = setup.config.rollout
        if not isinstance(spec, VLLMRollout):
            raise ValueError("VLLMRollouts needs rollout: {backend: vllm}")
        if not isinstance(setup.source, (str, Path)) or setup.config.lora is not None:
            raise ValueError("the vllm rollout backend loads the policy from its model directory: give the run a "
                             "model directory (not a model object) and no LoRA, or choose another rollout backend")
        args = VLLMEngineArgs(dtype=spec.dtype, gpu_memory_utilization=spec.gpu_memory_utilization,
                              max_model_len=spec.max_model_len, enforce_eager=spec.enforce_eager, seed=setup.config.seed)
        engine = VLLMRolloutEngine(setup.source, args=args, version=setup.version, llm_class=llm_class,
                                   sampling_params_class=sampling_params_class)
        super().__init__(setup, engine)
        self.vllm = engine
        if setup.version != 0:  # a resumed run: vLLM read the directory, the learner holds the checkpoint's weights
            self.publish(setup.model, setup.version)

    def publish(self, model: torch.nn.Module, version: int) -> None:
        """Push the learner's new weights into vLLM as policy ``version``."""
        self.vllm.load_weights(model.state_dict(), version)
