"""One class defines vLLM's arguments: a deployment's server command line and the rollout engine's ``vllm.LLM``
keyword arguments come from the same fields; a deploy's engine overrides are checked when it is submitted."""

from __future__ import annotations

import pytest
from conftest import OPERATOR

from posttrain.platform.engines.vllm import CPU_KV_CACHE_BYTES, VllmProfile
from posttrain.platform.jobs import queue
from posttrain.platform.jobs.registry import JobConfigError


def test_the_server_and_the_rollout_engine_read_the_same_fields() -> None:
    cpu = VllmProfile.for_rollouts("/models/m", device="cpu", max_model_len=512, seed=3, dtype="float32")
    assert cpu.llm_kwargs() == {
        "model": "/models/m", "dtype": "float32", "enable_prefix_caching": True, "enforce_eager": False, "seed": 3,
        "logprobs_mode": "processed_logprobs", "kv_cache_memory_bytes": CPU_KV_CACHE_BYTES, "max_model_len": 512,
    }  # fmt: skip
    args = cpu.to_args("python")
    assert args[args.index("--max-model-len") + 1] == "512" and args[args.index("--seed") + 1] == "3"
    assert "--gpu-memory-utilization" not in args and "--dtype" in args and args[args.index("--dtype") + 1] == "float32"
    gpu = VllmProfile.for_rollouts("/models/m", llm_extra={"swap_space": 0})
    assert gpu.llm_kwargs("/reloaded")["model"] == "/reloaded"  # a weight sync's new directory
    assert gpu.llm_kwargs()["gpu_memory_utilization"] == 0.5 and gpu.llm_kwargs()["swap_space"] == 0
    assert "--gpu-memory-utilization" in gpu.to_args()


def test_a_deploy_s_engine_overrides_are_checked_at_submit(platform_env: dict[str, str]) -> None:
    with pytest.raises(JobConfigError, match="max_num_seq are not VllmProfile fields"):
        queue.submit(OPERATOR, "deploy", {"model": "m", "engine": "vllm", "vllm_overrides": {"max_num_seq": 4}})
    with pytest.raises(JobConfigError, match="max_num_seqs: Input should be greater than or equal to 1"):
        queue.submit(OPERATOR, "deploy", {"model": "m", "engine": "vllm", "vllm_overrides": {"max_num_seqs": 0}})
    with pytest.raises(JobConfigError, match="gguf_path are not LlamaCppProfile fields"):
        queue.submit(OPERATOR, "deploy", {"model": "m", "llamacpp_overrides": {"gguf_path": "/etc/passwd"}})
    assert queue.list_jobs() == []  # nothing stored
    queue.submit(OPERATOR, "deploy", {"model": "m", "engine": "vllm", "vllm_overrides": {"max_num_seqs": 4}})
