"""The task scheduler: seeded determinism, priorities, the curriculum shift, JSON state round trip."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from posttrain.platform.verifiers.models import TaskSpec
from posttrain.training.scheduler import DomainSpec, Scheduler, SchedulerConfig, learnability

DOMAINS = ["arith.add.int", "str.copy.letters", "compare.larger.int", "str.upper.letters"]


def _ids(batches: list[list[TaskSpec]]) -> list[str | None]:
    return [t.task_id for batch in batches for t in batch]


def _take(sched: Scheduler, n: int, domains=None) -> list[list[TaskSpec]]:  # type: ignore[no-untyped-def]
    stream = sched.stream(domains)
    return [next(stream) for _ in range(n)]


def test_same_seed_same_stream_other_seed_other_stream() -> None:
    a = _take(Scheduler(SchedulerConfig(batch_size=6, seed=3)), 5, DOMAINS)
    b = _take(Scheduler(SchedulerConfig(batch_size=6, seed=3)), 5, DOMAINS)
    c = _take(Scheduler(SchedulerConfig(batch_size=6, seed=4)), 5, DOMAINS)
    assert _ids(a) == _ids(b)
    assert _ids(a) != _ids(c)
    assert all(len(batch) == 6 for batch in a)
    assert len(set(_ids(a))) == 30  # no task repeats within a domain's stream


def test_learnability_peaks_at_half() -> None:
    assert learnability(0.5, 0.05) == 1.0
    assert learnability(None, 0.05) == 1.0
    assert learnability(1.0, 0.05) == 0.05
    assert learnability(0.0, 0.05) == 0.05
    assert learnability(0.9, 0.05) == pytest.approx(0.36)


def test_sampling_shifts_toward_mid_pass_rates() -> None:
    sched = Scheduler(SchedulerConfig(batch_size=50, seed=0, ema_alpha=1.0))
    sched.set_domains(DOMAINS)
    sched.record("arith.add.int", [True] * 8)  # always solved
    sched.record("str.copy.letters", [False] * 8)  # never solved
    sched.record("compare.larger.int", [True, False] * 4)  # 0.5: most to learn
    sched.record("str.upper.letters", [True] * 7 + [False])  # 0.875
    counts = Counter(t.domain for batch in _take(sched, 40) for t in batch)
    # weights 0.05 : 0.05 : 1 : 0.4375  -> shares 3.6% : 3.6% : 66.5% : 29.1% of 2000 draws
    assert counts["compare.larger.int"] > 1200
    assert 450 < counts["str.upper.letters"] < 700
    assert counts["arith.add.int"] < 130 and counts["str.copy.letters"] < 130
    assert counts["arith.add.int"] > 0  # floored, never starved
    probs = sched.probabilities()
    assert probs["compare.larger.int"] == pytest.approx(1 / 1.5375)
    metrics = sched.metrics()
    assert metrics["sched/compare.larger.int/pass_rate"] == 0.5
    assert metrics["sched/str.upper.letters/drawn"] == counts["str.upper.letters"]


def test_without_curriculum_only_weight_and_priority_count() -> None:
    sched = Scheduler(SchedulerConfig(batch_size=100, seed=1, curriculum=False))
    sched.set_domains(
        [
            DomainSpec(name="arith.add.int"),
            DomainSpec(name="str.copy.letters", priority=2),
            DomainSpec(name="compare.larger.int", weight=3.0),
        ]
    )
    sched.record("str.copy.letters", [True] * 10)  # ignored without curriculum
    counts = Counter(t.domain for batch in _take(sched, 16) for t in batch)
    # weights 1 : 2**2 = 4 : 3 -> shares 1/8, 4/8, 3/8 of 1600 draws
    assert 140 < counts["arith.add.int"] < 260
    assert 700 < counts["str.copy.letters"] < 900
    assert 500 < counts["compare.larger.int"] < 700


def test_fixed_task_lists_are_cycled() -> None:
    tasks = [
        TaskSpec(domain="mine", prompt=f"q{i}", verifier={"kind": "exact", "spec": {"answer": str(i)}})
        for i in range(3)
    ]
    sched = Scheduler(SchedulerConfig(batch_size=7))
    batch = next(sched.stream([DomainSpec(name="mine", tasks=tasks)]))
    assert [t.prompt_text for t in batch] == ["q0", "q1", "q2", "q0", "q1", "q2", "q0"]


def test_state_round_trip_through_json_continues_the_stream() -> None:
    cfg = SchedulerConfig(batch_size=12, seed=7)
    first = Scheduler(cfg)
    _take(first, 4, DOMAINS)  # 48 draws: some domain crosses a chunk boundary of 32
    first.record("arith.add.int", [True, True, False])
    state = json.loads(json.dumps(first.state_dict()))
    expected = _take(first, 5)

    resumed = Scheduler(cfg)
    resumed.set_domains(DOMAINS)
    resumed.load_state_dict(state)
    assert _ids(_take(resumed, 5)) == _ids(expected)
    assert resumed.stats()["arith.add.int"].pass_rate == pytest.approx(2 / 3)
    assert resumed.stats()["arith.add.int"].results == 3


def test_bad_domain_lists_are_rejected() -> None:
    with pytest.raises(ValueError, match="at least one"):
        Scheduler().set_domains([])
    with pytest.raises(ValueError, match="listed twice"):
        Scheduler().set_domains(["arith.add.int", "arith.add.int"])


def test_the_signal_curriculum_draws_toward_domains_whose_groups_disagree() -> None:
    """Weighed by learning signal, a domain whose groups are all right or all wrong falls to the floor, and one
    whose groups disagree takes the draws; its pass rate alone would not say so (the pass-rate curriculum weighs
    a domain solved in half its groups and failed in the rest, no group ever disagreeing, as the best to learn)."""
    sched = Scheduler(SchedulerConfig(batch_size=50, seed=0, ema_alpha=1.0, weigh_by="signal"))
    sched.set_domains(DOMAINS)
    for _ in range(2):
        sched.record("arith.add.int", [True] * 4)  # all right: no signal
        sched.record("str.copy.letters", [False] * 4)  # all wrong: no signal
    sched.record("compare.larger.int", [True] * 4)  # half its groups right, half wrong, none mixed
    sched.record("compare.larger.int", [False] * 4)
    sched.record("str.upper.letters", [True, False, False, False])  # mixed: signal
    assert sched.stats()["compare.larger.int"].pass_rate == 0.0  # EMA with alpha 1: the last group
    counts = Counter(t.domain for batch in _take(sched, 40) for t in batch)
    # weights 0.05 : 0.05 : 0.05 : 1 -> 87% of 2000 draws to the one domain with signal, the floor keeps the rest
    assert counts["str.upper.letters"] > 1650
    assert all(0 < counts[d] < 200 for d in DOMAINS if d != "str.upper.letters"), counts
    metrics = sched.metrics()
    assert metrics["sched/str.upper.letters/signal_rate"] == 1.0
    assert metrics["sched/arith.add.int/signal_rate"] == 0.0
    assert metrics["sched/str.upper.letters/prob"] == pytest.approx(1 / 1.15)


def test_rewards_that_differ_are_signal_even_when_every_answer_fails() -> None:
    """Signal is rewards that differ (partial credit, format rewards), not pass flags."""
    sched = Scheduler(SchedulerConfig(weigh_by="signal", ema_alpha=1.0))
    sched.set_domains(DOMAINS)
    sched.record("arith.add.int", [False] * 4, rewards=[0.0, 0.1, 0.0, 0.0])
    sched.record("str.copy.letters", [False] * 4, rewards=[0.1] * 4)
    stats = sched.stats()
    assert stats["arith.add.int"].signal_rate == 1.0 and stats["str.copy.letters"].signal_rate == 0.0
    assert stats["arith.add.int"].groups == 1


def test_difficulty_steps_up_and_down_with_the_pass_rate_and_resumes() -> None:
    cfg = SchedulerConfig(
        batch_size=4, seed=0, ema_alpha=1.0, adapt_difficulty=True, min_results=8, step_up_at=0.8, step_down_at=0.2
    )
    sched = Scheduler(cfg)
    sched.set_domains(["arith.add.int", "str.copy.letters"])
    _take(sched, 2)
    sched.record("arith.add.int", [True] * 4)
    assert sched.difficulty("arith.add.int") == 1  # 4 results: too few to step
    sched.record("arith.add.int", [True] * 4)
    assert sched.difficulty("arith.add.int") == 2
    stats = sched.stats()["arith.add.int"]
    assert stats.pass_rate is None and stats.signal_rate is None and stats.at_difficulty == 0  # afresh
    drawn = [t for batch in _take(sched, 30) for t in batch if t.domain == "arith.add.int"]
    assert drawn and all(t.metadata["difficulty"] == 2 for t in drawn)
    sched.record("str.copy.letters", [False] * 8)
    assert sched.difficulty("str.copy.letters") == 1  # never below the lowest
    floored = Scheduler(cfg)
    floored.set_domains([DomainSpec(name="str.copy.letters", difficulty=2, min_difficulty=2)])
    floored.record("str.copy.letters", [False] * 8)
    assert floored.difficulty("str.copy.letters") == 2  # nor below its own floor
    for _ in range(2):
        sched.record("arith.add.int", [False] * 4)
    assert sched.difficulty("arith.add.int") == 1
    sched.record("arith.add.int", [True] * 8)
    state = json.loads(json.dumps(sched.state_dict()))
    expected = _take(sched, 3)
    resumed = Scheduler(cfg)
    resumed.set_domains(["arith.add.int", "str.copy.letters"])
    resumed.load_state_dict(state)
    assert resumed.difficulty("arith.add.int") == 2
    assert _ids(_take(resumed, 3)) == _ids(expected)
    assert resumed.metrics()["sched/arith.add.int/difficulty"] == 2.0
    with pytest.raises(ValueError, match="step_down_at"):
        SchedulerConfig(step_up_at=0.3, step_down_at=0.5)


def test_a_difficulty_stepped_back_to_comes_back_with_its_estimates() -> None:
    """Each difficulty is its own domain to the policy: a domain solved at 1 and never solved at 2 steps between
    them, and each step back restores what was measured there (weighed by it: the floor, not an unseen domain's top
    weight), with the clock it was measured by; a difficulty not measured yet starts afresh. Checkpointed."""
    cfg = SchedulerConfig(
        batch_size=4,
        seed=0,
        ema_alpha=1.0,
        weigh_by="signal",
        adapt_difficulty=True,
        min_results=8,
        step_up_at=0.8,
        step_down_at=0.2,
    )
    sched = Scheduler(cfg)
    sched.set_domains(["arith.add.int", "str.copy.letters"])
    sched.record("str.copy.letters", [True, False, False, False])
    sched.record("arith.add.int", [True] * 8)  # solved at 1: up to 2, afresh (an unseen domain's weight)
    assert sched.difficulty("arith.add.int") == 2 and sched.stats()["arith.add.int"].signal_rate is None
    assert sched.probabilities()["arith.add.int"] == pytest.approx(1 / 2)
    _take(sched, 2)
    sched.record("arith.add.int", [False] * 8)  # never solved at 2: back to 1, where it was solved at batch 0
    stats = sched.stats()["arith.add.int"]
    assert sched.difficulty("arith.add.int") == 1
    # the estimates come back; the count the step gate reads starts again at 0
    assert (stats.pass_rate, stats.signal_rate, stats.at_difficulty, stats.seen_at, stats.quiet) == (1.0, 0.0, 0, 0, 1)
    assert set(stats.levels) == {2} and stats.levels[2].pass_rate == 0.0 and stats.levels[2].seen_at == 2
    assert sched.probabilities()["arith.add.int"] == pytest.approx(0.05 / 1.05)  # the floor: nothing to learn at 1
    state = json.loads(json.dumps(sched.state_dict()))
    resumed = Scheduler(cfg)
    resumed.set_domains(["arith.add.int", "str.copy.letters"])
    resumed.load_state_dict(state)
    assert resumed.stats()["arith.add.int"] == stats
    resumed.record("arith.add.int", [True] * 4)  # 4 results since the step back: too few to step again
    assert resumed.difficulty("arith.add.int") == 1
    resumed.record("arith.add.int", [True] * 4)  # still solved at 1: up to 2 again, as measured there (not afresh)
    back = resumed.stats()["arith.add.int"]
    assert resumed.difficulty("arith.add.int") == 2 and (back.pass_rate, back.signal_rate, back.seen_at) == (
        0.0,
        0.0,
        2,
    )
    assert back.at_difficulty == 0 and back.levels[1].at_difficulty == 8


def test_a_step_back_waits_min_results_before_it_steps_again() -> None:
    """The ``min_results`` gate counts the results since the last step, also on a step back: a domain solved at
    1 and never solved at 2 steps once per ``min_results`` results, not on every group. (Were the count at the
    level it steps back to restored with its estimates, the gate would already be met there, and each 4-result
    group would switch it between the two difficulties.)"""
    cfg = SchedulerConfig(
        batch_size=4, seed=0, ema_alpha=1.0, adapt_difficulty=True, min_results=8, step_up_at=0.8, step_down_at=0.2
    )
    sched = Scheduler(cfg)
    sched.set_domains(["arith.add.int"])
    sched.record("arith.add.int", [True] * 8)  # 8 results at 1, solved: up to 2
    sched.record("arith.add.int", [False] * 8)  # 8 results at 2, never solved: back to 1, its estimates restored
    assert sched.difficulty("arith.add.int") == 1 and sched.stats()["arith.add.int"].pass_rate == 1.0
    seen, counts = [], []
    for _ in range(8):  # solved at 1, never solved at 2: each 4-result group is what the policy gets there
        sched.record("arith.add.int", [sched.difficulty("arith.add.int") == 1] * 4)
        seen.append(sched.difficulty("arith.add.int"))
        counts.append(sched.stats()["arith.add.int"].at_difficulty)
    assert seen == [1, 2, 2, 1, 1, 2, 2, 1]  # a step every second group: 8 results since the last one each time
    assert counts == [4, 0, 4, 0, 4, 0, 4, 0]
    state = json.loads(json.dumps(sched.state_dict()))
    resumed = Scheduler(cfg)
    resumed.set_domains(["arith.add.int"])
    resumed.load_state_dict(state)
    assert resumed.stats()["arith.add.int"] == sched.stats()["arith.add.int"]
    resumed.record("arith.add.int", [True] * 4)  # the count since the step survives the checkpoint: 4 of 8 so far
    assert resumed.difficulty("arith.add.int") == 1 and resumed.stats()["arith.add.int"].at_difficulty == 4
    resumed.record("arith.add.int", [True] * 4)
    assert resumed.difficulty("arith.add.int") == 2


def test_fixed_task_lists_keep_their_difficulty() -> None:
    tasks = [
        TaskSpec(domain="mine", prompt=f"q{i}", verifier={"kind": "exact", "spec": {"answer": str(i)}})
        for i in range(3)
    ]
    sched = Scheduler(SchedulerConfig(batch_size=3, adapt_difficulty=True, min_results=1))
    sched.set_domains([DomainSpec(name="mine", tasks=tasks)])
    sched.record("mine", [True] * 4)
    assert sched.difficulty("mine") == 1
    assert [t.prompt_text for t in next(sched.stream())] == ["q0", "q1", "q2"]


def test_revisits_draw_a_domain_at_the_floor_again_and_a_record_sends_it_back() -> None:
    """``revisit_after``: the weight of a domain left unrecorded ages toward an unseen domain's, so one at the floor
    (solved, or never solved) is drawn again to check whether the policy has forgotten it or begun to answer it;
    the measured estimate itself stays, and a new group without signal sends the domain back to the floor."""
    cfg = SchedulerConfig(batch_size=4, seed=0, ema_alpha=1.0, weigh_by="signal", revisit_after=5)
    sched, kept = Scheduler(cfg), Scheduler(cfg.model_copy(update={"revisit_after": None}))
    for s in (sched, kept):
        s.set_domains(["arith.add.int", "str.copy.letters"])
        s.record("arith.add.int", [True] * 4)  # solved: no signal
        s.record("str.copy.letters", [True, False, False, False])
    assert sched.probabilities()["arith.add.int"] == pytest.approx(0.05 / 1.05)  # no batch drawn yet: at the floor
    for s in (sched, kept):
        _take(s, 10)
        s.record("str.copy.letters", [True, False, False, False])  # the other domain, recorded all along
    # 10 batches unrecorded: 1 - exp(-2) = 86% of the way back to all signal; without revisits it stays at the floor
    assert sched.probabilities()["arith.add.int"] == pytest.approx(0.8647 / 1.8647, abs=1e-3)
    assert kept.probabilities()["arith.add.int"] == pytest.approx(0.05 / 1.05)
    assert sched.stats()["arith.add.int"].signal_rate == 0.0  # the measured estimate is what was measured
    sched.record("arith.add.int", [True] * 4)  # checked: still no signal, back to the floor
    assert sched.probabilities()["arith.add.int"] == pytest.approx(0.05 / 1.05)
    state = json.loads(json.dumps(sched.state_dict()))
    resumed = Scheduler(cfg)
    resumed.set_domains(["arith.add.int", "str.copy.letters"])
    resumed.load_state_dict(state)
    _take(sched, 3), _take(resumed, 3)
    assert resumed.probabilities() == sched.probabilities()  # the clock is in the state
    # a second group in a row without signal doubled its revisit time: 10 batches now age it 1 - exp(-1) = 63%
    _take(sched, 7)
    sched.record("str.copy.letters", [True, False, False, False])
    assert sched.probabilities()["arith.add.int"] == pytest.approx(0.6321 / 1.6321, abs=1e-3)
    sched.record("arith.add.int", [True] * 4)  # a third: four times the time, 10 batches age it 1 - exp(-0.5) = 39%
    _take(sched, 10)
    sched.record("str.copy.letters", [True, False, False, False])
    assert sched.probabilities()["arith.add.int"] == pytest.approx(0.3935 / 1.3935, abs=1e-3)
    sched.record("arith.add.int", [True, False, True, True])  # a group with signal: the revisit time is back to 5
    assert sched.stats()["arith.add.int"].quiet == 0


def test_a_task_whose_last_groups_had_no_signal_is_skipped_before_rollout_then_tried_again() -> None:
    """A stored task all wrong (or all right) twice in a row is skipped once at its next draws, twice after a third
    quiet group, and drawn as ever once a group of it disagrees; the skips survive a checkpoint, and a list all of
    whose tasks went quiet is still drawn."""
    tasks = [
        TaskSpec(domain="mine", prompt=f"q{i}", verifier={"kind": "exact", "spec": {"answer": str(i)}}, task_id=f"t{i}")
        for i in range(3)
    ]
    sched = Scheduler(SchedulerConfig(batch_size=3))
    sched.set_domains([DomainSpec(name="mine", tasks=tasks)])

    def draw(n: int) -> list[str | None]:
        return [t.task_id for _ in range(n) for t in sched.next_batch(1)]

    assert draw(3) == ["t0", "t1", "t2"]
    for _ in range(2):
        sched.record("mine", [False, False], task_id="t0")
    assert draw(3) == ["t1", "t2", "t0"] and sched.skipped == 1  # t0 skipped at its next draw only
    sched.record("mine", [False, False], task_id="t0")  # a third quiet group: skipped at its next two draws
    assert draw(7) == ["t1", "t2", "t1", "t2", "t1", "t2", "t0"] and sched.skipped == 3
    sched.record("mine", [False, False], task_id="t0")
    state = json.loads(json.dumps(sched.state_dict()))
    sched.record("mine", [True, False], task_id="t0")  # a signal: drawn as ever
    assert draw(3) == ["t1", "t2", "t0"] and sched.skipped == 3

    resumed = Scheduler(SchedulerConfig(batch_size=3))
    resumed.set_domains([DomainSpec(name="mine", tasks=tasks)])
    resumed.load_state_dict(state)
    # four quiet groups when saved: t0 is skipped at its next four draws
    assert [t.task_id for t in resumed.next_batch(6)] == ["t1", "t2"] * 3
    assert resumed.skipped == 5

    for task_id in ("t0", "t1", "t2"):  # all quiet: the list is still drawn, in order
        for _ in range(3):
            resumed.record("mine", [True, True], task_id=task_id)
    assert len(resumed.next_batch(4)) == 4
    never = Scheduler(SchedulerConfig(batch_size=3, skip_quiet_prompts=None))
    never.set_domains([DomainSpec(name="mine", tasks=tasks)])
    for _ in range(5):
        never.record("mine", [False, False], task_id="t0")
    assert [t.task_id for t in never.next_batch(3)] == ["t0", "t1", "t2"] and never.skipped == 0
    generated = Scheduler(SchedulerConfig(batch_size=2))  # a generated task is never drawn again: no record kept
    generated.set_domains(["arith.add.int"])
    for task in generated.next_batch():
        for _ in range(3):
            generated.record("arith.add.int", [False, False], task_id=task.task_id)
    assert generated.state_dict()["quiet_tasks"] == {}
