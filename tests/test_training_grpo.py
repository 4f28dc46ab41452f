"""GRPO math against numbers worked out by hand (see the comments), not against the code itself."""

from __future__ import annotations

import math

import pytest
import torch

from posttrain.training.grpo import group_advantages, grpo_loss

# Three groups of four: a split group, a zero-variance group, one winner out of four.
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 1.0, 0.0, 0.0, 0.0])


def test_group_advantages_divide_by_population_std_and_drop_zero_variance_group() -> None:
    adv, keep = group_advantages(REWARDS, group_size=4)
    # group 1: mean 0.5, std 0.5 -> +-1;  group 2: all equal -> 0, dropped;
    # group 3: mean 0.25, var (0.75^2 + 3 * 0.25^2) / 4 = 0.1875, std 0.4330 -> 0.75/0.4330 = sqrt(3), -0.25/0.4330 = -1/sqrt(3)
    s3 = math.sqrt(3.0)
    expected = [1, -1, -1, 1, 0, 0, 0, 0, s3, -1 / s3, -1 / s3, -1 / s3]
    assert adv.tolist() == pytest.approx(expected, abs=1e-5)
    assert keep.tolist() == [True] * 4 + [False] * 4 + [True] * 4


def test_dr_grpo_advantages_only_subtract_the_mean() -> None:
    adv, keep = group_advantages(REWARDS, group_size=4, scale_by_std=False)
    expected = [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0, 0.75, -0.25, -0.25, -0.25]
    assert adv.tolist() == pytest.approx(expected, abs=1e-7)
    assert keep.sum().item() == 8


def test_group_advantages_reject_ragged_groups() -> None:
    with pytest.raises(ValueError, match="groups of 4"):
        group_advantages(torch.ones(6), group_size=4)


def _two_sequences() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    # ratios: seq 0 (A=+1): 1.0, 1.5, 0.5;  seq 1 (A=-1): 0.5, 1.1, [pad 3.0]
    ratios = torch.tensor([[1.0, 1.5, 0.5], [0.5, 1.1, 3.0]])
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.7, -1.2, -3.0]])
    logprobs = (old + ratios.log()).requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    return logprobs, old, torch.tensor([1.0, -1.0]), mask


def test_token_level_loss_clips_at_both_bounds() -> None:
    logprobs, old, adv, mask = _two_sequences()
    out = grpo_loss(logprobs, old, adv, mask, clip_low=0.2, clip_high=0.28, aggregation="token")
    # clip range [0.8, 1.28]
    # seq 0, A=+1: min(1,1)=1; min(1.5,1.28)=1.28 (high clip); min(0.5,0.8)=0.5 -> losses -1, -1.28, -0.5
    # seq 1, A=-1: min(-0.5,-0.8)=-0.8 (low clip); min(-1.1,-1.1)=-1.1  -> losses 0.8, 1.1
    # token mean over 5 tokens: (-1 - 1.28 - 0.5 + 0.8 + 1.1) / 5 = -0.176
    assert out.loss.item() == pytest.approx(-0.176, abs=1e-6)
    assert out.stats.clip_frac_high == pytest.approx(0.2)
    assert out.stats.clip_frac_low == pytest.approx(0.2)
    assert out.stats.ratio_mean == pytest.approx((1 + 1.5 + 0.5 + 0.5 + 1.1) / 5, abs=1e-6)
    assert out.stats.tokens == 5
    out.loss.backward()
    # d(-r*A/5)/dlogp = -r*A/5 where not clipped, 0 where clipped or padded
    expected_grad = [[-0.2, 0.0, -0.1], [0.0, 0.22, 0.0]]
    assert logprobs.grad is not None
    assert logprobs.grad.tolist()[0] == pytest.approx(expected_grad[0], abs=1e-6)
    assert logprobs.grad.tolist()[1] == pytest.approx(expected_grad[1], abs=1e-6)


def test_sequence_mean_aggregation() -> None:
    logprobs, old, adv, mask = _two_sequences()
    out = grpo_loss(logprobs, old, adv, mask, clip_low=0.2, clip_high=0.28, aggregation="sequence")
    # seq 0: -2.78 / 3; seq 1: 1.9 / 2; mean of the two
    assert out.loss.item() == pytest.approx((-2.78 / 3 + 1.9 / 2) / 2, abs=1e-6)


def test_explicit_normalizer_splits_a_batch_into_micro_batches() -> None:
    logprobs, old, adv, mask = _two_sequences()
    first = grpo_loss(logprobs[:1], old[:1], adv[:1], mask[:1], normalizer=5.0)
    second = grpo_loss(logprobs[1:], old[1:], adv[1:], mask[1:], normalizer=5.0)
    assert first.loss.item() + second.loss.item() == pytest.approx(-0.176, abs=1e-6)


def test_k3_kl_penalty_is_added_with_its_coefficient() -> None:
    logprobs = torch.zeros(1, 2, requires_grad=True)
    ref = torch.tensor([[math.log(2.0), 0.0]])
    # k3 = e^d - d - 1 with d = ref - logp: token 0 -> 2 - ln 2 - 1 = 0.3068528, token 1 -> 0; mean 0.1534264
    out = grpo_loss(
        logprobs, logprobs.detach().clone(), torch.zeros(1), torch.ones(1, 2), ref_logprobs=ref, kl_coef=0.1
    )
    assert out.stats.kl == pytest.approx(0.1534264, abs=1e-6)
    assert out.loss.item() == pytest.approx(0.01534264, abs=1e-7)
    assert out.stats.ratio_mean == pytest.approx(1.0)


def test_shape_mismatch_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="same shape"):
        grpo_loss(torch.zeros(2, 3), torch.zeros(2, 4), torch.zeros(2), torch.ones(2, 3))
