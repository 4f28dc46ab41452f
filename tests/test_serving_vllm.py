"""vLLM profile to arguments, and the subprocess launcher against a real stand-in server."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import httpx
import pytest

from posttrain.platform.models import TinyModelSpec, build_tiny_model
from posttrain.platform.serving import DEFAULT_TIERS, LaunchError, ServerProcess, TierCatalog, VllmProfile


def _arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_fast_tier_profile_becomes_vllm_arguments() -> None:
    profile = VllmProfile.for_tier("/models/qwen", DEFAULT_TIERS["fast"], served_model_name="qwen", port=8100,
                                   tensor_parallel_size=2, limit_mm_per_prompt={"image": 4})
    args = profile.long_context(131072).to_args()
    assert args[:3] == ["vllm", "serve", "/models/qwen"]
    assert _arg(args, "--max-model-len") == "131072" and _arg(args, "--kv-cache-dtype") == "fp8"
    assert "--enable-prefix-caching" in args and "--enable-chunked-prefill" in args
    assert _arg(args, "--tensor-parallel-size") == "2" and _arg(args, "--port") == "8100"
    assert _arg(args, "--max-num-seqs") == "64" and _arg(args, "--max-num-batched-tokens") == "8192"
    assert json.loads(_arg(args, "--limit-mm-per-prompt")) == {"image": 4}
    spec = json.loads(_arg(args, "--speculative-config"))
    assert spec == {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    assert _arg(args, "--tool-call-parser") == "hermes" and "--enable-auto-tool-choice" in args
    assert _arg(args, "--served-model-name") == "qwen"


def test_standard_tier_has_no_speculation_and_validation_names_fields() -> None:
    args = VllmProfile.for_tier("/m", DEFAULT_TIERS["standard"], enable_prefix_caching=False).to_args()
    assert "--speculative-config" not in args and "--no-enable-prefix-caching" in args
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        VllmProfile(model_path="/m", gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="needs enable_chunked_prefill=True"):
        VllmProfile(model_path="/m", enable_chunked_prefill=False, max_num_batched_tokens=1024, max_model_len=8192)


def test_tier_catalog_is_editable_on_disk(tmp_path: Path) -> None:
    catalog = TierCatalog()
    catalog.tiers["fast"].prompt_lookup_num_tokens = 6
    catalog.save(tmp_path / "tiers.json")
    loaded = TierCatalog.load(tmp_path / "tiers.json")
    assert loaded.get("fast").prompt_lookup_num_tokens == 6
    with pytest.raises(KeyError, match="known tiers: fast, llamacpp, q8, standard"):
        loaded.get("turbo")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_launcher_runs_the_embedded_engine_as_a_subprocess(tmp_path: Path) -> None:
    model = build_tiny_model(tmp_path / "tiny", TinyModelSpec(hidden_size=64, num_layers=1, num_heads=4,
                                                              num_kv_heads=2, intermediate_size=128))
    port = _free_port()
    lines: list[str] = []
    command = [sys.executable, "-m", "posttrain.platform.serving", "--model", str(model),
               "--served-model-name", "tiny", "--port", str(port), "--tier", "fast"]
    proc = ServerProcess(command, f"http://127.0.0.1:{port}", log_path=tmp_path / "logs" / "engine.log",
                         on_log=lines.append)
    with proc:
        assert proc.running and proc.healthy()
        r = httpx.post(f"http://127.0.0.1:{port}/v1/completions",
                       json={"model": "tiny", "prompt": "hello", "max_tokens": 3}, timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert not proc.running and proc.proc is not None and proc.proc.returncode is not None
    assert any("serving tiny (fast)" in line for line in lines)
    assert "serving tiny" in (tmp_path / "logs" / "engine.log").read_text()


def test_launcher_reports_a_server_that_dies(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "posttrain.platform.serving", "--model", str(tmp_path / "missing"),
               "--port", str(_free_port())]
    with pytest.raises(LaunchError, match="(?s)exited with code 1.*error: model directory .* does not exist"):
        ServerProcess(command, "http://127.0.0.1:1").start(timeout_s=60)
