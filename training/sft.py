"""Supervised fine-tuning on task references or chat JSONL, loss on assistant tokens only.

    result = train_sft(SFTConfig(model="path/to/model", domains=["str.copy.letters"], max_steps=50,
                                 output_dir="runs/sft1"))

Read top to bottom: the learner (model, optimizer, schedule; resumed from the latest
checkpoint) -> data -> packed rows -> for each step: the step's rows -> ``Learner.sft_step``
(micro-batches with gradient accumulation, loss = summed token NLL / trained tokens of the
whole step; clip, step, schedule) -> metrics -> checkpoint. The data order is a seeded
permutation per epoch, so the step number alone is the data position. The same loop runs
on every rank of an FSDP job.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch

from posttrain.platform.verifiers.models import TaskSpec
from posttrain.training.checkpoint import checkpoint_due, checkpoint_step
from posttrain.training.config import SFTConfig
from posttrain.training.data import SFTExample, chat_example, episode_example, pack, read_chat_jsonl, task_examples
from posttrain.training.environments.base import read_episodes
from posttrain.training.learner import DistContext, Learner, TrainResult, local_context
from posttrain.training.modeling import PolicySource

MetricsFn = Callable[[int, dict[str, float]], None]
StopFn = Callable[[], bool]
StartFn = Callable[[int], None]  # called once with the step the run starts from (0, or a resumed checkpoint's)


def sft_tasks(config: SFTConfig) -> list[TaskSpec]:
    """The procedural tasks an SFT run trains on (the ``train`` split): those whose references it learns, and those
    its demonstrations repair."""
    from posttrain.platform.tasks.domains import generate
    from posttrain.platform.tasks.prompt_format import apply_format

    demonstrated: list[TaskSpec] = []
    if config.demonstrations is not None:
        from posttrain.training.demonstrations import demonstration_tasks

        demonstrated = demonstration_tasks(config.demonstrations)
    return apply_format([t for i, domain in enumerate(config.domains)
                         for t in generate(domain, config.tasks_per_domain, seed=config.seed * 1000 + i,
                                           difficulty=config.difficulty_of(domain))], config.prompt_format) + demonstrated


def episode_files(config: SFTConfig, tokenizer) -> list[tuple[Path, float | None]]:  # type: ignore[no-untyped-def]
    """The episode files the run trains on, each with its reward floor: ``episodes_path``, and the
    demonstrations it makes (once) under its output directory."""
    files: list[tuple[Path, float | None]] = []
    if config.episodes_path:
        files.append((Path(config.episodes_path), config.episodes_min_reward))
    if config.demonstrations is not None:
        from posttrain.training.demonstrations import demonstration_file

        if config.output_dir is None:
            raise ValueError("SFT with demonstrations writes them under output_dir: set output_dir")
        files.append((demonstration_file(config.demonstrations, tokenizer, Path(config.output_dir) / "demonstrations.jsonl"), None))
    return files


def build_examples(config: SFTConfig, tokenizer) -> list[SFTExample]:  # type: ignore[no-untyped-def]
    """Examples from the configured domains' references, the chat JSONL file and the episodes file (multi-turn
    episodes token for token, trained on the policy's tokens only, as GRPO's loss covers them)."""
    examples: list[SFTExample] = task_examples(tokenizer, sft_tasks(config), config.max_seq_len) if config.domains else []
    if config.jsonl_path:
        examples += [chat_example(tokenizer, chat, config.max_seq_len) for chat in read_chat_jsonl(config.jsonl_path)]
    for path, min_reward in episode_files(config, tokenizer):
        episodes = read_episodes(path, min_reward=min_reward)
        if not episodes:
            raise ValueError(f"{path} holds no episode with a reward of at least {min_reward}; "
                             "lower episodes_min_reward or make demonstrations first")
        examples += [episode_example(e.prompt_ids, e.token_ids, e.loss_mask, config.max_seq_len) for e in episodes]
    if not examples:
        raise ValueError("no SFT data: set SFTConfig.domains, jsonl_path, episodes_path or demonstrations")
    return examples


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


def train_sft(
    config: SFTConfig,
    policy: PolicySource | None = None,
    examples: Sequence[SFTExample] | None = None,
    *,
    batches: Iterable[Sequence[list[SFTExample]]] | None = None,
    on_metrics: MetricsFn | None = None,
    should_stop: StopFn | None = None,
    on_start: StartFn | None = None,
    ctx: DistContext | None = None,
) -> TrainResult:
    """SFT on ``config``'s data (or ``examples``), in this process or, with ``ctx`` from
    :func:`posttrain.training.fsdp.process_group`, as one rank of an FSDP job (the same loop on every rank).

    ``batches``: a stream of each step's rows instead (fresh data every step; no data position to resume)."""
    learner = Learner(config, ctx or local_context(config), policy)
    if batches is None:
        data = list(examples) if examples is not None else build_examples(config, learner.tokenizer)
        rows = training_rows(config, data)
        batches = (step_rows(rows, step, config) for step in itertools.count(learner.start))
    stream = iter(batches)
    result = TrainResult(steps=learner.start, checkpoint=None, model=learner.model, resumed_from=learner.start)
    if on_start is not None:
        on_start(learner.start)
    for step in range(learner.start, config.max_steps):
        if should_stop is not None and should_stop():
            break
        chosen = next(stream, None)
        if chosen is None:
            raise ValueError(f"the batch stream ended after {step} of {config.max_steps} steps")
        metrics = learner.sft_step(chosen)
        result.metrics.append(metrics)
        result.steps = step + 1
        if on_metrics is not None:
            on_metrics(step + 1, metrics)
        if checkpoint_due(config, step + 1):
            result.checkpoint = learner.save(step + 1, {"data_position": step + 1}) or result.checkpoint
    result.checkpoint = learner.last_checkpoint(result.checkpoint)
    return result


def continue_sft(
    config: SFTConfig,
    warm_checkpoint: Path,
    extra_steps: int,
    output_dir: Path,
    *,
    on_metrics: MetricsFn | None = None,
    should_stop: StopFn | None = None,
) -> TrainResult:
    """The control arm of a comparison: SFT continued from ``warm_checkpoint`` (model, optimizer,
    scheduler and data position) for ``extra_steps`` more steps, in ``output_dir``. Resumes from
    ``output_dir``'s own checkpoints when it has some."""
    import shutil

    warm_steps = checkpoint_step(warm_checkpoint)
    ckpt_root = Path(output_dir) / "checkpoints"
    if not any(ckpt_root.glob("step_*")):
        ckpt_root.mkdir(parents=True, exist_ok=True)
        shutil.copytree(warm_checkpoint, ckpt_root / Path(warm_checkpoint).name)
    control = config.updated(output_dir=str(output_dir), max_steps=warm_steps + extra_steps, resume=True, register_as=None)
    return train_sft(control, on_metrics=on_metrics, should_stop=should_stop)
