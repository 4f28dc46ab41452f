"""vLLM's tier profiles as its server's arguments; the subprocess launcher running the embedded engine's own
server (one that serves, one that dies on start); and a vllm deployment: vLLM's OpenAI server from its own
environment (``make vllm``, on the CPU here), started by a deploy job and reached through the gateway."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from posttrain.platform.engines import DEFAULT_TIERS, LaunchError, ServerProcess, TierCatalog, TierProfile, VllmProfile
from posttrain.platform.engines.launcher import free_port
from posttrain.platform.models import TinyModelSpec, build_tiny_model


def _arg(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def test_fast_tier_profile_becomes_vllm_arguments() -> None:
    profile = VllmProfile.for_tier(
        "/models/qwen",
        DEFAULT_TIERS["fast"],
        served_model_name="qwen",
        port=8100,
        tensor_parallel_size=2,
        limit_mm_per_prompt={"image": 4},
    )
    args = profile.long_context(131072).to_args("/envs/vllm/bin/python")
    assert args[:5] == ["/envs/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", "/models/qwen"]
    assert _arg(args, "--max-model-len") == "131072" and _arg(args, "--kv-cache-dtype") == "fp8"
    assert "--enable-prefix-caching" in args and "--enable-chunked-prefill" in args
    assert _arg(args, "--tensor-parallel-size") == "2" and _arg(args, "--port") == "8100"
    assert _arg(args, "--max-num-seqs") == "64" and _arg(args, "--max-num-batched-tokens") == "8192"
    assert json.loads(_arg(args, "--limit-mm-per-prompt")) == {"image": 4}
    spec = json.loads(_arg(args, "--speculative-config"))
    assert spec == {"method": "ngram", "num_speculative_tokens": 5, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    assert _arg(args, "--tool-call-parser") == "hermes" and "--enable-auto-tool-choice" in args
    assert _arg(args, "--served-model-name") == "qwen"
    # a GPU host: a share of GPU memory, compiled graphs; every host: the content format the ChatML template needs
    assert _arg(args, "--gpu-memory-utilization") == "0.9" and "--enforce-eager" not in args
    assert "--kv-cache-memory-bytes" not in args and _arg(args, "--chat-template-content-format") == "string"


def test_a_cpu_host_profile_sizes_the_kv_cache_in_bytes_and_keeps_to_the_model_s_context() -> None:
    """The same profile class on a CPU: the KV cache in bytes (a memory share there would be a share of the RAM),
    eager start-up, and ``max_model_len`` capped at the model's own whatever the operator asks."""
    args = VllmProfile.for_tier("/m", DEFAULT_TIERS["standard"], device="cpu", model_max_len=8192).to_args()
    assert "--gpu-memory-utilization" not in args and _arg(args, "--kv-cache-memory-bytes") == str(2**30)
    assert "--enforce-eager" in args and _arg(args, "--max-model-len") == "8192"
    asked = VllmProfile.for_tier("/m", DEFAULT_TIERS["standard"], device="cpu", model_max_len=8192, max_model_len=32768)
    assert asked.max_model_len == 8192
    shorter = VllmProfile.for_tier("/m", DEFAULT_TIERS["standard"], device="cpu", model_max_len=8192, max_model_len=2048,
                                   kv_cache_memory_bytes=2**28, enforce_eager=False)  # fmt: skip
    assert shorter.max_model_len == 2048 and "--enforce-eager" not in shorter.to_args()
    assert _arg(shorter.to_args(), "--kv-cache-memory-bytes") == str(2**28)
    assert "--max-model-len" not in VllmProfile(model_path="/m").to_args()  # vLLM's default: the model's own


def test_standard_tier_has_no_speculation_and_validation_names_fields() -> None:
    args = VllmProfile.for_tier("/m", DEFAULT_TIERS["standard"], enable_prefix_caching=False).to_args()
    assert "--speculative-config" not in args and "--no-enable-prefix-caching" in args
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        VllmProfile(model_path="/m", gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="needs enable_chunked_prefill=True"):
        VllmProfile(model_path="/m", enable_chunked_prefill=False, max_num_batched_tokens=1024, max_model_len=8192)


def test_tier_catalog_is_editable_on_disk(tmp_path: Path) -> None:
    catalog = TierCatalog()
    catalog.tiers["fast"].embedded.prompt_lookup_num_tokens = 6
    catalog.save(tmp_path / "tiers.json")
    loaded = TierCatalog.load(tmp_path / "tiers.json")
    assert loaded.get("fast").embedded.prompt_lookup_num_tokens == 6
    with pytest.raises(KeyError, match="known tiers: fast, llamacpp, q8, standard"):
        loaded.get("turbo")


def test_each_engine_has_its_own_tier_section_and_a_flat_tiers_file_reads_the_same(tmp_path: Path) -> None:
    """A tier's embedded and vLLM settings are typed sections of their own (a vLLM field in the embedded section is
    refused, naming it); a tiers file saved before the split (the fields side by side, vLLM's prefixed) loads as the
    same tiers."""
    flat = {"name": "fast", "description": "low latency", "prompt_lookup_num_tokens": 10, "max_num_seqs": 4,
            "batch_wait_ms": 0.0, "vllm_speculative_ngram_tokens": 5, "vllm_max_num_seqs": 64,
            "vllm_max_num_batched_tokens": 8192}  # fmt: skip
    (tmp_path / "tiers.json").write_text(json.dumps({"tiers": {"fast": flat}}))
    assert TierCatalog.load(tmp_path / "tiers.json").get("fast") == DEFAULT_TIERS["fast"].model_copy(
        update={"description": "low latency"}
    )
    assert VllmProfile.for_tier("/m", DEFAULT_TIERS["fast"]).max_num_seqs == 64  # vLLM's section, not the embedded 4
    with pytest.raises(ValueError, match="embedded.speculative_ngram_tokens"):
        TierProfile.model_validate({"name": "x", "embedded": {"speculative_ngram_tokens": 5}})


def _cmdline(process: psutil.Process) -> list[str]:
    """A process's command line; none for one that ended meanwhile."""
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def test_launcher_runs_the_embedded_engine_as_a_subprocess(tmp_path: Path) -> None:
    model = build_tiny_model(
        tmp_path / "tiny",
        TinyModelSpec(hidden_size=64, num_layers=1, num_heads=4, num_kv_heads=2, intermediate_size=128),
    )
    port = free_port()
    lines: list[str] = []
    command = [
        sys.executable,
        "-m",
        "posttrain.platform.serving",
        "--model",
        str(model),
        "--served-model-name",
        "tiny",
        "--port",
        str(port),
        "--tier",
        "fast",
    ]
    proc = ServerProcess(
        command, f"http://127.0.0.1:{port}", log_path=tmp_path / "logs" / "engine.log", on_log=lines.append
    )
    with proc:
        assert proc.running and proc.healthy()
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/completions",
            json={"model": "tiny", "prompt": "hello", "max_tokens": 3},
            timeout=60,
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert not proc.running and proc.proc is not None and proc.proc.returncode is not None
    assert any("serving tiny (fast)" in line for line in lines)
    assert "serving tiny" in (tmp_path / "logs" / "engine.log").read_text()


def test_launcher_reports_a_server_that_dies(tmp_path: Path) -> None:
    command = [
        sys.executable,
        "-m",
        "posttrain.platform.serving",
        "--model",
        str(tmp_path / "missing"),
        "--port",
        str(free_port()),
    ]
    with pytest.raises(LaunchError, match="(?s)exited with code 1.*error: model directory .* does not exist"):
        ServerProcess(command, "http://127.0.0.1:1").start(timeout_s=60)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.requires("vllm")
def test_vllm_deployment_serves_through_the_gateway(platform_env: dict[str, str], real_model_dir) -> None:  # type: ignore[no-untyped-def]
    """Without vLLM's environment a vllm deployment fails at once, naming `make vllm`; with it, vLLM's own OpenAI
    server runs from that environment on loopback with a CPU host's settings (KV cache in bytes, eager mode, the
    model's own context at most though the deployment asks for more, the string content format, the fast tier's
    n-gram speculation), and the official client reaches it through the gateway: chat in the model's template, plain
    and streamed (the same greedy text), log-probs, completions, the tier's metrics (drafted tokens too) on the
    deployment; cancelling stops the server."""
    from conftest import OPERATOR, start_worker, stop_deployment, stop_worker, wait_deployed, wait_for
    from openai import OpenAI

    from posttrain.platform.db.models import JobStatus
    from posttrain.platform.engines.vllm import find_python
    from posttrain.platform.jobs import queue
    from posttrain.platform.models.registry import register_model
    from posttrain.platform.serving.client import prometheus_values
    from posttrain.platform.serving.gateway import GatewayConfig, create_gateway_app
    from posttrain.platform.serving.jobs import registered_deployments
    from posttrain.platform.serving.server import serve_in_thread

    python = find_python()  # make test installs it (make vllm)
    register_model(OPERATOR, "smol", real_model_dir.path, meta=real_model_dir.meta)
    config = {"model": "smol", "tier": "fast", "engine": "vllm", "max_model_len": 65536}

    worker = start_worker(
        {**platform_env, "POSTTRAIN_VLLM_PYTHON": str(Path(platform_env["POSTTRAIN_DATA_DIR"]) / "none")}
    )
    try:
        missing = queue.submit(OPERATOR, "deploy", config)
        wait_for(lambda: queue.get_job(missing).status.finished, timeout=60, message="deploy without vLLM ends")
        failed = queue.get_job(missing)
        assert failed.status is JobStatus.failed and "make vllm" in (failed.error or ""), failed.error
        assert len((failed.error or "").splitlines()) == 1, failed.error
    finally:
        stop_worker(worker)

    worker = start_worker(platform_env)
    try:
        deployed = queue.submit(OPERATOR, "deploy", config)
        route = wait_deployed(deployed, timeout=600)
        assert route.tier == "fast" and route.base_url.startswith("http://127.0.0.1:")
        # vLLM's server is a child of this deployment's job process, whose pid the job row records (not any vLLM
        # server on the machine: another deployment may be serving beside the test)
        job = queue.get_job(deployed)
        assert job.pid is not None and psutil.Process(job.pid).create_time() == pytest.approx(job.proc_started, abs=1)
        servers = [(p, args) for p in psutil.Process(job.pid).children(recursive=True)
                   if (args := _cmdline(p))[:1] == [str(python)] and "--served-model-name" in args]  # fmt: skip
        assert len(servers) == 1, servers
        ((server, args),) = servers
        assert args[1:3] == ["-m", "vllm.entrypoints.openai.api_server"] and _arg(args, "--host") == "127.0.0.1"
        assert _arg(args, "--max-model-len") == "8192"  # SmolLM2's own, not the 65536 asked for
        assert _arg(args, "--kv-cache-memory-bytes") == str(2**30) and "--enforce-eager" in args
        assert (
            _arg(args, "--dtype") == "float32"
        )  # vLLM's CPU "auto" is bf16, whose kernels answered wrongly on an AMX host
        assert _arg(args, "--chat-template-content-format") == "string"
        assert json.loads(_arg(args, "--speculative-config"))["method"] == "ngram"  # the fast tier's speculation

        gateway = serve_in_thread(
            create_gateway_app(GatewayConfig(deployments=[], health_interval_s=0.5), refresh=registered_deployments)
        )
        with gateway:
            client = OpenAI(base_url=gateway.base_url + "/v1", api_key="unused")
            wait_for(lambda: client.models.list().data, timeout=30, message="gateway sees the deployment")
            (listed,) = client.models.list().data
            assert listed.id == "smol"
            messages = [{"role": "user", "content": "What is the capital of France?"}]
            reply = client.chat.completions.create(model="smol@fast", messages=messages, max_tokens=24, temperature=0,
                                                   logprobs=True, top_logprobs=2)  # fmt: skip
            text = reply.choices[0].message.content
            assert text and "Paris" in text, text  # the chat template reached the model: it answers the question
            tokens = reply.choices[0].logprobs.content
            assert len(tokens) == reply.usage.completion_tokens and all(t.logprob <= 0 for t in tokens)
            assert all(len(t.top_logprobs) == 2 and t.top_logprobs[0].logprob >= t.logprob - 1e-6 for t in tokens)
            stream = client.chat.completions.create(model="smol", messages=messages, max_tokens=24, temperature=0,
                                                    stream=True)  # fmt: skip
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == text
            completion = client.completions.create(
                model="smol", prompt="The capital of France is", max_tokens=4, temperature=0
            )
            assert completion.usage.completion_tokens == 4 and completion.choices[0].text
            echo = [{"role": "user", "content": "Repeat exactly: the quick brown fox jumps over the lazy dog, "
                                                "the quick brown fox jumps over the lazy dog"}]  # fmt: skip
            client.chat.completions.create(model="smol", messages=echo, max_tokens=40, temperature=0)
        names = ("vllm:generation_tokens_total", "vllm:spec_decode_num_draft_tokens_total")
        metrics = prometheus_values(route.base_url, names)
        assert metrics["vllm:generation_tokens_total"] >= 2 * reply.usage.completion_tokens
        assert metrics["vllm:spec_decode_num_draft_tokens_total"] > 0, metrics  # n-gram drafts on the repetition

        stop_deployment(deployed, server)
    finally:
        stop_worker(worker)
