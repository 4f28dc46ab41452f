"""Loading a policy and scoring tokens with it: the seams every trainer shares.

``load_policy`` takes any Hugging Face model directory (or an already loaded
``(model, tokenizer)`` pair); ``token_logprobs`` gives the log-probability of each
next token, the quantity both SFT and GRPO are built on.
"""

from __future__ import annotations

import contextlib
import copy
import resource
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from posttrain.platform.engines.chat_template import COMPLETION, reply_end_ids, resolve_template
from posttrain.platform.engines.loader import load_tokenizer  # the tokenizer loader serving uses too

Policy = tuple[PreTrainedModel, PreTrainedTokenizerBase]
PolicySource = str | Path | tuple[Any, Any]


def load_policy(
    source: PolicySource,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    chat_template: str | None = None,
) -> Policy:
    """A causal LM and its tokenizer from a model directory, or a given pair (moved to ``device``), the tokenizer
    rendering prompts and answers the way training and evaluation put them to the model: in ``chat_template`` (a
    family, ``completion`` for the plain completion format, or a Jinja template; :func:`resolve_template`) instead
    of its own; else in its own chat template; a base model (none) in the plain completion format
    (:data:`~posttrain.platform.engines.chat_template.COMPLETION_TEMPLATE`), as TRL trains non-conversational data."""
    if isinstance(source, tuple):
        model, tokenizer = source
    else:
        path = Path(source)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"{path} is not a model directory (no config.json); pass a Hugging Face model directory"
            )
        tokenizer = load_tokenizer(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    if tokenizer.pad_token_id is None:
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has neither a pad token nor an eos token; set one of them")
        tokenizer.pad_token = tokenizer.eos_token

    if chat_template is None and getattr(tokenizer, "chat_template", None) is None:
        chat_template = COMPLETION  # a base model
    if chat_template is not None:
        tokenizer.chat_template = resolve_template(chat_template)
        # the template's end of turn ends replies too, in every model saved from this one (its generation config)
        model.generation_config.eos_token_id = reply_end_ids(tokenizer, model.generation_config.eos_token_id)
    return model.to(device), tokenizer


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def autocast(device: torch.device, bf16: bool | None) -> contextlib.AbstractContextManager[Any]:
    """bf16 autocast when asked (``None``: only on a GPU that supports it); fp32 otherwise."""
    if bf16 is None:
        bf16 = device.type == "cuda" and torch.cuda.is_bf16_supported()
    if not bf16:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def token_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    position_ids: torch.Tensor | None = None,
    temperature: float = 1.0,
) -> torch.Tensor:
    """``out[b, t] = log p(input_ids[b, t + 1] | input_ids[b, : t + 1])``, shape ``(B, T - 1)``, fp32."""
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
    ).logits
    logits = logits[:, :-1].float()
    if temperature != 1.0:
        logits = logits / temperature
    targets = input_ids[:, 1:]
    return torch.gather(F.log_softmax(logits, dim=-1), 2, targets.unsqueeze(-1)).squeeze(-1)


def peak_rss_bytes() -> int:
    """This process's peak resident set size (Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def snapshot_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A detached CPU copy of the weights (what the rollout workers load after each update)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """An eval-mode copy with no gradients (a reference model or a rollout snapshot)."""
    clone = copy.deepcopy(model)
    clone.eval()
    for p in clone.parameters():
        p.requires_grad_(False)
    return clone


@contextlib.contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[None]:
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
