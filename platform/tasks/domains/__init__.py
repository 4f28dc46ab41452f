"""Procedural task domains: families of generators times their parameters.

from posttrain.platform.tasks.domains import list_domains, generate
names = [d.name for d in list_domains()]
tasks = generate("arith.add.int", n=8, seed=1, difficulty=1)
prompt_space("format.to_hex", 1).has_held_out_split   # False: 10 prompts, none to spare
"""

from posttrain.platform.tasks.domains.base import MAX_DIFFICULTY, MIN_DIFFICULTY, Domain, Problem
from posttrain.platform.tasks.domains.registry import (
    EVAL_FRACTION,
    MIN_EVAL_PROMPTS,
    DomainInfo,
    NoHeldOutSplitError,
    PromptSpace,
    UnknownDomainError,
    generate,
    get_domain,
    held_out_level,
    list_domains,
    list_families,
    prompt_hash,
    prompt_space,
    prompt_split,
    register_domain,
)

__all__ = [
    "EVAL_FRACTION",
    "MAX_DIFFICULTY",
    "MIN_EVAL_PROMPTS",
    "MIN_DIFFICULTY",
    "Domain",
    "DomainInfo",
    "NoHeldOutSplitError",
    "Problem",
    "PromptSpace",
    "UnknownDomainError",
    "generate",
    "get_domain",
    "held_out_level",
    "list_domains",
    "list_families",
    "prompt_hash",
    "prompt_space",
    "prompt_split",
    "register_domain",
]
