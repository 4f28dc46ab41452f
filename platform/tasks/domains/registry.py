"""The registry of procedural domains and ``generate(domain, n, seed, difficulty)``."""

from __future__ import annotations

import importlib
import random
import threading
from dataclasses import dataclass
from typing import Any

from posttrain.platform.tasks.domains.base import MAX_DIFFICULTY, MIN_DIFFICULTY, Domain
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
)
GENERATOR_VERSION = 1
_MAX_TRIES_PER_TASK = 20

_lock = threading.Lock()
_domains: dict[str, Domain] = {}
_loaded = False


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
            DomainInfo(domain.name, domain.family, domain.description, dict(domain.params), domain.max_difficulty, probe.verifier.kind)
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

    Prompts within one call are distinct while the domain has enough of them.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    spec = get_domain(domain)
    if not MIN_DIFFICULTY <= difficulty <= spec.max_difficulty:
        raise ValueError(
            f"difficulty {difficulty} is out of range for domain {domain!r}; use {MIN_DIFFICULTY}..{spec.max_difficulty}"
        )
    rng = random.Random(f"{domain}|{seed}|{difficulty}|{split}")
    seen: set[str] = set()
    tasks: list[TaskSpec] = []
    for index in range(n):
        for _ in range(_MAX_TRIES_PER_TASK):
            problem = spec.make(rng, difficulty)
            if problem.prompt not in seen:
                break
        seen.add(problem.prompt)
        tasks.append(
            TaskSpec(
                domain=domain,
                prompt=[ChatMessage(role="user", content=problem.prompt)],
                verifier=problem.verifier,
                reference=problem.answer,
                split=split,
                task_id=f"{domain}/d{difficulty}/s{seed}/{split}/{index}",
                metadata={"family": spec.family, "difficulty": difficulty, "seed": seed, "index": index, "params": dict(spec.params)},
                provenance={"source": "procedural", "generator": domain, "version": GENERATOR_VERSION},
            )
        )
    return tasks
