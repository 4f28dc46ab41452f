"""The inference engine protocol rollouts sample through, and the embedded engine.

    engine = EmbeddedRolloutEngine.from_dir("var/models/tiny")           # CPU: serving's decode loop
    groups = rollout_groups(engine, engine.tokenizer, tasks, group_size=8, sampling=SamplingConfig())
    ... learner update ...
    engine.load_weights(snapshot_state(model), version=step)             # every update
    check_logprob_mismatch(measure_logprob_mismatch(model, trajectories, pad_id=pad, temperature=1.0))

An :class:`InferenceEngine` samples ``n`` completions of each token-id prompt with one sampling
config and returns, per completion, the exact token ids, the behaviour log-prob of every sampled
token and whether it ended with a stop token. Log-probs follow :mod:`posttrain.training.rollout`'s
convention: ``log_softmax(logits / temperature)`` of the untruncated distribution (``top_p`` only
shapes what is drawn). :func:`rollout_groups` turns any engine's output into the
:class:`~posttrain.training.rollout.RolloutGroup` s that :func:`~posttrain.training.rollout.generate_groups`
makes, tagged with the engine's policy version.

- :class:`EmbeddedRolloutEngine` (here) runs the embedded serving engine's continuous-batching loop
  (:func:`~posttrain.platform.engines.generation.decode_groups`): each prompt is prefilled once and
  its KV cache repeated for its group, and finished rows leave the batch as they finish, where
  ``generate`` keeps them until the longest completion ends.
- The vLLM engines are :mod:`posttrain.training.vllm_engines`'; how the learner's weights reach an engine in
  another process, :mod:`posttrain.training.weight_sync`; the check that an engine samples from the learner's
  weights, :mod:`posttrain.training.logprob_check`.

Each engine's :meth:`~InferenceEngine.batcher` serves a multi-turn environment's episodes, one completion
at a time per episode thread, batched underneath: :class:`ContinuousBatcher` on the embedded engine's
decode loop, the vLLM batchers on vLLM's engine loop.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from posttrain.platform.engines.chat_template import reply_end_ids
from posttrain.platform.engines.generation import (
    DecodeBatch,
    KVPrefix,
    SamplingParams,
    SpeculationConfig,
    decode_groups,
)
from posttrain.platform.engines.generation import Sequence as DecodeSequence
from posttrain.platform.engines.loader import load_model
from posttrain.platform.verifiers import TaskSpec
from posttrain.training.modeling import eval_mode
from posttrain.training.rollout import RolloutGroup, SamplingConfig, Trajectory, make_trajectory, prompt_ids

log = logging.getLogger(__name__)


DEFAULT_PREFIX_CACHE_BYTES = 512 << 20
"""KV caches kept for episodes' next turns (SmolLM2-135M holds 46 KB a token in fp32: about 11,000 tokens)."""


@dataclass(frozen=True)
class Completion:
    """One sampled completion: its exact token ids, the behaviour log-prob of each, and whether it
    ended with a stop token (False: cut at ``max_new_tokens``)."""

    token_ids: list[int]
    logprobs: list[float]
    finished: bool


@runtime_checkable
class InferenceEngine(Protocol):
    """What rollouts sample through; ``version`` is the policy version of the weights it holds."""

    version: int

    def generate(
        self, prompts: Sequence[list[int]], n: int, sampling: SamplingConfig, *, seed: int | None = None
    ) -> list[list[Completion]]:
        """``n`` completions of each prompt, in prompt order."""
        ...

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        """Take the learner's weights (a full state dict) as policy ``version``."""
        ...

    def batcher(self, *, seed: int = 0) -> PolicyBatcher:
        """Token-in, token-out completions for many callers at once (a multi-turn environment's episodes)."""
        ...


class PolicyBatcher(Protocol):
    """One completion at a time for each of many threads, batched together underneath; each completion is
    tagged with the engine's policy version when it was asked for. Load weights only while none is out."""

    @property
    def version(self) -> int: ...

    def complete(
        self, prompt_ids: Sequence[int], sampling: SamplingConfig, *, max_new_tokens: int | None = None
    ) -> Completion: ...

    def forget_prefixes(self) -> None:
        """Drop what is kept for later turns (the episodes it was kept for are over): memory the learner's update
        can use."""
        ...

    def close(self) -> None: ...


def rollout_groups(
    engine: InferenceEngine,
    tokenizer: PreTrainedTokenizerBase,
    tasks: Sequence[TaskSpec],
    group_size: int,
    sampling: SamplingConfig,
    *,
    seed: int | None = None,
) -> list[RolloutGroup]:
    """``group_size`` completions of each task through ``engine``: the groups
    :func:`~posttrain.training.rollout.generate_groups` makes, tagged with ``engine.version``."""
    prompts = [prompt_ids(tokenizer, t) for t in tasks]
    version = engine.version
    completions = engine.generate(prompts, group_size, sampling, seed=seed)
    return [
        RolloutGroup(task=task, trajectories=[_trajectory(tokenizer, prompt, c) for c in group], policy_version=version)
        for task, prompt, group in zip(tasks, prompts, completions)
    ]


def _trajectory(tokenizer: PreTrainedTokenizerBase, prompt: list[int], completion: Completion) -> Trajectory:
    return make_trajectory(tokenizer, prompt, completion.token_ids, completion.logprobs, completion.finished)


# ----------------------------------------------------------------------------- the embedded engine


class EmbeddedRolloutEngine:
    """Rollouts on the embedded serving engine's decode loop, on CPU or one torch device.

    Stops at ``stop_token_ids`` (default: where the model's replies end, its end-of-sequence and end-of-turn tokens,
    :func:`~posttrain.platform.engines.chat_template.reply_end_ids`).
    ``max_num_seqs`` caps the rows decoded together (None: every group of a call at once); waiting
    groups join as rows leave. With ``seed`` a call draws from one generator of its own, so the same
    prompts, weights and seed give the same completions. ``prefix_cache_bytes``: the KV its batchers keep for
    episodes' next turns (see :class:`ContinuousBatcher`; 0 prefills every turn whole).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        *,
        stop_token_ids: Iterable[int] | None = None,
        max_num_seqs: int | None = None,
        version: int = 0,
        prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES,
    ) -> None:
        eos = tokenizer.eos_token_id
        self.model, self.tokenizer, self.max_num_seqs, self.version = model, tokenizer, max_num_seqs, version
        self.prefix_cache_bytes = prefix_cache_bytes
        if stop_token_ids is None:
            stop_token_ids = reply_end_ids(
                tokenizer, getattr(getattr(model, "generation_config", None), "eos_token_id", None)
            )
        self.stop_token_ids = frozenset(stop_token_ids)
        pad = tokenizer.pad_token_id
        self.pad_token_id = pad if pad is not None else (eos if eos is not None else 0)

    @classmethod
    def from_dir(
        cls, path: str | os.PathLike[str], *, dtype: torch.dtype = torch.float32, device: str = "cpu", **kwargs: Any
    ) -> EmbeddedRolloutEngine:
        """An engine on a model directory, loaded the way serving loads it (stops at its end-of-turn tokens)."""
        loaded = load_model(path, dtype=dtype, device=device)
        kwargs.setdefault("stop_token_ids", loaded.eos_token_ids)
        return cls(loaded.model, loaded.tokenizer, **kwargs)

    def generate(
        self, prompts: Sequence[list[int]], n: int, sampling: SamplingConfig, *, seed: int | None = None
    ) -> list[list[Completion]]:
        params = SamplingParams(
            max_new_tokens=sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            logprobs=True,
        )
        generator = None if seed is None else torch.Generator(device=self.model.device).manual_seed(seed)
        groups = [
            [DecodeSequence(list(p), params, self.stop_token_ids, generator=generator) for _ in range(n)]
            for p in prompts
        ]
        with eval_mode(self.model):
            decode_groups(self.model, groups, pad_token_id=self.pad_token_id, max_num_seqs=self.max_num_seqs)
        return [[Completion(s.generated, s.logprobs, s.finish_reason == "stop") for s in group] for group in groups]

    @torch.no_grad()
    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        self.model.load_state_dict(dict(state_dict))
        self.version = version

    def batcher(self, *, seed: int = 0) -> ContinuousBatcher:
        return ContinuousBatcher(self, seed=seed, prefix_cache_bytes=self.prefix_cache_bytes)


class PrefixStore:
    """The KV caches finished completions left (:class:`KVPrefix`), for the prompts that go on from them: an
    episode's next turn starts with its previous prompt and reply. At most ``max_bytes`` are kept (the least
    recently stored go first), and only for the policy version that computed them."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes, self.version = max_bytes, -1
        self._entries: OrderedDict[tuple[int, ...], KVPrefix] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, prefix: KVPrefix, version: int) -> None:
        with self._lock:
            self._at(version)
            if prefix.nbytes > self.max_bytes or prefix.token_ids in self._entries:
                return
            self._entries[prefix.token_ids] = prefix
            self._bytes += prefix.nbytes
            while self._bytes > self.max_bytes:
                self._bytes -= self._entries.popitem(last=False)[1].nbytes

    def take(self, prompt_ids: Sequence[int], version: int) -> KVPrefix | None:
        """The longest stored prefix that is a proper start of ``prompt_ids``, removed from the store (the
        completion that goes on from it leaves a longer one)."""
        with self._lock:
            self._at(version)
            best = max(
                (ids for ids in self._entries if len(ids) < len(prompt_ids) and tuple(prompt_ids[: len(ids)]) == ids),
                key=len,
                default=None,
            )
            if best is None:
                return None
            prefix = self._entries.pop(best)
            self._bytes -= prefix.nbytes
            return prefix

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def _at(self, version: int) -> None:
        if version != self.version:  # new weights: every cached key and value is stale
            self._entries.clear()
            self._bytes, self.version = 0, version


class ContinuousBatcher:
    """Token-in, token-out completions for many callers at once on an embedded engine's model: the
    episodes of an environment, each in a thread of its own, call :meth:`complete` while others wait on
    their tools. A driver thread keeps one running decode batch: requests join it between decode steps
    and leave as they finish (continuous batching), and requests pending together with the same prompt
    (the first turns of a rollout group) share one prefill. A request whose prompt goes on from an earlier
    completion's prompt and reply (an episode's next turn) prefills only the tokens added since, from the KV
    cache that completion left (``prefix_cache_bytes`` of them kept; 0: every turn prefilled whole), with the
    same tokens and log-probs as prefilling it whole. Each completion is tagged with the engine's policy
    version when it was asked for; load weights only while no request is out.

        batcher = ContinuousBatcher(engine)
        completion = batcher.complete(prompt_ids, sampling)     # blocks; thread-safe
        batcher.close()
    """

    def __init__(
        self, engine: EmbeddedRolloutEngine, *, seed: int = 0, prefix_cache_bytes: int = DEFAULT_PREFIX_CACHE_BYTES
    ) -> None:
        self.engine = engine
        self._generator = torch.Generator(device=engine.model.device).manual_seed(seed)
        self._cond = threading.Condition()
        self._pending: list[tuple[DecodeSequence, Future[Completion]]] = []
        self._prefixes = PrefixStore(prefix_cache_bytes) if prefix_cache_bytes > 0 else None
        self.reused_tokens = 0  # prompt tokens not prefilled again: their KV came from an earlier turn
        self._closed = False
        self._thread = threading.Thread(target=self._drive, name="posttrain-batcher", daemon=True)
        self._thread.start()

    @property
    def version(self) -> int:
        return self.engine.version

    def complete(
        self, prompt_ids: Sequence[int], sampling: SamplingConfig, *, max_new_tokens: int | None = None
    ) -> Completion:
        """One completion of ``prompt_ids`` (at most ``max_new_tokens``, else the sampling config's)."""
        params = SamplingParams(
            max_new_tokens=max_new_tokens or sampling.max_new_tokens,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            logprobs=True,
        )
        seq = DecodeSequence(
            list(prompt_ids),
            params,
            self.engine.stop_token_ids,
            generator=self._generator,
            keep_kv=self._prefixes is not None,
        )
        if self._prefixes is not None:  # held by the sequence alone, which lets it go once the batch has a copy
            seq.prefix = self._prefixes.take(prompt_ids, self.engine.version)
            self.reused_tokens += len(seq.prefix.token_ids) if seq.prefix is not None else 0
        future: Future[Completion] = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            self._pending.append((seq, future))
            self._cond.notify_all()
        return future.result()

    def forget_prefixes(self) -> None:
        if self._prefixes is not None:
            self._prefixes.clear()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    def _drive(self) -> None:
        batch = DecodeBatch(self.engine.model, SpeculationConfig(0), self.engine.pad_token_id)
        out: dict[int, Future[Completion]] = {}
        limit = self.engine.max_num_seqs
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or self._pending or len(batch))
                if self._closed:
                    for _seq, future in self._pending:
                        future.set_exception(RuntimeError("the batcher closed"))
                    for future in out.values():
                        future.set_exception(RuntimeError("the batcher closed"))
                    return
                room = (limit - len(batch)) if limit else len(self._pending)
                joining = self._pending[:room] if batch.can_join else []
                self._pending = self._pending[len(joining) :]
            try:
                with eval_mode(self.engine.model):
                    if joining:
                        same: dict[tuple[Any, ...], list[DecodeSequence]] = {}
                        for seq, future in joining:
                            same.setdefault((id(seq.prefix), *seq.prompt_ids), []).append(seq)
                            out[id(seq)] = future
                        batch.add_groups(list(same.values()))
                    self._resolve(batch.pop_finished(), out)
                    batch.step()
                    self._resolve(batch.pop_finished(), out)
            except BaseException as exc:  # noqa: BLE001 - every caller in the batch gets it
                for future in out.values():
                    future.set_exception(exc)
                out.clear()
                batch = DecodeBatch(self.engine.model, SpeculationConfig(0), self.engine.pad_token_id)

    def _resolve(self, finished: list[DecodeSequence], out: dict[int, Future[Completion]]) -> None:
        for seq in finished:
            if self._prefixes is not None and seq.kv is not None:
                self._prefixes.put(seq.kv, self.engine.version)
                seq.kv = None
            future = out.pop(id(seq), None)
            if future is not None:
                future.set_result(Completion(seq.generated, seq.logprobs, seq.finish_reason == "stop"))
