"""A library of small everyday Python functions for the code-repair family, with the defects planted in them.

These are repair-only: no ``code.*`` task asks for them; the repair family draws from them and from the
``code.*`` functions (``code_tasks.TASKS``), whose defects ``DEFECTS`` holds too. Each ``CodeTask`` holds the reference solution (one
``def``, builtins only) and an input generator whose draws catch every defect of the function; ``DEFECTS`` maps
each function to the defects that can be planted in it (``old`` replaced once by ``new``). ``CALLS`` names the
callers: functions whose solution calls another function of this library, so a module holding a caller holds
its callee beside it, and a defect planted in the callee shows in the caller's tests too.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

from posttrain.platform.tasks.domains.families.code_tasks import CodeTask, _ints, _nonempty, _word

KINDS = ("off_by_one", "wrong_operator", "missing_case", "wrong_return", "swapped_arguments")


@dataclass(frozen=True)
class Defect:
    kind: str
    old: str  # replaced once in the function's reference solution
    new: str


def _list(rng: random.Random, difficulty: int) -> list[int]:
    """Integers, at least two of them, or now and then an empty list."""
    if rng.random() < 0.08:
        return []
    return [rng.randint(-5 * difficulty, 10 * difficulty) for _ in range(rng.randint(2, 3 + 2 * difficulty))]


def _text(rng: random.Random, difficulty: int) -> str:
    """Mixed-case letters with a few spaces."""
    alphabet = string.ascii_letters + "  "
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(3, 4 + 2 * difficulty)))


def _runs(rng: random.Random, difficulty: int) -> str:
    """Runs of repeated letters, like 'aaabccb'."""
    return "".join(rng.choice("abc") * rng.randint(1, 3) for _ in range(rng.randint(1, 2 + difficulty)))


def _sentence_and_length(rng: random.Random, difficulty: int) -> tuple[str, int]:
    words = [_word(rng, difficulty) or "x" for _ in range(rng.randint(1, 3 + difficulty))]
    return " ".join(words), rng.choice([len(w) for w in words])


def _with_substring(rng: random.Random, difficulty: int) -> tuple[str, str]:
    s = "".join(rng.choice("ab") for _ in range(rng.randint(3, 4 + 2 * difficulty)))
    size = rng.randint(1, 3)
    return s, s[-size:] if rng.random() < 0.75 else "".join(rng.choice("ab") for _ in range(size))


def _with_char(rng: random.Random, difficulty: int) -> tuple[str, str]:
    s = _word(rng, difficulty) or "ab"
    return s, rng.choice(s) if rng.random() < 0.8 else rng.choice(string.ascii_lowercase)


def _rotation(rng: random.Random, difficulty: int) -> tuple[list[int], int]:
    xs = [] if rng.random() < 0.08 else [rng.randint(0, 9) for _ in range(rng.randint(3, 4 + 2 * difficulty))]
    return xs, rng.randint(0, 6 * len(xs))


def _clip(rng: random.Random, difficulty: int) -> tuple[list[int], int, int]:
    lo = rng.randint(-3 * difficulty, 2 * difficulty)
    xs = [rng.randint(-8 * difficulty, 8 * difficulty) for _ in range(rng.randint(2, 3 + 2 * difficulty))]
    return xs, lo, lo + rng.randint(0, 4 * difficulty)


def _prefixed(rng: random.Random, difficulty: int) -> tuple[str, str]:
    prefix = _word(rng, difficulty)
    return prefix + _word(rng, difficulty) + "x", prefix + _word(rng, difficulty)


def _sorted_pair(rng: random.Random, difficulty: int) -> tuple[list[int], list[int]]:
    return sorted(_nonempty(rng, difficulty)), sorted(_ints(rng, difficulty))


def _truncation(rng: random.Random, difficulty: int) -> tuple[str, int]:
    s = _word(rng, difficulty) or "abc"
    return s, rng.randint(len(s), len(s) + 3) if rng.random() < 0.7 else rng.randint(0, len(s) - 1)


def _vowelly(rng: random.Random, difficulty: int) -> tuple[str]:
    return ("".join(rng.choice("aeiouAEIOUbcdxyzBCDXYZ ") for _ in range(rng.randint(6, 6 + 2 * difficulty))),)


def _factors(rng: random.Random, difficulty: int) -> tuple[list[int]]:
    """Non-zero factors, now and then with a zero among them."""
    xs = [rng.choice((-3, -2, -1, 1, 2, 3, 4, 5)) for _ in range(rng.randint(1, 2 + difficulty))]
    return (xs + [0] if rng.random() < 0.1 else xs,)


def _roman_input(rng: random.Random, difficulty: int) -> tuple[int]:
    return (rng.randint(1, min(50, 10 + 10 * difficulty)),)


FUNCTIONS: tuple[CodeTask, ...] = (
    # --------------------------------------------------------------- callees
    CodeTask(
        "power",
        "power(base, exp)",
        "returns base raised to the integer power exp >= 0 (power(b, 0) == 1), by repeated squaring",
        "def power(base, exp):\n"
        "    result = 1\n"
        "    while exp > 0:\n"
        "        if exp % 2 == 1:\n"
        "            result *= base\n"
        "        base *= base\n"
        "        exp //= 2\n"
        "    return result\n",
        lambda r, d: (r.randint(-3, 2 + d), r.randint(0, 2 + 2 * d)),
    ),
    CodeTask(
        "triangular",
        "triangular(n)",
        "returns the n-th triangular number 0 + 1 + ... + n, for n >= 0",
        "def triangular(n):\n    return n * (n + 1) // 2\n",
        lambda r, d: (r.randint(0, 10 * d),),
    ),
    CodeTask(
        "insertion_sort",
        "insertion_sort(xs)",
        "returns a new list of the items of xs in ascending order (xs itself is left unchanged)",
        "def insertion_sort(xs):\n"
        "    out = []\n"
        "    for x in xs:\n"
        "        i = 0\n"
        "        while i < len(out) and out[i] <= x:\n"
        "            i += 1\n"
        "        out.insert(i, x)\n"
        "    return out\n",
        lambda r, d: (_list(r, d),),
    ),
    CodeTask(
        "caesar_shift",
        "caesar_shift(s, k)",
        "returns s with every letter moved k places on in the alphabet, wrapping from z to a and keeping its case "
        "(k may be negative or above 25); other characters are kept",
        "def caesar_shift(s, k):\n"
        "    out = ''\n"
        "    for c in s:\n"
        "        if c.islower():\n"
        "            c = chr((ord(c) - 97 + k) % 26 + 97)\n"
        "        elif c.isupper():\n"
        "            c = chr((ord(c) - 65 + k) % 26 + 65)\n"
        "        out += c\n"
        "    return out\n",
        lambda r, d: (_text(r, d), r.randint(1, 25)),
    ),
    CodeTask(
        "count_positives",
        "count_positives(xs)",
        "returns how many numbers in xs are greater than zero",
        "def count_positives(xs):\n"
        "    count = 0\n"
        "    for x in xs:\n"
        "        if x > 0:\n"
        "            count += 1\n"
        "    return count\n",
        lambda r, d: (_list(r, d),),
    ),
    CodeTask(
        "to_binary",
        "to_binary(n)",
        "returns the binary digits of n >= 0 as a string, without a prefix or leading zeros ('0' for 0)",
        "def to_binary(n):\n"
        "    if n == 0:\n"
        "        return '0'\n"
        "    bits = ''\n"
        "    while n > 0:\n"
        "        bits = str(n % 2) + bits\n"
        "        n //= 2\n"
        "    return bits\n",
        lambda r, d: (r.randint(0, 2 ** (3 + d)),),
    ),
    CodeTask(
        "run_length_encode",
        "run_length_encode(s)",
        "returns the runs of equal adjacent characters of s as a list of [character, run length] lists, "
        "in order ([] for an empty string)",
        "def run_length_encode(s):\n"
        "    out = []\n"
        "    for c in s:\n"
        "        if out and out[-1][0] == c:\n"
        "            out[-1][1] += 1\n"
        "        else:\n"
        "            out.append([c, 1])\n"
        "    return out\n",
        lambda r, d: (_runs(r, d),),
    ),
    # --------------------------------------------------------------- callers (each calls one callee above)
    CodeTask(
        "sum_of_powers",
        "sum_of_powers(xs, p)",
        "returns the sum of power(x, p) over the numbers x in xs, i.e. of each x raised to the power p >= 0 "
        "(0 for an empty list)",
        "def sum_of_powers(xs, p):\n    total = 0\n    for x in xs:\n        total += power(x, p)\n    return total\n",
        lambda r, d: ([r.randint(-3, 3 + d) for _ in range(r.randint(1, 2 + d))], r.randint(0, 2 + d)),
    ),
    CodeTask(
        "range_sum",
        "range_sum(a, b)",
        "returns a + (a + 1) + ... + b for integers a >= 1 and b, computed as triangular(b) - triangular(a - 1); "
        "0 when a > b",
        "def range_sum(a, b):\n    if a > b:\n        return 0\n    return triangular(b) - triangular(a - 1)\n",
        lambda r, d: (lambda a: (a, a + r.randint(-2, 8 * d)))(r.randint(1, 10 * d)),
    ),
    CodeTask(
        "nth_smallest",
        "nth_smallest(xs, n)",
        "returns the n-th smallest item of xs, counting from 1 (1 <= n <= len(xs)), read off insertion_sort(xs)",
        "def nth_smallest(xs, n):\n    return insertion_sort(xs)[n - 1]\n",
        lambda r, d: (lambda xs: (xs, r.randint(1, len(xs))))(_list(r, d) or [r.randint(0, 9)]),
    ),
    CodeTask(
        "median",
        "median(xs)",
        "returns the median of the non-empty list xs as a float: the middle item of insertion_sort(xs), or the "
        "mean of its two middle items when len(xs) is even",
        "def median(xs):\n    s = insertion_sort(xs)\n    n = len(s)\n    return (s[(n - 1) // 2] + s[n // 2]) / 2\n",
        lambda r, d: (_list(r, d) or [r.randint(0, 9)],),
    ),
    CodeTask(
        "decode_caesar",
        "decode_caesar(s, k)",
        "returns the text that caesar_shift(text, k) turned into s: caesar_shift(s, -k)",
        "def decode_caesar(s, k):\n    return caesar_shift(s, -k)\n",
        lambda r, d: (_text(r, d), r.randint(1, 25)),
    ),
    CodeTask(
        "positive_ratio",
        "positive_ratio(xs)",
        "returns the fraction of the numbers in xs that are positive, count_positives(xs) / len(xs), rounded to 2 "
        "decimal places; 0.0 for an empty list",
        "def positive_ratio(xs):\n"
        "    if not xs:\n"
        "        return 0.0\n"
        "    return round(count_positives(xs) / len(xs), 2)\n",
        lambda r, d: (_list(r, d),),
    ),
    CodeTask(
        "binary_padded",
        "binary_padded(n, width)",
        "returns to_binary(n), the binary digits of n >= 0, padded on the left with '0' to at least width characters",
        "def binary_padded(n, width):\n    return to_binary(n).rjust(width, '0')\n",
        lambda r, d: (lambda n: (n, max(1, n.bit_length()) + r.randint(0, 4)))(r.randint(0, 2 ** (2 + d))),
    ),
    CodeTask(
        "compress_string",
        "compress_string(s)",
        "returns the runs of run_length_encode(s) written out as one string, each run's character followed by "
        "its length: 'aaab' -> 'a3b1' ('' for an empty string)",
        "def compress_string(s):\n    return ''.join(c + str(n) for c, n in run_length_encode(s))\n",
        lambda r, d: (_runs(r, d),),
    ),
    # --------------------------------------------------------------- stand-alone functions
    CodeTask(
        "chunk",
        "chunk(xs, size)",
        "returns xs cut into consecutive lists of size items (size >= 1), the last one shorter if need be "
        "([] for an empty xs)",
        "def chunk(xs, size):\n    return [xs[i:i + size] for i in range(0, len(xs), size)]\n",
        lambda r, d: (_list(r, d), r.randint(1, 3)),
    ),
    CodeTask(
        "rotate_left",
        "rotate_left(xs, k)",
        "returns xs rotated left by k >= 0 places, the first k items moved to the end (k may exceed len(xs): "
        "rotating by len(xs) gives xs back); [] for an empty list",
        "def rotate_left(xs, k):\n    if not xs:\n        return []\n    k %= len(xs)\n    return xs[k:] + xs[:k]\n",
        _rotation,
    ),
    CodeTask(
        "count_longer_than",
        "count_longer_than(s, k)",
        "returns how many of the space-separated words of s have more than k characters",
        "def count_longer_than(s, k):\n    return sum(1 for w in s.split() if len(w) > k)\n",
        _sentence_and_length,
    ),
    CodeTask(
        "digit_sum",
        "digit_sum(n)",
        "returns the sum of the decimal digits of n >= 0",
        "def digit_sum(n):\n"
        "    total = 0\n"
        "    while n > 0:\n"
        "        total += n % 10\n"
        "        n //= 10\n"
        "    return total\n",
        lambda r, d: (r.randint(0, 10 ** (1 + d)),),
    ),
    CodeTask(
        "to_roman",
        "to_roman(n)",
        "returns n (1 <= n <= 50) in Roman numerals, upper case, using L, XL, X, IX, V, IV and I",
        "def to_roman(n):\n"
        "    out = ''\n"
        "    for value, letters in ((50, 'L'), (40, 'XL'), (10, 'X'), (9, 'IX'), (5, 'V'), (4, 'IV'), (1, 'I')):\n"
        "        while n >= value:\n"
        "            out += letters\n"
        "            n -= value\n"
        "    return out\n",
        _roman_input,
    ),
    CodeTask(
        "interleave",
        "interleave(a, b)",
        "returns a[0], b[0], a[1], b[1], ... as one list; once the shorter list runs out the rest of the longer "
        "one follows in order",
        "def interleave(a, b):\n"
        "    out = []\n"
        "    for i in range(max(len(a), len(b))):\n"
        "        if i < len(a):\n"
        "            out.append(a[i])\n"
        "        if i < len(b):\n"
        "            out.append(b[i])\n"
        "    return out\n",
        lambda r, d: (_ints(r, d), _nonempty(r, d)),
    ),
    CodeTask(
        "zip_to_dict",
        "zip_to_dict(keys, values)",
        "returns a dict mapping keys[i] to values[i] for every i below the length of the shorter list; "
        "a repeated key keeps its last value",
        "def zip_to_dict(keys, values):\n"
        "    out = {}\n"
        "    for k, v in zip(keys, values):\n"
        "        out[k] = v\n"
        "    return out\n",
        lambda r, d: (lambda n: ([_word(r, d) or "k" for _ in range(n)], [r.randint(0, 9) for _ in range(n)]))(
            r.randint(1, 2 + d)
        ),
    ),
    CodeTask(
        "first_negative_index",
        "first_negative_index(xs)",
        "returns the index of the first negative number in xs, or -1 if there is none",
        "def first_negative_index(xs):\n"
        "    for i, x in enumerate(xs):\n"
        "        if x < 0:\n"
        "            return i\n"
        "    return -1\n",
        lambda r, d: ([r.randint(-9, 9) for _ in range(r.randint(2, 4 + d))],),
    ),
    CodeTask(
        "longest_run",
        "longest_run(xs)",
        "returns the length of the longest block of equal adjacent items of xs (0 for an empty list)",
        "def longest_run(xs):\n"
        "    best = run = 0\n"
        "    for i, x in enumerate(xs):\n"
        "        run = run + 1 if i > 0 and xs[i - 1] == x else 1\n"
        "        best = max(best, run)\n"
        "    return best\n",
        lambda r, d: ([r.randint(0, 2) for _ in range(r.randint(2, 4 + 2 * d))],),
    ),
    CodeTask(
        "pairwise_differences",
        "pairwise_differences(xs)",
        "returns [xs[1] - xs[0], xs[2] - xs[1], ...], one difference per adjacent pair ([] for fewer than two items)",
        "def pairwise_differences(xs):\n    return [xs[i + 1] - xs[i] for i in range(len(xs) - 1)]\n",
        lambda r, d: (_list(r, d),),
    ),
    CodeTask(
        "merge_sorted",
        "merge_sorted(a, b)",
        "returns the items of the ascending lists a and b merged into one ascending list",
        "def merge_sorted(a, b):\n"
        "    out, i, j = [], 0, 0\n"
        "    while i < len(a) and j < len(b):\n"
        "        if a[i] <= b[j]:\n"
        "            out.append(a[i])\n"
        "            i += 1\n"
        "        else:\n"
        "            out.append(b[j])\n"
        "            j += 1\n"
        "    return out + a[i:] + b[j:]\n",
        _sorted_pair,
    ),
    CodeTask(
        "remove_char",
        "remove_char(s, c)",
        "returns s with every occurrence of the character c removed",
        "def remove_char(s, c):\n    return ''.join(ch for ch in s if ch != c)\n",
        _with_char,
    ),
    CodeTask(
        "count_substring",
        "count_substring(s, sub)",
        "returns how many times the non-empty string sub occurs in s, counting overlapping occurrences "
        "('aa' occurs twice in 'aaa')",
        "def count_substring(s, sub):\n"
        "    return sum(1 for i in range(len(s) - len(sub) + 1) if s[i:i + len(sub)] == sub)\n",
        _with_substring,
    ),
    CodeTask(
        "list_product",
        "list_product(xs)",
        "returns the product of the numbers in xs (1 for an empty list)",
        "def list_product(xs):\n    result = 1\n    for x in xs:\n        result *= x\n    return result\n",
        _factors,
    ),
    CodeTask(
        "remove_vowels",
        "remove_vowels(s)",
        "returns s without its vowels a, e, i, o, u, in lower or upper case",
        "def remove_vowels(s):\n    return ''.join(c for c in s if c not in 'aeiouAEIOU')\n",
        _vowelly,
    ),
    CodeTask(
        "clip_values",
        "clip_values(xs, lo, hi)",
        "returns xs with every number below lo replaced by lo and every number above hi replaced by hi (lo <= hi)",
        "def clip_values(xs, lo, hi):\n    return [lo if x < lo else hi if x > hi else x for x in xs]\n",
        _clip,
    ),
    CodeTask(
        "every_nth",
        "every_nth(xs, n)",
        "returns every n-th item of xs (n >= 1): the items at positions n - 1, 2n - 1, 3n - 1, ...",
        "def every_nth(xs, n):\n    return xs[n - 1::n]\n",
        lambda r, d: (_list(r, d), r.randint(1, 3)),
    ),
    CodeTask(
        "common_prefix",
        "common_prefix(a, b)",
        "returns the longest string that both a and b start with",
        "def common_prefix(a, b):\n"
        "    i = 0\n"
        "    while i < min(len(a), len(b)) and a[i] == b[i]:\n"
        "        i += 1\n"
        "    return a[:i]\n",
        _prefixed,
    ),
    CodeTask(
        "index_of_max",
        "index_of_max(xs)",
        "returns the index of the largest item of the non-empty list xs (the first one if it occurs more than once)",
        "def index_of_max(xs):\n"
        "    best = 0\n"
        "    for i in range(1, len(xs)):\n"
        "        if xs[i] > xs[best]:\n"
        "            best = i\n"
        "    return best\n",
        lambda r, d: (_list(r, d) or [r.randint(0, 9)],),
    ),
    CodeTask(
        "subtract_lists",
        "subtract_lists(a, b)",
        "returns the items of a that do not occur in b, in the order of a",
        "def subtract_lists(a, b):\n    return [x for x in a if x not in b]\n",
        lambda r, d: tuple([r.randint(0, 3 + d) for _ in range(r.randint(2, 3 + d))] for _ in range(2)),
    ),
    CodeTask(
        "window_sums",
        "window_sums(xs, k)",
        "returns the sums of every run of k >= 1 consecutive items of xs, from left to right "
        "([] when xs has fewer than k items)",
        "def window_sums(xs, k):\n    return [sum(xs[i:i + k]) for i in range(len(xs) - k + 1)]\n",
        lambda r, d: (_list(r, d), r.randint(1, 3)),
    ),
    CodeTask(
        "mode",
        "mode(xs)",
        "returns the most frequent item of the non-empty list xs; among equally frequent items the smallest",
        "def mode(xs):\n"
        "    counts = {}\n"
        "    for x in xs:\n"
        "        counts[x] = counts.get(x, 0) + 1\n"
        "    return min(counts, key=lambda x: (-counts[x], x))\n",
        lambda r, d: ([r.randint(0, 2 + d // 2) for _ in range(r.randint(4, 4 + 2 * d))],),
    ),
    CodeTask(
        "cumulative_max",
        "cumulative_max(xs)",
        "returns the running maximum of xs: item i is the largest of xs[0], ..., xs[i]",
        "def cumulative_max(xs):\n"
        "    out = []\n"
        "    for x in xs:\n"
        "        out.append(x if not out or x > out[-1] else out[-1])\n"
        "    return out\n",
        lambda r, d: (_list(r, d),),
    ),
    CodeTask(
        "reverse_words",
        "reverse_words(s)",
        "returns the space-separated words of s in reverse order, joined by single spaces",
        "def reverse_words(s):\n    return ' '.join(s.split()[::-1])\n",
        lambda r, d: (" ".join(_word(r, d) or "x" for _ in range(r.randint(2, 3 + d))),),
    ),
    CodeTask(
        "truncate",
        "truncate(s, n)",
        "returns s unchanged when it has at most n characters, otherwise its first n characters followed by '...'",
        "def truncate(s, n):\n    if len(s) <= n:\n        return s\n    return s[:n] + '...'\n",
        _truncation,
    ),
    CodeTask(
        "alternate_case",
        "alternate_case(s)",
        "returns s with the characters at even positions (0, 2, ...) upper-cased and the others lower-cased",
        "def alternate_case(s):\n    return ''.join(c.upper() if i % 2 == 0 else c.lower() for i, c in enumerate(s))\n",
        lambda r, d: (_text(r, d),),
    ),
    CodeTask(
        "abs_values",
        "abs_values(xs)",
        "returns the absolute values of the numbers in xs, in order",
        "def abs_values(xs):\n    return [-x if x < 0 else x for x in xs]\n",
        lambda r, d: (_list(r, d),),
    ),
)

DEFECTS: dict[str, tuple[Defect, ...]] = {  # the code.* functions' defects first, then this library's
    "add": (Defect("wrong_operator", "a + b", "a - b"), Defect("off_by_one", "a + b", "a + b + 1")),
    "reverse_string": (Defect("wrong_return", "s[::-1]", "s"), Defect("off_by_one", "s[::-1]", "s[-2::-1]")),
    "is_palindrome": (Defect("wrong_operator", "s == s[::-1]", "s != s[::-1]"),),
    "count_vowels": (
        Defect("missing_case", "'aeiou'", "'aeio'"),
        Defect("wrong_operator", "c in 'aeiou'", "c not in 'aeiou'"),
    ),
    "factorial": (
        Defect("off_by_one", "range(2, n + 1)", "range(2, n)"),
        Defect("wrong_operator", "result *= k", "result += k"),
    ),
    "fibonacci": (Defect("off_by_one", "range(n)", "range(n - 1)"), Defect("wrong_return", "return a\n", "return b\n")),
    "sum_list": (Defect("off_by_one", "sum(xs)", "sum(xs[1:])"),),
    "max_of": (
        Defect("wrong_return", "max(xs)", "min(xs)"),
        Defect("off_by_one", "max(xs)", "max(xs[1:] or xs[:1]) if len(xs) > 2 else max(xs)"),
    ),
    "evens": (Defect("wrong_operator", "x % 2 == 0", "x % 2 == 1"),),
    "gcd": (Defect("wrong_return", "return a\n", "return b\n"), Defect("off_by_one", "return a\n", "return a - 1\n")),
    "is_prime": (
        Defect("off_by_one", "k * k <= n", "k * k < n"),
        Defect("missing_case", "    if n < 2:\n        return False\n", ""),
    ),
    "word_count": (Defect("off_by_one", "len(s.split())", "len(s.split()) - 1"),),
    "capitalize_words": (Defect("wrong_return", "w[:1].upper()", "w[:1].lower()"),),
    "flatten": (Defect("wrong_return", "[x for xs in xss for x in xs]", "[xs[0] for xs in xss if xs]"),),
    "second_largest": (Defect("off_by_one", "[-2]", "[-1]"),),
    "running_sum": (
        Defect(
            "off_by_one",
            "        total += x\n        out.append(total)\n",
            "        out.append(total)\n        total += x\n",
        ),
    ),
    "char_count": (Defect("off_by_one", "counts.get(c, 0) + 1", "counts.get(c, 1)"),),
    "dedupe": (Defect("wrong_operator", "if x not in seen", "if x in seen or not seen"),),
    "fizzbuzz": (
        Defect("missing_case", "    if n % 15 == 0:\n        return 'FizzBuzz'\n", ""),
        Defect("wrong_operator", "n % 5 == 0", "n % 5 == 1"),
    ),
    "clamp": (
        Defect("missing_case", "max(lo, min(hi, x))", "min(hi, x)"),
        Defect("wrong_return", "max(lo, min(hi, x))", "max(lo, x)"),
    ),
    "power": (
        Defect("off_by_one", "while exp > 0", "while exp > 1"),
        Defect("wrong_operator", "result *= base", "result += base"),
        Defect("swapped_arguments", "def power(base, exp)", "def power(exp, base)"),
    ),
    "triangular": (
        Defect("off_by_one", "n * (n + 1)", "n * (n - 1)"),
        Defect("wrong_operator", "n * (n + 1)", "n + (n + 1)"),
    ),
    "insertion_sort": (
        Defect("off_by_one", "out.insert(i, x)", "out.insert(i - 1, x)"),
        Defect("wrong_operator", "i < len(out) and", "i < len(out) or"),
        Defect("wrong_return", "return out", "return xs"),
    ),
    "caesar_shift": (
        Defect("missing_case", "        elif c.isupper():\n            c = chr((ord(c) - 65 + k) % 26 + 65)\n", ""),
        Defect("wrong_operator", "ord(c) - 97 + k", "ord(c) - 97 - k"),
        Defect("off_by_one", "% 26 + 97", "% 25 + 97"),
    ),
    "count_positives": (
        Defect("off_by_one", "count = 0", "count = 1"),
        Defect("wrong_operator", "x > 0", "x < 0"),
        Defect("wrong_return", "return count", "return len(xs)"),
    ),
    "to_binary": (
        Defect("off_by_one", "while n > 0", "while n > 1"),
        Defect("swapped_arguments", "str(n % 2) + bits", "bits + str(n % 2)"),
    ),
    "run_length_encode": (
        Defect("wrong_operator", "out[-1][0] == c", "out[-1][0] != c"),
        Defect("off_by_one", "out.append([c, 1])", "out.append([c, 0])"),
        Defect("missing_case", "if out and out[-1][0] == c", "if out[-1][0] == c"),
    ),
    "sum_of_powers": (
        Defect("swapped_arguments", "power(x, p)", "power(p, x)"),
        Defect("wrong_operator", "total += ", "total -= "),
    ),
    "range_sum": (
        Defect("swapped_arguments", "def range_sum(a, b)", "def range_sum(b, a)"),
        Defect("off_by_one", "triangular(a - 1)", "triangular(a)"),
    ),
    "nth_smallest": (
        Defect("off_by_one", "[n - 1]", "[n]"),
        Defect("swapped_arguments", "def nth_smallest(xs, n)", "def nth_smallest(n, xs)"),
    ),
    "median": (Defect("off_by_one", "s[(n - 1) // 2]", "s[(n + 1) // 2]"),),
    "decode_caesar": (
        Defect("wrong_operator", "caesar_shift(s, -k)", "caesar_shift(s, k)"),
        Defect("swapped_arguments", "caesar_shift(s, -k)", "caesar_shift(-k, s)"),
    ),
    "positive_ratio": (Defect("swapped_arguments", "count_positives(xs) / len(xs)", "len(xs) / count_positives(xs)"),),
    "binary_padded": (
        Defect("swapped_arguments", "def binary_padded(n, width)", "def binary_padded(width, n)"),
        Defect("wrong_return", "rjust", "ljust"),
    ),
    "compress_string": (
        Defect("swapped_arguments", "c + str(n)", "str(n) + c"),
        Defect("off_by_one", "str(n)", "str(n - 1)"),
    ),
    "chunk": (
        Defect("off_by_one", "xs[i:i + size]", "xs[i:i + size - 1]"),
        Defect("swapped_arguments", "range(0, len(xs), size)", "range(0, size, len(xs))"),
    ),
    "rotate_left": (
        Defect("missing_case", "    k %= len(xs)\n", ""),
        Defect("off_by_one", "xs[k:] + xs[:k]", "xs[k + 1:] + xs[:k + 1]"),
        Defect("swapped_arguments", "xs[k:] + xs[:k]", "xs[:k] + xs[k:]"),
    ),
    "count_longer_than": (
        Defect("off_by_one", "len(w) > k", "len(w) >= k"),
        Defect("swapped_arguments", "def count_longer_than(s, k)", "def count_longer_than(k, s)"),
    ),
    "digit_sum": (
        Defect("off_by_one", "while n > 0", "while n > 9"),
        Defect("wrong_operator", "total += n % 10", "total -= n % 10"),
    ),
    "to_roman": (
        Defect("wrong_operator", "while n >= value", "while n > value"),
        Defect("missing_case", "(10, 'X'), ", ""),
    ),
    "interleave": (
        Defect("swapped_arguments", "def interleave(a, b)", "def interleave(b, a)"),
        Defect("wrong_operator", "max(len(a), len(b))", "min(len(a), len(b))"),
        Defect("off_by_one", "if i < len(b)", "if i < len(b) - 1"),
    ),
    "zip_to_dict": (Defect("swapped_arguments", "zip(keys, values)", "zip(values, keys)"),),
    "first_negative_index": (
        Defect("wrong_operator", "x < 0", "x > 0"),
        Defect("off_by_one", "return i\n", "return i + 1\n"),
        Defect("wrong_return", "return i\n", "return x\n"),
    ),
    "longest_run": (
        Defect("off_by_one", "else 1", "else 0"),
        Defect("wrong_operator", "xs[i - 1] == x", "xs[i - 1] != x"),
    ),
    "pairwise_differences": (
        Defect("swapped_arguments", "xs[i + 1] - xs[i]", "xs[i] - xs[i + 1]"),
        Defect("off_by_one", "range(len(xs) - 1)", "range(len(xs) - 2)"),
    ),
    "merge_sorted": (
        Defect("wrong_operator", "a[i] <= b[j]", "a[i] >= b[j]"),
        Defect("wrong_return", "return out + a[i:] + b[j:]", "return out"),
    ),
    "remove_char": (
        Defect("wrong_operator", "ch != c", "ch == c"),
        Defect("swapped_arguments", "def remove_char(s, c)", "def remove_char(c, s)"),
    ),
    "count_substring": (
        Defect("off_by_one", "len(s) - len(sub) + 1", "len(s) - len(sub)"),
        Defect("swapped_arguments", "def count_substring(s, sub)", "def count_substring(sub, s)"),
    ),
    "list_product": (
        Defect("off_by_one", "result = 1", "result = 0"),
        Defect("wrong_operator", "result *= x", "result += x"),
    ),
    "remove_vowels": (
        Defect("missing_case", "'aeiouAEIOU'", "'aeiou'"),
        Defect("wrong_operator", "not in", "in"),
    ),
    "clip_values": (
        Defect("missing_case", "lo if x < lo else ", ""),
        Defect("swapped_arguments", "def clip_values(xs, lo, hi)", "def clip_values(xs, hi, lo)"),
    ),
    "every_nth": (
        Defect("off_by_one", "xs[n - 1::n]", "xs[n::n]"),
        Defect("swapped_arguments", "def every_nth(xs, n)", "def every_nth(n, xs)"),
    ),
    "common_prefix": (
        Defect("off_by_one", "return a[:i]", "return a[:i + 1]"),
        Defect("wrong_operator", "a[i] == b[i]", "a[i] != b[i]"),
    ),
    "index_of_max": (
        Defect("wrong_operator", "xs[i] > xs[best]", "xs[i] < xs[best]"),
        Defect("wrong_return", "return best", "return xs[best]"),
    ),
    "subtract_lists": (
        Defect("swapped_arguments", "def subtract_lists(a, b)", "def subtract_lists(b, a)"),
        Defect("wrong_operator", "not in", "in"),
    ),
    "window_sums": (
        Defect("off_by_one", "range(len(xs) - k + 1)", "range(len(xs) - k)"),
        Defect("swapped_arguments", "def window_sums(xs, k)", "def window_sums(k, xs)"),
    ),
    "mode": (
        Defect("wrong_operator", "-counts[x]", "counts[x]"),
        Defect("off_by_one", "counts.get(x, 0) + 1", "counts.get(x, 1)"),
        Defect("wrong_return", "return min(", "return max("),
    ),
    "cumulative_max": (
        Defect("wrong_operator", "x > out[-1]", "x < out[-1]"),
        Defect("missing_case", "not out or ", ""),
    ),
    "reverse_words": (
        Defect("wrong_return", "s.split()[::-1]", "s.split()"),
        Defect("off_by_one", "s.split()[::-1]", "s.split()[-2::-1]"),
    ),
    "truncate": (
        Defect("missing_case", "    if len(s) <= n:\n        return s\n", ""),
        Defect("swapped_arguments", "def truncate(s, n)", "def truncate(n, s)"),
    ),
    "alternate_case": (
        Defect("off_by_one", "i % 2 == 0", "i % 2 == 1"),
        Defect("wrong_return", "else c.lower()", "else c"),
    ),
    "abs_values": (
        Defect("missing_case", "-x if x < 0 else x", "x"),
        Defect("wrong_operator", "x < 0", "x > 0"),
    ),
}

CALLS: dict[str, tuple[str, ...]] = {
    "sum_of_powers": ("power",),
    "range_sum": ("triangular",),
    "nth_smallest": ("insertion_sort",),
    "median": ("insertion_sort",),
    "decode_caesar": ("caesar_shift",),
    "positive_ratio": ("count_positives",),
    "binary_padded": ("to_binary",),
    "compress_string": ("run_length_encode",),
}
