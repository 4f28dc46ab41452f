"""The inference engine protocol rollouts sample through, its two engines, and the log-prob agreement check.

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

- :class:`EmbeddedRolloutEngine` runs the embedded serving engine's continuous-batching loop
  (:func:`~posttrain.platform.engines.generation.decode_groups`): each prompt is prefilled once and
  its KV cache repeated for its group, and finished rows leave the batch as they finish, where
  ``generate`` keeps them until the longest completion ends.
- :class:`VLLMRolloutEngine` drives ``vllm.LLM`` in the learner's process (an environment with vLLM, a GPU
  host's), :class:`VLLMServerEngine` drives it in a process of its own from vLLM's own environment (``.venv-vllm``
  on a CPU host); both push the learner's weights into it after every update.

Each engine's :meth:`~InferenceEngine.batcher` serves a multi-turn environment's episodes, one completion
at a time per episode thread, batched underneath: :class:`ContinuousBatcher` on the embedded engine's
decode loop, :class:`VLLMBatcher` and :class:`VLLMServerBatcher` on vLLM's engine loop.

Behaviour and learner log-probs of the same tokens should agree up to numerics (fp32 CPU: about
1e-6; bf16 engines: about 1e-2 mean absolute difference); :func:`measure_logprob_mismatch` and
:func:`check_logprob_mismatch` catch an engine that samples from weights other than the learner's.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import httpx
import torch
from safetensors.torch import save_file
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
from posttrain.platform.engines.launcher import ServerProcess, free_port
from posttrain.platform.engines.loader import load_model
from posttrain.platform.engines.vllm import VllmProfile, find_python, server_env
from posttrain.platform.verifiers import TaskSpec
from posttrain.training.config import MismatchTolerance
from posttrain.training.learner import completion_batch, completion_logprobs
from posttrain.training.modeling import autocast, eval_mode
from posttrain.training.rollout import RolloutGroup, SamplingConfig, Trajectory, make_trajectory, prompt_ids
from posttrain.training.vllm_server import Driver, completion

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


# ----------------------------------------------------------------------------- the vLLM engines


WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth", ".safetensors.index.json", ".bin.index.json")


def with_output_layer(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The learner's weights as vLLM must get them: ``lm_head.weight`` named even when the model ties it to the
    embeddings (vLLM's CPU backend keeps a packed copy of the output layer, which an update without it leaves
    stale: log-probs then drift by about 0.6)."""
    weights = dict(state_dict)
    if "lm_head.weight" not in weights and "model.embed_tokens.weight" in weights:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    return weights


class VLLMRolloutEngine:
    """Rollouts through vLLM in the learner's process (``vllm.LLM``): a host whose environment has vLLM (a GPU
    host's ``gpu`` extra), the engine colocated with the learner.

    Sampling: one ``SamplingParams(n=..., temperature, top_p, max_tokens, logprobs=0, seed)`` per
    call, prompts given as token ids; ``logprobs=0`` returns the sampled token's log-prob only.

    Weights (:meth:`load_weights`, after every update) go through the workers' supported in-place reload,
    ``llm.collective_rpc("reload_weights", kwargs={"weights_iterator": ...})`` with ``lm_head`` named
    (:func:`with_output_layer`), never through the model object's private attributes (on vLLM's CPU backend,
    which repacks linear weights, the model's own ``load_weights`` fails). A vLLM without that reload gets the
    state saved as a model directory under ``weights_dir`` and a new ``LLM`` built on it. Either is followed
    by ``llm.reset_prefix_cache()`` (cached prefixes hold the old weights' keys and values); ``weight_sync``
    says which way the last update went.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        args: VllmProfile | None = None,
        weights_dir: str | os.PathLike[str] | None = None,
        version: int = 0,
        llm_class: Any = None,
        sampling_params_class: Any = None,
    ) -> None:
        if llm_class is None or sampling_params_class is None:
            vllm = _import_vllm()
            llm_class, sampling_params_class = llm_class or vllm.LLM, sampling_params_class or vllm.SamplingParams
        args = args or VllmProfile.for_rollouts(model_path)
        self.model_path, self.args, self.version = Path(model_path), args, version
        self.weights_dir = (
            Path(weights_dir) if weights_dir is not None else Path(tempfile.mkdtemp(prefix="posttrain-vllm-"))
        )
        self._llm_class, self._sampling_params_class = llm_class, sampling_params_class
        self.llm = llm_class(**args.llm_kwargs(self.model_path))
        self.weight_sync: str | None = None

    def sampling_params(
        self, n: int, sampling: SamplingConfig, seed: int | None, max_new_tokens: int | None = None
    ) -> Any:
        return self._sampling_params_class(
            n=n,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            max_tokens=max_new_tokens or sampling.max_new_tokens,
            logprobs=0,
            seed=seed,
        )

    def generate(
        self, prompts: Sequence[list[int]], n: int, sampling: SamplingConfig, *, seed: int | None = None
    ) -> list[list[Completion]]:
        outputs = self.llm.generate(
            [{"prompt_token_ids": list(p)} for p in prompts],
            sampling_params=self.sampling_params(n, sampling, seed),
            use_tqdm=False,
        )
        return [[_vllm_completion(o) for o in out.outputs] for out in outputs]

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        weights = with_output_layer(state_dict)
        if not self._reload_through_rpc(list(weights.items())):
            self._rebuild_from(save_weights(weights, self.model_path, self.weights_dir, version))
            self.weight_sync = "reload_from_dir"
        self.llm.reset_prefix_cache()
        self.version = version

    def batcher(self, *, seed: int = 0) -> VLLMBatcher:
        return VLLMBatcher(self, seed=seed)

    def close(self) -> None:
        self.llm = None
        shutil.rmtree(self.weights_dir, ignore_errors=True)

    def _reload_through_rpc(self, weights: list[tuple[str, torch.Tensor]]) -> bool:
        if not hasattr(self.llm, "collective_rpc"):
            return False
        try:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        except Exception as exc:  # older workers have no in-place reload: save and rebuild instead
            log.warning("vLLM collective_rpc('reload_weights') failed (%s); reloading from a saved directory", exc)
            return False
        self.weight_sync = "collective_rpc"
        return True

    def _rebuild_from(self, path: Path) -> None:
        self.llm = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        self.llm = self._llm_class(**self.args.llm_kwargs(path))


class VLLMBatcher:
    """:class:`ContinuousBatcher`'s contract on a colocated :class:`VLLMRolloutEngine`, for multi-turn episodes:
    callers' requests go into vLLM's own engine loop through the rollout server's
    :class:`~posttrain.training.vllm_server.Driver` (``add_request`` between ``step`` s, one driver thread making
    every engine call), which batches them continuously and shares cached prefixes (a group's first turns, an
    episode's earlier turns). Request j draws with seed ``seed + j``, so the same requests in the same order sample
    the same completions."""

    def __init__(self, engine: VLLMRolloutEngine, *, seed: int = 0) -> None:
        self.engine, self._seed, self._asked = engine, seed, 0
        self._lock = threading.Lock()
        self._driver = Driver(engine.llm, engine._sampling_params_class)
        self._thread = threading.Thread(target=self._driver.run, name="posttrain-vllm-batcher", daemon=True)
        self._thread.start()

    @property
    def version(self) -> int:
        return self.engine.version

    def complete(
        self, prompt_ids: Sequence[int], sampling: SamplingConfig, *, max_new_tokens: int | None = None
    ) -> Completion:
        """One completion of ``prompt_ids`` (at most ``max_new_tokens``, else the sampling config's)."""
        with self._lock:
            j, self._asked = self._asked, self._asked + 1
        answer = self._driver.generate(vllm_request(prompt_ids, 1, sampling, self._seed + j, max_new_tokens)).result()
        return Completion(**answer["completions"][0])

    def forget_prefixes(self) -> None:  # vLLM's prefix cache is its own, within its KV budget
        pass

    def close(self) -> None:
        self._driver.close()
        self._thread.join(timeout=30)


def vllm_request(
    prompt: Sequence[int], n: int, sampling: SamplingConfig, seed: int | None, max_new_tokens: int | None = None
) -> dict[str, Any]:
    """One request as the rollout server's :class:`~posttrain.training.vllm_server.Driver` takes it."""
    return {"prompt": list(prompt), "n": n, "temperature": sampling.temperature, "top_p": sampling.top_p,
            "max_tokens": max_new_tokens or sampling.max_new_tokens, "seed": seed}  # fmt: skip


SERVER_SCRIPT = Path(__file__).resolve().parent / "vllm_server.py"


class VLLMServerEngine:
    """Rollouts through vLLM in a process of its own, run by another environment's Python (``.venv-vllm`` on a
    CPU host, :func:`~posttrain.platform.engines.vllm.find_python`): :mod:`~posttrain.training.vllm_server`
    on loopback, the learner keeping the platform's environment. The same contract as :class:`VLLMRolloutEngine`:

    - :meth:`generate` sends every prompt in one request; the server's engine loop batches them;
    - :meth:`load_weights` writes the learner's state (``lm_head`` named: :func:`with_output_layer`) to one
      safetensors file in shared memory and the server reloads it through the workers' ``reload_weights``;
      ``sync_seconds`` keeps each update's time;
    - every answer names the policy version its weights were when the request went in, and a completion sampled
      from any other version than the engine's raises (a rollout always knows what sampled it);
    - :meth:`batcher` serves multi-turn episodes: each episode thread's request goes to the server, whose engine
      loop batches the concurrent ones.
    """

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        *,
        args: VllmProfile | None = None,
        version: int = 0,
        python: str | os.PathLike[str] | None = None,
        start_timeout_s: float = 600.0,
    ) -> None:
        args = args or VllmProfile.for_rollouts(model_path)
        self.model_path, self.args, self.version = Path(model_path), args, version
        port = free_port("127.0.0.1")
        command = [str(find_python(python)), "-P", str(SERVER_SCRIPT), "--port", str(port),
                   "--llm", json.dumps(args.llm_kwargs(self.model_path)), "--version", str(version)]  # fmt: skip
        env = {**server_env(cpu_threads=args.cpu_threads if args.device == "cpu" else None), "PYTHONNOUSERSITE": "1"}
        self.server = ServerProcess(command, f"http://127.0.0.1:{port}", env=env,
                                    on_log=lambda line: log.info("vllm: %s", line))  # fmt: skip
        self.server.start(timeout_s=start_timeout_s)
        self.client = httpx.Client(base_url=self.server.base_url, timeout=httpx.Timeout(None, connect=10.0))
        shm = Path("/dev/shm")
        self._weights_dir = Path(tempfile.mkdtemp(prefix="posttrain-vllm-weights-", dir=shm if shm.is_dir() else None))
        self.weight_sync = "reload_weights"
        self.sync_seconds: list[float] = []

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        resp = self.client.post(path, json=body)
        if resp.status_code != 200:
            raise RuntimeError(f"the vLLM rollout server at {self.server.base_url} answered {path} with "
                               f"{resp.status_code}: {resp.text[:500]}")  # fmt: skip
        return resp.json()

    def _completions(self, answer: dict[str, Any]) -> list[Completion]:
        if answer["version"] != self.version:
            raise RuntimeError(f"the vLLM rollout server sampled with policy version {answer['version']}, "
                               f"not {self.version}: a weight update and a rollout overlapped")  # fmt: skip
        return [Completion(**c) for c in answer["completions"]]

    def generate(
        self, prompts: Sequence[list[int]], n: int, sampling: SamplingConfig, *, seed: int | None = None
    ) -> list[list[Completion]]:
        answers = self._post("/generate", {"requests": [vllm_request(p, n, sampling, seed) for p in prompts]})
        return [self._completions(a) for a in answers["outputs"]]

    def complete(
        self, prompt_ids: Sequence[int], sampling: SamplingConfig, seed: int | None, max_new_tokens: int | None = None
    ) -> Completion:
        (answer,) = self._post(
            "/generate", {"requests": [vllm_request(prompt_ids, 1, sampling, seed, max_new_tokens)]}
        )["outputs"]
        return self._completions(answer)[0]

    def load_weights(self, state_dict: Mapping[str, torch.Tensor], version: int) -> None:
        path = self._weights_dir / "weights.safetensors"
        weights, seen = {}, set()
        for name, tensor in with_output_layer(state_dict).items():  # a tensor shared by two names is written twice
            tensor = tensor.detach().to("cpu").contiguous()
            weights[name] = tensor.clone() if tensor.data_ptr() in seen else tensor
            seen.add(tensor.data_ptr())
        save_file(weights, str(path), metadata={"format": "pt"})
        try:
            answer = self._post("/weights", {"path": str(path), "version": version})
        finally:
            path.unlink(missing_ok=True)
        self.sync_seconds.append(float(answer["seconds"]))
        self.version = version

    def batcher(self, *, seed: int = 0) -> VLLMServerBatcher:
        return VLLMServerBatcher(self, seed=seed)

    def close(self) -> None:
        self.client.close()
        self.server.stop()
        shutil.rmtree(self._weights_dir, ignore_errors=True)


class VLLMServerBatcher:
    """:class:`ContinuousBatcher`'s contract on a :class:`VLLMServerEngine`: each caller's request goes to the
    server as it comes, and the server's engine loop batches the concurrent ones. Request j draws with seed
    ``seed + j``."""

    def __init__(self, engine: VLLMServerEngine, *, seed: int = 0) -> None:
        self.engine, self._seed, self._asked = engine, seed, 0
        self._lock = threading.Lock()
        self._closed = False

    @property
    def version(self) -> int:
        return self.engine.version

    def complete(
        self, prompt_ids: Sequence[int], sampling: SamplingConfig, *, max_new_tokens: int | None = None
    ) -> Completion:
        with self._lock:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            j, self._asked = self._asked, self._asked + 1
        return self.engine.complete(prompt_ids, sampling, self._seed + j, max_new_tokens)

    def forget_prefixes(self) -> None:  # the server's prefix cache is its own, within its KV budget
        pass

    def close(self) -> None:
        with self._lock:
            self._closed = True


def _import_vllm() -> Any:
    os.environ.setdefault(
        "VLLM_ENABLE_V1_MULTIPROCESSING", "0"
    )  # the engine core in this process (its batcher drives it)
    try:
        import vllm  # optional: the gpu extra
    except ImportError as exc:
        raise ImportError(
            "VLLMRolloutEngine needs vLLM in this environment (a GPU host: pip install 'posttrain[gpu]'); "
            "elsewhere VLLMServerEngine runs it from its own environment (make vllm)"
        ) from exc
    return vllm


def _vllm_completion(output: Any) -> Completion:
    """A vLLM ``CompletionOutput`` (token ids, per-token ``{token_id: Logprob}``, finish reason) as a Completion."""
    return Completion(**completion(output))


def save_weights(state_dict: Mapping[str, torch.Tensor], source: Path, weights_dir: Path, version: int) -> Path:
    """``state_dict`` as a model directory ``weights_dir/version-N`` (the source directory's config and
    tokenizer files, one ``model.safetensors``), written to a temporary name and renamed; older
    versions are removed."""
    weights_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".version-", dir=weights_dir))
    for item in source.iterdir():
        if item.is_file() and not item.name.endswith(WEIGHT_FILES):
            shutil.copy2(item, staging / item.name)
    save_file(
        {k: v.detach().to("cpu").contiguous().clone() for k, v in state_dict.items()},
        str(staging / "model.safetensors"),
        metadata={"format": "pt"},
    )
    final = weights_dir / f"version-{version}"
    shutil.rmtree(final, ignore_errors=True)
    os.replace(staging, final)
    for old in weights_dir.glob("version-*"):
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final


# ----------------------------------------------------------------------------- behaviour vs learner log-probs


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
