"""CPU serving engines: the embedded engine's lean decode step and Q8_0 weights, and llama.cpp's llama-server
deployed as a job behind the gateway."""

from __future__ import annotations

import copy
import time
from pathlib import Path

import psutil
import pytest
import torch
from conftest import OPERATOR, start_worker, stop_deployment, stop_worker, wait_deployed, wait_for
from torch import nn

from posttrain.platform.db.models import JobStatus
from posttrain.platform.jobs import queue

pytestmark = pytest.mark.slow
sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # tests that start servers: once


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def tiny(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    from posttrain.platform.engines import load_model
    from posttrain.platform.models import TinyModelSpec, build_tiny_model

    path = build_tiny_model(tmp_path_factory.mktemp(request.param) / "m",
                            TinyModelSpec(architecture=request.param, hidden_size=64, num_layers=2))  # fmt: skip
    return load_model(path)


def _prefilled(model, prompts: list[list[int]]):  # type: ignore[no-untyped-def]
    from posttrain.platform.engines.generation import DecodeBatch

    batch = DecodeBatch(model)
    cache, mask, _ = batch._prefill(prompts)
    return cache, mask


def test_lean_decode_step_computes_what_forward_computes(tiny) -> None:  # type: ignore[no-untyped-def]
    """Rows of different lengths (left padding) and three tokens a step (speculation): the same logits and cache."""
    from posttrain.platform.engines.generation import LeanDecoder, _forward

    model = tiny.model
    assert LeanDecoder.supports(model)
    prompts = [[5, 6, 7, 8, 9, 10], [11, 12, 13]]
    step = torch.tensor([[20, 21, 22], [23, 24, 25]])
    with torch.inference_mode():
        theirs, mask = _prefilled(model, prompts)
        ours = copy.deepcopy(theirs)
        full = torch.cat([mask, torch.ones(2, 3, dtype=torch.long)], dim=1)
        positions = mask.sum(-1, keepdim=True) + torch.arange(3)
        expected = _forward(model, theirs, input_ids=step, attention_mask=full, position_ids=positions).logits
        got = LeanDecoder(model)(ours, input_ids=step, attention_mask=full, position_ids=positions)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
    for a, b in zip(ours.layers, theirs.layers):
        torch.testing.assert_close(a.keys, b.keys)
        torch.testing.assert_close(a.values, b.values)


def test_fused_q8_layers_compute_what_the_q8_modules_compute(tiny) -> None:  # type: ignore[no-untyped-def]
    """A quantized model's decode step with each layer in two kernel calls equals the same step through its
    Q8Linear modules; left padding (a mask) included, and Qwen2's q/k/v biases."""
    from posttrain.platform.engines.generation import LeanDecoder
    from posttrain.platform.engines.q8 import quantize_q8

    assert LeanDecoder(tiny.model).fused is None  # fp32 weights: the tensor operations
    model = copy.deepcopy(tiny.model)
    quantize_q8(model)
    fused, modules = LeanDecoder(model), LeanDecoder(model)
    assert fused.fused is not None
    modules.fused = None
    with torch.inference_mode():
        theirs, mask = _prefilled(model, [[5, 6, 7, 8, 9, 10], [11, 12, 13]])
        ours = copy.deepcopy(theirs)
        for token in range(3):  # three steps, each row one token
            mask = torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], dim=1)
            inputs = {
                "input_ids": torch.tensor([[20 + token], [30 + token]]),
                "attention_mask": mask,
                "position_ids": mask.sum(-1, keepdim=True) - 1,
            }
            expected, got = modules(theirs, **inputs), fused(ours, **inputs)
            scale = float(expected.abs().max())
            assert float((got - expected).abs().max()) < 1e-5 * scale, float((got - expected).abs().max()) / scale
    for a, b in zip(ours.layers, theirs.layers):
        assert float((a.keys - b.keys).abs().max()) < 1e-5 * float(b.keys.abs().max())


def test_q8_linear_is_close_to_fp32_in_both_paths() -> None:
    from posttrain.platform.engines.q8 import KERNEL_ROWS, Q8Linear, quantize_q8

    torch.manual_seed(0)
    linear = nn.Linear(256, 96)
    q8 = Q8Linear(linear)
    for rows in (1, 3, KERNEL_ROWS + 20):  # the kernel (activations quantized too) and the dequantized slices
        x = torch.randn(2, rows, 256)
        error = (q8(x) - linear(x)).abs().max() / linear(x).abs().max()
        assert error < 0.02, (rows, float(error))
    assert q8.values.dtype == torch.int8 and q8.values.numel() == 256 * 96  # a quarter of fp32's bytes, plus scales

    block = nn.Module()
    block.q_proj, block.k_proj, block.v_proj = nn.Linear(64, 64), nn.Linear(64, 32), nn.Linear(64, 32, bias=False)
    x = torch.randn(1, 64)
    before = {n: getattr(block, n)(x) for n in ("q_proj", "k_proj", "v_proj")}
    assert quantize_q8(block) == 3
    stacked = block.qkv_proj(x)
    assert torch.equal(torch.cat([getattr(block, n)(x) for n in ("q_proj", "k_proj", "v_proj")], dim=-1), stacked)
    assert block.q_proj.values.data_ptr() == block.qkv_proj.values.data_ptr()  # views into the stack, not copies
    for name, reference in before.items():
        assert (getattr(block, name)(x) - reference).abs().max() < 0.02 * reference.abs().max()


def test_q8_tier_decodes_faster_than_the_standard_tier_on_the_real_model(real_model) -> None:  # type: ignore[no-untyped-def]
    """The q8 tier serves a copy (the shared model keeps its weights), answers sensibly, and decodes at least twice
    as many tokens a second as the standard tier, the two measured turn about in the same run. It streams a quarter
    of the bytes, and how much of that becomes speed depends on the CPU: 4.55x alone on an AMD EPYC host (the
    fused layers in two kernel calls each; the modules' own step was 2.77x), 2.8x alone and 2.3-2.6x beside the
    suite's other worker on a Sapphire Rapids VM, whose one core streams fp32 weights at 10 GB/s."""
    from posttrain.platform.engines import DEFAULT_TIERS, EngineConfig
    from posttrain.platform.engines.generation import DecodeBatch, LeanDecoder, SamplingParams, Sequence
    from posttrain.platform.engines.q8 import Q8Linear
    from posttrain.platform.serving import EmbeddedEngine

    q8 = EmbeddedEngine(EngineConfig(model_path=str(real_model.info.path), tier=DEFAULT_TIERS["q8"]), loaded=real_model)
    assert isinstance(q8.loaded.model.lm_head, Q8Linear) and isinstance(real_model.model.lm_head, nn.Linear)
    assert LeanDecoder(q8.loaded.model).fused is not None  # every layer of the real model qualifies
    tokenizer = real_model.tokenizer
    prompt = list(tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                                add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"])  # fmt: skip

    def decode(model: nn.Module, tokens: int = 40) -> tuple[list[int], float]:
        seq = Sequence(prompt, SamplingParams(max_new_tokens=tokens), frozenset())
        batch = DecodeBatch(model)
        batch.add([seq])
        start = time.perf_counter()
        while not seq.finished:
            batch.step()
        return seq.generated, (len(seq.generated) - 1) / (time.perf_counter() - start)

    decode(q8.loaded.model, 4)  # the kernel compiled and warm
    rates: dict[str, list[float]] = {"q8": [], "standard": []}
    threads = torch.get_num_threads()
    torch.set_num_threads(
        1
    )  # both tiers as a serving process runs them (the kernel uses one thread), also outside xdist
    try:
        for _ in range(2):
            for name, model in (("q8", q8.loaded.model), ("standard", real_model.model)):
                tokens, rate = decode(model)
                rates[name].append(rate)
                assert "Paris" in tokenizer.decode(tokens), (name, tokenizer.decode(tokens))
    finally:
        torch.set_num_threads(threads)
    ratio = max(rates["q8"]) / max(rates["standard"])
    print(f"decode tokens/s: q8 {max(rates['q8']):.1f}, standard {max(rates['standard']):.1f} ({ratio:.2f}x)")
    assert ratio > 2.0, rates


def _cmdline(process: psutil.Process) -> list[str]:
    """A process's command line; none for one that ended meanwhile."""
    try:
        return process.cmdline()
    except psutil.Error:
        return []


@sqlite_only
@pytest.mark.requires("llama-server")
def test_llamacpp_deployment_serves_through_the_gateway(platform_env: dict[str, str], real_model_dir) -> None:  # type: ignore[no-untyped-def]
    """Without the binary a llamacpp deployment fails at once, naming the make target; with it, the llamacpp tier
    exports the model's Q8_0 GGUF, runs llama-server on loopback, and the official client chats through the
    gateway (plain and streamed, the same greedy text); cancelling stops the server."""
    from openai import OpenAI

    from posttrain.platform.engines.llamacpp import find_server
    from posttrain.platform.models.registry import register_model
    from posttrain.platform.serving.gateway import GatewayConfig, create_gateway_app
    from posttrain.platform.serving.jobs import registered_deployments
    from posttrain.platform.serving.server import serve_in_thread

    binary = find_server()  # make test builds it (make llamacpp)
    register_model(OPERATOR, "smol", real_model_dir.path, meta=real_model_dir.meta)

    worker = start_worker(
        {**platform_env, "POSTTRAIN_LLAMA_SERVER": str(Path(platform_env["POSTTRAIN_DATA_DIR"]) / "none")}
    )
    try:
        missing = queue.submit(OPERATOR, "deploy", {"model": "smol", "tier": "llamacpp"})
        wait_for(lambda: queue.get_job(missing).status.finished, timeout=60, message="deploy without the binary ends")
        failed = queue.get_job(missing)
        assert failed.status is JobStatus.failed and "make llamacpp" in (failed.error or ""), failed.error
    finally:
        stop_worker(worker)

    worker = start_worker(platform_env)
    try:
        deployed = queue.submit(OPERATOR, "deploy", {"model": "smol", "tier": "llamacpp"})
        route = wait_deployed(deployed)
        assert route.tier == "llamacpp" and route.base_url.startswith("http://127.0.0.1:")
        # llama-server is a child of this deployment's job process, whose pid the job row records (not any
        # llama-server on the machine: another deployment may be serving beside the test)
        job = queue.get_job(deployed)
        assert job.pid is not None and psutil.Process(job.pid).create_time() == pytest.approx(job.proc_started, abs=1)
        servers = [(p, args) for p in psutil.Process(job.pid).children(recursive=True)
                   if (args := _cmdline(p))[:1] == [str(binary)]]  # fmt: skip
        assert len(servers) == 1, servers
        ((server, args),) = servers
        assert args[args.index("--model") + 1].endswith("smol.Q8_0.gguf") and args[args.index("--parallel") + 1] == "4"

        gateway = serve_in_thread(
            create_gateway_app(GatewayConfig(deployments=[], health_interval_s=0.5), refresh=registered_deployments)
        )
        with gateway:
            client = OpenAI(base_url=gateway.base_url + "/v1", api_key="unused")
            wait_for(lambda: client.models.list().data, timeout=30, message="gateway sees the deployment")
            (listed,) = client.models.list().data
            assert listed.id == "smol" and listed.model_extra["max_model_len"] > 0
            messages = [{"role": "user", "content": "Name three primary colours."}]
            reply = client.chat.completions.create(
                model="smol@llamacpp", messages=messages, max_tokens=24, temperature=0
            )  # the tier named as any OpenAI client can
            text = reply.choices[0].message.content
            assert text and reply.usage.completion_tokens > 0 and reply.choices[0].finish_reason in ("stop", "length")
            stream = client.chat.completions.create(model="smol", messages=messages, max_tokens=24, temperature=0,
                                                    stream=True)  # fmt: skip
            assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == text

        stop_deployment(deployed, server)
    finally:
        stop_worker(worker)


def test_a_tiers_weights_follow_the_engine_that_serves_it() -> None:
    """Unset weights mean q8_0 on llama.cpp and the model's own elsewhere, whichever engine the tier names."""
    from posttrain.platform.engines import DEFAULT_TIERS

    assert DEFAULT_TIERS["standard"].weights_for("llamacpp") == "q8_0"
    assert DEFAULT_TIERS["llamacpp"].weights_for("embedded") == "model"
    assert DEFAULT_TIERS["q8"].weights_for("embedded") == DEFAULT_TIERS["q8"].weights_for("llamacpp") == "q8_0"
