"""Whether an engine samples from the learner's weights: behaviour and learner log-probs of the same tokens.

    check_logprob_mismatch(measure_logprob_mismatch(model, trajectories, pad_id=pad, temperature=1.0))

They should agree up to numerics (fp32 CPU: about 1e-6; bf16 engines: about 1e-2 mean absolute difference);
:func:`measure_logprob_mismatch` and :func:`check_logprob_mismatch` catch an engine that samples from weights other
than the learner's (a weight sync that did not land, a stale prefix cache).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from posttrain.training.config import MismatchTolerance
from posttrain.training.learner import completion_batch, completion_logprobs
from posttrain.training.modeling import autocast, eval_mode
from posttrain.training.rollout import Trajectory


@dataclass(frozen=True)
class LogprobMismatch:
    """How far the behaviour log-probs recorded at sampling are from the learner's for the same tokens.

    With ``d = learner - behaviour`` per completion token: ``mean_abs_diff`` and ``max_abs_diff`` of
    ``|d|`` (slime's ``train_rollout_logprob_abs_diff``), ``kl_k1 = mean(-d)`` and
    ``kl_k3 = mean(exp(d) - d - 1)``, estimates of KL(behaviour || learner) from the sampled tokens
    (verl's ``rollout_corr/kl`` and ``k3_kl``; k3 is never negative), the importance ratio
    ``exp(d)``'s mean, min and max (TRL's ``importance_sampling_ratio``) and the mean absolute
    difference of the probabilities (verl's ``rollout_probs_diff_mean``).
    """

    tokens: int
    mean_abs_diff: float
    max_abs_diff: float
    kl_k1: float
    kl_k3: float
    ratio_mean: float
    ratio_min: float
    ratio_max: float
    prob_abs_diff_mean: float

    def metrics(self, prefix: str = "rollout/logprob_") -> dict[str, float]:
        return {f"{prefix}{name}": float(getattr(self, name)) for name in self.__dataclass_fields__}


_EXP_BOUND = 20.0  # |d| beyond this is clamped before exp (verl's SAFETY_BOUND)


def logprob_mismatch(behaviour: torch.Tensor, learner: torch.Tensor, mask: torch.Tensor) -> LogprobMismatch:
    """The mismatch over the tokens where ``mask`` is 1 (all three tensors: completions x tokens)."""
    keep = mask.bool()
    if not keep.any():
        raise ValueError("logprob_mismatch: the mask selects no tokens")
    b, lp = behaviour.detach().double()[keep], learner.detach().double()[keep]
    d = lp - b
    ratio = torch.exp(d.clamp(-_EXP_BOUND, _EXP_BOUND))
    return LogprobMismatch(
        tokens=int(keep.sum()),
        mean_abs_diff=float(d.abs().mean()),
        max_abs_diff=float(d.abs().max()),
        kl_k1=float((-d).mean()),
        kl_k3=float((ratio - d - 1).mean()),
        ratio_mean=float(ratio.mean()),
        ratio_min=float(ratio.min()),
        ratio_max=float(ratio.max()),
        prob_abs_diff_mean=float((lp.exp() - b.exp()).abs().mean()),
    )


def measure_logprob_mismatch(
    model: torch.nn.Module,
    trajectories: Sequence[Trajectory],
    *,
    pad_id: int,
    temperature: float,
    bf16: bool | None = False,
) -> LogprobMismatch:
    """Recompute the trajectories' completion log-probs with the learner's ``model`` (its own batch
    layout, :func:`~posttrain.training.learner.completion_logprobs`) and compare them with the
    behaviour log-probs recorded at sampling."""
    device = next(model.parameters()).device
    batch = completion_batch(trajectories, [0.0] * len(trajectories), pad_id)
    with eval_mode(model), torch.no_grad(), autocast(device, bf16):
        learner = completion_logprobs(model, batch, device, temperature).float().cpu()
    return logprob_mismatch(batch.old_logprobs, learner, batch.mask)


class LogprobMismatchError(RuntimeError):
    """Behaviour and learner log-probs disagree beyond the tolerance; ``mismatch`` holds the figures."""

    def __init__(self, message: str, mismatch: LogprobMismatch) -> None:
        super().__init__(message)
        self.mismatch = mismatch


def check_logprob_mismatch(mismatch: LogprobMismatch, tolerance: MismatchTolerance | None = None) -> None:
    """Raise :class:`LogprobMismatchError` naming each figure past its tolerance (the defaults when none is given)."""
    tolerance = tolerance or MismatchTolerance()
    limits = {
        "mean_abs_diff": tolerance.mean_abs_diff,
        "kl_k3": tolerance.kl_k3,
        "max_abs_diff": tolerance.max_abs_diff,
    }
    over = [
        f"{name} {getattr(mismatch, name):.4g} > {limit:g}"
        for name, limit in limits.items()
        if limit is not None and getattr(mismatch, name) > limit
    ]
    if not over:
        return
    raise LogprobMismatchError(
        f"behaviour log-probs (recorded at sampling) and the learner's disagree over {mismatch.tokens} tokens: "
        f"{'; '.join(over)} (mean |d| {mismatch.mean_abs_diff:.4g}, max |d| {mismatch.max_abs_diff:.4g}, "
        f"k3 KL {mismatch.kl_k3:.4g}). The rollout engine is not sampling from the learner's weights as the "
        "learner scores them: check that load_weights ran after the last update, that both use the same "
        "temperature and no top_p truncation in the engine's log-probs; if a low-precision engine is expected "
        "to drift this far, raise MismatchTolerance.",
        mismatch,
    )
