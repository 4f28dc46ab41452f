"""Expert demonstrations of code repair: a scripted agent through the real code_repair environment in real
bubblewrap sandboxes, with the real model's tokenizer; and SFT on the episodes it leaves, token for token."""

from __future__ import annotations

import json
import shutil

import pytest
from conftest import ImportedRealModel, reachable_dir
from test_code_verifier import pool, service  # noqa: F401 - its module-scoped pool and verifier service, one of each here
from transformers import AutoTokenizer

from posttrain.platform.sandbox import SandboxPool
from posttrain.platform.tasks.domains.registry import generate
from posttrain.platform.tasks.episodes import as_file
from posttrain.platform.verifiers import VerifierService
from posttrain.training.config import EnvironmentConfig, SamplingConfig
from posttrain.training.data import IGNORE, chat_example, episode_example
from posttrain.training.demonstrations import TOOLS, demonstrations, expert_script, fix_edits
from posttrain.training.environments.base import read_episodes, write_episodes
from posttrain.training.environments.code_repair import CodeRepair

pytestmark = [pytest.mark.requires("bubblewrap"), pytest.mark.requires("real model")]

ENV = EnvironmentConfig(name="code_repair", max_turns=8, max_episode_tokens=4096, tools=TOOLS)
SAMPLING = SamplingConfig(max_new_tokens=512)


@pytest.fixture(scope="module")
def tokenizer(real_model_dir: ImportedRealModel):  # type: ignore[no-untyped-def]
    return AutoTokenizer.from_pretrained(real_model_dir.path)


def repair_tasks() -> list:  # type: ignore[type-arg]
    return [
        *generate("repair.off_by_one", 2, seed=1, difficulty=4),
        *generate("repair.wrong_operator", 1, seed=2, difficulty=2),
        *generate("repair.humaneval", 1, seed=3, difficulty=1),
    ]


def test_fix_edits_anchor_each_hunk_once_and_rebuild_the_reference() -> None:
    for task in repair_tasks():
        module, reference = task.metadata["files"]["solution.py"], task.reference
        edits = fix_edits(module, reference)
        text = module
        for edit in edits:
            assert text.count(edit.old) == 1, edit
            text = text.replace(edit.old, edit.new, 1)
        assert text == reference and edits
    with pytest.raises(ValueError, match="unique"):
        fix_edits("", "x = 1\n")  # nothing to anchor an edit on


def test_scripts_vary_over_seeds_and_keep_the_expert_s_steps() -> None:
    task = repair_tasks()[0]
    scripts = [expert_script(task, seed) for seed in range(12)]
    assert len({tuple(s) for s in scripts}) > 6  # commands, order and words vary
    for script in scripts:
        calls = "\n".join(script)
        assert "test_visible.py" in script[1] + script[2] and "solution.py" in script[1] + script[2]
        assert calls.count('"edit_file"') == 2 and "<tool_call>" not in script[-1]  # two defects, then a plain reply
        assert "test_visible.py" in script[-2]  # the tests run again before the reply


def test_a_demonstration_replays_to_the_hidden_tests_pass(
    tokenizer,
    pool: SandboxPool,
    service: VerifierService,
    tmp_path,
) -> None:  # type: ignore[no-untyped-def]
    tasks = repair_tasks()
    episodes = demonstrations(tasks, tokenizer, ENV, SAMPLING, service, pool, seed=7)
    assert len(episodes) == len(tasks)
    for task, episode in zip(tasks, episodes):
        assert episode.stop_reason == "answer" and episode.verdict is not None and episode.verdict.passed, (
            episode.verdict
        )
        outputs = [c.output for c in episode.tool_calls]
        runs = [
            o
            for c, o in zip(episode.tool_calls, outputs)
            if c.name == "bash" and "test_visible" in c.arguments["command"]
        ]
        # What the sandbox really printed: the visible tests fail before the fix and pass after it.
        assert "AssertionError" in runs[0] or "NotImplementedError" in runs[0], runs[0]
        assert "all visible tests pass" in runs[-1], runs[-1]
        assert all(c.status == "ok" for c in episode.tool_calls if c.name == "edit_file")
        # The module the episode left passes the hidden tests when graded again, whole.
        assert service.verify(as_file(task), episode.answer or "").passed
    # Stored and read back as ordinary episodes, ids and masks token for token.
    stored = read_episodes(write_episodes(tmp_path / "demos.jsonl", episodes), min_reward=1.0)
    assert [(s.prompt_ids, s.token_ids, s.loss_mask) for s in stored] == [
        (e.prompt_ids, e.token_ids, e.loss_mask) for e in episodes
    ]
    (tmp_path / "bad.jsonl").write_text('{"prompt_ids": [1]}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl, line 1: not an episode"):
        read_episodes(tmp_path / "bad.jsonl")


def test_sft_on_a_multi_turn_episode_trains_the_policy_s_tokens_as_the_rollout_path_laid_them(
    tokenizer, pool: SandboxPool, service: VerifierService
) -> None:  # type: ignore[no-untyped-def]
    task = generate("repair.wrong_operator", 1, seed=2, difficulty=2)[0]
    episode = demonstrations([task], tokenizer, ENV, SAMPLING, service, pool, seed=1)[0]
    example = episode_example(episode.prompt_ids, episode.token_ids, episode.loss_mask)
    trained = [i for i, label in enumerate(example.labels) if label != IGNORE]
    start = len(episode.prompt_ids)
    assert trained == [start + i for i, m in enumerate(episode.loss_mask) if m]  # the policy's tokens, nothing else
    # Tool output is never trained on: no tool result's text is in the trained tokens.
    trained_text = tokenizer.decode([example.input_ids[i] for i in trained])
    assert episode.policy_turns >= 6 and "all visible tests pass" not in trained_text and "<tool_call>" in trained_text
    # No template drift: the chat template's rendering of the same messages is the episode's ids, and its
    # assistant spans are the tokens trained on (up to the newline the template puts after the last turn).
    environment = CodeRepair(ENV, tokenizer, SAMPLING)
    messages = environment.messages(task)
    names: list[str] = []
    for turn in episode.turns:
        if turn.role == "assistant":
            messages.append({"role": "assistant", "content": turn.content})
            names = [c.name for c in turn.tool_calls]
        else:
            messages.append({"role": "tool", "name": names.pop(0), "content": turn.content})
    rendered = chat_example(tokenizer, messages)
    ids = example.input_ids
    assert rendered.input_ids[: len(ids)] == ids and len(rendered.input_ids) - len(ids) <= 1
    assert rendered.labels[: len(ids)] == example.labels


def test_an_sft_run_reads_episodes_filtered_by_reward(
    tokenizer,
    pool: SandboxPool,
    service: VerifierService,
    tmp_path,
) -> None:  # type: ignore[no-untyped-def]
    from posttrain.training.config import SFTConfig
    from posttrain.training.sft import build_examples

    episode = demonstrations(
        generate("repair.wrong_return", 1, seed=4, difficulty=1), tokenizer, ENV, SAMPLING, service, pool
    )[0]
    path = write_episodes(tmp_path / "episodes.jsonl", [episode, episode])
    lines = path.read_text().splitlines()
    path.write_text(
        lines[0] + "\n" + lines[1].replace('"reward": 1.0', '"reward": 0.25') + "\n"
    )  # a stored rollout that half failed
    every = build_examples(SFTConfig(episodes_path=str(path), max_seq_len=4096), tokenizer)
    kept = build_examples(SFTConfig(episodes_path=str(path), episodes_min_reward=1.0, max_seq_len=4096), tokenizer)
    assert len(every) == 2 and len(kept) == 1
    assert kept[0] == episode_example(episode.prompt_ids, episode.token_ids, episode.loss_mask)
    with pytest.raises(ValueError, match="no episode with a reward of at least 2"):
        build_examples(SFTConfig(episodes_path=str(path), episodes_min_reward=2.0), tokenizer)


def test_an_sft_run_makes_its_demonstrations_once_under_its_output_dir(tokenizer, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """``SFTConfig.demonstrations``: the run makes its expert episodes in the platform's own sandboxes, writes them
    beside its checkpoints, and reads them back (not made again) when it resumes with the same settings."""

    from posttrain.platform.settings import get_settings
    from posttrain.training.config import DemonstrationsConfig, SFTConfig
    from posttrain.training.sft import build_examples

    data, out = reachable_dir(), reachable_dir()  # the sandbox uid must be able to enter them; removed at the end
    monkeypatch.setenv("POSTTRAIN_DATA_DIR", str(data))
    get_settings.cache_clear()
    try:
        demos = {
            "domains": [
                {"name": "repair.off_by_one", "difficulty": 2},
                {"name": "repair.missing_case", "difficulty": 2},
            ],
            "tasks_per_domain": 2,
            "environment": ENV.model_dump(),
        }
        config = SFTConfig(output_dir=str(out), demonstrations=demos, max_seq_len=4096)
        examples = build_examples(config, tokenizer)
        made = out / "demonstrations.jsonl"
        stored = read_episodes(made, min_reward=1.0)
        assert len(examples) == len(stored) == 4  # every scripted repair passed the hidden tests
        domains = [json.loads(line)["task"]["domain"] for line in made.read_text().splitlines()]
        assert sorted(set(domains)) == ["repair.missing_case", "repair.off_by_one"]
        assert [x.labels for x in examples] == [
            episode_example(e.prompt_ids, e.token_ids, e.loss_mask, 4096).labels for e in stored
        ]
        written = made.stat().st_mtime_ns
        assert (
            build_examples(config, tokenizer) == examples and made.stat().st_mtime_ns == written
        )  # read back, not made again
        other = config.updated(demonstrations={**demos, "seed": 1})
        assert (
            build_examples(other, tokenizer) != examples and made.stat().st_mtime_ns != written
        )  # new settings: made anew
    finally:
        get_settings.cache_clear()
        for made in (data, out):  # checkpoints: gigabytes
            shutil.rmtree(made, ignore_errors=True)
    with pytest.raises(ValueError, match="not repair"):
        DemonstrationsConfig(domains=[{"name": "arith.add.int"}])
    with pytest.raises(ValueError, match="code_repair environment"):
        DemonstrationsConfig(domains=[{"name": "repair.off_by_one"}], environment={"name": "tool_use"})
    with pytest.raises(ValueError, match="set output_dir"):
        build_examples(SFTConfig(demonstrations=demos), tokenizer)


def test_self_generated_episodes_keep_only_what_the_rubric_passed_up_to_the_share_of_a_task() -> None:
    """Of each group of episodes, the first ``keep_per_task`` whose reward reaches ``min_reward``; an unscored episode
    (its sandbox failed) is never kept, whatever its answer."""
    from types import SimpleNamespace

    from posttrain.training.config import SelfGeneratedConfig
    from posttrain.training.sft import own_successes

    def group(*rewards: float | None) -> SimpleNamespace:
        return SimpleNamespace(
            trajectories=[SimpleNamespace(reward=r, episode=f"e{i}:{r}") for i, r in enumerate(rewards)]
        )

    groups = [group(0.0, 1.0, 1.0, 1.0), group(None, 0.5, 0.0), group(None, 1.0)]
    assert own_successes(groups, SelfGeneratedConfig(keep_per_task=2)) == ["e1:1.0", "e2:1.0", "e1:1.0"]
    assert own_successes(groups, SelfGeneratedConfig(keep_per_task=1, min_reward=0.5)) == ["e1:1.0", "e1:0.5", "e1:1.0"]


def test_an_sft_run_plays_its_demonstrated_tasks_itself_and_trains_on_what_passed_beside_the_expert(
    real_model_dir: ImportedRealModel, tokenizer, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    """``self_generated`` with ``demonstrations``: the starting model plays whole episodes of each demonstrated task in
    real sandboxes; only the episodes the rubric passed are written (a model that passes none leaves the expert's
    episodes to train on, not a failed run), and the run trains on both."""

    from posttrain.platform.settings import get_settings
    from posttrain.training.config import SFTConfig
    from posttrain.training.demonstrations import demonstration_tasks
    from posttrain.training.sft import build_examples, train_sft

    data, out = reachable_dir(), reachable_dir()  # the sandbox uid must be able to enter them; removed at the end
    monkeypatch.setenv("POSTTRAIN_DATA_DIR", str(data))
    get_settings.cache_clear()
    try:
        demos = {
            "domains": [{"name": "repair.off_by_one", "difficulty": 2}],
            "tasks_per_domain": 1,
            "environment": ENV.model_dump(),
        }
        config = SFTConfig(
            model=str(real_model_dir.path),
            output_dir=str(out),
            demonstrations=demos,
            max_seq_len=4096,
            max_steps=1,
            device="cpu",
            micro_batch_size=2,
            self_generated={"samples": 2, "max_new_tokens": 32},
        )
        assert train_sft(config).steps == 1
        own = [json.loads(line) for line in (out / "self-generated.jsonl").read_text().splitlines()]
        task_ids = {t.task_id for t in demonstration_tasks(config.demonstrations)}  # type: ignore[arg-type]
        assert all(e["task"]["task_id"] in task_ids and e["reward"] >= 1.0 for e in own), own
        assert len(own) <= len(task_ids)  # one kept a task at most
        expert = read_episodes(out / "demonstrations.jsonl")
        assert len(build_examples(config, tokenizer)) == len(expert) + len(own)
    finally:
        get_settings.cache_clear()
        for made in (data, out):  # checkpoints: gigabytes
            shutil.rmtree(made, ignore_errors=True)
    with pytest.raises(ValueError, match="name them in domains or demonstrations"):
        SFTConfig(output_dir="o", self_generated={})
