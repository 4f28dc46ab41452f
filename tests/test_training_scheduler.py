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
    sched.record("arith.add.int", [True] * 8)          # always solved
    sched.record("str.copy.letters", [False] * 8)      # never solved
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
    sched.set_domains([DomainSpec(name="arith.add.int"), DomainSpec(name="str.copy.letters", priority=2),
                       DomainSpec(name="compare.larger.int", weight=3.0)])
    sched.record("str.copy.letters", [True] * 10)  # ignored without curriculum
    counts = Counter(t.domain for batch in _take(sched, 16) for t in batch)
    # weights 1 : 2**2 = 4 : 3 -> shares 1/8, 4/8, 3/8 of 1600 draws
    assert 140 < counts["arith.add.int"] < 260
    assert 700 < counts["str.copy.letters"] < 900
    assert 500 < counts["compare.larger.int"] < 700


def test_fixed_task_lists_are_cycled() -> None:
    tasks = [TaskSpec(domain="mine", prompt=f"q{i}", verifier={"kind": "exact", "spec": {"answer": str(i)}}) for i in range(3)]
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
