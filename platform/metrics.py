"""Read a run's metrics and trajectories for charts and browsers, downsampled in the database.

A long run logs hundreds of thousands of points; a chart needs a thousand. The
database does the reduction: the run's steps are cut into buckets whose width
is a power of two, aligned at multiples of that width (so a live chart's buckets
stay put while the run grows and only merge when the width doubles), and one
``GROUP BY name, step // width`` query returns one row per series and bucket
with the mean, minimum and maximum. Integer ``//`` is plain integer division on SQLite
and PostgreSQL alike.

    series(job_id, ["train/loss", "rollout/reward_mean"], max_points=500)
    # {"train/loss": [(0, 2.31), (256, 2.05), ...], "rollout/reward_mean": [...]}
    latest(job_id)["train/loss"]          # Point(step=99_999, value=0.41): the last logged point
    metric_names(job_id)                  # ["rollout/reward_mean", "train/loss", ...]
    duration(372.0)                       # "6.2 min": a wall time as pages and the CLI show it
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal, NamedTuple

from sqlalchemy import ColumnElement, func, literal
from sqlmodel import col, select

from posttrain.platform.db.engine import session
from posttrain.platform.db.models import Metric, Trajectory

Aggregate = Literal["mean", "min", "max"]


def duration(seconds: float) -> str:
    """``42 s``, ``6.1 min``, ``1.8 h``."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 90 * 60 else f"{seconds / 3600:.1f} h"


class Point(NamedTuple):
    step: int
    value: float


class Bucket(NamedTuple):
    """The points of one series whose steps fall in one bucket."""

    step: int  # the first step logged in the bucket
    last_step: int
    mean: float
    min: float
    max: float
    count: int  # type: ignore[assignment]  # the field hides tuple.count


def bucket_width(first_step: int, last_step: int, max_points: int) -> int:
    """The smallest power of two for which steps ``first_step..last_step`` fall in at most ``max_points`` buckets."""
    if max_points < 1:
        raise ValueError(f"max_points must be at least 1, got {max_points}")
    width = 1
    while last_step // width - first_step // width + 1 > max_points:
        width *= 2
    return width


def step_range(job_id: int, *, url: str | None = None) -> tuple[int, int] | None:
    """The first and last step ``job_id`` logged, or None: two index lookups, no scan."""
    first = select(func.min(Metric.step)).where(Metric.job_id == job_id).scalar_subquery()
    last = select(func.max(Metric.step)).where(Metric.job_id == job_id).scalar_subquery()
    with session(url, read_only=True) as s:
        low, high = s.exec(select(first, last)).one()
    return None if low is None else (int(low), int(high))


def buckets(
    job_id: int, names: Iterable[str], max_points: int = 1000, *, url: str | None = None
) -> dict[str, list[Bucket]]:
    """Each named series of ``job_id`` reduced to at most ``max_points`` buckets (mean, min, max), by step.

    Every series of a run shares one bucket width, chosen from the run's whole
    step range, so charts of one run line up; when the run has logged no more
    than ``max_points`` steps the width is 1 and points come back one for one.
    Names the run never logged are left out.
    """
    wanted = sorted(set(names))
    extent = step_range(job_id, url=url)
    if not wanted or extent is None:
        return {}
    width = bucket_width(*extent, max_points)
    # The bucket is computed in a subquery and grouped by as a column: PostgreSQL would not treat
    # two occurrences of an expression with a bind parameter (select list, GROUP BY) as the same.
    points = (
        select(Metric.name, Metric.step, Metric.value, (col(Metric.step) // literal(width)).label("bucket"))
        .where(Metric.job_id == job_id, col(Metric.name).in_(wanted))
        .subquery()
    )
    stmt = (
        select(  # type: ignore[call-overload]  # sqlmodel's overloads stop at four columns
            points.c.name,
            points.c.bucket,
            func.min(points.c.step),
            func.max(points.c.step),
            func.avg(points.c.value),
            func.min(points.c.value),
            func.max(points.c.value),
            func.count(),
        )
        .group_by(points.c.name, points.c.bucket)
        .order_by(points.c.name, points.c.bucket)
    )
    with session(url, read_only=True) as s:
        rows = s.exec(stmt).all()
    out: dict[str, list[Bucket]] = {}
    for name, _, first, last, mean, low, high, count in rows:
        out.setdefault(name, []).append(Bucket(int(first), int(last), float(mean), float(low), float(high), int(count)))
    return out


def series(
    job_id: int, names: Iterable[str], max_points: int = 1000, url: str | None = None, *, agg: Aggregate = "mean"
) -> dict[str, list[Point]]:
    """Each named series as at most ``max_points`` (step, value) points: one per step bucket.

    The step of a point is the first step in its bucket; its value is the
    bucket's mean (``agg="min"`` or ``"max"`` for the envelope).
    """
    return {
        name: [Point(b.step, getattr(b, agg)) for b in rows]
        for name, rows in buckets(job_id, names, max_points, url=url).items()
    }


def latest(job_id: int, names: Iterable[str] | None = None, *, url: str | None = None) -> dict[str, Point]:
    """The last logged point of each named series of ``job_id`` (every series when ``names`` is None).

    One ``ORDER BY step DESC LIMIT 1`` per name: it walks the (job_id, step, name) index
    backwards from the run's last step and stops at the first row of that name.
    """
    wanted = metric_names(job_id, url=url) if names is None else sorted(set(names))
    out: dict[str, Point] = {}
    with session(url, read_only=True) as s:
        for name in wanted:
            row = s.exec(
                select(Metric.step, Metric.value)
                .where(Metric.job_id == job_id, Metric.name == name)
                .order_by(col(Metric.step).desc())
                .limit(1)
            ).first()
            if row is not None:
                out[name] = Point(int(row[0]), float(row[1]))
    return out


def metric_names(job_id: int, *, url: str | None = None) -> list[str]:
    """Every metric name ``job_id`` has logged, sorted."""
    with session(url, read_only=True) as s:
        return sorted(s.exec(select(Metric.name).where(Metric.job_id == job_id).distinct()).all())


def point_count(job_id: int, *, url: str | None = None) -> int:
    with session(url, read_only=True) as s:
        return int(s.exec(select(func.count()).select_from(Metric).where(Metric.job_id == job_id)).one())


# --- trajectories ----------------------------------------------------------------------


def _trajectory_filter(
    job_id: int,
    domains: Sequence[str] | None,
    steps: tuple[int, int] | None,
    rewards: tuple[float, float] | None = None,
) -> list[ColumnElement[bool] | bool]:
    conditions: list[ColumnElement[bool] | bool] = [Trajectory.job_id == job_id]
    if domains:
        conditions.append(col(Trajectory.domain).in_(list(domains)))
    if steps is not None:
        conditions += [col(Trajectory.step) >= steps[0], col(Trajectory.step) <= steps[1]]
    if rewards is not None:
        conditions += [col(Trajectory.reward) >= rewards[0], col(Trajectory.reward) <= rewards[1]]
    return conditions


def trajectories(
    job_id: int,
    *,
    domains: Sequence[str] | None = None,
    steps: tuple[int, int] | None = None,
    rewards: tuple[float, float] | None = None,
    limit: int = 20,
    offset: int = 0,
    url: str | None = None,
) -> list[Trajectory]:
    """One page of a run's trajectories (of ``domains``, in the step and reward ranges given, both ends
    included), newest step first (ties by id)."""
    with session(url, read_only=True) as s:
        stmt = (
            select(Trajectory)
            .where(*_trajectory_filter(job_id, domains, steps, rewards))
            .order_by(col(Trajectory.step).desc(), col(Trajectory.id).asc())
            .offset(offset)
            .limit(limit)
        )
        return list(s.exec(stmt).all())


def trajectory_count(
    job_id: int,
    *,
    domains: Sequence[str] | None = None,
    steps: tuple[int, int] | None = None,
    rewards: tuple[float, float] | None = None,
    url: str | None = None,
) -> int:
    with session(url, read_only=True) as s:
        stmt = select(func.count()).select_from(Trajectory).where(*_trajectory_filter(job_id, domains, steps, rewards))
        return int(s.exec(stmt).one())


def trajectory_steps(job_id: int, *, url: str | None = None) -> tuple[int, int] | None:
    """The first and last step of a run that stored trajectories (None: it stored none)."""
    with session(url, read_only=True) as s:
        low, high = s.exec(
            select(func.min(Trajectory.step), func.max(Trajectory.step)).where(Trajectory.job_id == job_id)
        ).one()
    return None if low is None else (int(low), int(high))


def trajectory_domains(job_id: int, *, url: str | None = None) -> list[str]:
    with session(url, read_only=True) as s:
        return sorted(s.exec(select(Trajectory.domain).where(Trajectory.job_id == job_id).distinct()).all())
