"""Rollouts: sample ``group_size`` completions per prompt, token in and token out, then verify.

Each :class:`Trajectory` keeps the exact prompt and completion token ids and the
behaviour policy's log-prob of every sampled token (from the logits generation used,
divided by the temperature), so the learner never re-tokenises text and its importance
ratio compares against the policy that really produced the tokens.

Sampling draws from the full softmax at ``temperature`` (``top_k`` off); ``top_p < 1``
truncates the distribution, and the recorded log-probs are then those of the
untruncated distribution (the usual approximation).

In the plain completion format (a base model's) a continuation is cut where the model goes on to a question of
its own, as evaluation cuts it (:func:`make_trajectory`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from typing import Any, cast

import torch
import torch.nn.functional as F
from transformers import DynamicCache, PreTrainedTokenizerBase

from posttrain.platform.engines.chat_template import completion_cut, is_completion_format
from posttrain.platform.engines.loader import cache_keyword
from posttrain.platform.tasks.episodes import task_messages
from posttrain.platform.verifiers import TaskSpec, Verdict, VerifierService
from posttrain.training.config import SamplingConfig
from posttrain.training.modeling import eval_mode


@dataclass
class Trajectory:
    prompt_ids: list[int]
    completion_ids: list[int]
    behaviour_logprobs: list[float]
    text: str
    finished: bool  # ended with the end-of-turn token (False: cut at max_new_tokens)
    reward: float | None = None
    passed: bool | None = None
    verdict: Verdict | None = None
    # multi-turn episodes: 1 on the policy's own tokens, 0 on what the environment put between its
    # turns (tool output, the template's turn markers), which carry no loss; None: all the policy's
    loss_mask: list[int] | None = None
    episode: Any = None  # the environments.Episode it came from (turns, tool calls, stop reason)


@dataclass
class RolloutGroup:
    """``group_size`` completions of one task by one policy version."""

    task: TaskSpec
    trajectories: list[Trajectory]
    policy_version: int
    created_at: float = field(default_factory=time.monotonic)
    verify_futures: list[Future[Verdict]] = field(default_factory=list, repr=False)
    verify_latency_s: float | None = None
    infra_errors: int = 0

    @property
    def rewards(self) -> list[float]:
        return [t.reward if t.reward is not None else 0.0 for t in self.trajectories]

    @property
    def verified(self) -> bool:
        return all(t.verdict is not None for t in self.trajectories)


def make_trajectory(
    tokenizer: PreTrainedTokenizerBase, prompt: list[int], token_ids: list[int], logprobs: list[float], finished: bool
) -> Trajectory:
    """One sampled completion of ``prompt``. In the plain completion format the continuation is kept through the
    token where it goes on to a question of its own (:func:`~posttrain.platform.engines.chat_template.completion_cut`):
    those tokens are what the learner scores, the answer before that question is what the verifier reads (as in
    evaluation), and the completion counts as finished."""
    if is_completion_format(tokenizer):
        kept, answer, ended = completion_cut(tokenizer, token_ids)
        return Trajectory(
            prompt_ids=prompt,
            completion_ids=token_ids[:kept],
            behaviour_logprobs=logprobs[:kept],
            text=answer,
            finished=finished or ended,
        )
    return Trajectory(
        prompt_ids=prompt,
        completion_ids=token_ids,
        behaviour_logprobs=logprobs,
        text=cast(str, tokenizer.decode(token_ids, skip_special_tokens=True)),
        finished=finished,
    )


def prompt_ids(tokenizer: PreTrainedTokenizerBase, task: TaskSpec | list[dict[str, Any]]) -> list[int]:
    """The ids of the task's prompt (or of ``messages``) with the generation prompt, as rollouts sample from."""
    messages = task_messages(task) if isinstance(task, TaskSpec) else task
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


@torch.no_grad()
def generate_groups(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    tasks: Sequence[TaskSpec],
    group_size: int,
    sampling: SamplingConfig,
    *,
    policy_version: int = 0,
) -> list[RolloutGroup]:
    """Sample ``group_size`` completions for each task with ``model`` (one batched ``generate``).

    Each prompt is run through the model once, not once per sample: its KV cache (all but the
    last prompt token) is computed for the distinct prompts and repeated ``group_size`` times
    before sampling starts (the samples of a group share their prompt).
    """
    device = next(model.parameters()).device
    prompts = [prompt_ids(tokenizer, t) for t in tasks]
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=device)
    attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
    eos = tokenizer.eos_token_id
    with eval_mode(model), torch.no_grad():
        key = cache_keyword(model)
        prefilled = {}
        if width > 1:
            positions = (attention.cumsum(-1) - 1).clamp(min=0)
            cache = DynamicCache(config=model.config)  # type: ignore[arg-type]
            model(
                input_ids=input_ids[:, :-1],
                attention_mask=attention[:, :-1],
                position_ids=positions[:, :-1],
                use_cache=True,
                **{key: cache},
            )
            cache.batch_repeat_interleave(group_size)
            prefilled = {key: cache}
        out = model.generate(  # type: ignore[operator]
            input_ids=input_ids.repeat_interleave(group_size, dim=0),
            attention_mask=attention.repeat_interleave(group_size, dim=0),
            **prefilled,
            do_sample=True,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=0,
            max_new_tokens=sampling.max_new_tokens,
            eos_token_id=eos,
            pad_token_id=pad,
            output_logits=True,
            return_dict_in_generate=True,
        )
    new_tokens = out.sequences[:, width:]
    if out.logits:
        logits = torch.stack(out.logits, dim=1).float() / sampling.temperature  # (B*n, L, V)
        logprobs = torch.gather(F.log_softmax(logits, dim=-1), 2, new_tokens.unsqueeze(-1)).squeeze(-1).cpu()
    else:
        logprobs = torch.zeros(new_tokens.shape)
    new_tokens = new_tokens.cpu()
    groups = []
    for i, task in enumerate(tasks):
        trajectories = []
        for j in range(group_size):
            row = i * group_size + j
            ids = new_tokens[row].tolist()
            finished = eos in ids
            length = ids.index(eos) + 1 if finished else len(ids)
            trajectories.append(
                make_trajectory(tokenizer, prompts[i], ids[:length], logprobs[row, :length].tolist(), finished)
            )
        groups.append(RolloutGroup(task=task, trajectories=trajectories, policy_version=policy_version))
    return groups


def submit_verification(
    executor: Executor, service: VerifierService, group: RolloutGroup, timeout_s: float | None = None
) -> None:
    """Start checking every completion of ``group`` in the verifier pool (returns at once).

    ``executor`` only waits on the service's worker processes; size it like the pool.
    """
    if group.verified:  # an environment verified its episodes where they ran (the sandbox still theirs)
        return
    started = time.monotonic()
    futures = [executor.submit(service.verify, group.task, t.text, timeout_s=timeout_s) for t in group.trajectories]
    group.verify_futures = futures
    group.created_at = min(group.created_at, started)


def collect_verification(group: RolloutGroup) -> RolloutGroup:
    """Wait for ``group``'s verdicts and set rewards; infrastructure errors are counted, not scored."""
    started = time.monotonic()
    for trajectory, future in zip(group.trajectories, group.verify_futures):
        verdict = future.result()
        trajectory.verdict = verdict
        if verdict.is_infra_error:
            group.infra_errors += 1
            trajectory.reward, trajectory.passed = None, None
        else:
            trajectory.reward, trajectory.passed = verdict.score, verdict.passed
    waited = time.monotonic() - started
    elapsed = [t.verdict.elapsed_s or 0.0 for t in group.trajectories if t.verdict is not None]
    group.verify_latency_s = max(max(elapsed, default=0.0), waited)
    group.verify_futures = []
    return group
