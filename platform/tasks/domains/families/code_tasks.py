"""Small code-writing tasks with generated unit tests (checked by the 'code' verifier).

Each task has a reference solution; the tests' expected values are computed by running
that reference on generated inputs, so they are right by construction.
"""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from posttrain.platform.tasks.domains.base import Domain, Problem
from posttrain.platform.verifiers.models import VerifierRef


@dataclass(frozen=True)
class CodeTask:
    name: str
    signature: str
    description: str
    solution: str
    inputs: Callable[[random.Random, int], tuple[Any, ...]]


def _word(rng: random.Random, difficulty: int) -> str:
    return "".join(
        rng.choice("abcde" if difficulty < 3 else string.ascii_lowercase)
        for _ in range(rng.randint(0, 2 + 2 * difficulty))
    )


def _ints(rng: random.Random, difficulty: int) -> list[int]:
    return [rng.randint(-5 * difficulty, 10 * difficulty) for _ in range(rng.randint(0, 2 + 2 * difficulty))]


def _nonempty(rng: random.Random, difficulty: int) -> list[int]:
    return _ints(rng, difficulty) or [rng.randint(0, 9)]


TASKS = (
    CodeTask(
        "add",
        "add(a, b)",
        "returns a + b",
        "def add(a, b):\n    return a + b\n",
        lambda r, d: (r.randint(-(10**d), 10**d), r.randint(-(10**d), 10**d)),
    ),
    CodeTask(
        "reverse_string",
        "reverse_string(s)",
        "returns s reversed",
        "def reverse_string(s):\n    return s[::-1]\n",
        lambda r, d: (_word(r, d),),
    ),
    CodeTask(
        "is_palindrome",
        "is_palindrome(s)",
        "returns True if s reads the same backwards",
        "def is_palindrome(s):\n    return s == s[::-1]\n",
        lambda r, d: (r.choice([_word(r, d), "aba", "abba", "ab"]),),
    ),
    CodeTask(
        "count_vowels",
        "count_vowels(s)",
        "returns how many of a, e, i, o, u are in s",
        "def count_vowels(s):\n    return sum(c in 'aeiou' for c in s)\n",
        lambda r, d: (_word(r, d),),
    ),
    CodeTask(
        "factorial",
        "factorial(n)",
        "returns n! (factorial(0) == 1)",
        "def factorial(n):\n    result = 1\n    for k in range(2, n + 1):\n        result *= k\n    return result\n",
        lambda r, d: (r.randint(0, 3 + 2 * d),),
    ),
    CodeTask(
        "fibonacci",
        "fibonacci(n)",
        "returns the n-th Fibonacci number (fibonacci(0) == 0, fibonacci(1) == 1)",
        "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
        lambda r, d: (r.randint(0, 5 + 5 * d),),
    ),
    CodeTask(
        "sum_list",
        "sum_list(xs)",
        "returns the sum of the numbers in xs",
        "def sum_list(xs):\n    return sum(xs)\n",
        lambda r, d: (_ints(r, d),),
    ),
    CodeTask(
        "max_of",
        "max_of(xs)",
        "returns the largest number of the non-empty list xs",
        "def max_of(xs):\n    return max(xs)\n",
        lambda r, d: (_nonempty(r, d),),
    ),
    CodeTask(
        "evens",
        "evens(xs)",
        "returns the even numbers of xs, in order",
        "def evens(xs):\n    return [x for x in xs if x % 2 == 0]\n",
        lambda r, d: (_ints(r, d),),
    ),
    CodeTask(
        "gcd",
        "gcd(a, b)",
        "returns the greatest common divisor of positive a and b",
        "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return a\n",
        lambda r, d: (r.randint(1, 10 * d * d), r.randint(1, 10 * d * d)),
    ),
    CodeTask(
        "is_prime",
        "is_prime(n)",
        "returns True if n is a prime number",
        "def is_prime(n):\n    if n < 2:\n        return False\n    k = 2\n    while k * k <= n:\n        if n % k == 0:\n            return False\n        k += 1\n    return True\n",
        lambda r, d: (r.randint(0, 20 * d * d),),
    ),
    CodeTask(
        "word_count",
        "word_count(s)",
        "returns the number of space-separated words in s",
        "def word_count(s):\n    return len(s.split())\n",
        lambda r, d: (" ".join(_word(r, d) or "x" for _ in range(r.randint(0, 2 + d))),),
    ),
    CodeTask(
        "capitalize_words",
        "capitalize_words(s)",
        "returns s with the first letter of each space-separated word upper-cased",
        "def capitalize_words(s):\n    return ' '.join(w[:1].upper() + w[1:] for w in s.split(' '))\n",
        lambda r, d: (" ".join(_word(r, d) or "x" for _ in range(r.randint(1, 2 + d))),),
    ),
    CodeTask(
        "flatten",
        "flatten(xss)",
        "returns the lists in xss concatenated into one list",
        "def flatten(xss):\n    return [x for xs in xss for x in xs]\n",
        lambda r, d: ([_ints(r, d) for _ in range(r.randint(0, 1 + d))],),
    ),
    CodeTask(
        "second_largest",
        "second_largest(xs)",
        "returns the second largest distinct value of xs (which has at least two distinct values)",
        "def second_largest(xs):\n    return sorted(set(xs))[-2]\n",
        lambda r, d: (_nonempty(r, d) + [10**6],),
    ),
    CodeTask(
        "running_sum",
        "running_sum(xs)",
        "returns the running totals of xs",
        "def running_sum(xs):\n    out, total = [], 0\n    for x in xs:\n        total += x\n        out.append(total)\n    return out\n",
        lambda r, d: (_ints(r, d),),
    ),
    CodeTask(
        "char_count",
        "char_count(s)",
        "returns a dict mapping each character of s to how often it occurs",
        "def char_count(s):\n    counts = {}\n    for c in s:\n        counts[c] = counts.get(c, 0) + 1\n    return counts\n",
        lambda r, d: (_word(r, d),),
    ),
    CodeTask(
        "is_anagram",
        "is_anagram(a, b)",
        "returns True if a and b have the same letters with the same counts",
        "def is_anagram(a, b):\n    return sorted(a) == sorted(b)\n",
        lambda r, d: (lambda w: (w, r.choice([w[::-1], _word(r, d)])))(_word(r, d)),
    ),
    CodeTask(
        "dedupe",
        "dedupe(xs)",
        "returns xs without repeated values, keeping first occurrences",
        "def dedupe(xs):\n    seen, out = set(), []\n    for x in xs:\n        if x not in seen:\n            seen.add(x)\n            out.append(x)\n    return out\n",
        lambda r, d: ([r.randint(0, 3 + d) for _ in range(r.randint(0, 3 + 2 * d))],),
    ),
    CodeTask(
        "fizzbuzz",
        "fizzbuzz(n)",
        "returns 'FizzBuzz' if n is divisible by 15, 'Fizz' by 3, 'Buzz' by 5, else str(n)",
        "def fizzbuzz(n):\n    if n % 15 == 0:\n        return 'FizzBuzz'\n    if n % 3 == 0:\n        return 'Fizz'\n    if n % 5 == 0:\n        return 'Buzz'\n    return str(n)\n",
        lambda r, d: (r.randint(1, 20 * d),),
    ),
    CodeTask(
        "clamp",
        "clamp(x, lo, hi)",
        "returns x limited to the range lo..hi (lo <= hi)",
        "def clamp(x, lo, hi):\n    return max(lo, min(hi, x))\n",
        lambda r, d: (lambda lo: (r.randint(-10 * d, 10 * d), lo, lo + r.randint(0, 5 * d)))(r.randint(-5 * d, 5 * d)),
    ),
)


def _reference(task: CodeTask) -> Callable[..., Any]:
    namespace: dict[str, Any] = {}
    exec(compile(task.solution, f"<reference {task.name}>", "exec"), namespace)  # noqa: S102 - our own source
    return namespace[task.name]


def _make(task: CodeTask, rng: random.Random, difficulty: int) -> Problem:
    function = _reference(task)
    cases: list[tuple[Any, ...]] = []
    for _ in range(30):
        args = task.inputs(rng, difficulty)
        if args not in cases:
            cases.append(args)
        if len(cases) == 2 + difficulty:
            break
    lines = [f"assert {task.name}({', '.join(map(repr, args))}) == {function(*args)!r}" for args in cases]
    prompt = f"Write a Python function {task.signature} that {task.description}. Reply with code only."
    spec = {"language": "python", "tests": "\n".join(lines) + "\n", "entry_point": task.name}
    return Problem(prompt, task.solution, VerifierRef(kind="code", spec=spec))


def domains() -> list[Domain]:
    return [
        Domain(
            f"code.{t.name}", "code", f"write {t.signature}: {t.description}", partial(_make, t), {"function": t.name}
        )
        for t in TASKS
    ]
