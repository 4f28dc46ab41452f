"""Regular-expression extraction from generated text: list the matches, or count them.

The answer is computed by running the pattern over the generated text."""

from __future__ import annotations

import random
import re
import string
from collections.abc import Callable
from functools import partial

from posttrain.platform.tasks.domains.base import Domain, Problem, exact, numeric

_FILLER = "the of and to in is was for on that with as at by from it this we our all some more".split()


def _word(rng: random.Random) -> str:
    return rng.choice(_FILLER)


Maker = Callable[[random.Random], str]

PATTERNS: dict[str, tuple[str, str, Maker]] = {
    "email": (
        "email addresses",
        r"[a-z]+@[a-z]+\.(?:com|org|net)",
        lambda r: (
            f"{r.choice(['ann', 'bob', 'li', 'max'])}@{r.choice(['mail', 'corp', 'uni'])}.{r.choice(['com', 'org', 'net'])}"
        ),
    ),
    "phone": (
        "phone numbers like 555-1234",
        r"\b\d{3}-\d{4}\b",
        lambda r: f"{r.randint(200, 999)}-{r.randint(0, 9999):04d}",
    ),
    "iso_date": (
        "dates like 2024-01-31",
        r"\b\d{4}-\d{2}-\d{2}\b",
        lambda r: f"{r.randint(1990, 2030)}-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}",
    ),
    "integer": ("whole numbers", r"(?<![\d.])\d+(?![\d.])", lambda r: str(r.randint(0, 999))),
    "decimal": ("decimal numbers like 3.14", r"\b\d+\.\d+\b", lambda r: f"{r.randint(0, 99)}.{r.randint(1, 99)}"),
    "hashtag": ("hashtags", r"#[a-z]+", lambda r: "#" + r.choice(["ai", "fun", "news", "tech", "cats"])),
    "mention": ("@mentions", r"(?<![a-z])@[a-z]+", lambda r: "@" + r.choice(["ann", "bob", "cat", "dan"])),
    "url": (
        "URLs",
        r"https?://[a-z]+\.[a-z]+(?:/[a-z]+)?",
        lambda r: (
            f"{r.choice(['http', 'https'])}://{r.choice(['site', 'docs', 'shop'])}.{r.choice(['com', 'io'])}/{r.choice(['a', 'home', 'faq'])}"
        ),
    ),
    "capitalized": (
        "capitalized words",
        r"\b[A-Z][a-z]+\b",
        lambda r: r.choice(["Paris", "Alice", "Monday", "Rome", "Bob"]),
    ),
    "ing_word": (
        "words ending in -ing",
        r"\b[a-z]+ing\b",
        lambda r: r.choice(["running", "eating", "singing", "coding", "reading"]),
    ),
    "hex_color": (
        "hex colors like #a1b2c3",
        r"#[0-9a-f]{6}\b",
        lambda r: "#" + "".join(r.choice("0123456789abcdef") for _ in range(6)),
    ),
    "ipv4": (
        "IPv4 addresses",
        r"\b(?:\d{1,3}\.){3}\d{1,3}\b",
        lambda r: ".".join(str(r.randint(0, 255)) for _ in range(4)),
    ),
    "time": ("times like 09:30", r"\b\d{2}:\d{2}\b", lambda r: f"{r.randint(0, 23):02d}:{r.randint(0, 59):02d}"),
    "zip": ("5-digit ZIP codes", r"(?<![\d-])\d{5}(?![\d-])", lambda r: f"{r.randint(10000, 99999)}"),
    "acronym": (
        "all-caps acronyms",
        r"\b[A-Z]{2,}\b",
        lambda r: "".join(r.choice(string.ascii_uppercase) for _ in range(r.randint(2, 4))),
    ),
    "double_letter": (
        "words with a doubled letter",
        r"\b[a-z]*([a-z])\1[a-z]*\b",
        lambda r: r.choice(["book", "tree", "ball", "apple", "coffee"]),
    ),
}


def _text(rng: random.Random, make: Maker, difficulty: int) -> str:
    parts: list[str] = []
    for _ in range(rng.randint(1, difficulty + 1)):
        parts += [_word(rng) for _ in range(rng.randint(0, 1 + difficulty))]
        parts.append(make(rng))
    parts += [_word(rng) for _ in range(rng.randint(0, 2))]
    return " ".join(parts)


def _matches(pattern: str, text: str) -> list[str]:
    return [m.group(0) for m in re.finditer(pattern, text)]


def _make(name: str, mode: str, rng: random.Random, difficulty: int) -> Problem:
    label, pattern, maker = PATTERNS[name]
    text = _text(rng, maker, difficulty)
    found = _matches(pattern, text)
    if mode == "count":
        return numeric(f"How many {label} are in: {text}", len(found))
    return exact(
        f"List the {label}, comma-separated, in order: {text}",
        ", ".join(found) if found else "none",
        normalize=name not in ("capitalized", "acronym"),
    )


def domains() -> list[Domain]:
    return [
        Domain(
            f"regex.{name}.{mode}",
            "regex",
            f"regex {mode}: {PATTERNS[name][0]}",
            partial(_make, name, mode),
            {"pattern": name, "mode": mode},
        )
        for name in PATTERNS
        for mode in ("extract", "count")
    ]
