"""Optimizer, LR schedule and (optional) LoRA wrapping from a :class:`TrainConfig`."""

from __future__ import annotations

import math
from typing import Literal

import torch

from posttrain.training.config import LoRAConfig, TrainConfig


def apply_lora(model: torch.nn.Module, lora: LoRAConfig) -> torch.nn.Module:
    """Wrap ``model`` with LoRA adapters (needs ``pip install peft``); only adapters train."""
    try:
        from peft import LoraConfig, get_peft_model  # heavy: only for LoRA
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("LoRA needs the 'peft' package: pip install peft") from exc
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, config)


def make_optimizer(model: torch.nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    optim = config.optim
    return torch.optim.AdamW(params, lr=optim.lr, weight_decay=optim.weight_decay, betas=optim.betas)


Schedule = Literal["constant", "linear", "cosine", "wsd"]


def lr_at(
    step: int,
    steps: int,
    lr: float,
    warmup_steps: int,
    schedule: Schedule,
    min_lr_ratio: float = 0.1,
    decay_fraction: float = 0.25,
) -> float:
    """The learning rate of step ``step`` (0-based) of ``steps``: a linear warm-up over ``warmup_steps``, then
    ``constant``; ``linear`` or ``cosine`` decay to ``min_lr_ratio * lr``; or ``wsd`` (warm-up, stable,
    decay): constant, then a cosine decay over the last ``decay_fraction`` of the steps."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    start = max(warmup_steps, int(steps * (1 - decay_fraction))) if schedule == "wsd" else warmup_steps
    if step < start:
        return lr
    progress = min(1.0, (step - start) / max(1, steps - start))
    shape = 1.0 - progress if schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return lr * (min_lr_ratio + (1 - min_lr_ratio) * shape)


def make_lr_scheduler(optimizer: torch.optim.Optimizer, config: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    """The config's schedule (:func:`lr_at`) as a factor on the optimizer's learning rate, one step per update."""
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_at(
            step, config.max_steps, 1.0, config.optim.warmup_steps, config.optim.lr_schedule, config.optim.min_lr_ratio
        ),
    )
