"""Number formatting: separators, rounding, words, Roman numerals, bases, ordinals, padding."""

from __future__ import annotations

import random
from decimal import ROUND_HALF_UP, Decimal
from functools import partial

from posttrain.platform.tasks.domains.base import Domain, Problem, digits_number, exact

_ONES = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def number_to_words(n: int) -> str:
    """English words for 0 <= n < 10**9 ("one hundred twenty-three")."""
    if n < 20:
        return _ONES[n]
    if n < 100:
        return _TENS[n // 10] + ("" if n % 10 == 0 else "-" + _ONES[n % 10])
    if n < 1000:
        rest = n % 100
        return _ONES[n // 100] + " hundred" + ("" if rest == 0 else " " + number_to_words(rest))
    for size, name in ((10**6, "million"), (1000, "thousand")):
        if n >= size:
            rest = n % size
            return number_to_words(n // size) + f" {name}" + ("" if rest == 0 else " " + number_to_words(rest))
    raise ValueError(n)


def to_roman(n: int) -> str:
    table = [
        (1000, "M"),
        (900, "CM"),
        (500, "D"),
        (400, "CD"),
        (100, "C"),
        (90, "XC"),
        (50, "L"),
        (40, "XL"),
        (10, "X"),
        (9, "IX"),
        (5, "V"),
        (4, "IV"),
        (1, "I"),
    ]
    out = []
    for value, letters in table:
        while n >= value:
            out.append(letters)
            n -= value
    return "".join(out)


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _int(rng: random.Random, difficulty: int, top: int | None = None) -> int:
    value = max(1, digits_number(rng, difficulty))
    return min(value, top) if top else value


def _make(task: str, rng: random.Random, difficulty: int) -> Problem:
    if task == "thousands":
        n = digits_number(rng, difficulty + 3)
        return exact(f"Write {n} with comma thousands separators.", f"{n:,}")
    if task == "round":
        places = rng.randint(0, min(3, difficulty))
        value = Decimal(rng.randint(1, 10 ** (difficulty + 1))) / Decimal(10) ** (places + 2)
        text = f"{value:.{places + 2}f}"
        rounded = str(value.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP))
        return exact(f"Round {text} to {places} decimal places.", rounded)
    if task == "percent":
        places = min(4, difficulty + 1)
        value = Decimal(rng.randint(1, 10**places - 1)) / Decimal(10) ** places
        text = format(value.normalize(), "f")
        percent = format((value * 100).normalize(), "f") + "%"
        return exact(f"Write {text} as a percentage.", percent)
    if task == "to_words":
        n = digits_number(rng, difficulty)
        return exact(f"Write {n} in English words.", number_to_words(n), normalize=True)
    if task == "from_words":
        n = digits_number(rng, difficulty)
        return exact(f"Write as digits: {number_to_words(n)}", str(n))
    if task == "to_roman":
        n = _int(rng, difficulty, 3999)
        return exact(f"Write {n} in Roman numerals.", to_roman(n), normalize=True)
    if task == "from_roman":
        n = _int(rng, difficulty, 3999)
        return exact(f"Write the Roman numeral {to_roman(n)} as a number.", str(n))
    if task in ("to_binary", "to_hex", "to_octal"):
        n = digits_number(rng, difficulty)
        spec = {"to_binary": ("binary", "b"), "to_hex": ("hexadecimal", "x"), "to_octal": ("octal", "o")}[task]
        return exact(f"Write {n} in {spec[0]}.", format(n, spec[1]), normalize=True)
    if task in ("from_binary", "from_hex"):
        n = digits_number(rng, difficulty)
        base, code = ("binary", "b") if task == "from_binary" else ("hexadecimal", "x")
        return exact(f"Convert {base} {format(n, code)} to decimal.", str(n))
    if task == "ordinal":
        n = _int(rng, difficulty)
        return exact(f"Write {n} as an ordinal (like 1st).", ordinal(n), normalize=True)
    if task == "zero_pad":
        n = digits_number(rng, difficulty)
        width = len(str(n)) + rng.randint(1, 3)
        return exact(f"Pad {n} with zeros to {width} digits.", str(n).zfill(width))
    if task == "scientific":
        mantissa = rng.randint(10, 99) / 10
        exponent = rng.randint(-difficulty - 1, difficulty + 2)
        number = mantissa * 10.0**exponent
        return exact(
            f"Write {number:.{max(0, 1 - exponent)}f} in scientific notation like 1.5e3.",
            f"{mantissa:g}e{exponent}",
            normalize=True,
        )
    raise ValueError(task)  # pragma: no cover


_TASKS = (
    "thousands",
    "round",
    "percent",
    "to_words",
    "from_words",
    "to_roman",
    "from_roman",
    "to_binary",
    "to_hex",
    "to_octal",
    "from_binary",
    "from_hex",
    "ordinal",
    "zero_pad",
    "scientific",
)


def domains() -> list[Domain]:
    return [
        Domain(f"format.{task}", "formatting", f"number formatting: {task}", partial(_make, task), {"task": task})
        for task in _TASKS
    ]
