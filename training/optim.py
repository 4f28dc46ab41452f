"""Optimizer, LR schedule and (optional) LoRA wrapping from a :class:`TrainConfig`."""

from __future__ import annotations

import math

import torch

from posttrain.training.config import LoRAConfig, TrainConfig


def apply_lora(model: torch.nn.Module, lora: LoRAConfig) -> torch.nn.Module:
    """Wrap ``model`` with LoRA adapters (needs ``pip install peft``); only adapters train."""
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("LoRA needs the 'peft' package: pip install peft") from exc
    config = LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=lora.target_modules, task_type="CAUSAL_LM")
    return get_peft_model(model, config)


def make_optimizer(model: torch.nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    return torch.optim.AdamW(params, lr=config.lr, weight_decay=config.weight_decay, betas=config.betas)


def make_lr_scheduler(optimizer: torch.optim.Optimizer, config: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    warmup, total, shape = config.warmup_steps, config.max_steps, config.lr_schedule

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if shape == "constant":
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return 1.0 - progress if shape == "linear" else 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
