"""The inference engines rollouts sample through: the embedded engine on a real tiny model, the vLLM
engine's calls against a fake ``LLM`` (vLLM needs a GPU host), and the behaviour/learner log-prob check."""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import pytest
import torch
from safetensors.torch import load_file
from test_training_tiny import tiny_policy_dir

from posttrain.platform.engines.generation import SHARED_PREFIX_MIN, SamplingParams, Sequence, generate_batch
from posttrain.platform.engines.vllm import VllmProfile
from posttrain.platform.verifiers import TaskSpec
from posttrain.training.config import MismatchTolerance
from posttrain.training.inference import EmbeddedRolloutEngine, InferenceEngine, rollout_groups
from posttrain.training.learner import completion_batch, completion_logprobs
from posttrain.training.logprob_check import (
    LogprobMismatchError,
    check_logprob_mismatch,
    logprob_mismatch,
    measure_logprob_mismatch,
)
from posttrain.training.modeling import load_policy, snapshot_state
from posttrain.training.rollout import RolloutGroup, SamplingConfig, prompt_ids
from posttrain.training.vllm_engines import VLLMBatcher, VLLMRolloutEngine

TASKS = [TaskSpec(domain="lower", prompt=f"Write lowercase {i}", verifier={"kind": "exact"}, reference="x", task_id=f"l{i}")
         for i in range(4)]  # fmt: skip


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_policy_dir(tmp_path_factory.mktemp("inference") / "tiny")


@pytest.fixture(scope="module")
def other_state(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The weights of another tiny model of the same shape (seed 1)."""
    model, _ = load_policy(tiny_policy_dir(tmp_path_factory.mktemp("other") / "tiny", seed=1))
    return snapshot_state(model)


@pytest.fixture()
def engine(tiny_dir: Path) -> EmbeddedRolloutEngine:
    return EmbeddedRolloutEngine.from_dir(tiny_dir)


@pytest.fixture()
def forwards(engine: EmbeddedRolloutEngine) -> Iterator[list[tuple[int, int]]]:
    """(rows, tokens) of every forward pass the engine's model makes (prefills through ``forward``, decode steps
    through the lean step: both embed their input ids first)."""
    shapes: list[tuple[int, int]] = []
    handle = engine.model.get_input_embeddings().register_forward_pre_hook(
        lambda _m, args: shapes.append(tuple(args[0].shape))
    )
    yield shapes
    handle.remove()


def ids(groups: list[RolloutGroup]) -> list[list[list[int]]]:
    return [[t.completion_ids for t in g.trajectories] for g in groups]


def logprobs(groups: list[RolloutGroup]) -> list[list[list[float]]]:
    return [[t.behaviour_logprobs for t in g.trajectories] for g in groups]


def _learner_logprobs(model: torch.nn.Module, trajectories: list, pad_id: int, temperature: float) -> torch.Tensor:
    batch = completion_batch(trajectories, [0.0] * len(trajectories), pad_id)
    with torch.no_grad():
        return completion_logprobs(model, batch, torch.device("cpu"), temperature) * batch.mask


# ----------------------------------------------------------------------------- the embedded engine


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 1.0), (1.0, 0.9)])
def test_engine_records_the_exact_tokens_and_their_behaviour_logprobs(
    engine: EmbeddedRolloutEngine, temperature: float, top_p: float
) -> None:
    tok = engine.tokenizer
    groups = rollout_groups(
        engine, tok, TASKS[:2], 3, SamplingConfig(max_new_tokens=10, temperature=temperature, top_p=top_p), seed=0
    )
    assert [len(g.trajectories) for g in groups] == [3, 3] and [g.task for g in groups] == TASKS[:2]
    flat = [t for g in groups for t in g.trajectories]
    for group in groups:
        assert all(t.prompt_ids == prompt_ids(tok, group.task) for t in group.trajectories)
    for t in flat:
        assert 1 <= len(t.completion_ids) <= 10 and len(t.behaviour_logprobs) == len(t.completion_ids)
        assert t.finished == (t.completion_ids[-1] == tok.eos_token_id)
        assert t.finished or len(t.completion_ids) == 10
        assert tok.eos_token_id not in t.completion_ids[:-1]
        assert t.text == tok.decode(t.completion_ids, skip_special_tokens=True)
    # teacher forcing the same ids in the learner's own layout gives the recorded log-probs (untruncated
    # by top_p: the learner scores the full distribution)
    batch = completion_batch(flat, [0.0] * len(flat), engine.pad_token_id)
    learner = _learner_logprobs(engine.model, flat, engine.pad_token_id, temperature)
    torch.testing.assert_close(learner, batch.old_logprobs, atol=1e-4, rtol=0)
    assert (batch.old_logprobs < 0).sum() == batch.mask.sum()


def test_each_prompt_is_prefilled_once_for_its_group_and_finished_rows_leave(
    tiny_dir: Path, forwards: list[tuple[int, int]], engine: EmbeddedRolloutEngine
) -> None:
    """Lowercase letters stop a completion here, so rows end at different steps: each row is decoded
    for exactly as many steps as it has tokens after the first (which the prefill chose)."""
    letters = [engine.tokenizer.convert_tokens_to_ids(c) for c in "abcdefghijklmnopqrstuvwxyz"]
    stopping = EmbeddedRolloutEngine(engine.model, engine.tokenizer, stop_token_ids=letters)
    groups = stopping.generate(
        [prompt_ids(engine.tokenizer, t) for t in TASKS[:2]], 8, SamplingConfig(max_new_tokens=12), seed=3
    )
    shared, own, decode = forwards[0], forwards[1], forwards[2:]
    # the prompts' common start (the chat template's, "Write lowercase") runs once for one row, then each prompt's
    # own tokens once: two prefilled rows for 16
    assert shared[0] == 1 and shared[1] >= SHARED_PREFIX_MIN and own[0] == 2 and own[1] > 1
    assert all(tokens == 1 for _, tokens in decode)
    rows = [r for r, _ in decode]
    assert rows == sorted(rows, reverse=True) and rows[-1] < 16
    completions = [c for g in groups for c in g]
    assert len(decode) == max(len(c.token_ids) for c in completions) - 1
    assert sum(rows) == sum(len(c.token_ids) - 1 for c in completions)
    assert len({len(c.token_ids) for c in completions}) > 2  # mixed lengths, the case continuous batching is for
    for c in completions:
        assert c.finished == (c.token_ids[-1] in letters) and (c.finished or len(c.token_ids) == 12)


def test_waiting_groups_join_as_rows_leave_within_max_num_seqs(
    engine: EmbeddedRolloutEngine, forwards: list[tuple[int, int]]
) -> None:
    capped = EmbeddedRolloutEngine(engine.model, engine.tokenizer, max_num_seqs=8)
    groups = capped.generate(
        [prompt_ids(engine.tokenizer, t) for t in TASKS], 4, SamplingConfig(max_new_tokens=6), seed=0
    )
    assert [len(g) for g in groups] == [4, 4, 4, 4]
    prefills = [rows for rows, tokens in forwards if tokens > 1]
    assert (
        prefills[:2] == [1, 2] and len(prefills) >= 3
    )  # two groups fit at first (their common start once); the others joined later
    decoded_rows = [rows for rows, tokens in forwards if tokens == 1]
    assert max(decoded_rows) <= 8


def test_seeded_sampling_is_reproducible(engine: EmbeddedRolloutEngine) -> None:
    prompts = [prompt_ids(engine.tokenizer, t) for t in TASKS[:2]]
    sampling = SamplingConfig(max_new_tokens=8)
    first, again, other = (engine.generate(prompts, 4, sampling, seed=s) for s in (11, 11, 12))
    assert first == again
    assert first != other


def test_tiny_top_p_keeps_only_the_most_likely_token(engine: EmbeddedRolloutEngine) -> None:
    """top_p truncates what is drawn (here to the argmax: greedy output) but the recorded log-probs
    stay those of the full distribution."""
    prompts = [prompt_ids(engine.tokenizer, t) for t in TASKS[:2]]
    greedy = engine.generate(prompts, 1, SamplingConfig(max_new_tokens=8, temperature=0.0))
    nucleus = engine.generate(prompts, 3, SamplingConfig(max_new_tokens=8, temperature=1.0, top_p=1e-6), seed=0)
    for g, n in zip(greedy, nucleus):
        assert all(c.token_ids == g[0].token_ids for c in n)
        assert all(lp < -1e-3 for c in n for lp in c.logprobs)  # not log 1: the untruncated distribution


def test_load_weights_tags_the_version_and_changes_what_is_sampled(
    engine: EmbeddedRolloutEngine, other_state: dict[str, torch.Tensor]
) -> None:
    sampling = SamplingConfig(max_new_tokens=8)
    assert isinstance(engine, InferenceEngine)
    original = snapshot_state(engine.model)
    before = rollout_groups(engine, engine.tokenizer, TASKS[:2], 4, sampling, seed=5)
    assert {g.policy_version for g in before} == {0}
    engine.load_weights(other_state, version=3)
    after = rollout_groups(engine, engine.tokenizer, TASKS[:2], 4, sampling, seed=5)
    assert engine.version == 3 and {g.policy_version for g in after} == {3}
    assert logprobs(after) != logprobs(before)
    engine.load_weights(original, version=4)
    restored = rollout_groups(engine, engine.tokenizer, TASKS[:2], 4, sampling, seed=5)
    assert ids(restored) == ids(before) and logprobs(restored) == logprobs(before)
    assert {g.policy_version for g in restored} == {4}


def test_serving_sequences_record_no_logprobs_unless_asked(engine: EmbeddedRolloutEngine) -> None:
    prompt = prompt_ids(engine.tokenizer, TASKS[0])
    plain = Sequence(prompt, SamplingParams(max_new_tokens=5, temperature=1.0, seed=1), frozenset())
    logged = Sequence(prompt, SamplingParams(max_new_tokens=5, temperature=1.0, seed=1, logprobs=True), frozenset())
    generate_batch(engine.model, [plain])
    generate_batch(engine.model, [logged])
    assert plain.logprobs == [] and len(logged.logprobs) == len(logged.generated) == 5
    assert plain.generated == logged.generated  # recording changes nothing about what is drawn


# ----------------------------------------------------------------------------- the log-prob check


def test_mismatch_figures_on_recorded_logprobs() -> None:
    behaviour = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, 0.0, 0.0]], dtype=torch.float64)
    learner = behaviour + torch.tensor(
        [[0.1, -0.1, 0.2], [0.0, 5.0, 5.0]], dtype=torch.float64
    )  # padding (mask 0) differs
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    m = logprob_mismatch(behaviour, learner, mask)
    d = torch.tensor([0.1, -0.1, 0.2, 0.0], dtype=torch.float64)
    assert m.tokens == 4
    assert m.mean_abs_diff == pytest.approx(0.1) and m.max_abs_diff == pytest.approx(0.2)
    assert m.kl_k1 == pytest.approx(float(-d.mean()))
    assert m.kl_k3 == pytest.approx(float((d.exp() - d - 1).mean())) and m.kl_k3 > 0
    assert m.ratio_min == pytest.approx(float(d.exp().min())) and m.ratio_max == pytest.approx(float(d.exp().max()))
    assert set(m.metrics()) >= {"rollout/logprob_mean_abs_diff", "rollout/logprob_kl_k3"}
    check_logprob_mismatch(m, MismatchTolerance(mean_abs_diff=0.2, kl_k3=0.1))
    with pytest.raises(LogprobMismatchError, match=r"mean_abs_diff 0\.1 > 0\.05") as err:
        check_logprob_mismatch(m, MismatchTolerance(mean_abs_diff=0.05, kl_k3=0.1, max_abs_diff=0.3))
    assert err.value.mismatch is m
    with pytest.raises(LogprobMismatchError, match=r"max_abs_diff 0\.2 > 0\.15"):
        check_logprob_mismatch(m, MismatchTolerance(mean_abs_diff=1.0, kl_k3=1.0, max_abs_diff=0.15))
    with pytest.raises(ValueError, match="mean_abs_diff must be > 0"):
        MismatchTolerance(mean_abs_diff=0)
    with pytest.raises(ValueError, match="selects no tokens"):
        logprob_mismatch(behaviour, learner, torch.zeros_like(mask))


def test_mismatch_check_passes_for_the_engine_and_fails_for_stale_weights(
    engine: EmbeddedRolloutEngine, other_state: dict[str, torch.Tensor], tiny_dir: Path
) -> None:
    """The learner holds the directory's weights: an engine holding them agrees to fp32 precision; one
    still holding other weights (a missed push) is stopped with a clear error."""
    learner, _ = load_policy(tiny_dir)
    sampling = SamplingConfig(max_new_tokens=10, temperature=0.8)
    flat = [t for g in rollout_groups(engine, engine.tokenizer, TASKS, 4, sampling, seed=0) for t in g.trajectories]
    agreeing = measure_logprob_mismatch(learner, flat, pad_id=engine.pad_token_id, temperature=0.8)
    assert agreeing.mean_abs_diff < 1e-5 and agreeing.max_abs_diff < 1e-4 and abs(agreeing.ratio_mean - 1) < 1e-5
    check_logprob_mismatch(agreeing)
    engine.load_weights(other_state, version=1)
    stale = [t for g in rollout_groups(engine, engine.tokenizer, TASKS, 4, sampling, seed=0) for t in g.trajectories]
    drifted = measure_logprob_mismatch(learner, stale, pad_id=engine.pad_token_id, temperature=0.8)
    with pytest.raises(LogprobMismatchError, match="load_weights ran after the last update"):
        check_logprob_mismatch(drifted)
    assert drifted.mean_abs_diff > 100 * agreeing.mean_abs_diff


# ----------------------------------------------------------------------------- the vLLM engine, on a fake LLM


class FakeLLM:
    """Records what a ``vllm.LLM`` is built with and asked; samples ``[prompt[-1] + k + 1 for k < len]``
    with log-prob ``-0.5 * (k + 1)``, length 3 and finish reason ``stop`` for the first sample, 2 and
    ``length`` for the others."""

    built: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, **kwargs: Any) -> None:
        FakeLLM.built.append(kwargs)
        self.kwargs, self.calls, self.resets = kwargs, [], 0
        self.rpcs: list[tuple[str, dict[str, Any]]] = []

    def generate(
        self, prompts: list[dict[str, list[int]]], sampling_params: dict[str, Any], use_tqdm: bool
    ) -> list[Any]:
        self.calls.append({"prompts": prompts, "params": sampling_params, "use_tqdm": use_tqdm})
        return [
            SimpleNamespace(outputs=[self._sample(p["prompt_token_ids"], j) for j in range(sampling_params["n"])])
            for p in prompts
        ]

    @staticmethod
    def _sample(prompt: list[int], j: int) -> Any:
        ids = [prompt[-1] + k + 1 for k in range(3 if j == 0 else 2)]
        logprobs = [{tok: SimpleNamespace(logprob=-0.5 * (k + 1), rank=1)} for k, tok in enumerate(ids)]
        return SimpleNamespace(token_ids=ids, logprobs=logprobs, finish_reason="stop" if j == 0 else "length")

    def reset_prefix_cache(self) -> None:
        self.resets += 1

    def collective_rpc(
        self, method: str, timeout: float | None = None, args: tuple = (), kwargs: dict | None = None
    ) -> list:
        self.rpcs.append((method, kwargs or {}))
        return [None]


class OldRpcLLM(FakeLLM):
    """Workers without an in-place reload: the engine saves the weights and builds a new LLM on them."""

    def collective_rpc(
        self, method: str, timeout: float | None = None, args: tuple = (), kwargs: dict | None = None
    ) -> list:
        raise AttributeError(f"'Worker' object has no attribute {method!r}")


def _vllm(tiny_dir: Path, llm_class: type, tmp_path: Path) -> VLLMRolloutEngine:
    FakeLLM.built.clear()
    return VLLMRolloutEngine(
        tiny_dir,
        args=VllmProfile.for_rollouts(tiny_dir, gpu_memory_utilization=0.3, max_model_len=1024, seed=7),
        weights_dir=tmp_path / "weights",
        llm_class=llm_class,
        sampling_params_class=dict,
    )


def test_vllm_engine_builds_its_arguments_and_reads_the_outputs(tiny_dir: Path, tmp_path: Path) -> None:
    engine = _vllm(tiny_dir, FakeLLM, tmp_path)
    assert FakeLLM.built == [
        {
            "model": str(tiny_dir),
            "dtype": "auto",
            "gpu_memory_utilization": 0.3,
            "enable_prefix_caching": True,
            "enforce_eager": False,
            "seed": 7,
            "logprobs_mode": "processed_logprobs",
            "max_model_len": 1024,
        }
    ]
    _, tokenizer = load_policy(tiny_dir)
    sampling = SamplingConfig(max_new_tokens=16, temperature=0.9, top_p=0.95)
    groups = rollout_groups(engine, tokenizer, TASKS[:2], 3, sampling, seed=4)
    call = engine.llm.calls[0]
    prompts = [prompt_ids(tokenizer, t) for t in TASKS[:2]]
    assert call["prompts"] == [{"prompt_token_ids": p} for p in prompts] and call["use_tqdm"] is False
    assert call["params"] == {"n": 3, "temperature": 0.9, "top_p": 0.95, "max_tokens": 16, "logprobs": 0, "seed": 4}
    for prompt, group in zip(prompts, groups):
        first, rest = group.trajectories[0], group.trajectories[1:]
        assert first.completion_ids == [prompt[-1] + 1, prompt[-1] + 2, prompt[-1] + 3] and first.finished
        assert first.behaviour_logprobs == [-0.5, -1.0, -1.5] and first.prompt_ids == prompt
        assert all(len(t.completion_ids) == 2 and not t.finished for t in rest)
        assert group.policy_version == 0


def test_vllm_engine_pushes_weights_through_the_workers_reload_and_tags_the_version(
    tiny_dir: Path, tmp_path: Path, other_state: dict[str, torch.Tensor]
) -> None:
    """Weights go through ``collective_rpc("reload_weights")``, never the model object's private attributes, with
    ``lm_head.weight`` named though the state ties it to the embeddings (vLLM's CPU backend keeps its own copy)."""
    engine = _vllm(tiny_dir, FakeLLM, tmp_path)
    tied = {k: v for k, v in other_state.items() if k != "lm_head.weight"}
    engine.load_weights(tied, version=2)
    engine.load_weights(other_state, version=3)
    (method, first), (_, second) = engine.llm.rpcs
    assert method == "reload_weights" and engine.weight_sync == "collective_rpc"
    sent = dict(first["weights_iterator"])
    assert sent.keys() == tied.keys() | {"lm_head.weight"}
    assert torch.equal(sent["lm_head.weight"], tied["model.embed_tokens.weight"])
    assert dict(second["weights_iterator"]).keys() == other_state.keys() | {"lm_head.weight"}
    assert engine.llm.resets == 2 and engine.version == 3 and len(FakeLLM.built) == 1  # no rebuild
    _, tokenizer = load_policy(tiny_dir)
    assert {g.policy_version for g in rollout_groups(engine, tokenizer, TASKS[:1], 2, SamplingConfig())} == {3}


def test_vllm_engine_falls_back_to_saving_and_reloading(
    tiny_dir: Path, tmp_path: Path, other_state: dict[str, torch.Tensor]
) -> None:
    engine = _vllm(tiny_dir, OldRpcLLM, tmp_path)
    engine.load_weights(other_state, version=6)
    saved = tmp_path / "weights" / "version-6"
    assert engine.weight_sync == "reload_from_dir" and engine.version == 6
    assert [b["model"] for b in FakeLLM.built] == [str(tiny_dir), str(saved)] and engine.llm.kwargs["seed"] == 7
    assert json.loads((saved / "config.json").read_text()) == json.loads((tiny_dir / "config.json").read_text())
    assert (saved / "tokenizer.json").is_file() and [p.name for p in saved.parent.iterdir()] == ["version-6"]
    tensors = load_file(str(saved / "model.safetensors"))
    assert tensors.keys() == other_state.keys() | {"lm_head.weight"}
    assert all(torch.equal(tensors[k], v) for k, v in other_state.items())
    engine.load_weights(other_state, version=7)
    assert sorted(p.name for p in (tmp_path / "weights").iterdir()) == ["version-7"]  # the older version is gone


def test_vllm_engine_refuses_outputs_without_logprobs(tiny_dir: Path, tmp_path: Path) -> None:
    engine = _vllm(tiny_dir, FakeLLM, tmp_path)
    engine.llm._sample = lambda prompt, j: SimpleNamespace(token_ids=[5, 6], logprobs=None, finish_reason="length")
    with pytest.raises(RuntimeError, match="log-probs for 0 of 2 sampled tokens"):
        engine.generate([[1, 2]], 1, SamplingConfig())


class FakeEngineLoop:
    """vLLM's engine loop as a batcher drives it (``add_request`` between ``step`` s): a request finishes
    ``params["max_tokens"]`` steps after it was added, its tokens ``prompt[-1] + 1 ...``, and none finishes before
    ``hold_until`` requests have joined; records when each request joined and how many were running then.
    ``fail_running``: the first step with that many requests running raises."""

    def __init__(self, hold_until: int = 0, fail_running: int | None = None) -> None:
        self.steps, self.hold_until, self.fail_running = 0, hold_until, fail_running
        self.running: dict[str, tuple[list[int], dict[str, Any], int]] = {}
        self.joined: list[tuple[str, int, int]] = []  # (request id, step it joined before, requests already running)
        self.aborted: list[str] = []

    def add_request(self, request_id: str, prompt: dict[str, list[int]], params: dict[str, Any]) -> None:
        self.joined.append((request_id, self.steps, len(self.running)))
        self.running[request_id] = (prompt["prompt_token_ids"], params, self.steps)

    def step(self) -> list[Any]:
        self.steps += 1
        time.sleep(0.01)
        if len(self.running) == self.fail_running:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        done = [
            r
            for r, (_, params, added) in self.running.items()
            if self.steps - added >= params["max_tokens"] and len(self.joined) >= self.hold_until
        ]
        outputs = []
        for request_id in done:
            prompt, params, _ = self.running.pop(request_id)
            ids = [prompt[-1] + k + 1 for k in range(params["max_tokens"])]
            out = SimpleNamespace(
                token_ids=ids,
                logprobs=[{t: SimpleNamespace(logprob=-0.1 * params["seed"])} for t in ids],
                finish_reason="length",
            )
            outputs.append(SimpleNamespace(request_id=request_id, finished=True, outputs=[out]))
        # requests still running report unfinished (cumulative) outputs, as vLLM's default output kind does
        outputs += [SimpleNamespace(request_id=r, finished=False, outputs=[]) for r in self.running]
        return outputs

    def abort_request(self, request_ids: list[str]) -> None:
        self.aborted += request_ids
        for r in request_ids:
            self.running.pop(r, None)


def _loop_engine(tiny_dir: Path, tmp_path: Path, loop: FakeEngineLoop) -> VLLMRolloutEngine:
    engine = _vllm(tiny_dir, FakeLLM, tmp_path)
    engine.llm.llm_engine = loop
    return engine


def test_vllm_batcher_serves_many_episode_threads_through_vllms_engine_loop(tiny_dir: Path, tmp_path: Path) -> None:
    """A multi-turn environment on vLLM: each caller's request joins the engine loop between steps while others run
    (continuous batching), comes back as its own completion with its log-probs, seeded request by request."""
    loop = FakeEngineLoop(hold_until=4)
    engine = _loop_engine(tiny_dir, tmp_path, loop)
    engine.version = 4
    batcher = engine.batcher(seed=10)
    assert isinstance(batcher, VLLMBatcher) and batcher.version == 4
    sampling = SamplingConfig(max_new_tokens=6, temperature=0.8, top_p=0.9)
    results: dict[int, Any] = {}

    def episode(i: int) -> None:
        while len(loop.joined) < i:  # callers arrive one after another while the earlier ones are being decoded
            time.sleep(0.005)
        results[i] = batcher.complete([100 * (i + 1)], sampling, max_new_tokens=3 + i)

    threads = [threading.Thread(target=episode, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    batcher.close()
    for i, completion in results.items():
        assert completion.token_ids == [100 * (i + 1) + k + 1 for k in range(3 + i)] and not completion.finished
    assert sorted(results) == [0, 1, 2, 3]
    assert [already for _, _, already in loop.joined] == [
        0,
        1,
        2,
        3,
    ] and not loop.running  # each joined the running batch
    assert all(step > 0 for _, step, _ in loop.joined[1:])  # between steps, not before the first
    seeds = sorted(round(-c.logprobs[0] / 0.1) for c in results.values())
    assert seeds == [10, 11, 12, 13]  # request j draws with seed + j
    with pytest.raises(RuntimeError, match="closed"):
        batcher.complete([1], sampling)


def test_vllm_batcher_fails_the_waiting_callers_when_the_engine_fails(tiny_dir: Path, tmp_path: Path) -> None:
    """A failed engine step reaches every caller waiting on it (their requests aborted in vLLM), and the batcher
    serves the next requests."""
    loop = FakeEngineLoop(hold_until=3, fail_running=2)
    batcher = _loop_engine(tiny_dir, tmp_path, loop).batcher()
    errors: list[BaseException] = []

    def call() -> None:
        try:
            batcher.complete([7], SamplingConfig(), max_new_tokens=1)
        except RuntimeError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert len(errors) == 2 and all("illegal memory access" in str(e) for e in errors), errors
    assert sorted(loop.aborted) == sorted(r for r, *_ in loop.joined)
    assert batcher.complete([7], SamplingConfig(), max_new_tokens=2).token_ids == [8, 9]
    batcher.close()


def test_vllm_engine_without_vllm_says_how_to_install_it(tiny_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm now raises ImportError, installed or not
    with pytest.raises(ImportError, match=r"posttrain\[gpu\]"):
        VLLMRolloutEngine(tiny_dir)


def episodes(
    batcher, starts: list[list[int]], sampling: SamplingConfig, turns: int, *, concurrent: bool
) -> list[list[Any]]:  # type: ignore[no-untyped-def]
    """Synthetic multi-turn episodes: each turn's prompt is the last prompt, the reply and a few tokens the
    'environment' adds; the completions of every turn, per episode."""

    def run(start: list[int], out: list[Any]) -> None:
        prompt = list(start)
        for turn in range(turns):
            completion = batcher.complete(prompt, sampling)
            out.append(completion)
            prompt = prompt + completion.token_ids + [5 + turn, 7, 11 + len(out)]

    results: list[list[Any]] = [[] for _ in starts]
    threads = [threading.Thread(target=run, args=(s, r)) for s, r in zip(starts, results)]
    for thread in threads:
        thread.start()
        if not concurrent:
            thread.join()
    for thread in threads:
        thread.join()
    return results


@pytest.mark.parametrize("concurrent,temperature", [(True, 0.0), (False, 1.0)])
def test_turns_that_go_on_from_a_cached_prefix_give_the_tokens_a_whole_prefill_gives(
    tiny_dir: Path, concurrent: bool, temperature: float
) -> None:
    """Greedy episodes side by side, and sampled ones one after another (so both runs draw the same numbers): the
    same tokens and log-probs with the KV cache kept between turns as with every turn prefilled whole."""
    sampling = SamplingConfig(max_new_tokens=12, temperature=temperature)
    starts = [[1 + i, 20 + i, 30, 31, 32, 33 + i] for i in range(4)]
    runs = {}
    for keep in (0, 64 << 20):
        engine = EmbeddedRolloutEngine.from_dir(tiny_dir, prefix_cache_bytes=keep, stop_token_ids=[])
        batcher = engine.batcher(seed=3)
        try:
            runs[keep] = (episodes(batcher, starts, sampling, turns=4, concurrent=concurrent), batcher.reused_tokens)
        finally:
            batcher.close()
    (whole, none_reused), (kept, reused) = runs[0], runs[64 << 20]
    assert none_reused == 0 and reused > 0.5 * sum(len(s) + 4 * 12 for s in starts)  # most of each later turn's prompt
    for a, b in zip(whole, kept):
        assert [c.token_ids for c in a] == [c.token_ids for c in b]
        assert torch.allclose(
            torch.tensor([x for c in a for x in c.logprobs]),
            torch.tensor([x for c in b for x in c.logprobs]),
            atol=1e-4,
        )


def test_a_turn_from_a_cached_prefix_keeps_one_copy_of_its_kv(engine: EmbeddedRolloutEngine) -> None:
    """Once the batch holds a turn's cache, the prefix it was made from is let go: an episode's kept KV is not
    held twice (in the batch and in the sequence) while the turn decodes."""
    import weakref

    from posttrain.platform.engines.generation import DecodeBatch

    first = Sequence([1, 20, 30, 31, 32, 33], SamplingParams(max_new_tokens=4), frozenset(), keep_kv=True)
    generate_batch(engine.model, [first], pad_token_id=engine.pad_token_id)
    assert first.kv is not None
    prefix, first.kv = first.kv, None
    kept = weakref.ref(prefix.layers[0][0])
    turn = Sequence(list(prefix.token_ids) + [5, 7, 9], SamplingParams(max_new_tokens=4), frozenset(), prefix=prefix)
    del prefix
    batch = DecodeBatch(engine.model, pad_token_id=engine.pad_token_id)
    batch.add([turn])
    assert turn.prefix is None and kept() is None and len(batch) == 1


def test_the_prefix_store_keeps_its_budget_and_forgets_stale_weights() -> None:
    from posttrain.platform.engines.generation import KVPrefix
    from posttrain.training.inference import PrefixStore

    def prefix(ids: tuple[int, ...]) -> KVPrefix:
        return KVPrefix(ids, ((torch.zeros(1, len(ids), 2), torch.zeros(1, len(ids), 2)),))

    store = PrefixStore(max_bytes=prefix((1, 2, 3)).nbytes * 2)
    store.put(prefix((1, 2)), version=0)
    store.put(prefix((1, 2, 3)), version=0)
    assert store.take([1, 2, 3], version=0).token_ids == (1, 2)  # type: ignore[union-attr]  # a proper start only
    store.put(prefix((4, 5, 6)), version=0)
    store.put(prefix((7, 8, 9)), version=0)  # over budget: the oldest goes
    assert store.take([1, 2, 3, 4], version=0) is None and store.take([4, 5, 6, 0], version=0) is not None
    assert store.take([7, 8, 9, 0], version=1) is None  # new weights: nothing cached is valid
    store.put(prefix((7, 8, 9)), version=1)
    store.clear()
    assert store.take([7, 8, 9, 0], version=1) is None


def test_a_batcher_forgets_its_prefixes_when_the_episodes_are_over(tiny_dir: Path) -> None:
    engine = EmbeddedRolloutEngine.from_dir(tiny_dir, stop_token_ids=[])
    batcher = engine.batcher(seed=0)
    sampling = SamplingConfig(max_new_tokens=4, temperature=0.0)
    try:
        first = batcher.complete([1, 20, 30, 31], sampling)
        batcher.forget_prefixes()
        turn = [1, 20, 30, 31, *first.token_ids, 5, 7]
        second = batcher.complete(turn, sampling)
        assert batcher.reused_tokens == 0  # the next turn was prefilled whole: nothing was kept
        batcher.complete([*turn, *second.token_ids, 9], sampling)
        assert batcher.reused_tokens >= len(turn)  # kept as before when not forgotten
    finally:
        batcher.close()
