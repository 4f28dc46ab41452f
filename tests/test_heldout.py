"""Held out by construction: for every domain at every difficulty, no eval prompt is a train prompt;
domains too small to hold out a split say so and are refused for evaluation."""

from __future__ import annotations

import random

import pytest

from posttrain.platform.tasks.domains import (
    EVAL_FRACTION,
    MIN_EVAL_PROMPTS,
    NoHeldOutSplitError,
    generate,
    get_domain,
    list_domains,
    prompt_space,
    prompt_split,
)
from posttrain.platform.tasks.heldout import check_held_out
from posttrain.platform.verifiers.models import ChatMessage, TaskSpec


def test_every_domain_that_claims_a_held_out_split_holds_it_out_at_every_difficulty() -> None:
    claimed = refused = 0
    failures = []
    for info in list_domains():
        levels = range(1, info.max_difficulty + 1)
        # what training draws at every level (a run may train at one level and evaluate at another)
        trained_anywhere = [t for level in levels for t in generate(info.name, 32, seed=3, difficulty=level)]
        for difficulty in levels:
            space = info.prompt_space(difficulty)
            if not space.has_held_out_split:
                refused += 1
                with pytest.raises(NoHeldOutSplitError, match=rf"{info.name}.*too few to hold out"):
                    generate(info.name, 4, seed=1, difficulty=difficulty, split="eval")
                continue
            claimed += 1
            # two training streams (the seeds a scheduler and an SFT run would use) against the eval split
            train = generate(info.name, 48, seed=0, difficulty=difficulty) + generate(
                info.name, 48, seed=1000, difficulty=difficulty
            )
            held = generate(info.name, 24, seed=7, difficulty=difficulty, split="eval")
            for label, trained in (("same level", train), ("any level", trained_anywhere)):
                check = check_held_out(trained, held)
                if not check.ok:
                    failures.append(f"{info.name} d{difficulty} against training at {label}: {check.describe()}")
            if any(t.split != "eval" for t in held) or any(t.split != "train" for t in train):
                failures.append(f"{info.name} d{difficulty}: a task carries the wrong split label")
    assert not failures, "\n".join(failures[:20])
    assert claimed >= 800 and refused >= 50, (claimed, refused)  # most domains hold out; the tiny ones are named


def test_a_small_domain_trains_on_every_prompt_and_they_stay_train_at_larger_levels() -> None:
    # format.to_hex at difficulty 1: ten digits, no eval split, so all ten are trained on
    assert {t.prompt_text for t in generate("format.to_hex", 200, seed=0)} == {
        f"Write {n} in hexadecimal." for n in range(10)
    }
    # code.fizzbuzz is one fixed problem: it can be trained on, never evaluated
    assert generate("code.fizzbuzz", 2)[0].split == "train"
    with pytest.raises(NoHeldOutSplitError, match="code.fizzbuzz"):
        generate("code.fizzbuzz", 1, split="eval")


def test_the_check_fails_on_two_random_streams_over_the_same_ten_prompts() -> None:
    # what the generator did before prompt-hash splits: train and eval were two random streams
    domain = get_domain("format.to_hex")

    def stream(tag: str, n: int) -> list[TaskSpec]:
        rng = random.Random(tag)
        return [TaskSpec(domain=domain.name, prompt=[ChatMessage(role="user", content=domain.make(rng, 1).prompt)],
                         verifier={"kind": "exact", "spec": {"answer": "0"}}) for _ in range(n)]  # fmt: skip

    check = check_held_out(stream("train", 200), stream("eval", 50))
    assert not check.ok and check.unseen_fraction == 0.0, check
    assert "50 of 50 eval tasks were trained on" in check.describe()
    # and today: format.to_hex at difficulty 1 is refused, naming the domain, the count and the fix
    space = prompt_space("format.to_hex", 1)
    assert space.distinct_prompts == 10 and not space.has_held_out_split
    with pytest.raises(
        NoHeldOutSplitError, match=r"'format.to_hex' has about 10 distinct prompts at difficulty 1.*higher difficulty"
    ):
        generate("format.to_hex", 8, split="eval")
    assert generate("format.to_hex", 0, split="eval") == []


def test_prompt_space_estimates_are_exact_for_small_spaces_and_large_for_large_ones() -> None:
    assert prompt_space("format.to_hex", 2).distinct_prompts == 90
    assert prompt_space("arith.add.int", 1).distinct_prompts == 100
    assert prompt_space("format.thousands", 1).distinct_prompts > 5000  # 9,000 four-digit numbers
    assert prompt_space("code.add", 1).distinct_prompts == 1  # a fixed problem: nothing to hold out
    big = prompt_space("format.to_hex", 3)
    assert big.has_held_out_split and abs(big.held_out_prompts - EVAL_FRACTION * 900) < 90, big
    assert MIN_EVAL_PROMPTS > 1


def test_a_prompts_split_ignores_case_and_spacing_and_holds_out_about_the_eval_fraction() -> None:
    assert prompt_split("Write 5 in hexadecimal.") == prompt_split("  write 5   IN hexadecimal. ")
    prompts = [f"Compute {a} + {b}." for a in range(100) for b in range(100)]
    share = sum(prompt_split(p) == "eval" for p in prompts) / len(prompts)
    assert abs(share - EVAL_FRACTION) < 0.02, share
