"""The registry of procedural domains and ``generate(domain, n, seed, difficulty)``.

Held out by construction: a prompt's split is a function of its normalised text
(:func:`prompt_split`: a hash puts ``EVAL_FRACTION`` of all prompts in ``eval``), so a train
stream never yields an eval prompt, whatever the seed or difficulty that made it. A problem may be
held out by more than its prompt (``Problem.held_out_by``: the code-repair domains hold out whole
functions, so no train module holds one): it is ``eval`` whatever its prompt's hash.
A domain whose eval share at a difficulty holds fewer than ``MIN_EVAL_PROMPTS`` distinct
prompts has no held-out split there: it trains on all its prompts at that difficulty (and
they stay train at every other), and ``generate(..., split="eval")`` refuses it with
:class:`NoHeldOutSplitError` (:func:`prompt_space` says how many prompts a domain has).
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import random
import threading
from collections import Counter
from dataclasses import dataclass
from typing import Any

from posttrain.platform.tasks.domains.base import MIN_DIFFICULTY, Domain, Problem
from posttrain.platform.verifiers.models import ChatMessage, Split, TaskSpec

FAMILY_MODULES = (
    "arithmetic",
    "comparison",
    "formatting",
    "units",
    "dates",
    "strings",
    "lists",
    "json_restructure",
    "regex_extract",
    "code_tasks",
    "repair_tasks",
)
GENERATOR_VERSION = 2  # 2: splits by prompt hash (1: two random streams over the same prompts)
_MAX_TRIES_PER_TASK = 20  # draws spent looking for an unseen prompt of the split before repeating one
_MAX_DRAWS_PER_TASK = 400  # draws spent looking for any prompt of the split before giving up
EVAL_FRACTION = 0.2  # the share of every domain's prompt space that is held out for evaluation
MIN_EVAL_PROMPTS = 20  # distinct held-out prompts a domain needs at a difficulty to be evaluated there
_SPACE_DRAWS = (200, 1000)  # draws that estimate a prompt space: the first look, then the whole count when it is small
_LARGE_SPACE = 1000  # distinct prompts after the first look above which a space is plainly large enough

_lock = threading.Lock()
_domains: dict[str, Domain] = {}
_loaded = False


class NoHeldOutSplitError(ValueError):
    """A domain whose prompt space at a difficulty is too small to hold out an eval split."""


class UnknownDomainError(LookupError):
    def __init__(self, name: str, known: list[str]) -> None:
        close = [k for k in known if k.split(".")[0] == name.split(".")[0]][:10]
        hint = f"; same family: {', '.join(close)}" if close else ""
        super().__init__(f"unknown domain {name!r} ({len(known)} registered; see list_domains()){hint}")


@dataclass(frozen=True)
class DomainInfo:
    """What the scheduler and the console need to know about a domain."""

    name: str
    family: str
    description: str
    params: dict[str, Any]
    max_difficulty: int
    verifier_kind: str

    def prompt_space(self, difficulty: int) -> PromptSpace:
        return prompt_space(self.name, difficulty)

    def held_out_level(self) -> int | None:
        return held_out_level(self.name)


def normalize_prompt(text: str) -> str:
    return " ".join(text.casefold().split())


def prompt_hash(text: str) -> str:
    """The normalised prompt's hash: what the held-out check compares."""
    return hashlib.sha256(normalize_prompt(text).encode()).hexdigest()


def prompt_split(text: str) -> Split:
    """The split a prompt belongs to, by its hash alone: ``EVAL_FRACTION`` of prompts are ``eval``."""
    return "eval" if int(prompt_hash(text)[:12], 16) < EVAL_FRACTION * 16**12 else "train"


def chao1(counts: Counter[str]) -> float:
    """Chao1 estimate of how many distinct values a sampled space has, from the draws' counts."""
    singletons = sum(1 for c in counts.values() if c == 1)
    doubletons = sum(1 for c in counts.values() if c == 2)
    if doubletons:
        return len(counts) + singletons**2 / (2 * doubletons)
    return len(counts) + singletons * (singletons - 1) / 2


@dataclass(frozen=True)
class PromptSpace:
    """How many distinct prompts a domain makes at a difficulty (Chao1 over ``draws`` seeded draws:
    exact when the space is small enough to be seen whole, an estimate above that), and how many of
    them are held out (the eval share of the prompts seen, less those trained on at other levels)."""

    domain: str
    difficulty: int
    distinct_prompts: int
    held_out_prompts: int  # distinct prompts of the eval share
    draws: int

    @property
    def has_held_out_split(self) -> bool:
        return self.held_out_prompts >= MIN_EVAL_PROMPTS

    def refusal(self) -> str:
        return (
            f"domain {self.domain!r} has about {self.distinct_prompts} distinct prompts at difficulty {self.difficulty} "
            f"({self.held_out_prompts} in the held-out share), too few to hold out an eval split (it needs "
            f"{MIN_EVAL_PROMPTS} held-out prompts); evaluate it at a higher difficulty or choose a domain with more prompts"
        )


def prompt_space(domain: str, difficulty: int) -> PromptSpace:
    return _domain_spaces(domain)[0][difficulty]


def held_out_level(domain: str) -> int | None:
    """The lowest difficulty at which ``domain`` holds out an eval split (None: no level does)."""
    spaces = _domain_spaces(domain)[0]
    return next((d for d in sorted(spaces) if spaces[d].has_held_out_split), None)


@functools.cache
def _level_counts(domain: str, difficulty: int) -> tuple[Counter[str], frozenset[str]]:
    """Seeded draws of ``domain``'s normalised prompts at ``difficulty`` (a first look, and the whole count,
    ``_SPACE_DRAWS[-1]`` draws, enough to see a small space whole, unless it is plainly large), and those
    of them whose problems are held out by more than their prompt."""
    spec = get_domain(domain)
    rng = random.Random(f"{domain}|space|{difficulty}")
    counts: Counter[str] = Counter()
    held: set[str] = set()
    for draws in _SPACE_DRAWS:
        for _ in range(draws - counts.total()):
            problem = spec.make(rng, difficulty)
            counts[prompt := normalize_prompt(problem.prompt)] += 1
            if problem.held_out_by:
                held.add(prompt)
        if chao1(counts) >= _LARGE_SPACE:
            break
    return counts, frozenset(held)


@functools.cache
def _domain_spaces(domain: str) -> tuple[dict[int, PromptSpace], frozenset[str]]:
    """Every level's prompt space, and the prompts that are train at every level: those of the levels
    too small to hold out a split. A level's held-out share leaves those out, which can make it small
    in turn, so this settles on a fixed point (at most one pass per level)."""
    levels = range(MIN_DIFFICULTY, get_domain(domain).max_difficulty + 1)
    counts = {d: _level_counts(domain, d)[0] for d in levels}
    forced = frozenset().union(*(_level_counts(domain, d)[1] for d in levels))
    small: set[int] = set()
    while True:
        train_only: frozenset[str] = frozenset().union(*(counts[d] for d in small)) - forced
        spaces = {}
        for d in levels:
            held = sum(1 for p in counts[d] if p in forced or (p not in train_only and prompt_split(p) == "eval"))
            distinct = chao1(counts[d])  # the held-out share of the space is the share of its seen prompts
            spaces[d] = PromptSpace(
                domain, d, round(distinct), round(distinct * held / len(counts[d])), counts[d].total()
            )
        now_small = {d for d in levels if not spaces[d].has_held_out_split}
        if now_small == small:
            return spaces, train_only
        small = now_small


def task_split(domain: str, difficulty: int, prompt: str, *, held_out_by: str | None = None) -> Split:
    """The split of one of ``domain``'s prompts at ``difficulty``: ``eval`` for a problem held out by more than
    its prompt (``held_out_by``), else :func:`prompt_split`, except that a domain with no held-out split at a
    difficulty trains on all its prompts there, and those prompts stay train wherever else they turn up (a
    larger difficulty whose space contains them)."""
    if held_out_by:
        return "eval"
    if not prompt_space(domain, difficulty).has_held_out_split:
        return "train"
    if normalize_prompt(prompt) in _domain_spaces(domain)[1]:
        return "train"
    return prompt_split(prompt)


def _ensure_loaded() -> None:
    global _loaded
    with _lock:
        if _loaded:
            return
        _loaded = True
    for module_name in FAMILY_MODULES:
        module = importlib.import_module(f"posttrain.platform.tasks.domains.families.{module_name}")
        for domain in module.domains():
            register_domain(domain)


def register_domain(domain: Domain, *, replace: bool = False) -> None:
    with _lock:
        if domain.name in _domains and not replace:
            raise ValueError(f"domain {domain.name!r} is already registered; pass replace=True to replace it")
        _domains[domain.name] = domain


def get_domain(name: str) -> Domain:
    _ensure_loaded()
    with _lock:
        domain = _domains.get(name)
        known = sorted(_domains)
    if domain is None:
        raise UnknownDomainError(name, known)
    return domain


def list_domains(family: str | None = None) -> list[DomainInfo]:
    """Every registered domain (optionally one family's), sorted by name."""
    _ensure_loaded()
    with _lock:
        domains = sorted(_domains.values(), key=lambda d: d.name)
    infos = []
    for domain in domains:
        if family is not None and domain.family != family:
            continue
        probe = domain.make(random.Random(0), MIN_DIFFICULTY)
        infos.append(
            DomainInfo(
                domain.name,
                domain.family,
                domain.description,
                dict(domain.params),
                domain.max_difficulty,
                probe.verifier.kind,
            )
        )
    return infos


def list_families() -> list[str]:
    _ensure_loaded()
    with _lock:
        return sorted({d.family for d in _domains.values()})


def generate(
    domain: str,
    n: int,
    seed: int = 0,
    difficulty: int = MIN_DIFFICULTY,
    *,
    split: Split = "train",
) -> list[TaskSpec]:
    """``n`` tasks of ``domain`` at ``difficulty`` (1 = easiest), the same for the same seed.

    Every prompt belongs to ``split`` (:func:`prompt_split`); prompts within one call are distinct
    while the split has enough of them. ``split="eval"`` on a domain with no held-out split at
    ``difficulty`` raises :class:`NoHeldOutSplitError`.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    spec = get_domain(domain)
    if not MIN_DIFFICULTY <= difficulty <= spec.max_difficulty:
        raise ValueError(
            f"difficulty {difficulty} is out of range for domain {domain!r}; use {MIN_DIFFICULTY}..{spec.max_difficulty}"
        )
    if split == "eval" and n and not (space := prompt_space(domain, difficulty)).has_held_out_split:
        raise NoHeldOutSplitError(space.refusal())
    rng = random.Random(f"{domain}|{seed}|{difficulty}|{split}")
    seen: set[str] = set()
    tasks: list[TaskSpec] = []
    for index in range(n):
        problem = _draw(spec, rng, difficulty, split, seen)
        seen.add(problem.prompt)
        tasks.append(
            TaskSpec(
                domain=domain,
                prompt=[ChatMessage(role="user", content=problem.prompt)],
                verifier=problem.verifier,
                reference=problem.answer,
                split=split,
                task_id=f"{domain}/d{difficulty}/s{seed}/{split}/{index}",
                metadata={
                    "family": spec.family,
                    "difficulty": difficulty,
                    "seed": seed,
                    "index": index,
                    "params": dict(spec.params),
                }
                | ({"files": dict(problem.files)} if problem.files else {})
                | ({"held_out_by": problem.held_out_by} if problem.held_out_by else {}),
                provenance={"source": "procedural", "generator": domain, "version": GENERATOR_VERSION},
            )
        )
    return tasks


def _draw(spec: Domain, rng: random.Random, difficulty: int, split: Split, seen: set[str]) -> Problem:
    """The next problem of ``split``: an unseen one if one turns up within ``_MAX_TRIES_PER_TASK``
    draws of the split, else a repeat."""
    found: Problem | None = None
    tries = 0
    for _ in range(_MAX_DRAWS_PER_TASK):
        problem = spec.make(rng, difficulty)
        if task_split(spec.name, difficulty, problem.prompt, held_out_by=problem.held_out_by) != split:
            continue
        found, tries = problem, tries + 1
        if problem.prompt not in seen or tries >= _MAX_TRIES_PER_TASK:
            return problem
    if found is None:
        raise NoHeldOutSplitError(
            f"domain {spec.name!r} made no {split} prompt in {_MAX_DRAWS_PER_TASK} draws at difficulty {difficulty}"
        )
    return found
