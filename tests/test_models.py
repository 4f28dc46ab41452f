"""Locally built model directories load through the same code as real checkpoints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image
from transformers import AutoModelForCausalLM, AutoTokenizer

from posttrain.platform.engines import ModelDirError, inspect_model_dir, load_model
from posttrain.platform.models import TinyModelSpec, TinyVisionModelSpec, build_tiny_model, build_tiny_vision_model

SMALL = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128)
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@pytest.fixture(scope="module")
def text_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("m") / "tiny", TinyModelSpec(**SMALL))


@pytest.mark.parametrize("arch,cls", [("qwen2", "Qwen2ForCausalLM"), ("llama", "LlamaForCausalLM")])
def test_text_model_builds_and_loads_with_auto_classes(tmp_path: Path, arch: str, cls: str) -> None:
    path = build_tiny_model(tmp_path / arch, TinyModelSpec(architecture=arch, **SMALL))
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in path.iterdir()}
    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert type(model).__name__ == cls
    assert model.config.num_hidden_layers == 2 and model.config.vocab_size == len(tok)
    ids = tok("The invoice total is 42.", return_tensors="pt")["input_ids"]
    out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape == (1, ids.shape[1] + 4)


def test_build_is_deterministic_and_refuses_to_overwrite(tmp_path: Path) -> None:
    a = load_model(build_tiny_model(tmp_path / "a", TinyModelSpec(**SMALL)))
    b = load_model(build_tiny_model(tmp_path / "b", TinyModelSpec(**SMALL)))
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        assert torch.equal(pa, pb)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        build_tiny_model(tmp_path / "a", TinyModelSpec(**SMALL))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary leftovers


def test_tokenizer_round_trips_any_text(text_dir: Path) -> None:
    tok = load_model(text_dir).tokenizer
    for text in ["Paris 2026-03-14: total 4520.", "ünïcødé ✓ 東京", '{"a": [1, 2]}\n\ttabs']:
        assert tok.decode(tok(text)["input_ids"]) == text


def test_chat_template_renders_tools_calls_and_results(text_dir: Path) -> None:
    tok = load_model(text_dir).tokenizer
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "21 C"},
    ]
    text = tok.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\nYou are a helpful assistant.\n\n# Tools")
    assert json.dumps(TOOLS[0]) in text
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>' in text
    assert "<|im_start|>user\n<tool_response>\n21 C\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")
    plain = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert plain == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )
    # tool-call markers are single tokens that survive skip_special_tokens
    ids = tok("<tool_call>x</tool_call>", add_special_tokens=False)["input_ids"]
    assert tok.convert_ids_to_tokens(ids)[0] == "<tool_call>"
    assert tok.decode(ids, skip_special_tokens=True) == "<tool_call>x</tool_call>"


def test_vision_model_answers_about_an_image(tmp_path: Path) -> None:
    path = build_tiny_vision_model(tmp_path / "vl", TinyVisionModelSpec())
    info = inspect_model_dir(path)
    assert info.is_vision and info.model_type == "qwen2_vl" and info.has_chat_template
    loaded = load_model(path)
    assert type(loaded.model).__name__ == "Qwen2VLForConditionalGeneration"
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What colour?"}]}]
    text = loaded.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert "<|vision_start|><|image_pad|><|vision_end|>What colour?" in text
    inputs = loaded.processor(text=[text], images=[Image.new("RGB", (100, 80), (200, 10, 10))], return_tensors="pt")
    image_token = loaded.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    n_visual = int((inputs["input_ids"] == image_token).sum())
    grid = inputs["image_grid_thw"][0]
    assert n_visual == int(grid.prod()) // 4 > 1  # the processor expanded the image into merged patches
    out = loaded.model.generate(**inputs, max_new_tokens=3, do_sample=False)
    assert out.shape[1] == inputs["input_ids"].shape[1] + 3


def test_inspect_rejects_what_is_not_a_model(tmp_path: Path) -> None:
    with pytest.raises(ModelDirError, match="does not exist"):
        inspect_model_dir(tmp_path / "missing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelDirError, match="no config.json"):
        inspect_model_dir(tmp_path / "empty")


def test_spec_validation_names_the_problem() -> None:
    with pytest.raises(ValueError, match="divisible by num_heads"):
        TinyModelSpec(hidden_size=100, num_heads=3)


# Gemma 3's own chat template (google/gemma-3-*-it, text part): the peer the platform's Gemma template must
# render exactly for conversations without tools.
GEMMA3_OFFICIAL = (
    "{{ bos_token }}{%- if messages[0]['role'] == 'system' -%}{%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}"
    '{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set first_user_prefix = "" -%}{%- set loop_messages = messages -%}'
    "{%- endif -%}{%- for message in loop_messages -%}{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    '{{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}{%- endif -%}'
    "{%- if (message['role'] == 'assistant') -%}{%- set role = \"model\" -%}{%- else -%}{%- set role = message['role'] -%}"
    "{%- endif -%}{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}"
    "{{ message['content'] | trim }}{{ '<end_of_turn>\n' }}{%- endfor -%}{%- if add_generation_prompt -%}"
    "{{'<start_of_turn>model\n'}}{%- endif -%}"
)


def test_gemma_template_renders_gemma_turns_and_the_tool_format(text_dir: Path) -> None:
    """The platform's Gemma template writes Gemma 3's turns exactly (the peer: Gemma's own template) and, with
    tools, the same Hermes tool format as ChatML inside them, which the platform's parser reads back; a Gemma
    template without tools gets that format from ``with_tool_support``, a tool-less chat still renders as before."""
    from posttrain.platform.engines.chat_template import (
        GEMMA_TEMPLATE,
        model_family,
        template_family,
        with_tool_support,
    )
    from posttrain.platform.serving.tool_parser import parse_tool_calls

    tok = load_model(text_dir).tokenizer
    chats = [
        [{"role": "user", "content": "hi "}],
        [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": " hello"},
            {"role": "user", "content": "again"},
        ],
    ]
    for chat in chats:
        for gen in (True, False):
            ours = tok.apply_chat_template(
                chat, chat_template=GEMMA_TEMPLATE, add_generation_prompt=gen, tokenize=False
            )
            assert ours == tok.apply_chat_template(
                chat, chat_template=GEMMA3_OFFICIAL, add_generation_prompt=gen, tokenize=False
            )
    assert ours.startswith(
        (tok.bos_token or "") + "<start_of_turn>user\nBe brief.\n\nhi<end_of_turn>\n<start_of_turn>model\nhello"
    )
    extended = with_tool_support(GEMMA3_OFFICIAL)
    assert template_family(extended) == "gemma" and template_family(GEMMA3_OFFICIAL) == "gemma"
    for chat in chats:  # no tools: the model's own template, unchanged
        assert tok.apply_chat_template(
            chat, chat_template=extended, add_generation_prompt=True, tokenize=False
        ) == tok.apply_chat_template(chat, chat_template=GEMMA3_OFFICIAL, add_generation_prompt=True, tokenize=False)
    messages = [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "21 C"},
    ]
    text = tok.apply_chat_template(
        messages, tools=TOOLS, chat_template=extended, add_generation_prompt=True, tokenize=False
    )
    assert text.startswith((tok.bos_token or "") + "<start_of_turn>user\nUse tools.\n\n# Tools\n")
    assert json.dumps(TOOLS[0]) in text and "Weather in Paris?<end_of_turn>\n" in text
    model_turn = text.split("<start_of_turn>model\n")[1].split("<end_of_turn>")[0]
    content, calls = parse_tool_calls(model_turn)
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert "<start_of_turn>user\n<tool_response>\n21 C\n</tool_response><end_of_turn>\n<start_of_turn>model\n" in text
    assert model_family("gemma3_text") == "gemma" and model_family("llama") == "chatml"
