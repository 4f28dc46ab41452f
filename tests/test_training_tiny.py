"""A tiny character-level chat model built inside the tests (no model hub), and checks of it.

Other training tests import :func:`tiny_policy_dir` from here.
"""

from __future__ import annotations

import string
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from posttrain.training.modeling import load_policy

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHARS = list(string.ascii_letters + string.digits + string.punctuation + " \n")
CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>' + '\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


def char_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(SPECIALS)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        padding_side="left",
    )


def tiny_policy_dir(path: Path, *, hidden: int = 64, layers: int = 2, seed: int = 0) -> Path:
    """Save a random tiny Qwen2 model and its char tokenizer under ``path`` (a HF model directory)."""
    tokenizer = char_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_tiny_model_round_trips_through_auto_classes(tmp_path: Path) -> None:
    path = tiny_policy_dir(tmp_path / "tiny")
    model, tokenizer = load_policy(path)  # AutoModelForCausalLM + the saved tokenizer.json as is
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi 7"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nHi 7<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    # <|im_start|> "user" \n "Hi 7" <|im_end|> \n <|im_start|> "assistant" \n: one token per char, specials whole
    assert len(ids) == 1 + 4 + 1 + 4 + 1 + 1 + 1 + 9 + 1
    assert tokenizer.decode(ids) == text
    out = model(input_ids=torch.tensor([ids]))
    assert out.logits.shape == (1, len(ids), len(tokenizer))
