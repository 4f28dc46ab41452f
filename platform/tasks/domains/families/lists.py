"""List transformations, sorting and counting over integers and words; difficulty = length and size."""

from __future__ import annotations

import random
import statistics
from functools import partial

from posttrain.platform.tasks.domains.base import Domain, Problem, exact, numeric
from posttrain.platform.tasks.domains.families.strings import WORDS


def _ints(rng: random.Random, difficulty: int) -> list[int]:
    top = (9, 20, 99, 500, 9999)[difficulty - 1]
    return [rng.randint(0, top) for _ in range(2 + difficulty)]


def _show(values: list[int] | list[str]) -> str:
    return ", ".join(str(v) for v in values)


def _list(prompt: str, values: list[int] | list[str]) -> Problem:
    return exact(prompt, _show(values) if values else "none", normalize=True)


def _make_int(task: str, rng: random.Random, difficulty: int) -> Problem:
    xs = _ints(rng, difficulty)
    shown = _show(xs)
    k = rng.randint(1, max(1, len(xs) - 1))
    if task == "sort_asc":
        return _list(f"Sort ascending: {shown}", sorted(xs))
    if task == "sort_desc":
        return _list(f"Sort descending: {shown}", sorted(xs, reverse=True))
    if task == "reverse":
        return _list(f"Reverse the list: {shown}", xs[::-1])
    if task == "unique":
        return _list(f"Remove duplicates, keep first occurrences: {shown}", list(dict.fromkeys(xs)))
    if task == "sum":
        return numeric(f"Sum of: {shown}", sum(xs))
    if task == "max":
        return numeric(f"Maximum of: {shown}", max(xs))
    if task == "min":
        return numeric(f"Minimum of: {shown}", min(xs))
    if task == "length":
        return numeric(f"How many numbers: {shown}", len(xs))
    if task == "count_value":
        target = rng.choice(xs)
        return numeric(f"How many times does {target} appear in: {shown}", xs.count(target))
    if task == "first_k":
        return _list(f"First {k} items of: {shown}", xs[:k])
    if task == "last_k":
        return _list(f"Last {k} items of: {shown}", xs[-k:])
    if task == "evens":
        return _list(f"Keep the even numbers (or say none): {shown}", [x for x in xs if x % 2 == 0])
    if task == "odds":
        return _list(f"Keep the odd numbers (or say none): {shown}", [x for x in xs if x % 2 == 1])
    if task == "greater_than":
        threshold = rng.choice(xs)
        return _list(f"Keep numbers greater than {threshold} (or say none): {shown}", [x for x in xs if x > threshold])
    if task == "add_k":
        return _list(f"Add {k} to each: {shown}", [x + k for x in xs])
    if task == "times_k":
        return _list(f"Multiply each by {k + 1}: {shown}", [x * (k + 1) for x in xs])
    if task == "cumsum":
        running, total = [], 0
        for x in xs:
            total += x
            running.append(total)
        return _list(f"Running totals of: {shown}", running)
    if task == "rotate":
        return _list(f"Rotate left by {k}: {shown}", xs[k:] + xs[:k])
    if task == "median":
        odd = xs if len(xs) % 2 else xs + [rng.randint(0, max(xs))]
        return numeric(f"Median of: {_show(odd)}", statistics.median(odd))
    if task == "range":
        return numeric(f"Largest minus smallest of: {shown}", max(xs) - min(xs))
    if task == "count_greater":
        threshold = rng.choice(xs)
        return numeric(f"How many numbers are greater than {threshold}: {shown}", sum(x > threshold for x in xs))
    raise ValueError(task)  # pragma: no cover


def _make_words(task: str, rng: random.Random, difficulty: int) -> Problem:
    words = [rng.choice(WORDS[: 20 * (difficulty + 1)]) for _ in range(2 + difficulty)]
    shown = _show(words)
    if task == "sort_alpha":
        return _list(f"Sort alphabetically: {shown}", sorted(words))
    if task == "sort_length":
        return _list(f"Sort by length, shortest first, ties keep order: {shown}", sorted(words, key=len))
    if task == "reverse":
        return _list(f"Reverse the list: {shown}", words[::-1])
    if task == "count":
        return numeric(f"How many words: {shown}", len(words))
    if task == "first_letters":
        return exact(f"First letters joined: {shown}", "".join(w[0] for w in words))
    if task == "shortest":
        return exact(f"Shortest word (first if tied): {shown}", min(words, key=len))
    if task == "join_dash":
        return exact(f"Join with dashes: {shown}", "-".join(words))
    if task == "unique":
        return _list(f"Remove duplicates, keep first occurrences: {shown}", list(dict.fromkeys(words)))
    if task == "starting_with":
        letter = rng.choice(words)[0]
        return _list(f"Words starting with '{letter}': {shown}", [w for w in words if w.startswith(letter)])
    if task == "total_letters":
        return numeric(f"Total letters in: {shown}", sum(len(w) for w in words))
    raise ValueError(task)  # pragma: no cover


INT_TASKS = (
    "sort_asc",
    "sort_desc",
    "reverse",
    "unique",
    "sum",
    "max",
    "min",
    "length",
    "count_value",
    "first_k",
    "last_k",
    "evens",
    "odds",
    "greater_than",
    "add_k",
    "times_k",
    "cumsum",
    "rotate",
    "median",
    "range",
    "count_greater",
)
WORD_TASKS = (
    "sort_alpha",
    "sort_length",
    "reverse",
    "count",
    "first_letters",
    "shortest",
    "join_dash",
    "unique",
    "starting_with",
    "total_letters",
)


def domains() -> list[Domain]:
    found = [
        Domain(f"list.int.{t}", "lists", f"integer list: {t}", partial(_make_int, t), {"task": t, "items": "int"})
        for t in INT_TASKS
    ]
    found += [
        Domain(f"list.word.{t}", "lists", f"word list: {t}", partial(_make_words, t), {"task": t, "items": "word"})
        for t in WORD_TASKS
    ]
    return found
