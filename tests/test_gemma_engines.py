"""The second model family (gemma3: sliding-window attention, QK norms, four norms a layer) on every embedded
tier: a path that does not know the family (the lean decode step, the Q8_0 fused layers) steps aside with a
logged reason, never a wrong answer. On a locally built gemma3 model, whose sliding window is shorter than the
prompts so the window really masks."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import openai
import pytest
import torch

from posttrain.platform.models import TinyModelSpec, build_tiny_model, load_model
from posttrain.platform.serving import DEFAULT_TIERS, EmbeddedEngine, EngineConfig, create_engine_app, serve_in_thread

NEAR_TIE = 0.05  # top-two logit margin under which a quantised tier may pick the other token


@pytest.fixture(scope="module")
def gemma3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Gemma 3 text model (three sliding-window layers of width 4, then a global one) with a local tokenizer."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    root = tmp_path_factory.mktemp("gemma3")
    tokenizer_from = build_tiny_model(root / "tok", TinyModelSpec(hidden_size=64, num_layers=1))
    config = Gemma3TextConfig(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=16, sliding_window=4, max_position_embeddings=512,
                              layer_types=["sliding_attention"] * 3 + ["full_attention"])  # fmt: skip
    torch.manual_seed(0)
    path = root / "g3"
    Gemma3ForCausalLM(config).save_pretrained(path)
    for file in tokenizer_from.iterdir():
        if file.name.startswith("tokenizer") or file.name in ("chat_template.jinja", "special_tokens_map.json"):
            shutil.copy(file, path / file.name)
    return path


def test_every_embedded_tier_serves_gemma3_as_transformers_generates(gemma3_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Greedy completions of prompts longer than the window, two at once (so rows are left-padded): the standard
    and fast (speculating) tiers give exactly transformers' ``generate`` tokens; the q8 tier the same up to the first
    position where the reference's top two logits are within a near tie. The lean decode step says why it is off."""
    from posttrain.platform.serving.generation import LeanDecoder
    from posttrain.platform.serving.q8 import Q8Linear

    loaded = load_model(gemma3_dir)
    assert LeanDecoder.unsupported(loaded.model) == "the lean decode step knows llama and qwen2 layers, not 'gemma3_text'"
    tokenizer = loaded.tokenizer
    prompts = ["the cat sat on the mat and the cat sat on", "one two three four five six seven eight nine ten one two"]
    expected, margins = [], []
    with torch.inference_mode():
        for prompt in prompts:
            ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
            out = loaded.model.generate(ids, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0,
                                        output_scores=True, return_dict_in_generate=True)  # fmt: skip
            expected.append(out.sequences[0, ids.shape[1]:].tolist())
            margins.append([float(s[0].topk(2).values[0] - s[0].topk(2).values[1]) for s in out.scores])
    for tier in ("standard", "fast", "q8"):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="posttrain.platform.serving.generation"):
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
        got = [tokenizer(c.text, add_special_tokens=False)["input_ids"] for c in sorted(out.choices, key=lambda c: c.index)]
        for tokens, reference, margin in zip(got, expected, margins):
            if tier == "q8":
                sure = next((i for i, m in enumerate(margin) if m < NEAR_TIE), len(margin))
                assert tokenizer.decode(reference[:sure]) == tokenizer.decode(tokens)[:len(tokenizer.decode(reference[:sure]))], tier
            else:
                assert tokenizer.decode(tokens) == tokenizer.decode(reference), tier
