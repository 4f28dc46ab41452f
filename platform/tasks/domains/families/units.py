"""Unit conversion between units of one dimension; checked numerically, units understood."""

from __future__ import annotations

import random
from functools import partial

from posttrain.platform.tasks.domains.base import Domain, Problem, format_number, numeric
from posttrain.platform.verifiers.kinds.units import find_unit

PAIRS = (
    ("km", "m"),
    ("m", "cm"),
    ("mi", "km"),
    ("ft", "m"),
    ("in", "cm"),
    ("yd", "m"),
    ("kg", "g"),
    ("lb", "kg"),
    ("oz", "g"),
    ("t", "kg"),
    ("h", "min"),
    ("min", "s"),
    ("day", "h"),
    ("week", "day"),
    ("L", "mL"),
    ("gal", "L"),
    ("GB", "MB"),
    ("MiB", "KiB"),
    ("KB", "B"),
    ("km/h", "m/s"),
    ("mph", "km/h"),
    ("°C", "°F"),
    ("°F", "°C"),
    ("°C", "K"),
    ("kcal", "kJ"),
    ("kWh", "J"),
    ("ha", "m2"),
    ("km2", "ha"),
)


def convert(value: float, source: str, target: str) -> float:
    from_unit, to_unit = find_unit(source), find_unit(target)
    assert from_unit is not None and to_unit is not None
    return to_unit.from_base(from_unit.to_base(value))


def _make(source: str, target: str, rng: random.Random, difficulty: int) -> Problem:
    if difficulty == 1:
        value: float = rng.randint(1, 9)
    elif difficulty == 2:
        value = rng.randint(10, 99)
    else:
        value = round(rng.uniform(0.5, 10 ** (difficulty - 1)), difficulty - 2)
    result = convert(value, source, target)
    answer = f"{float(f'{result:.8g}'):.8g}"
    return numeric(
        f"Convert {format_number(value)} {source} to {target}.",
        result,
        unit=target,
        rel_tol=1e-4,
        answer=f"{answer} {target}",
    )


def _slug(unit: str) -> str:
    return unit.replace("°", "deg").replace("/", "per")


def domains() -> list[Domain]:
    return [
        Domain(
            f"units.{_slug(s)}_to_{_slug(t)}",
            "units",
            f"convert {s} to {t}",
            partial(_make, s, t),
            {"from": s, "to": t},
        )
        for s, t in PAIRS
    ]
