"""String transformations of a word or of random letters; difficulty = length."""

from __future__ import annotations

import random
import string
from collections.abc import Callable
from functools import partial

from posttrain.platform.tasks.domains.base import Domain, Problem, exact, numeric

WORDS = (
    "cat dog sun map red cup hat pen box fox owl bee ant egg ice jam key net oak pig "
    "bird fish tree lamp rain snow book desk door frog gold milk moon ship star wind "
    "apple bread chair cloud grape house lemon mouse plant river stone table tiger water "
    "banana castle dragon forest garden island jungle market orange pencil rabbit silver "
    "blanket chicken diamond kitchen library monster picture rainbow teacher thunder "
    "airplane building calendar elephant fountain mountain notebook sandwich umbrella "
    "adventure chocolate butterfly telephone waterfall basketball strawberry helicopter"
).split()
VOWELS = set("aeiou")


def _word(rng: random.Random, difficulty: int, source: str) -> str:
    length = (3, 4, 6, 8, 10)[difficulty - 1]
    if source == "letters":
        return "".join(rng.choice(string.ascii_lowercase) for _ in range(length))
    near = [w for w in WORDS if abs(len(w) - length) <= 1]
    return rng.choice(near)


Transform = Callable[[str, random.Random], tuple[str, str, bool]]
"""(word, rng) -> (instruction, answer, case-insensitive?)"""


def _caesar(word: str, shift: int) -> str:
    return "".join(chr((ord(c) - 97 + shift) % 26 + 97) for c in word)


def _single(name: str, word: str, rng: random.Random) -> tuple[str, str, bool] | tuple[str, int]:
    if name == "copy":
        return f"Repeat exactly: {word}", word, False
    if name == "upper":
        return f"Uppercase: {word}", word.upper(), False
    if name == "capitalize":
        return f"Capitalize the first letter: {word}", word.capitalize(), False
    if name == "reverse":
        return f"Reverse: {word}", word[::-1], False
    if name == "first_char":
        return f"First letter of {word}?", word[0], False
    if name == "last_char":
        return f"Last letter of {word}?", word[-1], False
    if name == "length":
        return f"How many letters are in {word}?", len(word)
    if name == "vowel_count":
        return f"How many vowels (a, e, i, o, u) are in {word}?", sum(c in VOWELS for c in word)
    if name == "remove_vowels":
        return f"Remove the vowels from {word}", "".join(c for c in word if c not in VOWELS), False
    if name == "double":
        return f"Double every letter of {word}", "".join(c * 2 for c in word), False
    if name == "sort_letters":
        return f"Sort the letters of {word} alphabetically", "".join(sorted(word)), False
    if name == "rotate_left":
        return f"Move the first letter of {word} to the end", word[1:] + word[0], False
    if name == "caesar":
        shift = rng.randint(1, 3)
        return f"Shift each letter of {word} forward by {shift} (z wraps to a)", _caesar(word, shift), False
    if name == "count_char":
        char = rng.choice(word)
        return f"How many times does '{char}' occur in {word}?", word.count(char)
    if name == "char_at":
        index = rng.randrange(len(word))
        return f"What is letter number {index + 1} of {word}?", word[index], False
    if name == "palindrome":
        if rng.random() < 0.5:
            word = word[: (len(word) + 1) // 2] + word[: len(word) // 2][::-1]
        return f"Is {word} a palindrome? Answer yes or no.", "yes" if word == word[::-1] else "no", True
    if name == "dedupe":
        seen: list[str] = []
        for c in word:
            if c not in seen:
                seen.append(c)
        return f"Remove repeated letters from {word}, keeping first occurrences", "".join(seen), False
    if name == "swapcase":
        mixed = "".join(c.upper() if rng.random() < 0.5 else c for c in word)
        return f"Swap the case of each letter: {mixed}", mixed.swapcase(), False
    if name == "lower":
        mixed = "".join(c.upper() if rng.random() < 0.5 else c for c in word)
        return f"Lowercase: {mixed}", mixed.lower(), False
    if name == "repeat":
        times = rng.randint(2, 3)
        return f"Write {word} {times} times with no spaces", word * times, False
    raise ValueError(name)  # pragma: no cover


def _make_single(name: str, source: str, rng: random.Random, difficulty: int) -> Problem:
    result = _single(name, _word(rng, difficulty, source), rng)
    if len(result) == 2:
        return numeric(result[0], result[1])
    prompt, answer, loose = result
    return exact(prompt, answer, normalize=loose)


def _make_multi(name: str, rng: random.Random, difficulty: int) -> Problem:
    count = 1 + difficulty
    words = [_word(rng, max(1, difficulty - 1), "words") for _ in range(count)]
    sentence = " ".join(words)
    if name == "concat":
        a, b = words[0], words[1]
        return exact(f"Join {a} and {b} with no space", a + b)
    if name == "interleave":
        a, b = words[0][:3], words[1][:3]
        return exact(f"Interleave the letters of {a} and {b}", "".join(x + y for x, y in zip(a, b)))
    if name == "acronym":
        return exact(f"Acronym (first letters, uppercase) of: {sentence}", "".join(w[0] for w in words).upper())
    if name == "reverse_words":
        return exact(f"Reverse the word order: {sentence}", " ".join(reversed(words)))
    if name == "word_count":
        return numeric(f"How many words: {sentence}", len(words))
    if name == "longest_word":
        longest = max(words, key=len)
        return exact(f"Longest word (first if tied): {sentence}", longest)
    if name == "title_case":
        return exact(f"Title-case: {sentence}", " ".join(w.capitalize() for w in words))
    raise ValueError(name)  # pragma: no cover


SINGLE = (
    "copy",
    "upper",
    "lower",
    "capitalize",
    "swapcase",
    "reverse",
    "first_char",
    "last_char",
    "length",
    "vowel_count",
    "remove_vowels",
    "double",
    "sort_letters",
    "rotate_left",
    "caesar",
    "count_char",
    "char_at",
    "palindrome",
    "dedupe",
    "repeat",
)
MULTI = ("concat", "interleave", "acronym", "reverse_words", "word_count", "longest_word", "title_case")


def domains() -> list[Domain]:
    found = [
        Domain(
            f"str.{name}.{source}",
            "strings",
            f"string {name} on {source}",
            partial(_make_single, name, source),
            {"task": name, "source": source},
        )
        for name in SINGLE
        for source in ("words", "letters")
    ]
    found += [
        Domain(
            f"str.{name}.sentence",
            "strings",
            f"string {name} on a sentence",
            partial(_make_multi, name),
            {"task": name, "source": "sentence"},
        )
        for name in MULTI
    ]
    return found
