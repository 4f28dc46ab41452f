"""GRPO math: group-normalised advantages and the clipped policy-gradient loss.

Pure tensor functions, no model, no data: the trainers call them and the tests check
them against numbers worked out by hand.

    adv, keep = group_advantages(rewards, group_size=4)            # (B,), (B,) bool
    out = grpo_loss(logprobs, old_logprobs, adv, mask, clip_low=0.2, clip_high=0.28)
    out.loss.backward(); out.stats.clip_frac_high

Conventions (DAPO / Dr. GRPO):

- advantage ``A_i = (r_i - mean_g) / (std_g + eps)`` with the *population* std of the
  group (``scale_by_std=False``: ``A_i = r_i - mean_g``, Dr. GRPO);
- a group whose rewards all agree has no learning signal: ``keep`` is False for all
  its members and their advantage is 0 (dynamic sampling drops them);
- ratio ``rho_t = exp(logp_t - old_logp_t)``; per-token objective
  ``min(rho_t A, clip(rho_t, 1 - clip_low, 1 + clip_high) A)``;
- KL to a reference policy with the k3 estimator
  ``exp(ref - logp) - (ref - logp) - 1`` (always >= 0), times ``kl_coef``;
- aggregation ``"token"``: sum over all completion tokens / their number (or a given
  normaliser, for gradient accumulation); ``"sequence"``: mean over each completion's
  tokens, then mean over completions (original GRPO).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

Aggregation = Literal["token", "sequence"]


def group_advantages(
    rewards: torch.Tensor,
    group_size: int,
    *,
    scale_by_std: bool = True,
    eps: float = 1e-6,
    min_std: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages of ``rewards`` (shape ``(num_groups * group_size,)``, groups contiguous).

    Returns ``(advantages, keep)``: ``keep[i]`` is False when sample ``i``'s group has
    reward std below ``min_std`` (every sample scored the same).
    """
    if rewards.ndim != 1:
        raise ValueError(f"rewards must be 1-D, got shape {tuple(rewards.shape)}")
    if group_size < 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = rewards.float().view(-1, group_size)
    mean = grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True, unbiased=False)
    centred = grouped - mean
    advantages = centred / (std + eps) if scale_by_std else centred
    keep = (std > min_std).expand_as(grouped)
    advantages = torch.where(keep, advantages, torch.zeros_like(advantages))
    return advantages.reshape(-1), keep.reshape(-1)


@dataclass(frozen=True)
class GRPOStats:
    """Token-averaged diagnostics of one loss computation (plain floats, for metrics)."""

    policy_loss: float
    kl: float
    ratio_mean: float
    ratio_max: float
    clip_frac_low: float
    clip_frac_high: float
    tokens: int


@dataclass(frozen=True)
class GRPOLossOutput:
    loss: torch.Tensor
    stats: GRPOStats


def _aggregate(
    values: torch.Tensor, mask: torch.Tensor, aggregation: Aggregation, normalizer: float | None
) -> torch.Tensor:
    if aggregation == "token":
        denom = normalizer if normalizer is not None else mask.sum().clamp(min=1.0)
        return (values * mask).sum() / denom
    if aggregation == "sequence":
        per_seq = (values * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)
        denom = normalizer if normalizer is not None else float(values.shape[0])
        return per_seq.sum() / denom
    raise ValueError(f"unknown aggregation {aggregation!r}; use 'token' or 'sequence'")


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    aggregation: Aggregation = "token",
    normalizer: float | None = None,
) -> GRPOLossOutput:
    """The GRPO loss for completions of shape ``(B, T)``.

    ``logprobs``: the current policy's log-probs of the sampled tokens (with grad);
    ``old_logprobs``: the behaviour policy's, recorded at generation; ``advantages``: ``(B,)``;
    ``mask``: 1 on completion tokens, 0 on padding. ``normalizer``: the denominator to use
    instead of this batch's own (token count for ``"token"``, completion count for
    ``"sequence"``), so micro-batches of one step sum to the full-batch loss.
    """
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and mask "
            f"{tuple(mask.shape)} must have the same shape"
        )
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages must have shape ({logprobs.shape[0]},), got {tuple(advantages.shape)}")
    if clip_low < 0 or clip_low >= 1 or clip_high < 0:
        raise ValueError(f"need 0 <= clip_low < 1 and clip_high >= 0, got {clip_low}, {clip_high}")
    mask = mask.to(logprobs.dtype)
    adv = advantages.to(logprobs.dtype).unsqueeze(1)
    ratio = torch.exp(logprobs - old_logprobs.detach())
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    policy_loss = _aggregate(per_token, mask, aggregation, normalizer)

    kl_value = torch.zeros((), dtype=logprobs.dtype)
    loss = policy_loss
    if ref_logprobs is not None:
        log_ref_ratio = ref_logprobs.detach() - logprobs
        kl_per_token = torch.exp(log_ref_ratio) - log_ref_ratio - 1.0
        kl_value = _aggregate(kl_per_token, mask, aggregation, normalizer)
        if kl_coef:
            loss = loss + kl_coef * kl_value

    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        low = ((ratio < 1.0 - clip_low) & (adv < 0)).to(mask.dtype) * mask
        high = ((ratio > 1.0 + clip_high) & (adv > 0)).to(mask.dtype) * mask
        real = ratio.masked_select(mask.bool())
        stats = GRPOStats(
            policy_loss=float(policy_loss.detach()),
            kl=float(kl_value.detach()),
            ratio_mean=float((ratio * mask).sum() / n),
            ratio_max=float(real.max()) if real.numel() else 1.0,
            clip_frac_low=float(low.sum() / n),
            clip_frac_high=float(high.sum() / n),
            tokens=int(mask.sum()),
        )
    return GRPOLossOutput(loss=loss, stats=stats)
