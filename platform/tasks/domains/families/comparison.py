"""Comparing numbers: larger, smaller, yes/no, extremes of three, order three."""

from __future__ import annotations

import random
from functools import partial

from posttrain.platform.tasks.domains.base import Domain, Problem, digits_number, exact, format_number


def _number(rng: random.Random, difficulty: int, style: str) -> float | int:
    value: float | int = digits_number(rng, difficulty)
    if style == "decimal":
        value = round(value + rng.randint(1, 99) / 100, 2)
    elif style == "signed" and rng.random() < 0.5:
        value = -value
    return value


def _distinct(rng: random.Random, difficulty: int, style: str, count: int) -> list[float | int]:
    values: list[float | int] = []
    while len(values) < count:
        value = _number(rng, difficulty, style)
        if value not in values or len(values) >= 10 ** max(1, difficulty):
            values.append(value)
    return values


def _make(task: str, style: str, rng: random.Random, difficulty: int) -> Problem:
    show = format_number
    if task in ("larger", "smaller", "is_greater"):
        a, b = _distinct(rng, difficulty, style, 2)
        if task == "larger":
            return exact(f"Which is larger: {show(a)} or {show(b)}?", show(max(a, b)))
        if task == "smaller":
            return exact(f"Which is smaller: {show(a)} or {show(b)}?", show(min(a, b)))
        return exact(
            f"Is {show(a)} greater than {show(b)}? Answer yes or no.", "yes" if a > b else "no", normalize=True
        )
    values = _distinct(rng, difficulty, style, 3)
    listed = ", ".join(show(v) for v in values)
    if task == "max3":
        return exact(f"Largest of {listed}?", show(max(values)))
    if task == "min3":
        return exact(f"Smallest of {listed}?", show(min(values)))
    return exact(f"Sort ascending: {listed}", ", ".join(show(v) for v in sorted(values)), normalize=True)


def domains() -> list[Domain]:
    return [
        Domain(
            f"compare.{task}.{style}",
            "comparison",
            f"compare {style} numbers: {task}",
            partial(_make, task, style),
            {"task": task, "style": style},
        )
        for task in ("larger", "smaller", "is_greater", "max3", "min3", "sort3")
        for style in ("int", "signed", "decimal")
    ]
