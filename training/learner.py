"""The learner: the model being trained, its optimizer, LR schedule and checkpoints, and the two updates.

    ctx = local_context(config)                     # world 1; under torchrun: sharding.process_group(config)
    learner = Learner(config, ctx)                  # resumes from the latest checkpoint in output_dir
    metrics = learner.sft_step(rows)                # one optimizer step over a step's SFT rows
    metrics = learner.grpo_update(trajectories, advantages)
    path = learner.save(step, {"data_position": step})

With ``ctx.world > 1`` the same learner is one rank of an FSDP job: the model is loaded on the CPU,
resumed, then sharded (:mod:`posttrain.training.fsdp`); every rank takes its share of a step's rows
or trajectories, with the step's global normaliser and the same number of passes (a rank short of
work runs a pass with weight 0, so the collectives match), and the loss is scaled by ``world``
because FSDP averages the ranks' gradients: the update is the one-process update. The loops
(:mod:`~posttrain.training.sft`, :mod:`~posttrain.training.loop`) are the same on every rank.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule
from transformers import DynamicCache

from posttrain.platform import metric_names as names
from posttrain.platform.engines.loader import cache_keyword
from posttrain.training import sharding
from posttrain.training.checkpoint import latest_checkpoint, load_latest_checkpoint, save_checkpoint
from posttrain.training.config import GRPOConfig, SFTConfig, TrainConfig
from posttrain.training.data import IGNORE, PackedBatch, SFTExample, collate
from posttrain.training.grpo import group_advantages, grpo_loss
from posttrain.training.modeling import PolicySource, autocast, frozen_copy, load_policy
from posttrain.training.optim import apply_lora, make_lr_scheduler, make_optimizer
from posttrain.training.rollout import RolloutGroup, Trajectory
from posttrain.training.sharding import DistContext


# --- the losses ---------------------------------------------------------------------------
@dataclass(frozen=True)
class CompletionBatch:
    input_ids: torch.Tensor  # (B, P+L) prompt + completion, right-padded
    attention_mask: torch.Tensor
    gather_index: torch.Tensor  # (B, Lmax): the position whose output scores each completion token
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
        # the output at position k scores input_ids[:, k + 1]: completion token j sits at P + j
        index.append([len(t.prompt_ids) - 1 + j for j in range(n)] + [0] * (lmax - n))
        mask.append([float(m) for m in (t.loss_mask or [1] * n)] + [0.0] * (lmax - n))
        old.append(t.behaviour_logprobs + [0.0] * (lmax - n))
    return CompletionBatch(
        torch.tensor(ids),
        torch.tensor(attn),
        torch.tensor(index),
        torch.tensor(mask),
        torch.tensor(old),
        torch.tensor(list(advantages)),
    )


def scored_logprobs(
    model: torch.nn.Module,
    ids: torch.Tensor,
    targets: torch.Tensor,
    keep: torch.Tensor,
    *,
    temperature: float = 1.0,
    **inputs: Any,
) -> torch.Tensor:
    """``out[b, t] = log p(targets[b, t])`` from the model's output at input position ``t``, at the positions
    ``keep`` marks, 0 elsewhere; shape ``ids.shape``, fp32. ``inputs``: the model's other inputs
    (``attention_mask``, ``position_ids``, a KV cache).

    The output head runs at the kept positions only when the model's body and head are at hand (a plain
    Hugging Face causal LM, not sharded or wrapped): the head is a large share of a small model's compute,
    and its fp32 logits (positions x vocabulary, three copies kept for the backward pass) are most of a
    long episode's memory, whose tool outputs and padding are never scored. Either way, the same values."""
    keep = keep.bool()
    body = getattr(model, getattr(model, "base_model_prefix", ""), None)
    head = model.get_output_embeddings()  # type: ignore[operator]
    if body is None or body is model or head is None or hasattr(model, "peft_config") or _is_sharded(model):
        logits = model(input_ids=ids, **inputs).logits[keep].float()
    else:
        logits = head(body(input_ids=ids, **inputs).last_hidden_state[keep]).float()
    if temperature != 1.0:
        logits = logits / temperature
    out = torch.zeros(ids.shape, dtype=logits.dtype, device=logits.device)
    out[keep] = -F.cross_entropy(logits, targets[keep], reduction="none")
    return out


def completion_logprobs(
    model: torch.nn.Module, batch: CompletionBatch, device: torch.device, temperature: float
) -> torch.Tensor:
    """The log-probs of the batch's completion tokens under ``model``, shape ``(B, longest completion)``, at the
    tokens ``batch.mask`` scores (0 elsewhere)."""
    ids = batch.input_ids.to(device)
    index, mask = batch.gather_index.to(device), batch.mask.to(device) > 0
    keep = (
        torch.zeros(ids.shape, dtype=torch.int32, device=device).scatter_add_(1, index, mask.int()) > 0
    )  # positions scored
    targets = torch.cat([ids[:, 1:], ids[:, -1:]], dim=1)  # the output at position t predicts input t + 1
    scored = scored_logprobs(
        model,
        ids,
        targets,
        keep,
        temperature=temperature,
        attention_mask=batch.attention_mask.to(device),
        use_cache=False,
    )
    return torch.gather(scored, 1, index) * mask


@contextlib.contextmanager
def checkpointed_layers(model: torch.nn.Module, **flags: bool) -> Iterator[None]:
    """``flags`` set on every layer of ``model`` that activation checkpointing runs (``gradient_checkpointing=False``:
    run as is; ``_can_checkpoint_with_cache=True``: keep the KV cache it is given), put back after."""
    layers = [
        m
        for m in model.modules()
        if getattr(m, "gradient_checkpointing", False) and hasattr(type(m), "_can_checkpoint_with_cache")
    ]
    saved = [{k: m.__dict__[k] for k in flags if k in m.__dict__} for m in layers]
    for layer in layers:
        for key, value in flags.items():
            setattr(layer, key, value)
    try:
        yield
    finally:
        for layer, kept in zip(layers, saved):
            for key in flags:
                layer.__dict__.pop(key, None)  # the class's value again, or the instance's own
            layer.__dict__.update(kept)


def read_only(cache: DynamicCache) -> DynamicCache:
    """``cache`` answering every update with the states it would hold (the prefix's and the new ones) while keeping
    only the prefix: a layer that reads it may be checkpointed, the backward's recompute seeing what the forward saw."""
    update = cache.update

    def answer(key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any) -> Any:
        layer = cache.layers[layer_idx]
        kept = dict(vars(layer))
        try:
            return update(key_states, value_states, layer_idx, *args, **kwargs)
        finally:
            vars(layer).clear()
            vars(layer).update(kept)

    cache.update = answer  # type: ignore[method-assign]
    return cache


def shared_prompt_logprobs(
    model: torch.nn.Module, trajectories: Sequence[Trajectory], device: torch.device, temperature: float
) -> torch.Tensor:
    """:func:`completion_logprobs` of completions that share one prompt, with the prompt run once
    (:func:`prefix_shared_logprobs`). Column ``j`` scores completion token ``j``; shape ``(len(trajectories), longest
    completion)``. A group's prompt is most of its tokens in GRPO, so the update costs about what its completions do
    (and the output head runs on the policy's tokens only)."""
    prompt = trajectories[0].prompt_ids
    assert all(t.prompt_ids == prompt for t in trajectories), "shared_prompt_logprobs takes completions of one prompt"
    # the last prompt token and every completion token but the last are the inputs whose outputs score the completion
    return prefix_shared_logprobs(
        model,
        prompt,
        [[prompt[-1], *t.completion_ids[:-1]] for t in trajectories],
        [t.completion_ids for t in trajectories],
        [[bool(m) for m in (t.loss_mask or [1] * len(t.completion_ids))] for t in trajectories],
        device,
        temperature,
    )


def prefix_shared_logprobs(
    model: torch.nn.Module,
    prefix: Sequence[int],
    inputs: Sequence[Sequence[int]],
    targets: Sequence[Sequence[int]],
    keep: Sequence[Sequence[bool]],
    device: torch.device,
    temperature: float = 1.0,
) -> torch.Tensor:
    """:func:`scored_logprobs` of rows that all begin with ``prefix``, the prefix run once: ``inputs[i]`` is row
    ``i`` from the prefix's last token on, ``targets[i][j]`` what its output at ``inputs[i][j]`` is scored against
    where ``keep[i][j]``. The prefix's KV cache (all but its last token) is computed for one row and repeated for
    every row, with its graph, so the gradient still flows through it. Shape ``(len(inputs), longest input)``.

    Under activation checkpointing the prefix's one row runs as is (its activations kept: one row, not every row's)
    and the rows' layers are checkpointed reading the repeated cache, which no layer writes to."""
    rows, lmax, start = len(inputs), max(len(r) for r in inputs), len(prefix) - 1
    ids = torch.tensor([[*r] + [prefix[-1]] * (lmax - len(r)) for r in inputs], device=device)
    valid = torch.tensor([[1] * len(r) + [0] * (lmax - len(r)) for r in inputs], device=device)
    scored = torch.tensor([[*k] + [False] * (lmax - len(k)) for k in keep], device=device)
    extra: dict[str, Any] = {}
    checkpointed: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if start > 0:
        key = cache_keyword(model)
        cache = DynamicCache(config=model.config)  # type: ignore[arg-type]
        with checkpointed_layers(model, gradient_checkpointing=False):
            model(input_ids=torch.tensor([list(prefix[:-1])], device=device), use_cache=True, **{key: cache})
        cache.batch_repeat_interleave(rows)
        extra = {key: read_only(cache)}
        checkpointed = checkpointed_layers(model, _can_checkpoint_with_cache=True)
    attention = torch.cat([torch.ones(rows, start, dtype=valid.dtype, device=device), valid], dim=1)
    positions = torch.arange(start, start + lmax, device=device).expand(rows, lmax)
    wanted = torch.tensor([[*t] + [0] * (lmax - len(t)) for t in targets], device=device)
    with checkpointed:
        return scored_logprobs(
            model,
            ids,
            wanted,
            scored,
            temperature=temperature,
            attention_mask=attention,
            position_ids=positions,
            use_cache=bool(extra),
            **extra,
        )


def prompt_passes(indices: Sequence[int], trajectories: Sequence[Trajectory], micro_batch_size: int) -> list[list[int]]:
    """``indices`` in passes of at most ``micro_batch_size`` whose trajectories share their prompt (a GRPO
    group's completions), in first-seen order."""
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i in indices:
        by_prompt.setdefault(tuple(trajectories[i].prompt_ids), []).append(i)
    return [
        rows[k : k + micro_batch_size] for rows in by_prompt.values() for k in range(0, len(rows), micro_batch_size)
    ]


def select_groups(groups: Sequence[RolloutGroup], config: GRPOConfig) -> tuple[list[Trajectory], list[float], int]:
    """Trajectories and advantages of groups with reward variance; also the number of zero-variance groups."""
    if not groups:
        return [], [], 0
    rewards = torch.tensor([r for g in groups for r in g.rewards])
    adv, keep = group_advantages(rewards, config.algorithm.group_size, scale_by_std=config.algorithm.scale_by_std)
    trajectories = [t for g in groups for t in g.trajectories]
    every = not config.algorithm.skip_zero_signal  # measuring the saving: zero-signal groups at advantage 0
    kept = [(t, float(a) if k else 0.0) for t, a, k in zip(trajectories, adv, keep) if k or every]
    zero_variance = len(groups) - int(sum(bool(k) for k in keep)) // config.algorithm.group_size
    return [t for t, _ in kept], [a for _, a in kept], zero_variance


def sft_loss_sum(model: torch.nn.Module, batch: PackedBatch, device: torch.device) -> torch.Tensor:
    """Summed NLL of the labelled tokens (packed rows: positions restart, no cross-example attention)."""
    ids, positions = batch.input_ids.to(device), batch.position_ids.to(device)
    targets = torch.cat([batch.labels[:, 1:], torch.full_like(batch.labels[:, -1:], IGNORE)], dim=1).to(device)
    keep = targets != IGNORE
    return -scored_logprobs(model, ids, targets.clamp(min=0), keep, position_ids=positions, use_cache=False).sum()


MIN_SHARED_PREFIX = 16  # tokens: below this a pass runs its rows whole


def shared_prefix(examples: Sequence[SFTExample]) -> int:
    """How many leading tokens every example shares, up to the first token any of them is trained on (the shared
    part is never scored) and short of the shortest (each keeps a token of its own)."""
    first = examples[0].input_ids
    length = min(len(e.input_ids) for e in examples) - 1
    for e in examples[1:]:
        length = next((i for i, (a, b) in enumerate(zip(first[:length], e.input_ids)) if a != b), length)
    trained = min(next((i for i, label in enumerate(e.labels) if label != IGNORE), len(e.labels)) for e in examples)
    return max(0, min(length, trained))


def sft_pass_loss(
    model: torch.nn.Module, rows: Sequence[list[SFTExample]], pad: int, device: torch.device
) -> torch.Tensor:
    """:func:`sft_loss_sum` of one pass's rows; rows of one example each that share a prefix of
    ``MIN_SHARED_PREFIX`` tokens or more (a multi-turn demonstration's system prompt and tools) run it once
    (:func:`prefix_shared_logprobs`): the same loss and gradients, the prefix's compute paid once."""
    examples = [row[0] for row in rows if len(row) == 1]
    common = shared_prefix(examples) if len(examples) == len(rows) > 1 else 0
    if common < MIN_SHARED_PREFIX:
        return sft_loss_sum(model, collate(list(rows), pad), device)
    return -prefix_shared_logprobs(
        model,
        examples[0].input_ids[:common],
        [e.input_ids[common - 1 : -1] for e in examples],
        [e.labels[common:] for e in examples],
        [[label != IGNORE for label in e.labels[common:]] for e in examples],
        device,
    ).sum()


def _is_sharded(model: torch.nn.Module) -> bool:
    if not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return False

    return isinstance(model, FSDPModule)


def sft_metrics(loss: float, lr: float, grad_norm: float, tokens: int, elapsed_s: float) -> dict[str, float]:
    """What an SFT step reports."""
    return {
        names.LOSS: loss, names.LR: lr, names.GRAD_NORM: grad_norm,
        names.TRAINED_TOKENS: float(tokens), names.TRAIN_TOKENS_PER_S: tokens / max(elapsed_s, 1e-9),
    }  # fmt: skip


def _passes(items: int, world: int, micro_batch_size: int) -> int:
    """Forward/backward passes per rank for ``items`` rows split over ``world`` ranks: the same on every rank."""
    return math.ceil(math.ceil(items / world) / micro_batch_size)


@dataclass
class TrainResult:
    """What a training run (SFT or GRPO) did: its steps, final checkpoint, per-step metrics and model."""

    steps: int
    checkpoint: Path | None
    metrics: list[dict[str, float]] = field(default_factory=list)
    model: torch.nn.Module | None = None  # None from a multi-process run: the weights are the checkpoint's
    resumed_from: int = 0  # the step of the checkpoint the run continued from (0: a fresh start)


# --- the learner --------------------------------------------------------------------------
class Learner:
    """The trained model (LoRA-wrapped when configured; FSDP-sharded when ``ctx.world > 1``) with its
    tokenizer, optimizer, LR schedule and checkpoints, resumed from the latest checkpoint under
    ``<output_dir>/checkpoints`` when ``config.checkpoint.resume`` and one exists.

    ``reference``: score the starting policy too (the KL reference): under LoRA the model itself with its
    adapters switched off (no second copy of the weights: the base weights never train), else a frozen
    copy taken before any resume. ``policy``: a model directory or ``(model, tokenizer)`` pair instead of
    ``config.model``.
    """

    def __init__(
        self, config: TrainConfig, ctx: DistContext, policy: PolicySource | None = None, *, reference: bool = False
    ) -> None:
        self.config, self.ctx = config, ctx
        source = policy if policy is not None else config.model
        if source is None:
            raise ValueError(
                f"no model: set {type(config).__name__}.model to a model directory or pass a (model, tokenizer) pair"
            )
        torch.manual_seed(config.seed)
        sharded = ctx.world > 1
        model: torch.nn.Module  # a peft model under LoRA
        model, self.tokenizer = load_policy(
            source,
            device="cpu" if sharded else ctx.device,  # shards move to the device
            chat_template=config.chat_template,
        )
        if config.activation_checkpointing:  # off in eval mode: the rollout copy and the reference keep their cache
            model.activation_checkpointing_enable({"use_reentrant": False})
        if config.lora is not None:
            model = apply_lora(model, config.lora)
        model.train()
        self.has_reference = reference
        self.reference = frozen_copy(model) if reference and config.lora is None else None  # LoRA: adapters off
        self.ckpt_root = Path(config.output_dir) / "checkpoints" if config.output_dir else None
        loaded = (
            load_latest_checkpoint(self.ckpt_root, model)
            if self.ckpt_root is not None and config.checkpoint.resume
            else None
        )
        self.start = int(loaded.state["step"]) if loaded else 0  # the step the run continues from
        self.state: dict[str, Any] = loaded.state if loaded else {}  # the checkpoint's state.json
        self._mirror: torch.nn.Module | None = None  # rank 0 of a sharded learner: the unsharded policy rollouts use
        self._tied: set[str] = set()
        if sharded:
            sharding.agree_on_start(ctx, self.start, self.ckpt_root)
            self._mirror = frozen_copy(model) if ctx.main else None
            sharding.shard(model, ctx)
            if self.reference is not None:
                sharding.shard(self.reference, ctx)
            self._tied = sharding.aliases(model)
        self.model = model
        self.optimizer = make_optimizer(model, config)
        self.lr_scheduler = make_lr_scheduler(self.optimizer, config)
        if loaded:
            self._restore_optimizer(loaded.trainer)

    def _restore_optimizer(self, trainer: dict[str, Any]) -> None:
        if self.ctx.world > 1:
            sharding.load_optimizer_state(self.model, self.optimizer, trainer["optimizer"])
        else:
            self.optimizer.load_state_dict(trainer["optimizer"])
        if trainer["lr_scheduler"] is not None:
            self.lr_scheduler.load_state_dict(trainer["lr_scheduler"])

    @property
    def device(self) -> torch.device:
        return self.ctx.device

    # --- the updates ----------------------------------------------------------------------
    def _clip_and_step(self) -> tuple[float, float]:
        """Clip the gradient norm (global over the shards), step the optimizer, clear the gradients;
        ``(grad_norm, lr)``."""
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.optim.max_grad_norm or float("inf"))
        norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # FSDP: a DTensor
        lr = self.optimizer.param_groups[0]["lr"]
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(norm), lr

    def _sync_gradients(self, last_pass: bool) -> None:
        if self.ctx.world > 1:
            self.model.set_requires_gradient_sync(last_pass)  # type: ignore[operator]

    def sft_step(self, rows: Sequence[list[SFTExample]]) -> dict[str, float]:
        """One optimizer step over a step's rows, in micro-batches of ``micro_batch_size`` (this rank's
        share: rows ``rank, rank + world, ...``); the loss is the summed token NLL over the step's
        trained tokens (all ranks)."""
        assert isinstance(self.config, SFTConfig)
        started = time.perf_counter()
        rank, world, micro = self.ctx.rank, self.ctx.world, self.config.micro_batch_size
        pad = self.tokenizer.pad_token_id
        total_tokens = int((collate(list(rows), pad).labels[:, 1:] != IGNORE).sum())
        mine = list(rows)[rank::world]
        passes = _passes(len(rows), world, micro)
        loss_value = 0.0
        for k in range(passes):
            part = mine[k * micro : (k + 1) * micro]
            weight = 1.0 if part else 0.0  # a pass with no rows of its own: the collectives still run
            self._sync_gradients(k == passes - 1)
            with autocast(self.device, self.ctx.amp):
                loss = sft_pass_loss(self.model, part or list(rows[:1]), pad, self.device) * (
                    weight / max(1, total_tokens)
                )
            (loss * world).backward()  # FSDP averages the ranks' gradients; the loss is their sum
            loss_value += float(loss.detach())
        loss_value = self.ctx.sum(loss_value)
        grad_norm, lr = self._clip_and_step()
        self.lr_scheduler.step()
        return sft_metrics(loss_value, lr, grad_norm, total_tokens, time.perf_counter() - started)

    def grpo_update(self, trajectories: Sequence[Trajectory], advantages: Sequence[float]) -> dict[str, float]:
        """``updates_per_batch`` optimizer steps over the trajectories, each accumulated over micro-batches
        (this rank's share of each mini-batch, with the mini-batch's global normaliser); metrics are
        reduced over the ranks. Then one LR-schedule step."""
        assert isinstance(self.config, GRPOConfig)
        algo, temperature = self.config.algorithm, self.config.sampling.temperature
        rank, world, device = self.ctx.rank, self.ctx.world, self.device
        self.model.train()
        n = len(trajectories)
        per_update = -(-n // algo.updates_per_batch)
        totals: dict[str, float] = {}
        token_count = 0
        for start in range(0, n, per_update):
            mini = list(range(start, min(n, start + per_update)))
            tokens = sum(len(trajectories[i].completion_ids) for i in mini)
            normalizer = float(tokens) if algo.aggregation == "token" else float(len(mini))
            mine = mini[rank::world]
            shared = world == 1 and algo.shared_prompt  # needs its KV cache whole
            if shared:  # a group's completions in one pass, its prompt run once
                groups = prompt_passes(mini, trajectories, algo.micro_batch_size)
            else:  # every rank runs the same number of passes, whatever its rows' prompts
                groups = [
                    mine[k * algo.micro_batch_size : (k + 1) * algo.micro_batch_size]
                    for k in range(_passes(len(mini), world, algo.micro_batch_size))
                ]
            passes = len(groups)
            for k, idx in enumerate(groups):
                weight = 1.0 if idx else 0.0  # a pass with nothing of its own: the collectives still run
                idx = idx or mini[:1]
                self._sync_gradients(k == passes - 1)
                rows = [trajectories[i] for i in idx]
                batch = completion_batch(rows, [advantages[i] for i in idx], self.tokenizer.pad_token_id)

                def logprobs_of(model: torch.nn.Module) -> torch.Tensor:
                    if shared:
                        return shared_prompt_logprobs(model, rows, device, temperature)
                    return completion_logprobs(model, batch, device, temperature)

                with autocast(device, self.ctx.amp):
                    logprobs = logprobs_of(self.model)
                    ref = None
                    if self.has_reference and algo.kl_coef > 0:
                        with torch.no_grad(), self.reference_policy() as reference:
                            ref = logprobs_of(reference)
                out = grpo_loss(
                    logprobs,
                    batch.old_logprobs.to(device),
                    batch.advantages.to(device),
                    batch.mask.to(device),
                    clip_low=algo.clip_low,
                    clip_high=algo.clip_high,
                    ref_logprobs=ref,
                    kl_coef=algo.kl_coef,
                    aggregation=algo.aggregation,
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
            grad_norm, totals["lr"] = self._clip_and_step()
            totals["grad_norm"] = max(totals.get("grad_norm", 0.0), grad_norm)
        self.lr_scheduler.step()
        if world > 1:
            totals, token_count = _reduce_over_ranks(totals, token_count, device)
        updates = -(-n // per_update)
        return {
            names.LOSS: totals["loss"] / updates,
            names.KL: totals["kl"] / max(1, token_count),
            names.RATIO_MEAN: totals["ratio_mean"] / max(1, token_count),
            names.RATIO_MAX: totals["ratio_max"],
            names.CLIP_FRAC_LOW: totals["clip_frac_low"] / max(1, token_count),
            names.CLIP_FRAC_HIGH: totals["clip_frac_high"] / max(1, token_count),
            names.GRAD_NORM: totals["grad_norm"],
            names.LR: totals["lr"],
            names.TRAINED_TOKENS: float(token_count),
        }

    @contextlib.contextmanager
    def reference_policy(self) -> Iterator[torch.nn.Module]:
        """The starting policy, to score the KL reference with: the frozen copy, or under LoRA the trained model
        with its adapters switched off for the duration (its base weights are the starting policy's)."""
        if self.reference is not None:
            yield self.reference
            return
        if not self.has_reference:
            raise ValueError("this learner keeps no reference policy: create it with reference=True (kl_coef > 0)")
        with self.model.disable_adapter():  # type: ignore[operator]
            yield self.model

    def skip_step(self) -> dict[str, float]:
        """A step with nothing to learn from: the LR schedule still advances with the step count."""
        self.lr_scheduler.step()
        return {}

    # --- weights out ------------------------------------------------------------------------
    def rollout_policy(self) -> torch.nn.Module | None:
        """The unsharded model rollouts sample from: the model itself in one process, rank 0's mirror
        of the shards otherwise (None on the other ranks)."""
        return self.model if self.ctx.world == 1 else self._mirror

    def refresh_rollout_policy(self) -> torch.nn.Module | None:
        """After an update: the rollout policy with the new weights (every rank calls it: with
        ``world > 1`` it gathers the shards into rank 0's mirror)."""
        if self.ctx.world == 1:
            return self.model

        weights = sharding.full_state(self.model)
        if self._mirror is not None:
            self._mirror.load_state_dict(weights)
        return self._mirror

    def save(self, step: int, state: dict[str, Any]) -> Path | None:
        """A checkpoint of step ``step`` with ``state`` in its state.json (every rank calls it; rank 0
        writes, full state dicts gathered from the shards); its path on rank 0, else None. Nothing
        without an output_dir."""
        if self.ckpt_root is None:
            return None
        full: dict[str, Any] = {}
        if self.ctx.world > 1:
            full = sharding.full_states(self.model, self.optimizer, self._tied)
        if not self.ctx.main:
            return None
        return save_checkpoint(
            self.ckpt_root,
            step,
            self.model,
            self.tokenizer,
            self.optimizer,
            self.lr_scheduler,
            state,
            keep=self.config.checkpoint.keep,
            **full,
        )

    def last_checkpoint(self, saved: Path | None) -> Path | None:
        """The run's final checkpoint (``saved``, else the latest on disk); no rank leaves before rank 0 wrote it."""
        self.ctx.barrier()
        if saved is None and self.ckpt_root is not None:
            return latest_checkpoint(self.ckpt_root)
        return saved


_SUMMED = ("loss", "kl", "ratio_mean", "clip_frac_low", "clip_frac_high")


def _reduce_over_ranks(
    totals: dict[str, float], token_count: int, device: torch.device
) -> tuple[dict[str, float], int]:
    """Sum the ranks' loss and token-weighted statistics, take the largest ratio (the norm and LR are already global)."""
    summed = torch.tensor(
        [totals.get(k, 0.0) for k in _SUMMED] + [float(token_count)], dtype=torch.float64, device=device
    )
    dist.all_reduce(summed)
    peak = torch.tensor([totals.get("ratio_max", 0.0)], dtype=torch.float64, device=device)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX)
    out = dict(totals) | {k: float(v) for k, v in zip(_SUMMED, summed[:-1].tolist())} | {"ratio_max": float(peak)}
    return out, int(summed[-1])
