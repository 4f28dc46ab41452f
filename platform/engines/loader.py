"""Load any Hugging Face-layout model directory: a locally built one or real weights."""

from __future__ import annotations

import functools
import inspect
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import (
    AutoImageProcessor,
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoProcessor,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from posttrain.platform.engines.chat_template import reply_end_ids
from posttrain.platform.engines.inspect import ModelDirError, ModelInfo, inspect_model_dir


@functools.cache
def _parameters_of(forward: Any) -> frozenset[str]:
    return frozenset(inspect.signature(forward).parameters)


def forward_parameters(model: torch.nn.Module) -> frozenset[str]:
    """The keywords the model class's ``forward`` takes (looked up once per class); a peft model answers for its base."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # type: ignore[operator]
    return _parameters_of(type(base).forward)


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword under which this transformers version's ``forward``/``generate`` take a KV cache
    (``cache`` in newer releases, ``past_key_values`` before)."""
    return "cache" if "cache" in forward_parameters(model) else "past_key_values"


def load_tokenizer(path: str | os.PathLike[str]) -> PreTrainedTokenizerBase:
    """The directory's tokenizer, exactly as saved (the one tokenizer loader serving and training share).

    transformers 5 picks the tokenizer class from the *model* type for some architectures
    (Qwen2: ``Qwen2Tokenizer``, which rebuilds its own pre-tokenizer and merges, so a locally
    trained BPE tokenizer would split text differently); a directory whose
    ``tokenizer_config.json`` declares the generic ``TokenizersBackend`` (what
    ``PreTrainedTokenizerFast(...).save_pretrained`` writes for a locally trained tokenizer)
    is loaded from its ``tokenizer.json`` as is. Anything else goes through AutoTokenizer.
    """
    config_file = Path(path) / "tokenizer_config.json"
    if config_file.is_file():
        declared = json.loads(config_file.read_text()).get("tokenizer_class")
        if declared in ("TokenizersBackend", "PreTrainedTokenizerFast"):
            return PreTrainedTokenizerFast.from_pretrained(str(path))
    return AutoTokenizer.from_pretrained(str(path))


def _image_only_processor(path: str) -> Any:
    """The checkpoint's processor class without its video processor.

    transformers' video processors need torchvision, which a CPU-only torch host
    often cannot install; images do not need it. The class, tokenizer, image
    processor and chat template all still come from the directory.
    """
    config = json.loads((Path(path) / "processor_config.json").read_text())
    name = config.get("processor_class")
    base = getattr(transformers, str(name), None)
    if base is None:
        raise ModelDirError(f"{path}/processor_config.json names processor_class={name!r}, which transformers lacks")

    class ImageOnlyProcessor(base):  # type: ignore[misc, valid-type]
        @classmethod
        def get_attributes(cls) -> list[str]:
            return [a for a in super().get_attributes() if a != "video_processor"]

    ImageOnlyProcessor.__name__ = base.__name__
    template_file = Path(path) / "chat_template.jinja"
    chat_template = template_file.read_text() if template_file.is_file() else None
    return ImageOnlyProcessor(
        image_processor=AutoImageProcessor.from_pretrained(path),
        tokenizer=AutoTokenizer.from_pretrained(path),
        chat_template=chat_template,
    )


def load_processor(path: str | os.PathLike[str]) -> Any:
    """AutoProcessor.from_pretrained, falling back to an image-only processor when torchvision is missing."""
    try:
        return AutoProcessor.from_pretrained(str(path))
    except ImportError as exc:
        if "torchvision" not in str(exc).lower():
            raise
        return _image_only_processor(str(path))


@dataclass
class LoadedModel:
    """A model ready to run: weights, tokenizer, and the processor for vision-language models."""

    info: ModelInfo
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    processor: Any | None = None

    @property
    def eos_token_ids(self) -> list[int]:
        """Where a reply ends (:func:`~posttrain.platform.engines.chat_template.reply_end_ids`)."""
        return reply_end_ids(self.tokenizer, self.model.generation_config.eos_token_id)


def load_model(path: str | os.PathLike[str], *, dtype: torch.dtype = torch.float32, device: str = "cpu") -> LoadedModel:
    """Load a directory with AutoTokenizer / AutoModelForCausalLM (or AutoProcessor and the
    image-text-to-text model class for vision-language models)."""
    info = inspect_model_dir(path)
    if info.is_vision:
        processor = load_processor(info.path)
        tokenizer = processor.tokenizer
        model = AutoModelForImageTextToText.from_pretrained(info.path, dtype=dtype)
    else:
        processor = None
        tokenizer = load_tokenizer(info.path)
        model = AutoModelForCausalLM.from_pretrained(info.path, dtype=dtype)
    tokenizer.padding_side = "left"
    # transformers wraps ``to`` with functools.wraps, whose stub takes the device for ``self``
    model.to(device).eval()  # type: ignore[arg-type]
    return LoadedModel(info=info, model=model, tokenizer=tokenizer, processor=processor)
