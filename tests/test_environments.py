"""Environments: multi-turn episodes token-in, token-out on the real model's template, sandboxes
acquired per episode (a killed one redone, never scored), the model's tool mistakes as data, plugins
that fail, and a GRPO run on tool_use through the real worker whose episodes the console browses."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import OPERATOR, REPO_ROOT, login_as, reachable_dir, run_worker_until_idle
from required_parts import require
from sqlmodel import select
from streamlit.testing.v1 import AppTest
from test_training_tiny import tiny_policy_dir
from transformers import AutoTokenizer

from posttrain.platform import metric_names as names
from posttrain.platform.db.engine import session
from posttrain.platform.db.models import JobStatus, Metric, Trajectory
from posttrain.platform.jobs import queue
from posttrain.platform.models.registry import register_model
from posttrain.platform.sandbox import Sandbox, SandboxConfig, SandboxPool
from posttrain.platform.tasks.domains.registry import generate
from posttrain.platform.verifiers import TaskSpec, VerifierService
from posttrain.training.config import GRPOConfig, SamplingConfig
from posttrain.training.environments import EnvironmentLoadError, load_environment
from posttrain.training.environments.runner import EpisodeRunner, episode_metrics
from posttrain.training.environments.tool_use import ToolUse
from posttrain.training.inference import Completion, ContinuousBatcher, EmbeddedRolloutEngine
from posttrain.training.logprob_check import measure_logprob_mismatch
from posttrain.training.rollouts import has_signal

PY = '<tool_call>{{"name": "python", "arguments": {{"code": {code}}}}}</tool_call>'


def tool_call(code: str) -> str:
    import json

    return PY.format(code=json.dumps(code))


class ScriptedClient:
    """A policy whose first turns are given (their log-probs scored by ``model`` as a sampler records
    them, or 0 without one); after the script, ``then`` samples (the real batcher) or the episode answers."""

    def __init__(
        self, tokenizer: Any, script: Sequence[str], model: Any = None, then: ContinuousBatcher | None = None
    ) -> None:
        self.tokenizer, self.script, self.model, self.then = tokenizer, list(script), model, then
        self.version = 0

    def complete(
        self, prompt_ids: Sequence[int], sampling: SamplingConfig, *, max_new_tokens: int | None = None
    ) -> Completion:
        if not self.script and self.then is not None:
            return self.then.complete(prompt_ids, sampling, max_new_tokens=max_new_tokens)
        text = self.script.pop(0) if self.script else "done"
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) + [self.tokenizer.eos_token_id]
        logprobs = [0.0] * len(ids)
        if self.model is not None:
            with torch.no_grad():
                logits = self.model(torch.tensor([list(prompt_ids) + ids])).logits[0, len(prompt_ids) - 1 : -1].float()
            logprobs = torch.gather(F.log_softmax(logits / sampling.temperature, -1), 1, torch.tensor(ids)[:, None])[
                :, 0
            ].tolist()
        return Completion(ids, logprobs, True)

    def forget_prefixes(self) -> None:
        if self.then is not None:
            self.then.forget_prefixes()


@pytest.fixture(scope="module")
def pool() -> SandboxPool:
    require("bubblewrap")
    root = reachable_dir()
    with SandboxPool(SandboxConfig(pool_size=2, call_timeout_s=5), data_dir=root) as p:
        yield p
    shutil.rmtree(root, ignore_errors=True)


def _config(**environment: Any) -> GRPOConfig:
    return GRPOConfig(
        model="m",
        domains=["arith.add.int"],
        algorithm={"group_size": 2},
        sampling={"max_new_tokens": 48},
        environment={"name": "tool_use", "concurrency": 2, **environment},
        rollout={"backend": "thread"},
    )


def _task() -> TaskSpec:
    return generate("arith.add.int", 1, seed=3)[0]


def test_three_turns_token_in_token_out_on_the_real_template(real_model: Any, pool: SandboxPool) -> None:
    """Two tool turns, then the real model samples its answer: every policy token is kept as sampled,
    the learner's recomputed log-probs equal the behaviour ones on each of them, the tool tokens carry
    no loss weight, and the episode's ids are exactly the template's rendering of its messages."""
    model, tokenizer = real_model.model, real_model.tokenizer
    config = _config(max_turns=3)
    env = ToolUse(config.environment, tokenizer, config.sampling)
    engine = EmbeddedRolloutEngine(model, tokenizer, stop_token_ids=[tokenizer.eos_token_id])
    batcher = ContinuousBatcher(engine, seed=1)
    try:
        client = ScriptedClient(
            tokenizer, [tool_call("x = 20 + 22\nprint(x)"), tool_call("print(x * 2)")], model, batcher
        )
        with pool.acquire() as sandbox:
            episode = env.rollout(client, _task(), sandbox)
    finally:
        batcher.close()
    assert [t.role for t in episode.turns] == ["assistant", "tool", "assistant", "tool", "assistant"], episode.turns
    assert episode.stop_reason in ("answer", "length") and episode.policy_turns == 3
    assert [c.output.strip() for c in episode.tool_calls] == ["42", "84"]  # globals persist within the episode

    mask = episode.loss_mask
    assert len(mask) == len(episode.token_ids) == len(episode.logprobs)
    policy = [i for i, m in zip(episode.token_ids, mask) if m]
    environment = tokenizer.decode([i for i, m in zip(episode.token_ids, mask) if not m])
    assert "42" in environment and "84" in environment and "<|im_start|>" in environment  # tool output, turn markers
    assert "42" not in tokenizer.decode(policy).replace("20 + 22", "")  # the policy never wrote the tool output
    assert all(lp == 0.0 for lp, m in zip(episode.logprobs, mask) if not m)

    # the template renders the episode's messages to exactly its ids (no drift between turns)
    messages = env.messages(episode.task)
    for turn in episode.turns:
        messages.append(
            {"role": turn.role, "content": turn.content} | ({"name": "python"} if turn.role == "tool" else {})
        )
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    decoded = tokenizer.decode(episode.all_ids)
    assert rendered.startswith(decoded) and rendered[len(decoded) :].strip() == "", (rendered[-200:], decoded[-200:])

    from posttrain.training.environments.runner import trajectory

    mismatch = measure_logprob_mismatch(model, [trajectory(episode)], pad_id=tokenizer.pad_token_id, temperature=1.0)
    assert mismatch.tokens == sum(mask) == len(policy)  # scored on the policy's tokens only
    assert mismatch.max_abs_diff < 1e-3, mismatch

    # the learner's update weighs only the policy's tokens
    from posttrain.training.learner import completion_batch

    batch = completion_batch([trajectory(episode)], [1.0], tokenizer.pad_token_id)
    assert batch.mask[0, : len(mask)].tolist() == [float(m) for m in mask]


class KillsItsSandbox(ToolUse):
    """Kills the sandbox from outside before the first tool call of its first ``kills`` episodes."""

    kills = 1

    def prepare(self, task: TaskSpec, sandbox: Sandbox | None) -> None:
        if KillsItsSandbox.kills > 0 and sandbox is not None and sandbox.pid is not None:
            KillsItsSandbox.kills -= 1
            os.killpg(sandbox.pid, signal.SIGKILL)
            deadline = time.monotonic() + 10  # its processes inside die with it, a moment later
            while sandbox.intact() and time.monotonic() < deadline:
                time.sleep(0.01)


def _tokenizer(real_model_dir: Any) -> Any:
    return AutoTokenizer.from_pretrained(real_model_dir.path)


def _runner(env: Any, tokenizer: Any, pool: SandboxPool, config: GRPOConfig, script: list[str]) -> EpisodeRunner:
    runner = EpisodeRunner.__new__(EpisodeRunner)  # the scripted client instead of a batcher on a model
    runner.environment, runner.env_config, runner.service = env, config.environment, VerifierService()
    runner.group_size = config.algorithm.group_size
    runner.client, runner.pool, runner._own_pool = ScriptedClient(tokenizer, script), pool, False
    from concurrent.futures import ThreadPoolExecutor

    runner._threads = ThreadPoolExecutor(max_workers=1)
    return runner


def test_an_episode_whose_sandbox_is_killed_is_redone_and_never_scored(real_model_dir: Any, pool: SandboxPool) -> None:
    tokenizer = _tokenizer(real_model_dir)
    config = _config(infra_retries=1)
    task = _task()
    answer = task.reference or "0"
    KillsItsSandbox.kills = 1
    # the first attempt's call meets a dead sandbox; the redone episode calls again and answers; then the
    # two episodes of a group, each killed on both its attempts
    runner = _runner(
        KillsItsSandbox(config.environment, tokenizer, config.sampling),
        tokenizer,
        pool,
        config,
        [tool_call("print(1)"), tool_call("print(1)"), answer] + [tool_call("print(1)")] * 4,
    )
    episode = runner.episode(task)
    assert episode.attempts == 2 and episode.scored and episode.stop_reason == "answer"
    assert episode.verdict is not None and episode.verdict.passed and [c.status for c in episode.tool_calls] == ["ok"]

    KillsItsSandbox.kills = 4  # more than its retries: kept unscored, and its group has no learning signal
    groups = runner.groups([task])
    failed = [t.episode for t in groups[0].trajectories]
    assert all(e.stop_reason == "infrastructure_failure" and e.attempts == 2 for e in failed), [
        (e.stop_reason, e.attempts, e.error, [(t.role, t.content[:60]) for t in e.turns]) for e in failed
    ]
    assert all(t.reward is None for t in groups[0].trajectories) and groups[0].infra_errors == 2
    assert not has_signal(groups[0])
    metrics = episode_metrics(failed)
    assert metrics[names.ENV_INFRA_REDONE] >= 1 and metrics[names.ENV_UNSCORED] >= 1
    KillsItsSandbox.kills = 0
    runner._threads.shutdown()


def test_tool_mistakes_are_tool_errors_the_model_reads_next_turn(real_model_dir: Any, pool: SandboxPool) -> None:
    tokenizer = _tokenizer(real_model_dir)
    config = _config(max_turns=6, tool_output_chars=300, tool_timeout_s=1)
    env = ToolUse(config.environment, tokenizer, config.sampling)
    script = [
        '<tool_call>{"name": "python", "arguments": {"code": </tool_call>',  # does not parse
        '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',  # no such tool
        '<tool_call>{"name": "python", "arguments": {"source": "1"}}</tool_call>',  # bad arguments
        tool_call("import time\ntime.sleep(30)"),  # past its timeout
        tool_call("print('x' * 100000)"),  # floods its output
        "4",
    ]
    with pool.acquire() as sandbox:
        episode = env.rollout(ScriptedClient(tokenizer, script), _task(), sandbox)
    assert episode.stop_reason == "answer" and episode.answer == "4" and episode.policy_turns == 6
    calls = episode.tool_calls
    assert [c.failed for c in calls] == [True] * 5, calls
    assert calls[3].status == "timeout" and len(calls[4].output) < 400 and "output cut at 300" in calls[4].output
    tool_turns = [t.content for t in episode.turns if t.role == "tool"]
    assert "unknown tool 'rm_rf'" in tool_turns[1] and "needs the argument(s) ['code']" in tool_turns[2]
    environment_text = tokenizer.decode([i for i, m in zip(episode.token_ids, episode.loss_mask) if not m])
    assert "unknown tool 'rm_rf'" in environment_text  # what the model reads in its next turn
    assert episode_metrics([episode])[names.ENV_TOOL_ERRORS] >= 4


class Raises(ToolUse):
    name = "raises"

    def rollout(self, client: Any, task: TaskSpec, sandbox: Sandbox | None) -> Any:
        raise KeyError("the plugin's own bug")


def test_a_plugin_that_raises_fails_its_episode_and_one_that_cannot_load_fails_at_start(
    real_model_dir: Any, pool: SandboxPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = _tokenizer(real_model_dir)
    config = _config()
    episode = _runner(Raises(config.environment, tokenizer, config.sampling), tokenizer, pool, config, []).episode(
        _task()
    )
    assert episode.stop_reason == "environment_error" and not episode.scored
    assert "environment 'raises' raised KeyError" in (episode.error or "") and "the plugin's own bug" in (
        episode.error or ""
    )

    # plugins published under the entry-point group: one that loads, one whose module is broken
    (tmp_path / "pt_envs.py").write_text(
        "from posttrain.training.environments.tool_use import ToolUse\nclass Mine(ToolUse):\n    name = 'mine'\n"
    )
    (tmp_path / "pt_broken_env.py").write_text("raise ImportError('needs a package that is not installed')\n")
    dist = tmp_path / "pt_envs-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: pt-envs\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        "[posttrain.environments]\nmine = pt_envs:Mine\nbroken = pt_broken_env:Env\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    mine = load_environment(_config().environment.model_copy(update={"name": "mine"}), tokenizer, config.sampling)
    assert mine.name == "mine" and mine.needs_sandbox
    broken = GRPOConfig(
        model="m", domains=["a"], environment={"name": "broken"}, rollout={"backend": "thread"}
    ).environment
    with pytest.raises(
        EnvironmentLoadError, match=r"^environment 'broken' does not load: ImportError: needs a package"
    ):
        load_environment(broken, tokenizer, config.sampling)
    with pytest.raises(
        ValueError, match="no environment 'nope'; known: broken, code_repair, mine, single_turn, tool_use"
    ):
        GRPOConfig(model="m", domains=["a"], environment={"name": "nope"})
    del sys.modules["pt_envs"]


def _call(name: str, **arguments: Any) -> str:
    import json

    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def test_code_repair_grades_the_final_module_and_nothing_else_the_episode_wrote(
    real_model_dir: Any, pool: SandboxPool
) -> None:
    """The project is laid out; a repair scores 1; an episode that plants fake tests, a conftest, a
    sitecustomize, a rewritten visible test and a process left running, without touching the bug,
    still scores what the planted module scores (0): the hidden tests run elsewhere, on the module alone."""
    from posttrain.platform.verifiers import VerifyContext

    tokenizer = _tokenizer(real_model_dir)
    config = GRPOConfig(
        model="m",
        domains=["repair.off_by_one"],
        environment={"name": "code_repair", "max_turns": 8},
        rollout={"backend": "thread"},
    )
    env = load_environment(config.environment, tokenizer, config.sampling)
    task = generate("repair.off_by_one", 1, seed=0, difficulty=1)[0]
    files = task.metadata["files"]
    service = VerifierService()
    from posttrain.platform.verifiers.sandboxes import set_shared_pool

    previous = set_shared_pool(pool)  # the hidden tests' sandboxes come from the verifier's pool
    try:
        scripts = {
            "looks": [_call("list_dir"), _call("bash", command="python3 test_visible.py"), "DONE"],
            "repairs": [
                _call("write_file", path="solution.py", content=task.reference),
                _call("bash", command="python3 test_visible.py"),
                "DONE",
            ],
            "games": [
                _call("write_file", path="test_hidden.py", content="print('6/6 tests passed')"),
                _call("write_file", path="conftest.py", content="import os\nos._exit(0)\n"),
                _call("write_file", path="sitecustomize.py", content="import os\nos._exit(0)\n"),
                _call("write_file", path="test_visible.py", content="print('all visible tests pass')\n"),
                _call("bash", command="nohup sleep 600 >/dev/null 2>&1 &"),
                "DONE",
            ],
        }
        verdicts = {}
        for name, script in scripts.items():
            with pool.acquire() as sandbox:
                episode = env.rollout(ScriptedClient(tokenizer, script), task, sandbox)
                verdicts[name] = env.score(episode, service, sandbox)
                if name == "looks":
                    listing = episode.tool_calls[0].output
                    assert "solution.py" in listing and "test_visible.py" in listing
                    assert "AssertionError" in episode.tool_calls[1].output  # the model reads the failing test
    finally:
        set_shared_pool(previous)
        service.close()
    assert verdicts["repairs"].score == 1.0 and verdicts["repairs"].passed, verdicts["repairs"]
    planted = VerifierService().verify(task, files["solution.py"], context=VerifyContext(sandbox_pool=pool))
    assert planted.score < 1.0
    assert verdicts["games"].score == verdicts["looks"].score == planted.score, (verdicts, planted)
    assert not verdicts["games"].passed


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("environment, domain", [("tool_use", "format.to_hex"), ("code_repair", "repair.off_by_one")])
def test_grpo_on_an_environment_through_the_worker_stores_episodes_the_console_browses(
    platform_env: dict[str, str],
    db_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    environment: str,
    domain: str,
) -> None:
    sandboxes = reachable_dir()  # the sandbox uid cannot enter pytest's private tmp_path
    monkeypatch.setenv("POSTTRAIN_SANDBOX__ROOT_DIR", str(sandboxes))
    platform_env = {**platform_env, "POSTTRAIN_SANDBOX__ROOT_DIR": str(sandboxes)}
    register_model(OPERATOR, "tiny", tiny_policy_dir(tmp_path / "tiny"))
    job_id = queue.submit(
        OPERATOR,
        "train_grpo",
        {
            "model": "tiny",
            "domains": [domain],
            "scheduler": {"batch_size": 2, "seed": 0},
            "group_size": 2,
            "max_new_tokens": 8,
            "lr": 1e-3,
            "max_steps": 2,
            "device": "cpu",
            "verifier_workers": 1,
            "trajectories_per_step": 4,
            "environment": {"name": environment, "max_turns": 2, "concurrency": 2, "max_episode_tokens": 4096},
            "rollout": {"backend": "thread"},
        },
    )
    run_worker_until_idle(platform_env, timeout=400)
    job = queue.get_job(job_id)
    assert job.status is JobStatus.succeeded, job.error
    with session(db_url, read_only=True) as s:
        rows = s.exec(select(Trajectory).where(Trajectory.job_id == job_id)).all()
        metric_names = {m.name for m in s.exec(select(Metric).where(Metric.job_id == job_id))}
    assert len(rows) == 8 and all(r.tool_calls and r.tool_calls[0]["role"] == "assistant" for r in rows), [
        r.tool_calls for r in rows
    ]
    assert all(r.verdict["stop_reason"] in ("answer", "length", "max_turns", "context") for r in rows), [
        r.verdict for r in rows
    ]
    if environment == "code_repair":  # the hidden tests graded the final module, stored as the episode's answer
        assert all(r.verdict["kind"] == "code" and "def " in r.completion for r in rows), [r.verdict for r in rows]
    assert {names.ENV_TURNS_MEAN, names.ENV_TOOL_CALLS_MEAN, names.ENV_INFRA_REDONE} <= metric_names

    at = login_as(
        AppTest.from_file(str(REPO_ROOT / "ui" / "views" / "training.py"), default_timeout=60), "viewer"
    ).run()
    assert not at.exception, at.exception
    assert any(m.value.startswith("**Episode** ·") for m in at.markdown)
    assert any(m.value == "**Answer**" for m in at.markdown)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_an_evaluation_in_the_tool_environment_runs_whole_episodes(
    platform_env: dict[str, str], real_model_dir: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``EvalConfig.environment``: each held-out task is a greedy episode in the tool environment (the call runs in a
    sandbox, its output comes back, the answer after it is scored), as the run that trained in it saw them; the same
    tasks as single completions get the call written out but never run, so no answer."""
    from posttrain.platform.settings import get_settings
    from posttrain.training.evaluate import evaluate_policy
    from posttrain.training.presets import get_preset

    sandboxes = reachable_dir()  # the sandbox uid cannot enter pytest's private tmp_path
    monkeypatch.setenv("POSTTRAIN_SANDBOX__ROOT_DIR", str(sandboxes))
    get_settings.cache_clear()

    tools = get_preset("smollm2-tools").eval
    tools = tools.model_copy(
        update={
            "domains": ["arith.mul.int"],
            "tasks_per_domain": 4,
            "general": None,
            "batch_size": 4,
            "environment": tools.environment.model_copy(update={"concurrency": 2}),
        }
    )  # type: ignore[union-attr]
    records: list[dict[str, Any]] = []
    episodes = evaluate_policy(tools, str(real_model_dir.path), records=records)
    single = evaluate_policy(tools.model_copy(update={"environment": None}), str(real_model_dir.path))
    assert episodes["eval/pass@1"] - single["eval/pass@1"] >= 0.5, (episodes, single, records)
    assert all(
        r["completion"].startswith("\\boxed{") for r in records if r["passed"]
    )  # the answer after the tool's output
    # what the episodes did, beside the pass rate: the tool called, no test run (there is none), an answer after it
    assert episodes["eval/episodes/tool_calls"] >= 0.5 and episodes["eval/episodes/turns"] >= 1.5, episodes
    assert episodes["eval/episodes/tested_before_reply"] == 0.0 and "eval/episodes/turns" not in single


def test_an_evaluation_reports_each_held_out_group_of_the_repair_domains(real_model_dir: Any) -> None:
    """Repairs of functions no training task shows, unseen modules of seen functions, and HumanEval problems held
    out whole (at a difficulty of their own): each group's pass@1 and task count, per domain and over them all."""
    from posttrain.training.config import EvalConfig
    from posttrain.training.evaluate import all_eval_tasks, evaluate_policy

    config = EvalConfig(
        domains=["repair.off_by_one", "repair.humaneval"],
        difficulty=2,
        difficulties={"repair.humaneval": 3},
        tasks_per_domain=6,
        max_new_tokens=8,
        batch_size=12,
    )
    tasks = all_eval_tasks(config)
    why = [(t.domain, t.metadata.get("held_out_by", "prompt")) for t in tasks]
    report = evaluate_policy(config, str(real_model_dir.path))
    for domain, reason in set(why):
        assert report[f"eval/{domain}/held_out_by/{reason}/tasks"] == why.count((domain, reason)), (
            domain,
            reason,
            report,
        )
    assert {r for _, r in why} >= {"function", "problem"}  # the repairs hold out functions, HumanEval whole problems
    assert report["eval/held_out_by/function/tasks"] == sum(r == "function" for _, r in why)
    assert report["eval/held_out_by/function/pass@1"] == 0.0  # eight tokens repair nothing
    assert all(t.metadata["files"] for t in tasks if t.domain == "repair.humaneval")
    with pytest.raises(ValueError, match="does not list"):
        EvalConfig(domains=["repair.off_by_one"], difficulty=2, difficulties={"repair.humaneval": 3})
    with pytest.raises(ValueError, match="too few to hold out"):
        EvalConfig(domains=["repair.humaneval"], difficulty=3, difficulties={"repair.humaneval": 2})


def test_the_repair_preset_samples_its_episodes_through_vllm_where_its_environment_is(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """smollm2-repair's GRPO and evaluation take vLLM's server engine where vLLM's environment is found (faster on
    episodes: bench/turns.py --engine vllm), and the embedded engine where it is not, naming neither by hand."""
    from posttrain.platform.engines import vllm
    from posttrain.training.presets import get_preset

    monkeypatch.setattr(vllm, "environment_dir", lambda: tmp_path / "none")
    monkeypatch.setattr(vllm, "LINK", "no-such-venv")
    monkeypatch.setattr(vllm.importlib.util, "find_spec", lambda name: None)
    assert get_preset("smollm2-repair").grpo.rollout.backend == "sync"
    assert get_preset("smollm2-repair").eval.vllm is None  # its evaluation's episodes too
    monkeypatch.undo()
    fake = tmp_path / "venv"
    (fake / "bin").mkdir(parents=True)
    (fake / "bin" / "python").write_text("")
    (fake / vllm.COMPLETE).write_text("")
    monkeypatch.setattr(vllm, "environment_dir", lambda: fake)
    monkeypatch.setattr(vllm, "LINK", "no-such-venv")
    assert get_preset("smollm2-repair").grpo.rollout.backend == "vllm"
    assert get_preset("smollm2-repair").eval.vllm is not None
