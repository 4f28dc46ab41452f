"""Supervised fine-tuning on task references or chat JSONL, loss on assistant tokens only.

    result = train_sft(SFTConfig(model="path/to/model", domains=["str.copy.letters"], max_steps=50,
                                 output_dir="runs/sft1"))

Read top to bottom: data -> packed rows -> (resume) -> for each step: micro-batches with
gradient accumulation, loss = summed token NLL / trained tokens of the whole step ->
clip, step, schedule -> metrics -> checkpoint. The data order is a seeded permutation per
epoch, so the step number alone is the data position.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from posttrain.training.checkpoint import checkpoint_due, checkpoint_step, load_latest_checkpoint, save_checkpoint
from posttrain.platform.verifiers.models import TaskSpec
from posttrain.training.config import SFTConfig
from posttrain.training.data import IGNORE, PackedBatch, SFTExample, chat_example, collate, pack, read_chat_jsonl, task_examples
from posttrain.training.modeling import PolicySource, autocast, load_policy, resolve_device, token_logprobs
from posttrain.training.optim import apply_lora, make_lr_scheduler, make_optimizer

MetricsFn = Callable[[int, dict[str, float]], None]
StopFn = Callable[[], bool]


@dataclass
class SFTResult:
    steps: int
    checkpoint: Path | None
    metrics: list[dict[str, float]] = field(default_factory=list)
    model: torch.nn.Module | None = None
    resumed_from: int = 0  # the step of the checkpoint the run continued from (0: a fresh start)


def sft_tasks(config: SFTConfig) -> list[TaskSpec]:
    """The procedural tasks whose references an SFT run trains on (the ``train`` split)."""
    from posttrain.platform.tasks.domains import generate

    return [t for i, domain in enumerate(config.domains)
            for t in generate(domain, config.tasks_per_domain, seed=config.seed * 1000 + i, difficulty=config.difficulty)]  # fmt: skip


def build_examples(config: SFTConfig, tokenizer) -> list[SFTExample]:  # type: ignore[no-untyped-def]
    """Examples from the configured domains' references and the chat JSONL file."""
    examples: list[SFTExample] = task_examples(tokenizer, sft_tasks(config), config.max_seq_len) if config.domains else []
    if config.jsonl_path:
        examples += [chat_example(tokenizer, chat, config.max_seq_len) for chat in read_chat_jsonl(config.jsonl_path)]
    if not examples:
        raise ValueError("no SFT data: set SFTConfig.domains or SFTConfig.jsonl_path")
    return examples


def sft_loss_sum(model: torch.nn.Module, batch: PackedBatch, device: torch.device) -> torch.Tensor:
    """Summed NLL of the labelled tokens (packed rows: positions restart, no cross-example attention)."""
    ids = batch.input_ids.to(device)
    logprobs = token_logprobs(model, ids, None, position_ids=batch.position_ids.to(device))
    mask = (batch.labels[:, 1:] != IGNORE).to(device)
    return -(logprobs * mask).sum()


def _rows_for_step(num_rows: int, step: int, per_step: int, seed: int) -> list[int]:
    out = []
    for i in range(step * per_step, (step + 1) * per_step):
        epoch, index = divmod(i, num_rows)
        order = torch.randperm(num_rows, generator=torch.Generator().manual_seed(seed * 7919 + epoch))
        out.append(int(order[index]))
    return out


def training_rows(config: SFTConfig, examples: Sequence[SFTExample]) -> list[list[SFTExample]]:
    """The rows a run draws its batches from: packed examples, or one example per row."""
    return pack(examples, config.max_seq_len) if config.packing else [[e] for e in examples]


def step_rows(rows: Sequence[list[SFTExample]], step: int, config: SFTConfig) -> list[list[SFTExample]]:
    """The ``micro_batch_size * grad_accum_steps`` rows of global step ``step`` (0-based), in order."""
    per_step = config.micro_batch_size * config.grad_accum_steps
    return [rows[i] for i in _rows_for_step(len(rows), step, per_step, config.seed)]


def step_metrics(loss: float, lr: float, grad_norm: float, tokens: int, elapsed_s: float) -> dict[str, float]:
    """What an SFT step reports (one process or many)."""
    return {
        "train/loss": loss, "train/lr": lr, "train/grad_norm": grad_norm,
        "train/tokens": float(tokens), "train/tokens_per_s": tokens / max(elapsed_s, 1e-9),
    }  # fmt: skip


def train_sft(
    config: SFTConfig,
    policy: PolicySource | None = None,
    examples: Sequence[SFTExample] | None = None,
    *,
    on_metrics: MetricsFn | None = None,
    should_stop: StopFn | None = None,
) -> SFTResult:
    device = resolve_device(config.device)
    torch.manual_seed(config.seed)
    source = policy if policy is not None else config.model
    if source is None:
        raise ValueError("no model: set SFTConfig.model to a model directory or pass a (model, tokenizer) pair")
    model, tokenizer = load_policy(source, device=device)
    if config.lora is not None:
        model = apply_lora(model, config.lora)
    model.train()
    data = list(examples) if examples is not None else build_examples(config, tokenizer)
    rows = training_rows(config, data)
    optimizer = make_optimizer(model, config)
    lr_scheduler = make_lr_scheduler(optimizer, config)

    ckpt_root = Path(config.output_dir) / "checkpoints" if config.output_dir else None
    start = 0
    if ckpt_root is not None and config.resume and (loaded := load_latest_checkpoint(ckpt_root, model, optimizer, lr_scheduler)):
        start = int(loaded[1]["step"])

    per_step = config.micro_batch_size * config.grad_accum_steps
    result = SFTResult(steps=start, checkpoint=None, model=model, resumed_from=start)
    for step in range(start, config.max_steps):
        if should_stop is not None and should_stop():
            break
        t0 = time.perf_counter()
        chosen = step_rows(rows, step, config)
        micro = [chosen[i : i + config.micro_batch_size] for i in range(0, per_step, config.micro_batch_size)]
        batches = [collate(m, tokenizer.pad_token_id) for m in micro]
        total_tokens = sum(int((b.labels[:, 1:] != IGNORE).sum()) for b in batches)
        loss_value = 0.0
        for batch in batches:
            with autocast(device, config.bf16):
                loss = sft_loss_sum(model, batch, device) / max(1, total_tokens)
            loss.backward()
            loss_value += float(loss.detach())
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm or float("inf"))
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        lr_scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        elapsed = time.perf_counter() - t0
        metrics = step_metrics(loss_value, lr, float(grad_norm), total_tokens, elapsed)
        result.metrics.append(metrics)
        result.steps = step + 1
        if on_metrics is not None:
            on_metrics(step + 1, metrics)
        if ckpt_root is not None and checkpoint_due(config, step + 1):
            result.checkpoint = save_checkpoint(
                ckpt_root, step + 1, model, tokenizer, optimizer, lr_scheduler, {"data_position": step + 1}, keep=config.keep_checkpoints
            )
    return result


def continue_sft(
    config: SFTConfig,
    warm_checkpoint: Path,
    extra_steps: int,
    output_dir: Path,
    *,
    on_metrics: MetricsFn | None = None,
    should_stop: StopFn | None = None,
) -> SFTResult:
    """The control arm of a comparison: SFT continued from ``warm_checkpoint`` (model, optimizer,
    scheduler and data position) for ``extra_steps`` more steps, in ``output_dir``. Resumes from
    ``output_dir``'s own checkpoints when it has some."""
    import shutil

    warm_steps = checkpoint_step(warm_checkpoint)
    ckpt_root = Path(output_dir) / "checkpoints"
    if not any(ckpt_root.glob("step_*")):
        ckpt_root.mkdir(parents=True, exist_ok=True)
        shutil.copytree(warm_checkpoint, ckpt_root / Path(warm_checkpoint).name)
    control = config.model_copy(update={"output_dir": str(output_dir), "max_steps": warm_steps + extra_steps, "resume": True,
                                        "register_as": None})  # fmt: skip
    return train_sft(control, on_metrics=on_metrics, should_stop=should_stop)
