"""Build small Hugging Face model directories from scratch (no model hub).

A text model is a Qwen2- or Llama-architecture causal LM; a vision model is a
Qwen2-VL model with its processor. Both are saved with ``save_pretrained`` and
load through :func:`posttrain.platform.engines.loader.load_model`, the same code
that loads real checkpoints.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedModel,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
)

from posttrain.platform.engines.chat_template import CHAT_TEMPLATE
from posttrain.platform.models.specs import TinyModelSpec, TinyVisionModelSpec
from posttrain.platform.models.tokenizer_factory import EOS_TOKEN, PAD_TOKEN, train_tokenizer


def _generation_config(tokenizer: PreTrainedTokenizerFast) -> GenerationConfig:
    return GenerationConfig(
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS_TOKEN),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN),
        do_sample=False,
    )


def _write_atomically(out_dir: str | os.PathLike[str], overwrite: bool, write: Callable[[Path], None]) -> Path:
    """Write into a temporary sibling directory, then rename: no half-written model stays behind."""
    target = Path(out_dir)
    if target.exists() and any(target.iterdir()):
        if not overwrite:
            raise FileExistsError(f"model directory {target} already exists and is not empty; pass overwrite=True")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        write(tmp)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def build_tiny_model(
    out_dir: str | os.PathLike[str], spec: TinyModelSpec | None = None, *, overwrite: bool = False
) -> Path:
    """Train a tokenizer, initialise a causal LM from ``spec`` and save both to ``out_dir``."""
    spec = spec or TinyModelSpec()
    tokenizer = train_tokenizer(vocab_size=spec.vocab_size, seed=spec.seed)
    common: dict[str, Any] = dict(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|im_start|>"),
        eos_token_id=tokenizer.convert_tokens_to_ids(EOS_TOKEN),
        pad_token_id=tokenizer.convert_tokens_to_ids(PAD_TOKEN),
        tie_word_embeddings=True,
    )
    torch.manual_seed(spec.seed)
    if spec.architecture == "qwen2":
        model: PreTrainedModel = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        model = LlamaForCausalLM(LlamaConfig(**common))
    model.generation_config = _generation_config(tokenizer)

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)

    return _write_atomically(out_dir, overwrite, write)


def build_tiny_vision_model(
    out_dir: str | os.PathLike[str], spec: TinyVisionModelSpec | None = None, *, overwrite: bool = False
) -> Path:
    """Build a Qwen2-VL model with tokenizer, image processor and processor, saved to ``out_dir``."""
    spec = spec or TinyVisionModelSpec()
    tokenizer = train_tokenizer(vocab_size=spec.vocab_size, seed=spec.seed)
    ids = cast(
        dict[str, int],  # one token each: an id, not a list
        {
            name: tokenizer.convert_tokens_to_ids(name)
            for name in ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>", EOS_TOKEN, PAD_TOKEN)
        },
    )
    config = Qwen2VLConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            hidden_size=spec.hidden_size,
            intermediate_size=spec.intermediate_size,
            num_hidden_layers=spec.num_layers,
            num_attention_heads=spec.num_heads,
            num_key_value_heads=spec.num_kv_heads,
            max_position_embeddings=spec.max_position_embeddings,
            rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": spec.mrope_section},
            bos_token_id=tokenizer.convert_tokens_to_ids("<|im_start|>"),
            eos_token_id=ids[EOS_TOKEN],
            pad_token_id=ids[PAD_TOKEN],
        ),
        vision_config=dict(
            depth=spec.vision_depth,
            embed_dim=spec.vision_embed_dim,
            hidden_size=spec.hidden_size,
            num_heads=spec.vision_heads,
            mlp_ratio=2,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
        ),
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    torch.manual_seed(spec.seed)
    model = Qwen2VLForConditionalGeneration(config)
    model.generation_config = _generation_config(tokenizer)
    image_processor = Qwen2VLImageProcessorPil(min_pixels=spec.min_pixels, max_pixels=spec.max_pixels)

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        image_processor.save_pretrained(tmp)
        # Written by hand rather than by Qwen2VLProcessor.save_pretrained: constructing the processor
        # insists on a video-processor class that needs torchvision, which a CPU host may lack.
        # AutoProcessor.from_pretrained reads these files like any Qwen2-VL checkpoint's.
        (tmp / "processor_config.json").write_text(json.dumps({"processor_class": "Qwen2VLProcessor"}, indent=2))
        (tmp / "chat_template.jinja").write_text(CHAT_TEMPLATE)

    return _write_atomically(out_dir, overwrite, write)
