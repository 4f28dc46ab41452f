"""Procedural task domains: families of generators times their parameters.

    from posttrain.platform.tasks.domains import list_domains, generate
    names = [d.name for d in list_domains()]
    tasks = generate("arith.add.int", n=8, seed=1, difficulty=1)
"""

from posttrain.platform.tasks.domains.base import MAX_DIFFICULTY, MIN_DIFFICULTY, Domain, Problem
from posttrain.platform.tasks.domains.registry import (
    DomainInfo,
    UnknownDomainError,
    generate,
    get_domain,
    list_domains,
    list_families,
    register_domain,
)

__all__ = [
    "MAX_DIFFICULTY",
    "MIN_DIFFICULTY",
    "Domain",
    "DomainInfo",
    "Problem",
    "UnknownDomainError",
    "generate",
    "get_domain",
    "list_domains",
    "list_families",
    "register_domain",
]
