"""One GRPO update from verified rollout groups: advantages, micro-batched loss, optimizer step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from posttrain.training.config import GRPOConfig
from posttrain.training.grpo import group_advantages, grpo_loss
from posttrain.training.modeling import autocast, token_logprobs
from posttrain.training.rollout import RolloutGroup, Trajectory


@dataclass(frozen=True)
class CompletionBatch:
    input_ids: torch.Tensor  # (B, P+L) prompt + completion, right-padded
    attention_mask: torch.Tensor
    gather_index: torch.Tensor  # (B, Lmax): index into token_logprobs' time axis of each completion token
    mask: torch.Tensor  # (B, Lmax) 1 on completion tokens
    old_logprobs: torch.Tensor  # (B, Lmax) behaviour log-probs
    advantages: torch.Tensor  # (B,)


def completion_batch(trajectories: Sequence[Trajectory], advantages: Sequence[float], pad_id: int) -> CompletionBatch:
    width = max(len(t.prompt_ids) + len(t.completion_ids) for t in trajectories)
    lmax = max(len(t.completion_ids) for t in trajectories)
    ids, attn, index, mask, old = [], [], [], [], []
    for t in trajectories:
        seq = t.prompt_ids + t.completion_ids
        ids.append(seq + [pad_id] * (width - len(seq)))
        attn.append([1] * len(seq) + [0] * (width - len(seq)))
        n = len(t.completion_ids)
        # token_logprobs[:, k] scores input_ids[:, k + 1]: completion token j sits at P + j
        index.append([len(t.prompt_ids) - 1 + j for j in range(n)] + [0] * (lmax - n))
        mask.append([1.0] * n + [0.0] * (lmax - n))
        old.append(t.behaviour_logprobs + [0.0] * (lmax - n))
    return CompletionBatch(
        torch.tensor(ids), torch.tensor(attn), torch.tensor(index), torch.tensor(mask), torch.tensor(old), torch.tensor(list(advantages))
    )


def completion_logprobs(model: torch.nn.Module, batch: CompletionBatch, device: torch.device, temperature: float) -> torch.Tensor:
    all_lp = token_logprobs(model, batch.input_ids.to(device), batch.attention_mask.to(device), temperature=temperature)
    return torch.gather(all_lp, 1, batch.gather_index.to(device))


def select_groups(groups: Sequence[RolloutGroup], config: GRPOConfig) -> tuple[list[Trajectory], list[float], int]:
    """Trajectories and advantages of groups with reward variance; also the number of zero-variance groups."""
    if not groups:
        return [], [], 0
    rewards = torch.tensor([r for g in groups for r in g.rewards])
    adv, keep = group_advantages(rewards, config.group_size, scale_by_std=config.scale_by_std)
    trajectories = [t for g in groups for t in g.trajectories]
    kept = [(t, float(a)) for t, a, k in zip(trajectories, adv, keep) if k]
    zero_variance = len(groups) - len(kept) // config.group_size
    return [t for t, _ in kept], [a for _, a in kept], zero_variance


def grpo_update(
    model: torch.nn.Module,
    ref_model: torch.nn.Module | None,
    optimizer: torch.optim.Optimizer,
    lr_scheduler: torch.optim.lr_scheduler.LRScheduler,
    trajectories: Sequence[Trajectory],
    advantages: Sequence[float],
    config: GRPOConfig,
    pad_id: int,
    *,
    rank: int = 0,
    world: int = 1,
) -> dict[str, float]:
    """``updates_per_batch`` optimizer steps over the trajectories, each accumulated over micro-batches.

    With ``world > 1`` this is one rank of an FSDP learner (:mod:`posttrain.training.fsdp`): every
    rank gets all trajectories and trains on ``rank, rank + world, ...`` of each mini-batch, with the
    mini-batch's global normaliser, in the same number of passes (a rank short of trajectories runs
    a pass with weight 0, so the collectives match); the loss is scaled by ``world`` because FSDP
    averages the ranks' gradients, so the update is the one-process update. Metrics are reduced
    over the ranks.
    """
    device = next(model.parameters()).device
    model.train()
    n = len(trajectories)
    per_update = -(-n // config.updates_per_batch)
    totals: dict[str, float] = {}
    token_count = 0
    for start in range(0, n, per_update):
        mini = list(range(start, min(n, start + per_update)))
        tokens = sum(len(trajectories[i].completion_ids) for i in mini)
        normalizer = float(tokens) if config.aggregation == "token" else float(len(mini))
        mine = mini[rank::world]
        passes = -(-(-(-len(mini) // world)) // config.micro_batch_size)  # the same on every rank
        for k in range(passes):
            idx = mine[k * config.micro_batch_size : (k + 1) * config.micro_batch_size]
            weight = 1.0 if idx else 0.0  # a pass with nothing of its own: the collectives still run
            idx = idx or mini[:1]
            if world > 1:
                model.set_requires_gradient_sync(k == passes - 1)  # type: ignore[operator]
            batch = completion_batch([trajectories[i] for i in idx], [advantages[i] for i in idx], pad_id)
            with autocast(device, config.bf16):
                logprobs = completion_logprobs(model, batch, device, config.temperature)
                ref = None
                if ref_model is not None and config.kl_coef > 0:
                    with torch.no_grad():
                        ref = completion_logprobs(ref_model, batch, device, config.temperature)
            out = grpo_loss(
                logprobs,
                batch.old_logprobs.to(device),
                batch.advantages.to(device),
                batch.mask.to(device),
                clip_low=config.clip_low,
                clip_high=config.clip_high,
                ref_logprobs=ref,
                kl_coef=config.kl_coef,
                aggregation=config.aggregation,
                normalizer=normalizer,
            )
            (out.loss * (weight * world)).backward()
            if not weight:
                continue
            totals["loss"] = totals.get("loss", 0.0) + float(out.loss.detach())
            for key in ("kl", "ratio_mean", "clip_frac_low", "clip_frac_high"):  # token-weighted means
                totals[key] = totals.get(key, 0.0) + getattr(out.stats, key) * out.stats.tokens
            totals["ratio_max"] = max(totals.get("ratio_max", 0.0), out.stats.ratio_max)
            token_count += out.stats.tokens
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm or float("inf"))
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP: a DTensor
        totals["grad_norm"] = max(totals.get("grad_norm", 0.0), float(grad_norm))
        totals["lr"] = optimizer.param_groups[0]["lr"]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    lr_scheduler.step()
    if world > 1:
        totals, token_count = _reduce_over_ranks(totals, token_count, device)
    updates = -(-n // per_update)
    metrics = {
        "train/loss": totals["loss"] / updates,
        "train/kl": totals["kl"] / max(1, token_count),
        "train/ratio_mean": totals["ratio_mean"] / max(1, token_count),
        "train/ratio_max": totals["ratio_max"],
        "train/clip_frac_low": totals["clip_frac_low"] / max(1, token_count),
        "train/clip_frac_high": totals["clip_frac_high"] / max(1, token_count),
        "train/grad_norm": totals["grad_norm"],
        "train/lr": totals["lr"],
        "train/tokens": float(token_count),
    }
    return metrics


_SUMMED = ("loss", "kl", "ratio_mean", "clip_frac_low", "clip_frac_high")


def _reduce_over_ranks(totals: dict[str, float], token_count: int, device: torch.device) -> tuple[dict[str, float], int]:
    """Sum the ranks' loss and token-weighted statistics, take the largest ratio (the norm and LR are already global)."""
    import torch.distributed as dist

    summed = torch.tensor([totals.get(k, 0.0) for k in _SUMMED] + [float(token_count)], dtype=torch.float64, device=device)
    dist.all_reduce(summed)
    peak = torch.tensor([totals.get("ratio_max", 0.0)], dtype=torch.float64, device=device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    out = dict(totals) | {k: float(v) for k, v in zip(_SUMMED, summed[:-1].tolist())} | {"ratio_max": float(peak)}
    return out, int(summed[-1])
