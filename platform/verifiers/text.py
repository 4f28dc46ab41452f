"""Text helpers shared by the answer-matching verifiers: extraction, normalisation, token F1."""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from typing import Literal

ExtractMode = Literal["full", "last_line", "answer_tag", "boxed", "boxed_only", "after_answer"]

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_AFTER_ANSWER = re.compile(r"(?:final answer|answer)\s*(?:is)?\s*[:=]\s*(.+)", re.IGNORECASE)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_WHITESPACE = re.compile(r"\s+")
_PUNCT_TABLE = str.maketrans("", "", string.punctuation + "“”‘’«»…–—")


def extract_answer(completion: str, mode: ExtractMode) -> str:
    """The part of ``completion`` that holds the answer, by ``mode``; falls back to the whole text (``boxed_only``:
    to nothing)."""
    text = completion.strip()
    if mode == "full":
        return text
    if mode == "last_line":
        lines = [line for line in text.splitlines() if line.strip()]
        return lines[-1].strip() if lines else ""
    if mode == "answer_tag":
        found = _ANSWER_TAG.findall(text)
        return found[-1].strip() if found else text
    if mode == "boxed":
        boxed = last_boxed(text)
        return boxed if boxed is not None else text
    if mode == "boxed_only":  # strict: no box, no answer
        return last_boxed(text) or ""
    if mode == "after_answer":
        found = _AFTER_ANSWER.findall(text)
        return found[-1].strip() if found else text
    raise ValueError(f"unknown extract mode {mode!r}")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (braces balanced), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth = 0
    begin = start + len("\\boxed{")
    for index in range(begin - 1, len(text)):
        char = text[index]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[begin:index].strip()
    return None


def normalize_light(text: str) -> str:
    """Unicode NFKC, case-folded, whitespace collapsed, outer quotes and final period removed."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = _WHITESPACE.sub(" ", text).strip()
    text = text.strip("\"'`“”‘’")
    while text.endswith((".", "!")) and len(text) > 1:
        text = text[:-1].rstrip()
    return text


def normalize_answer(text: str) -> str:
    """SQuAD-style normalisation: lower case, no punctuation, no articles, single spaces."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = text.translate(_PUNCT_TABLE)
    text = _ARTICLES.sub(" ", text)
    return _WHITESPACE.sub(" ", text).strip()


def normalize_whitespace(text: str) -> str:
    """NFKC, case-folded, every run of whitespace made one space; hyphenated line breaks joined."""
    text = unicodedata.normalize("NFKC", text)
    text = re.sub(r"-\s*\n\s*", "", text)
    return _WHITESPACE.sub(" ", text).strip().casefold()


def token_f1(prediction: str, gold: str) -> float:
    """Token-level F1 between normalised ``prediction`` and ``gold`` (SQuAD definition)."""
    predicted = normalize_answer(prediction).split()
    expected = normalize_answer(gold).split()
    if not predicted or not expected:
        return float(predicted == expected)
    common = Counter(predicted) & Counter(expected)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(predicted)
    recall = overlap / len(expected)
    return 2 * precision * recall / (precision + recall)


def strip_code_fence(text: str) -> str:
    """The body of the first fenced block (```lang ... ```) in ``text``, or ``text`` itself."""
    match = re.search(r"```[\w+-]*[ \t]*\n(.*?)```", text, re.DOTALL)
    return match.group(1) if match else text
