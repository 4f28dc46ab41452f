"""The second model family (gemma3: sliding-window attention, QK norms, four norms a layer) on every embedded
tier and on llama.cpp: a path that does not know the family (the lean decode step, the Q8_0 fused layers) steps
aside with a logged reason, never a wrong answer; a gemma3 model exports to a GGUF that llama.cpp runs as
transformers does and that imports back as it was. On a locally built gemma3 model, whose sliding window is
shorter than the prompts so the window really masks, with a layer pattern of its own; and, for the vocabulary,
on the built-in Gemma's own SentencePiece tokenizer."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from pathlib import Path

import httpx
import openai
import pytest
import torch
from conftest import OPERATOR

from posttrain.platform.db import migrate
from posttrain.platform.engines import DEFAULT_TIERS, EngineConfig, load_model
from posttrain.platform.engines.chat_template import GEMMA_TEMPLATE, reply_end_ids
from posttrain.platform.engines.launcher import ServerProcess
from posttrain.platform.models import TinyModelSpec, build_tiny_model
from posttrain.platform.models.exporter import export_model
from posttrain.platform.models.importer import BUILTIN_MODELS, import_model
from posttrain.platform.serving import EmbeddedEngine, create_engine_app, serve_in_thread

NEAR_TIE = 0.05  # top-two logit margin under which a quantised tier may pick the other token
PROMPTS = ["the cat sat on the mat and the cat sat on", "one two three four five six seven eight nine ten one two"]


def llama_server(gguf: Path) -> ServerProcess:
    """llama-server on ``gguf`` as the llamacpp engine's profile starts it, one slot, one thread."""
    from posttrain.platform.engines.launcher import free_port
    from posttrain.platform.engines.llamacpp import LlamaCppProfile, find_server

    profile = LlamaCppProfile(gguf_path=str(gguf), port=free_port("127.0.0.1"), parallel=1, ctx_per_slot=512, threads=1)
    return ServerProcess(profile.to_args(find_server()), profile.base_url).start(timeout_s=180)


def greedy_reference(loaded, prompt: str, tokens: int = 12) -> tuple[list[int], list[float]]:  # type: ignore[no-untyped-def]
    """transformers' greedy tokens after ``prompt`` (tokenised as its tokenizer does by default) and each step's
    top-two logit margin."""
    ids = loaded.tokenizer(prompt, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        out = loaded.model.generate(ids, max_new_tokens=tokens, do_sample=False, eos_token_id=None, pad_token_id=0,
                                    output_scores=True, return_dict_in_generate=True)  # fmt: skip
    top = [s[0].topk(2).values for s in out.scores]
    return out.sequences[0, ids.shape[1] :].tolist(), [float(t[0] - t[1]) for t in top]


def agree_until_a_near_tie(got: list[int], reference: list[int], margins: list[float]) -> bool:
    sure = next((i for i, m in enumerate(margins) if m < NEAR_TIE), len(margins))
    return got[:sure] == reference[:sure]


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Gemma 3 text model (three sliding-window layers of width 4, then a global one) with a local tokenizer."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    root = tmp_path_factory.mktemp("gemma3")
    tokenizer_from = build_tiny_model(root / "tok", TinyModelSpec(hidden_size=64, num_layers=1))
    config = Gemma3TextConfig(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=32, sliding_window=4,
                              max_position_embeddings=512, layer_types=["sliding_attention"] * 3 + ["full_attention"])  # fmt: skip
    torch.manual_seed(0)
    path = root / "g3"
    Gemma3ForCausalLM(config).save_pretrained(path)
    for file in tokenizer_from.iterdir():
        if file.name.startswith("tokenizer") or file.name in ("chat_template.jinja", "special_tokens_map.json"):
            shutil.copy(file, path / file.name)
    return path


def test_every_embedded_tier_serves_gemma3_as_transformers_generates(
    gemma3_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Greedy completions of prompts longer than the window, two at once (so rows are left-padded): the standard
    and fast (speculating: a rejected draft is cropped from the sliding-window layers too, which keep their past
    until the crop) tiers give exactly transformers' ``generate`` tokens; the q8 tier the same up to the first
    position where the reference's top two logits are within a near tie. The lean decode step says why it is off."""
    from posttrain.platform.engines.generation import LeanDecoder
    from posttrain.platform.engines.q8 import Q8Linear

    loaded = load_model(gemma3_dir)
    assert (
        LeanDecoder.unsupported(loaded.model) == "the lean decode step knows llama and qwen2 layers, not 'gemma3_text'"
    )
    tokenizer = loaded.tokenizer
    prompts = PROMPTS
    expected, margins = [], []
    with torch.inference_mode():
        for prompt in prompts:
            ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
            out = loaded.model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0,
                                        output_scores=True, return_dict_in_generate=True)  # fmt: skip
            expected.append(out.sequences[0, ids.shape[1] :].tolist())
            margins.append([float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in out.scores])
    for tier in ("standard", "fast", "q8"):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="posttrain.platform.engines.generation"):
            engine = EmbeddedEngine(EngineConfig(model_path=str(gemma3_dir), served_model_name="g3", tier=DEFAULT_TIERS[tier],
                                                 max_model_len=256)).start()  # fmt: skip
            server = serve_in_thread(create_engine_app(engine))
            if tier == "q8":  # its weights really are Q8_0 (the family's Linear layers, through its own forward)
                assert any(isinstance(m, Q8Linear) for m in engine.loaded.model.modules())
            try:
                client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)
                out = client.completions.create(model="g3", prompt=prompts, max_tokens=12, temperature=0, logprobs=0)
            finally:
                server.stop()
                engine.stop()
        assert any("lean decode step knows llama and qwen2" in r.getMessage() for r in caplog.records), tier
        got = [
            tokenizer(c.text, add_special_tokens=False)["input_ids"] for c in sorted(out.choices, key=lambda c: c.index)
        ]
        for tokens, reference, margin in zip(got, expected, margins):
            if tier == "q8":
                sure = next((i for i, m in enumerate(margin) if m < NEAR_TIE), len(margin))
                assert (
                    tokenizer.decode(reference[:sure])
                    == tokenizer.decode(tokens)[: len(tokenizer.decode(reference[:sure]))]
                ), tier
            else:
                assert tokenizer.decode(tokens) == tokenizer.decode(reference), tier


@pytest.mark.requires("llama-server")
def test_a_gemma3_export_runs_in_llama_cpp_as_in_transformers(gemma3_dir: Path, tmp_path: Path) -> None:
    """The F16 GGUF states the window layer by layer (this model's three local layers, then a global one, not the
    family's usual five and one) with the local layers' RoPE base; llama-server tokenises the prompts as the model's
    tokenizer does and its greedy tokens are transformers' up to the first near tie."""
    import gguf

    source = load_model(gemma3_dir)
    with torch.no_grad():  # norms away from zero, so that the 1 + w Gemma applies and a plain w would differ
        for name, param in source.model.named_parameters():
            if name.endswith("norm.weight"):
                param.copy_(torch.randn(param.shape, generator=torch.Generator().manual_seed(1)) * 0.3)
    model_dir = tmp_path / "g3"
    shutil.copytree(gemma3_dir, model_dir)
    source.model.save_pretrained(model_dir)
    out = export_model(model_dir, tmp_path / "g3.F16.gguf", "gguf", outtype="f16")
    reader = gguf.GGUFReader(str(out))
    field = lambda key: reader.get_field(key).contents()  # type: ignore[union-attr]  # noqa: E731
    assert field("general.architecture") == "gemma3" and field("gemma3.attention.sliding_window") == 4
    assert field("gemma3.attention.sliding_window_pattern") == [True, True, True, False]
    assert field("gemma3.rope.freq_base_swa") == 10000.0 and field("gemma3.rope.freq_base") == 1_000_000.0
    server = llama_server(out)
    try:
        for prompt in PROMPTS:
            reference, margins = greedy_reference(source, prompt)
            assert httpx.post(f"{server.base_url}/tokenize", json={"content": prompt, "add_special": True},
                              timeout=60).json()["tokens"] == source.tokenizer(prompt)["input_ids"]  # fmt: skip
            got = httpx.post(f"{server.base_url}/completion", timeout=120, json={
                "prompt": prompt, "n_predict": len(reference), "temperature": 0, "top_k": 1, "ignore_eos": True,
                "return_tokens": True}).json()["tokens"]  # fmt: skip
            assert agree_until_a_near_tie(got, reference, margins), (prompt, got, reference, margins)
    finally:
        server.stop()


@pytest.mark.requires("vllm")
def test_vllm_runs_gemma3_as_transformers_does(gemma3_dir: Path) -> None:
    """vLLM (its own environment, fp32 on this CPU) on the same gemma3 model, its window shorter than the prompts:
    greedy tokens equal transformers' up to the first near tie."""
    import torch

    from posttrain.platform.engines.vllm import find_python, server_env

    source = load_model(gemma3_dir)
    prompts = [source.tokenizer(p)["input_ids"] for p in PROMPTS]
    script = f"""
import json, vllm
llm = vllm.LLM(model={str(gemma3_dir)!r}, dtype="float32", enforce_eager=True, max_model_len=256, kv_cache_memory_bytes=2**26)
outs = llm.generate([{{"prompt_token_ids": p}} for p in {prompts!r}],
                    vllm.SamplingParams(max_tokens=12, temperature=0, ignore_eos=True), use_tqdm=False)
print("RESULT", json.dumps([list(o.outputs[0].token_ids) for o in outs]))
"""
    done = subprocess.run([str(find_python()), "-P", "-c", script], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **server_env(cpu_threads=torch.get_num_threads())})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    for prompt, tokens in zip(PROMPTS, got):
        reference, margins = greedy_reference(source, prompt)
        assert agree_until_a_near_tie(tokens, reference, margins), (prompt, tokens, reference, margins)


@pytest.mark.requires("gemma chunks")
@pytest.mark.requires("llama-server")
def test_gemmas_sentencepiece_vocabulary_exports_as_llama_cpp_tokenizes_it_and_imports_back(tmp_path: Path) -> None:
    """The built-in Gemma's tokenizer (262,144 SentencePiece pieces, spaces as '▁', bytes it cannot spell as <0xNN>,
    runs of spaces as pieces of their own) on a tiny gemma3 model, exported: written as llama.cpp's ``llama``
    tokenizer with scores from its merge order, it tokenises text exactly as the platform's tokenizer does.
    Imported back (posttrain's GGUF import), the model has its own layer pattern (a local layer, then a global one),
    the same tokens and the same logits."""
    import gguf
    from transformers import AutoTokenizer, Gemma3ForCausalLM, Gemma3TextConfig

    joined = BUILTIN_MODELS["gemma3-270m"].locate()
    tokenizer = AutoTokenizer.from_pretrained(str(joined.parent), gguf_file=joined.name)
    # given Gemma's template, its replies end at <end_of_turn> as well as at the <eos> that ends a document
    tokenizer.chat_template = GEMMA_TEMPLATE
    assert (
        reply_end_ids(tokenizer, tokenizer.eos_token_id)
        == [1, tokenizer.convert_tokens_to_ids("<end_of_turn>")]
        == [1, 106]
    )
    tokenizer.chat_template = None
    config = Gemma3TextConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
                              layer_types=["sliding_attention", "full_attention"], max_position_embeddings=512)  # fmt: skip
    path = tmp_path / "g3-spm"
    torch.manual_seed(0)
    Gemma3ForCausalLM(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    out = export_model(path, tmp_path / "g3-spm.gguf", "gguf", outtype="f16")
    reader = gguf.GGUFReader(str(out))
    assert reader.get_field("tokenizer.ggml.model").contents() == "llama"  # type: ignore[union-attr]
    assert reader.get_field("tokenizer.ggml.add_space_prefix").contents() is False  # type: ignore[union-attr]
    types = reader.get_field("tokenizer.ggml.token_type").contents()  # type: ignore[union-attr]
    assert sum(t == gguf.TokenType.BYTE for t in types) == 256
    texts = ["Hello  world\n\n x", "Question: What is 37 + 45?\nAnswer:", "def fib(n):\n    if n < 2:\n        return n\n",
             "ünïcødé  \t tabs   and    spaces 1234567 ₹€ 日本語のテキスト 🦙🧪", "<start_of_turn>user\nhi<end_of_turn>\n",
             "   leading spaces, trailing ones   "]  # fmt: skip
    server = llama_server(out)
    try:
        for text in texts:
            got = httpx.post(
                f"{server.base_url}/tokenize",
                timeout=60,
                json={"content": text, "add_special": True, "parse_special": True},
            ).json()["tokens"]
            assert got == tokenizer.encode(text), (text, got, tokenizer.encode(text))
    finally:
        server.stop()

    url = f"sqlite:///{tmp_path / 'models.db'}"
    migrate.upgrade(url)
    source = load_model(path)
    back = load_model(import_model(OPERATOR, out, name="g3-back", url=url, dest_root=tmp_path / "models").path)
    assert back.model.config.layer_types == ["sliding_attention", "full_attention"]
    assert [back.tokenizer.encode(t) for t in texts] == [tokenizer.encode(t) for t in texts]
    ids = tokenizer(" ".join(texts), return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        torch.testing.assert_close(back.model(ids).logits, source.model(ids).logits, atol=5e-3, rtol=1e-3)
