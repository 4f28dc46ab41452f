"""Two models on the same tasks: the paired difference and its standard error, clustered where tasks share a source.

    from posttrain.platform.stats import paired_difference, unpaired_difference

    d = paired_difference(before, after)                      # per-task scores (pass = 1.0, fail = 0.0) of A and B
    d.delta, d.se                                              # mean of B - A per task, and its standard error
    d = paired_difference(before, after, clusters=functions)   # repair tasks of one function move together
    d.ci_low, d.ci_high, d.wins, d.losses

    u = unpaired_difference(0.41, 128, 0.55, 96)               # only where the two task sets differ; u.paired is False

Why paired: when both models answer the same tasks, most of the spread of each pass rate is which tasks were
drawn, and it is shared; the difference's error comes from the tasks where the two disagree. The paired SE is
the standard deviation of the per-task differences over sqrt(n). Tasks that share a source (the repair tasks of
one function, the questions of one document) are not independent: their differences are summed per cluster
and the SE is the cluster-robust one (Liang-Zeger, with the G / (G - 1) small-sample factor), which is the
plain paired SE when every task is its own cluster.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

Z95 = 1.959964  # two-sided 95% normal quantile


@dataclass(frozen=True)
class Difference:
    """B minus A: ``delta`` (a fraction; x100 for points) with its standard error ``se`` and 95% interval.

    ``paired`` says how the SE was computed: True for the paired (or cluster) SE over the same tasks, False for
    the unpaired one of two independent task sets, which a figure must label so."""

    a: float
    b: float
    delta: float
    se: float
    tasks: int
    paired: bool
    clusters: int | None = None  # the number of sources the SE was clustered over; None: every task its own
    unpaired_se: float | None = None  # on the same tasks: what the unpaired SE would have said, for comparison
    wins: int | None = None  # tasks B passed and A did not (pass/fail scores)
    ties: int | None = None
    losses: int | None = None

    @property
    def ci_low(self) -> float:
        return self.delta - Z95 * self.se

    @property
    def ci_high(self) -> float:
        return self.delta + Z95 * self.se

    @property
    def beyond_noise(self) -> bool:
        """The 95% interval clears zero."""
        return self.ci_low > 0 or self.ci_high < 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self) | {"ci_low": self.ci_low, "ci_high": self.ci_high}

    def points(self) -> str:
        """``+8.3 ± 2.9`` in points, with how the SE was taken."""
        how = (
            ("paired" if self.clusters is None else f"paired, {self.clusters} clusters") if self.paired else "unpaired"
        )
        return f"{100 * self.delta:+.1f} ± {100 * self.se:.1f} ({how} SE)"


def fell_beyond(delta: float, se: float, ses: float = 2.0) -> bool:
    """B fell below A beyond ``ses`` standard errors; with no spread to measure (``se`` 0), any fall. The rule a tier's
    quality flag and a trained model's general-check gate both use."""
    return delta < -ses * se if se > 0 else delta < 0


def paired_difference(a: Sequence[float], b: Sequence[float], clusters: Sequence[Hashable] | None = None) -> Difference:
    """B - A over the same tasks in the same order (scores in [0, 1]; ``True``/``False`` count as 1/0), with the
    paired SE; with ``clusters`` (one source label a task) the cluster-robust SE over the sources."""
    n = len(a)
    if n == 0 or len(b) != n:
        raise ValueError(f"a paired difference needs both models' scores on the same tasks: got {len(a)} and {len(b)}")
    if clusters is not None and len(clusters) != n:
        raise ValueError(f"one cluster label a task: got {len(clusters)} labels for {n} tasks")
    xs, ys = [float(x) for x in a], [float(y) for y in b]
    diffs = [y - x for x, y in zip(xs, ys)]
    mean = sum(diffs) / n
    groups: dict[Hashable, float] = {}
    for i, d in enumerate(diffs):
        key = clusters[i] if clusters is not None else i
        groups[key] = groups.get(key, 0.0) + d - mean
    g = len(groups)
    se = math.sqrt(g / (g - 1) * sum(s * s for s in groups.values())) / n if g > 1 else 0.0
    pa, pb = sum(xs) / n, sum(ys) / n
    binary = all(v in (0.0, 1.0) for v in xs + ys)
    return Difference(
        a=pa, b=pb, delta=mean, se=se, tasks=n, paired=True,
        clusters=g if clusters is not None else None,
        unpaired_se=math.sqrt((_variance(xs) + _variance(ys)) / n),
        wins=sum(d > 0 for d in diffs) if binary else None, ties=sum(d == 0 for d in diffs) if binary else None,
        losses=sum(d < 0 for d in diffs) if binary else None,
    )  # fmt: skip


def unpaired_difference(a: float, n_a: int, b: float, n_b: int) -> Difference:
    """B - A for two pass rates on different task sets (binomial SEs added in quadrature); labelled unpaired."""
    if n_a <= 0 or n_b <= 0:
        raise ValueError(f"an unpaired difference needs tasks on both sides: got {n_a} and {n_b}")
    se = math.sqrt(a * (1 - a) / n_a + b * (1 - b) / n_b)
    return Difference(a=a, b=b, delta=b - a, se=se, tasks=min(n_a, n_b), paired=False)


def _variance(values: list[float]) -> float:
    """The population variance (for pass/fail scores, p(1 - p): the binomial one a pass rate's SE uses)."""
    mean = sum(values) / len(values)
    return sum((v - mean) ** 2 for v in values) / len(values)
