"""Controls against forgetting, each checked where it would break: replay never trains on a prompt the general check
measures and holds its share exactly; the KL term's gradient pulls the policy toward its start, and under LoRA the
reference is the model itself with its adapters off, no second copy of the weights."""

from __future__ import annotations

import dataclasses
import json
import math
from collections import Counter
from pathlib import Path

import pytest
import torch

from posttrain.platform import metric_names as names
from posttrain.platform.tasks.domains import get_domain
from posttrain.platform.tasks.domains.registry import task_split
from posttrain.training.config import EvalConfig, GeneralCheck, GRPOConfig, ReplayConfig, SFTConfig
from posttrain.training.evaluate import all_eval_tasks, general_config
from posttrain.training.grpo import grpo_loss
from posttrain.training.scheduler import DomainSpec, Scheduler, SchedulerConfig, replayed_before

INSTRUCTION = "Answer with the number alone."


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from posttrain.platform.models import TinyModelSpec, build_tiny_model

    return build_tiny_model(
        tmp_path_factory.mktemp("m") / "tiny",
        TinyModelSpec(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, intermediate_size=64),
    )


def _general_eval_prompts(seeds: range = range(4), tasks_per_domain: int = 256) -> set[tuple[str, str]]:
    """The prompts the general check measures, as evaluation makes them, over several seeds."""
    out = set()
    for seed in seeds:
        general = general_config(
            EvalConfig(
                domains=["arith.add.int"],
                difficulty=3,
                seed=seed,
                general=GeneralCheck(tasks_per_domain=tasks_per_domain),
            )
        )
        assert general is not None
        out |= {(t.domain, t.prompt_text) for t in all_eval_tasks(general)}
    return out


def _assert_train_split_only(tasks) -> None:  # type: ignore[no-untyped-def]
    eval_prompts = _general_eval_prompts()
    assert tasks and not {(t.domain, t.prompt_text) for t in tasks} & eval_prompts, "a general-check prompt is replayed"
    for task in tasks:  # and at every difficulty the domain has: a prompt's split is the prompt's own
        for difficulty in range(1, get_domain(task.domain).max_difficulty + 1):
            assert task_split(task.domain, difficulty, task.prompt_text) == "train", (
                task.domain,
                difficulty,
                task.prompt_text,
            )


def test_sft_replay_trains_on_no_prompt_the_general_check_measures_and_holds_its_share(tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    from posttrain.training.data import IGNORE
    from posttrain.training.sft import replay_tasks, step_rows, task_examples, training_rows

    config = SFTConfig(
        model=str(tiny_model_dir),
        domains=["arith.add.int"],
        tasks_per_domain=32,
        packing=False,
        micro_batch_size=4,
        grad_accum_steps=1,
        replay=ReplayConfig(share=0.3, tasks_per_domain=64),
    )
    replayed = replay_tasks(config)
    assert Counter(t.domain for t in replayed) == {d: 64 for d in config.replay.domains}  # type: ignore[union-attr]
    _assert_train_split_only(replayed)
    assert all(
        t.prompt_text == t.prompt[0].content for t in replayed
    )  # put as generated, as the general check puts them

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    own = training_rows(config, task_examples(tokenizer, _own_tasks(config), config.max_seq_len))
    replay_rows = training_rows(config, task_examples(tokenizer, replayed, config.max_seq_len))
    replay_ids = {tuple(row[0].input_ids) for row in replay_rows}
    steps, per_step, seen_own, seen_replay = 40, 4, [], 0
    for step in range(steps):
        rows = step_rows(own, step, config, replay_rows)
        assert len(rows) == per_step
        from_replay = [r for r in rows if tuple(r[0].input_ids) in replay_ids]
        seen_replay += len(from_replay)
        seen_own += [tuple(r[0].input_ids) for r in rows if tuple(r[0].input_ids) not in replay_ids]
        assert seen_replay == replayed_before(step + 1, per_step, 0.3)  # the share, exactly, at every step
        assert all(any(x != IGNORE for x in r[0].labels) for r in rows)
    assert seen_replay == math.floor(steps * per_step * 0.3)
    # the run's own data is not skipped for the replay: its rows come in full epochs, each row once per epoch
    epoch = len(own)
    assert Counter(seen_own[:epoch]) == Counter(tuple(r[0].input_ids) for r in own)


def _own_tasks(config: SFTConfig):  # type: ignore[no-untyped-def]
    from posttrain.training.sft import sft_tasks

    return sft_tasks(config)


def test_grpo_replay_draws_the_train_split_as_generated_at_its_share_whatever_the_scheduler_s_split() -> None:
    from posttrain.platform.tasks.prompt_format import PromptFormat

    for split in ("train", "eval"):  # an evaluating scheduler still replays only train prompts
        scheduler = Scheduler(SchedulerConfig(batch_size=8, seed=3, split=split))
        scheduler.set_domains([DomainSpec(name="arith.add.int", difficulty=3)], PromptFormat(instruction=INSTRUCTION))
        replay = ReplayConfig(share=0.25)
        scheduler.set_replay(replay.domains, replay.difficulty, replay.share)
        drawn = [scheduler.next_batch() for _ in range(30)]
        replayed = [t for batch in drawn for t in batch if scheduler.is_replay(t.domain)]
        assert len(replayed) == replayed_before(30, 8, 0.25) == 60
        assert all(sum(scheduler.is_replay(t.domain) for t in batch) == 2 for batch in drawn)  # 0.25 of 8, every batch
        _assert_train_split_only(replayed)
        assert all(
            INSTRUCTION not in t.prompt_text for t in replayed
        )  # as generated: the run's format is its own tasks'
        assert all(INSTRUCTION in t.prompt_text for batch in drawn for t in batch if not scheduler.is_replay(t.domain))
        assert {t.domain for t in replayed} == set(replay.domains)
    with pytest.raises(ValueError, match=r"replay domains \['arith.add.int'\] are trained on already"):
        scheduler.set_replay(["arith.add.int"], 1, 0.1)


def test_a_replay_the_run_cannot_use_is_refused_at_submit() -> None:
    with pytest.raises(ValueError, match=r"replay domains \['list.int.max'\] are trained on already"):
        GRPOConfig(model="m", domains=["list.int.max"], replay={})
    with pytest.raises(ValueError, match="code_repair environment cannot run them"):
        GRPOConfig(model="m", domains=["repair.off_by_one"], environment={"name": "code_repair"}, replay={})
    with pytest.raises(ValueError, match="replay: difficulty 99 is out of range"):
        ReplayConfig(difficulty=99)
    with pytest.raises(ValueError, match="replay: .*no-such-domain"):
        ReplayConfig(domains=["no-such-domain"])


# --- KL to the starting policy ------------------------------------------------------------------------------------
def test_the_k3_kl_gradient_pulls_each_token_toward_the_reference() -> None:
    """d/dlogp of kl_coef * mean_t(e^(ref-logp) - (ref-logp) - 1) = kl_coef * (1 - e^(ref-logp)) / T: negative where
    the reference gives the token more probability (the loss falls as logp rises toward it), zero where they agree."""
    logprobs = torch.tensor([[0.0, math.log(0.5), -1.0]], requires_grad=True)
    ref = torch.tensor([[math.log(2.0), math.log(0.5), -2.0]])
    out = grpo_loss(
        logprobs, logprobs.detach().clone(), torch.zeros(1), torch.ones(1, 3), ref_logprobs=ref, kl_coef=0.1
    )
    out.loss.backward()
    expected = [0.1 * (1 - math.exp(r - p)) / 3 for r, p in zip(ref[0].tolist(), logprobs[0].tolist())]
    assert logprobs.grad is not None and logprobs.grad[0].tolist() == pytest.approx(expected, abs=1e-7)
    assert expected[0] < 0 and expected[1] == 0 and expected[2] > 0


def test_lora_kl_scores_the_base_with_adapters_off_and_its_gradient_pulls_the_policy_back(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from posttrain.training.learner import Learner
    from posttrain.training.modeling import load_policy
    from posttrain.training.rollout import Trajectory
    from posttrain.training.sharding import local_context

    config = GRPOConfig(
        model=str(tiny_model_dir),
        domains=["arith.add.int"],
        lora={"r": 4, "alpha": 8},
        kl_coef=1.0,
        lr=5e-3,
        device="cpu",
        group_size=2,
        micro_batch_size=4,
        shared_prompt=False,
    )
    learner = Learner(config, local_context(config), reference=True)
    assert learner.reference is None, "under LoRA the reference is the model with its adapters off, not a copy"
    with torch.no_grad():  # move the policy away from its start: the adapters' B matrices are zero when made
        for name, param in learner.model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.3)
    prompt = learner.tokenizer("Compute 2 + 3.", add_special_tokens=False)["input_ids"]
    completion = learner.tokenizer(" The answer is 5.", add_special_tokens=False)["input_ids"]
    base, _ = load_policy(str(tiny_model_dir), device="cpu")

    def logprobs(model: torch.nn.Module) -> torch.Tensor:
        ids = torch.tensor([prompt + completion])
        with torch.no_grad():
            out = torch.log_softmax(model(ids).logits[0, len(prompt) - 1 : -1].float(), dim=-1)
        return out.gather(1, torch.tensor(completion)[:, None])[:, 0]

    with learner.reference_policy() as reference:
        assert torch.allclose(logprobs(reference), logprobs(base), atol=1e-6)  # the starting policy, exactly
    assert not torch.allclose(logprobs(learner.model), logprobs(base), atol=1e-3)  # adapters back on afterwards

    trajectory = Trajectory(
        prompt_ids=prompt,
        completion_ids=completion,
        behaviour_logprobs=logprobs(learner.model).tolist(),
        text=" The answer is 5.",
        finished=True,
        reward=0.0,
    )
    kls = []
    for _ in range(8):  # zero advantages: only the KL term moves the policy
        kls.append(learner.grpo_update([trajectory], [0.0])[names.KL])
        trajectory = dataclasses.replace(trajectory, behaviour_logprobs=logprobs(learner.model).tolist())
    assert kls[0] > 0 and max(kls[-3:]) < 0.2 * kls[0], kls  # pulled back toward the start


# --- self-generated SFT data (rejection sampling) ------------------------------------------------------------------
def test_self_generated_sft_trains_on_the_model_s_own_passing_answers_only(real_model_dir, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The starting model answers each train task six times; only answers its verifier passes are kept (at most one a
    task), token for token as sampled, and they replace the references; a resumed run reads them back."""
    from transformers import AutoTokenizer

    from posttrain.platform.verifiers import verify
    from posttrain.training.data import IGNORE
    from posttrain.training.environments.base import read_episodes
    from posttrain.training.sft import build_examples, procedural_tasks, train_sft

    config = SFTConfig(
        model=str(real_model_dir.path),
        domains=["compare.is_greater.int"],
        tasks_per_domain=8,
        max_steps=1,
        output_dir=str(tmp_path / "run"),
        device="cpu",
        micro_batch_size=2,
        self_generated={"samples": 6, "keep_per_task": 1, "max_new_tokens": 32},
    )
    result = train_sft(config)
    assert result.steps == 1
    path = tmp_path / "run" / "self-generated.jsonl"
    kept = read_episodes(path)
    tasks = {tuple(t.prompt_text for t in [task]): task for task in procedural_tasks(config)}
    tokenizer = AutoTokenizer.from_pretrained(real_model_dir.path)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert 0 < len(kept) <= len(tasks), len(kept)  # the model passes some, not all; one kept a task at most
    assert len({line["task"]["task_id"] for line in lines}) == len(lines)
    for line, episode in zip(lines, kept):
        task = next(t for t in tasks.values() if t.task_id == line["task"]["task_id"])
        answer = tokenizer.decode(episode.token_ids, skip_special_tokens=True)
        assert verify(task, answer).passed, answer  # graded again here: it passes
        assert episode.loss_mask == [1] * len(episode.token_ids) and episode.reward == 1.0
    examples = build_examples(config, tokenizer)
    assert len(examples) == len(kept)  # no reference: only the model's own answers
    assert all(
        e.input_ids[: len(k.prompt_ids)] == k.prompt_ids and all(x == IGNORE for x in e.labels[: len(k.prompt_ids)])
        for e, k in zip(examples, kept)
    )
    written = path.stat().st_mtime_ns
    train_sft(config.updated(max_steps=2))  # resumed: the same answers, read back, not sampled again
    assert path.stat().st_mtime_ns == written
    both = build_examples(
        config.updated(
            self_generated={"samples": 6, "keep_per_task": 1, "max_new_tokens": 32, "with_references": True}
        ),
        tokenizer,
    )
    assert len(both) == len(kept) + len(tasks)


def test_self_generated_with_nothing_passed_says_what_to_do(tiny_model_dir: Path, tmp_path: Path) -> None:
    from posttrain.training.sft import train_sft

    config = SFTConfig(
        model=str(tiny_model_dir),
        domains=["arith.mul.int"],
        difficulty=3,
        tasks_per_domain=2,
        max_steps=1,
        output_dir=str(tmp_path / "run"),
        device="cpu",
        self_generated={"samples": 2, "max_new_tokens": 4},
    )
    with pytest.raises(ValueError, match=r"passed none of its 2 tasks in 2 tries each.*raise self_generated.samples"):
        train_sft(config)
    with pytest.raises(ValueError, match="self_generated writes the answers it keeps under output_dir"):
        SFTConfig(model="m", domains=["arith.add.int"], self_generated={})
