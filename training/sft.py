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
import json
import logging
import shutil
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import torch

from posttrain.platform.tasks.domains import generate
from posttrain.platform.tasks.prompt_format import apply_format
from posttrain.platform.verifiers import PoolConfig, VerifierService
from posttrain.platform.verifiers.models import TaskSpec
from posttrain.training.checkpoint import checkpoint_due, checkpoint_step
from posttrain.training.config import SamplingConfig, SelfGeneratedConfig, SFTConfig
from posttrain.training.data import SFTExample, chat_example, episode_example, pack, read_chat_jsonl, task_examples
from posttrain.training.demonstrations import demonstration_file, demonstration_tasks
from posttrain.training.environments import load_environment
from posttrain.training.environments.base import Episode, read_episodes, write_episodes
from posttrain.training.environments.runner import EpisodeRunner
from posttrain.training.inference import EmbeddedRolloutEngine
from posttrain.training.learner import Learner, TrainResult
from posttrain.training.modeling import PolicySource
from posttrain.training.rollout import generate_groups
from posttrain.training.scheduler import replayed_before
from posttrain.training.sharding import DistContext, local_context

MetricsFn = Callable[[int, dict[str, float]], None]
StopFn = Callable[[], bool]
StartFn = Callable[[int], None]  # called once with the step the run starts from (0, or a resumed checkpoint's)
_log = logging.getLogger(__name__)


def sft_tasks(config: SFTConfig) -> list[TaskSpec]:
    """The procedural tasks an SFT run trains on (the ``train`` split): those whose references it learns, and those
    its demonstrations repair."""
    demonstrated: list[TaskSpec] = []
    if config.demonstrations is not None:
        demonstrated = demonstration_tasks(config.demonstrations)
    return procedural_tasks(config) + demonstrated


def procedural_tasks(config: SFTConfig) -> list[TaskSpec]:
    """The ``train``-split tasks of the run's procedural domains, put in its prompt format."""
    return apply_format(
        [
            t
            for i, domain in enumerate(config.domains)
            for t in generate(
                domain, config.tasks_per_domain, seed=config.seed * 1000 + i, difficulty=config.difficulty_of(domain)
            )
        ],
        config.prompt_format,
    )


SELF_GENERATED = "self-generated.jsonl"


def self_generated_file(config: SFTConfig, learner: Learner) -> Path:
    """``<output_dir>/self-generated.jsonl``: the starting model's own answers that pass (:class:`~posttrain.training.config.
    SelfGeneratedConfig`): single answers to the run's procedural tasks, graded by their verifiers, and whole episodes
    of the demonstrated tasks in the demonstrations' environment, graded by its rubric where they ran. Made once by
    rank 0 with the unsharded policy (every rank waits for it), again only when the settings that made it change."""

    wanted = config.self_generated
    assert wanted is not None and config.output_dir is not None
    path = Path(config.output_dir) / SELF_GENERATED
    stamp = path.with_suffix(".config.json")
    made_for = json.dumps(
        {
            "self_generated": wanted.model_dump(mode="json"),
            "domains": config.domains,
            "seed": config.seed,
            "tasks_per_domain": config.tasks_per_domain,
            "difficulty": config.difficulty,
            "difficulties": config.difficulties,
            "model": config.model,
            "demonstrations": config.demonstrations and config.demonstrations.model_dump(mode="json"),
        },
        sort_keys=True,
    )
    policy = learner.rollout_policy()
    if policy is not None and not (path.is_file() and stamp.is_file() and stamp.read_text() == made_for):
        sampling = SamplingConfig(max_new_tokens=wanted.max_new_tokens, temperature=wanted.temperature)
        with VerifierService(PoolConfig(workers=1)) as service:
            tasks, kept = own_answers(config, policy, learner.tokenizer, sampling, service)
            episodes, kept_episodes = own_episodes(config, policy, learner.tokenizer, sampling, service)
        kept += kept_episodes
        others = config.demonstrations or config.jsonl_path or config.episodes_path or wanted.with_references
        if not kept and not others:
            raise ValueError(
                f"the model passed none of its {len(tasks) + len(episodes)} tasks in {wanted.samples} tries "
                "each: there is nothing of its own to train on; raise self_generated.samples, lower the "
                "difficulty, or train on references (self_generated: null)"
            )
        _log.info(
            "self_generated: kept %d passing answers of %d tasks and %d passing episodes of %d tasks (%d tries each)",
            len(kept) - len(kept_episodes),
            len(tasks),
            len(kept_episodes),
            len(episodes),
            wanted.samples,
        )
        write_episodes(path, kept)
        stamp.write_text(made_for)
    learner.ctx.barrier()
    return path


def own_answers(
    config: SFTConfig,
    policy,
    tokenizer,
    sampling: SamplingConfig,
    service,
) -> tuple[list[TaskSpec], list[Episode]]:
    """The run's procedural tasks, and the first ``keep_per_task`` of ``samples`` answers to each that reach
    ``min_reward``, as episodes of the policy's sampled tokens."""
    wanted = config.self_generated
    assert wanted is not None
    tasks, kept = procedural_tasks(config) if config.domains else [], []
    for start in range(0, len(tasks), SELF_GENERATED_BATCH):
        for group in generate_groups(
            policy, tokenizer, tasks[start : start + SELF_GENERATED_BATCH], wanted.samples, sampling
        ):
            verdicts = [service.verify(group.task, t.text) for t in group.trajectories]
            kept += first_passing(
                [
                    (_episode(group.task, t, v), None if v.is_infra_error else v.score)
                    for t, v in zip(group.trajectories, verdicts)
                ],
                wanted,
            )
    return tasks, kept


def own_episodes(
    config: SFTConfig,
    policy,
    tokenizer,
    sampling: SamplingConfig,
    service,
) -> tuple[list[TaskSpec], list[Episode]]:
    """The demonstrated tasks (none without ``demonstrations``), and the first ``keep_per_task`` of ``samples`` episodes
    of each, played by the policy in the demonstrations' environment, whose rubric gave at least ``min_reward``."""
    if config.demonstrations is None:
        return [], []

    wanted = config.self_generated
    assert wanted is not None
    env_config = config.demonstrations.environment
    tasks = demonstration_tasks(config.demonstrations)
    runner = EpisodeRunner(
        load_environment(env_config, tokenizer, sampling),
        EmbeddedRolloutEngine(policy, tokenizer),
        env_config,
        service,
        group_size=wanted.samples,
        seed=config.seed,
    )
    try:
        groups = runner.groups(tasks)
    finally:
        runner.close()
    return tasks, own_successes(groups, wanted)


def own_successes(groups, wanted: SelfGeneratedConfig) -> list[Episode]:
    """Of each group of scored episodes, :func:`first_passing` (an episode left unscored, its sandbox failed, is never
    kept)."""
    return [e for group in groups for e in first_passing([(t.episode, t.reward) for t in group.trajectories], wanted)]


def first_passing(tries: Sequence[tuple[Episode | None, float | None]], wanted: SelfGeneratedConfig) -> list[Episode]:
    """Of one task's tries (each an episode and its reward, None where it was not scored), the first ``keep_per_task``
    whose reward reaches ``min_reward``."""
    passing = [e for e, reward in tries if e is not None and reward is not None and reward >= wanted.min_reward]
    return passing[: wanted.keep_per_task]


SELF_GENERATED_BATCH = 8  # tasks sampled together (each with its samples)


def _episode(task: TaskSpec, trajectory, verdict) -> Episode:
    """A sampled single-turn answer as an episode: the policy's tokens, all of them trained on."""
    episode = Episode(task=task, prompt_ids=list(trajectory.prompt_ids), policy_version=0)
    episode.token_ids, episode.logprobs = list(trajectory.completion_ids), list(trajectory.behaviour_logprobs)
    episode.loss_mask = [1] * len(trajectory.completion_ids)
    episode.answer, episode.verdict, episode.stop_reason = trajectory.text, verdict, "answer"
    return episode


def episode_files(config: SFTConfig, tokenizer) -> list[tuple[Path, float | None]]:
    """The episode files the run trains on, each with its reward floor: ``episodes_path``, the model's own
    answers it keeps (``self_generated``), and the demonstrations it makes (once) under its output directory."""
    files: list[tuple[Path, float | None]] = []
    if config.episodes_path:
        files.append((Path(config.episodes_path), config.episodes_min_reward))
    if config.self_generated is not None and config.output_dir is not None:
        files.append((Path(config.output_dir) / SELF_GENERATED, config.self_generated.min_reward))
    if config.demonstrations is not None:
        if config.output_dir is None:
            raise ValueError("SFT with demonstrations writes them under output_dir: set output_dir")
        files.append(
            (
                demonstration_file(config.demonstrations, tokenizer, Path(config.output_dir) / "demonstrations.jsonl"),
                None,
            )
        )
    return files


def build_examples(config: SFTConfig, tokenizer) -> list[SFTExample]:
    """Examples from the configured domains' references, the chat JSONL file and the episodes file (multi-turn
    episodes token for token, trained on the policy's tokens only, as GRPO's loss covers them)."""
    references = config.domains and (config.self_generated is None or config.self_generated.with_references)
    examples: list[SFTExample] = task_examples(tokenizer, sft_tasks(config), config.max_seq_len) if references else []
    if config.jsonl_path:
        examples += [chat_example(tokenizer, chat, config.max_seq_len) for chat in read_chat_jsonl(config.jsonl_path)]
    for path, min_reward in episode_files(config, tokenizer):
        episodes = read_episodes(path, min_reward=min_reward)
        if not episodes and path.name == SELF_GENERATED:
            continue  # the model passed nothing of its own: the run's other data stands (self_generated_file said so)
        if not episodes:
            raise ValueError(
                f"{path} holds no episode with a reward of at least {min_reward}; "
                "lower episodes_min_reward or make demonstrations first"
            )
        examples += [episode_example(e.prompt_ids, e.token_ids, e.loss_mask, config.max_seq_len) for e in episodes]
    if not examples:
        raise ValueError("no SFT data: set SFTConfig.domains, jsonl_path, episodes_path or demonstrations")
    return examples


def _positions(num_rows: int, start: int, count: int, seed: int) -> list[int]:
    """Rows ``start .. start + count`` of a stream that visits all ``num_rows`` rows in a seeded order per epoch."""
    out = []
    for i in range(start, start + count):
        epoch, index = divmod(i, num_rows)
        order = torch.randperm(num_rows, generator=torch.Generator().manual_seed(seed * 7919 + epoch))
        out.append(int(order[index]))
    return out


def training_rows(config: SFTConfig, examples: Sequence[SFTExample]) -> list[list[SFTExample]]:
    """The rows a run draws its batches from: packed examples, or one example per row."""
    return pack(examples, config.max_seq_len) if config.packing else [[e] for e in examples]


def replay_tasks(config: SFTConfig) -> list[TaskSpec]:
    """The general tasks an SFT run with ``replay`` rehearses: the ``train`` split of the replay domains, put as
    generated (the general check's eval split is never drawn: a prompt's split is the prompt's own)."""
    replay = config.replay
    if replay is None:
        return []
    return [
        t
        for i, domain in enumerate(replay.domains)
        for t in generate(
            domain, replay.tasks_per_domain, seed=replay.seed * 1000 + i, difficulty=replay.difficulty, split="train"
        )
    ]


def step_rows(
    rows: Sequence[list[SFTExample]], step: int, config: SFTConfig, replay_rows: Sequence[list[SFTExample]] = ()
) -> list[list[SFTExample]]:
    """The ``micro_batch_size * grad_accum_steps`` rows of global step ``step`` (0-based), in order: with
    ``replay_rows``, ``replay.share`` of them (exactly, over the steps) from those, the rest from ``rows``."""
    per_step = config.micro_batch_size * config.grad_accum_steps
    if not replay_rows or config.replay is None:
        return [rows[i] for i in _positions(len(rows), step * per_step, per_step, config.seed)]
    before = replayed_before(step, per_step, config.replay.share)
    replays = replayed_before(step + 1, per_step, config.replay.share) - before
    own = [rows[i] for i in _positions(len(rows), step * per_step - before, per_step - replays, config.seed)]
    return own + [replay_rows[i] for i in _positions(len(replay_rows), before, replays, config.seed + 1)]


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
    :func:`posttrain.training.sharding.process_group`, as one rank of an FSDP job (the same loop on every rank).

    ``batches``: a stream of each step's rows instead (fresh data every step; no data position to resume)."""
    learner = Learner(config, ctx or local_context(config), policy)
    if batches is None:
        if examples is None and config.self_generated is not None:
            self_generated_file(config, learner)  # the starting model's own passing answers, made before the first step
        data = list(examples) if examples is not None else build_examples(config, learner.tokenizer)
        rows = training_rows(config, data)
        replay = training_rows(config, task_examples(learner.tokenizer, replay_tasks(config), config.max_seq_len))
        batches = (step_rows(rows, step, config, replay) for step in itertools.count(learner.start))
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
    warm_steps = checkpoint_step(warm_checkpoint)
    ckpt_root = Path(output_dir) / "checkpoints"
    if not any(ckpt_root.glob("step_*")):
        ckpt_root.mkdir(parents=True, exist_ok=True)
        shutil.copytree(warm_checkpoint, ckpt_root / Path(warm_checkpoint).name)
    control = config.updated(
        output_dir=str(output_dir), max_steps=warm_steps + extra_steps, resume=True, register_as=None
    )
    return train_sft(control, on_metrics=on_metrics, should_stop=should_stop)
