"""``rollout: {backend: vllm}``: on-policy rollouts through vLLM, the learner's weights pushed after every update.

    GRPOConfig(model="runs/sft/model", domains=[...], rollout={"backend": "vllm"})

The lock-step loop of the sync backend with a vLLM engine instead of the embedded one: vLLM loads the policy
from its model directory, samples every group with ``n = group_size`` (prefix caching shares each prompt), and
after every update the learner's weights go in through the workers' ``reload_weights`` and are tagged with the
new policy version. Where vLLM runs (``rollout.engine``):

- ``colocated``: :class:`~posttrain.training.vllm_engines.VLLMRolloutEngine`, ``vllm.LLM`` in the learner's process
  (an environment with vLLM: a GPU host's ``gpu`` extra);
- ``server``: :class:`~posttrain.training.vllm_engines.VLLMServerEngine`, vLLM in a process of its own run by
  vLLM's environment (``.venv-vllm``, ``make vllm``; the CPU host's way, and a GPU host's that keeps vLLM apart);
- ``auto``: colocated when this environment has vLLM, else the server.

Multi-turn environments' episodes go through the engine's batcher. The loop's log-prob check (``logprob_check``)
compares vLLM's recorded log-probs with the learner's every N steps and fails the run past its tolerance.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import torch

from posttrain.platform.engines.vllm import VllmProfile
from posttrain.training.config import VLLMRollout
from posttrain.training.rollouts.base import RolloutSetup
from posttrain.training.rollouts.sync import SyncRollouts
from posttrain.training.vllm_engines import VLLMRolloutEngine, VLLMServerEngine


def open_vllm_engine(
    source: str | Path,
    spec: VLLMRollout,
    *,
    device: str,
    seed: int,
    version: int = 0,
    llm_class: Any = None,
    sampling_params_class: Any = None,
) -> VLLMRolloutEngine | VLLMServerEngine:
    """vLLM loaded from model directory ``source`` as ``spec`` says, for a learner (or an evaluation) on ``device``
    (``cpu``: float32 unless set, eager, this process's torch threads)."""
    args = VllmProfile.for_rollouts(
        source, dtype=spec.dtype, gpu_memory_utilization=spec.gpu_memory_utilization,
        kv_cache_memory_bytes=spec.kv_cache_memory_bytes, max_model_len=spec.max_model_len,
        enforce_eager=device == "cpu" if spec.enforce_eager is None else spec.enforce_eager,
        device="cpu" if device == "cpu" else "cuda", seed=seed,
        cpu_threads=spec.cpu_threads or torch.get_num_threads(),
    )  # fmt: skip
    colocated = spec.engine == "colocated" or (
        spec.engine == "auto" and (llm_class is not None or importlib.util.find_spec("vllm") is not None)
    )
    if colocated:
        return VLLMRolloutEngine(source, args=args, version=version, llm_class=llm_class,
                                 sampling_params_class=sampling_params_class)  # fmt: skip
    return VLLMServerEngine(source, args=args, version=version)


class VLLMRollouts(SyncRollouts):
    """Sync rollouts through a vLLM engine; see the module docstring. ``llm_class`` and ``sampling_params_class``
    replace vLLM's in a colocated engine (tests)."""

    def __init__(self, setup: RolloutSetup, *, llm_class: Any = None, sampling_params_class: Any = None) -> None:
        spec = setup.config.rollout
        if not isinstance(spec, VLLMRollout):
            raise ValueError("VLLMRollouts needs rollout: {backend: vllm}")
        if not isinstance(setup.source, (str, Path)) or setup.config.lora is not None:
            raise ValueError(
                "the vllm rollout backend loads the policy from its model directory: give the run a "
                "model directory (not a model object) and no LoRA, or choose another rollout backend"
            )
        engine = open_vllm_engine(
            setup.source, spec, device=next(setup.model.parameters()).device.type, seed=setup.config.seed,
            version=setup.version, llm_class=llm_class, sampling_params_class=sampling_params_class,
        )  # fmt: skip
        try:
            super().__init__(setup, engine)
            self.vllm = engine
            if setup.version != 0:  # a resumed run: vLLM read the directory, the learner holds the checkpoint's weights
                self.publish(setup.model, setup.version)
        except BaseException:
            engine.close()
            raise

    def publish(self, model: torch.nn.Module, version: int) -> None:
        """Push the learner's new weights into vLLM as policy ``version``."""
        self.vllm.load_weights(model.state_dict(), version)

    def close(self) -> None:
        try:
            super().close()
        finally:
            self.vllm.close()
