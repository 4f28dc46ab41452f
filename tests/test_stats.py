"""The paired difference and its SE (platform/stats.py) against hand computations."""

from __future__ import annotations

import math
import random

import pytest

from posttrain.platform.stats import paired_difference, unpaired_difference


def test_the_paired_se_is_the_spread_of_the_per_task_differences_over_root_n() -> None:
    a = [1, 1, 0, 0, 1, 0, 1, 0]
    b = [1, 1, 1, 0, 1, 1, 0, 1]
    # differences 0 0 1 0 0 1 -1 1: mean 2/8 = 0.25; squares about the mean 3 * 0.0625 + 3 * 0.5625 + 1.5625 = 3.5
    d = paired_difference(a, b)
    assert d.delta == pytest.approx(0.25)
    assert d.se == pytest.approx(math.sqrt(3.5 / 7) / math.sqrt(8))
    assert (d.a, d.b, d.tasks, d.paired, d.clusters) == (0.5, 0.75, 8, True, None)
    assert (d.wins, d.ties, d.losses) == (3, 4, 1)
    # the unpaired SE the same rates would get: sqrt(.5 * .5 / 8 + .75 * .25 / 8)
    assert d.unpaired_se == pytest.approx(math.sqrt((0.25 + 0.1875) / 8))
    assert d.ci_low == pytest.approx(0.25 - 1.959964 * d.se)
    assert d.points() == f"+25.0 ± {100 * d.se:.1f} (paired SE)"


def test_the_paired_se_is_smaller_than_the_unpaired_one_when_the_two_models_agree_on_most_tasks() -> None:
    rng = random.Random(0)
    a = [rng.random() < 0.5 for _ in range(200)]
    b = [x if rng.random() < 0.85 else not x for x in a]  # B answers as A on about 85% of the tasks
    d = paired_difference(a, b)
    assert d.unpaired_se is not None and d.se < 0.6 * d.unpaired_se, (d.se, d.unpaired_se)


def test_clusters_of_one_task_give_the_paired_se_and_shared_sources_widen_it() -> None:
    rng = random.Random(1)
    # 20 functions, 8 repair tasks each; whether B beats A depends mostly on the function
    functions = [f"fn{i}" for i in range(20) for _ in range(8)]
    gain = {f: rng.choice([0.0, 0.0, 1.0]) for f in set(functions)}
    a = [0.0] * len(functions)
    b = [gain[f] if rng.random() < 0.9 else 1.0 - gain[f] for f in functions]
    plain = paired_difference(a, b)
    assert paired_difference(a, b, clusters=list(range(len(a)))).se == pytest.approx(plain.se)
    clustered = paired_difference(a, b, clusters=functions)
    assert clustered.clusters == 20 and clustered.delta == plain.delta
    assert clustered.se > 1.8 * plain.se, (clustered.se, plain.se)


def test_the_cluster_se_by_hand() -> None:
    # two clusters of two tasks and one of one: differences (1, 1), (0, -1), (1); mean 2/5 = 0.4
    d = paired_difference([0, 0, 0, 1, 0], [1, 1, 0, 0, 1], clusters=["x", "x", "y", "y", "z"])
    sums = [(1 - 0.4) + (1 - 0.4), (0 - 0.4) + (-1 - 0.4), 1 - 0.4]
    assert d.se == pytest.approx(math.sqrt(3 / 2 * sum(s * s for s in sums)) / 5)


def test_an_unpaired_difference_is_labelled_and_bad_input_is_named() -> None:
    u = unpaired_difference(0.41, 128, 0.55, 96)
    assert not u.paired and u.delta == pytest.approx(0.14)
    assert u.se == pytest.approx(math.sqrt(0.41 * 0.59 / 128 + 0.55 * 0.45 / 96))
    assert "unpaired SE" in u.points()
    with pytest.raises(ValueError, match="same tasks: got 3 and 2"):
        paired_difference([1, 0, 1], [1, 0])
    with pytest.raises(ValueError, match="one cluster label a task"):
        paired_difference([1, 0], [1, 1], clusters=["a"])
    with pytest.raises(ValueError, match="tasks on both sides"):
        unpaired_difference(0.5, 0, 0.5, 10)
