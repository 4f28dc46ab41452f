"""Environments: what one rollout is. An environment is tasks plus a rubric plus a rollout,
``rollout(policy_client, task, sandbox) -> Episode``, chosen by ``environment.name``::

    GRPOConfig(..., environment={"name": "tool_use", "max_turns": 4, "tools": ["python"]},
               rollout={"backend": "thread"})

===========  ==========================================================================================
name         one episode
===========  ==========================================================================================
single_turn  one completion of the task's prompt, scored by its verifier (every domain; the rollouts
             the backends batch themselves, a group's prompt prefilled once)
tool_use     up to ``max_turns`` turns of tool calls (python and bash in a sandbox from the warm pool)
             before an answer, which the task's verifier scores (:mod:`.tool_use`)
code_repair  a small project with a planted defect laid into the sandbox (the ``repair.*`` domains); the
             policy reads, edits and tests it over up to ``max_turns`` turns; the hidden tests run on
             the final module in a fresh sandbox (:mod:`.code_repair`)
<plugin>     a class published under the ``posttrain.environments`` entry-point group
===========  ==========================================================================================

A plugin is a class built as ``cls(config, tokenizer, sampling)`` with the
:class:`~posttrain.training.environments.base.Environment` members (``name``, ``needs_sandbox``,
``rollout``, ``score``); :class:`~posttrain.training.environments.base.EnvironmentBase` gives the
template bookkeeping and the default rubric. A package declares it in its pyproject::

    [project.entry-points."posttrain.environments"]
    my_env = "my_package.envs:MyEnvironment"

Episodes run through :class:`~posttrain.training.environments.runner.EpisodeRunner`: many at once
against one continuous-batching engine, each with its own sandbox.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from transformers import PreTrainedTokenizerBase

from posttrain.training.config import EnvironmentConfig, SamplingConfig
from posttrain.training.environment_names import BUILT_IN, ENTRY_POINT_GROUP, environment_names
from posttrain.training.environments.base import Environment, Episode, PolicyClient


class EnvironmentLoadError(RuntimeError):
    """An environment that cannot be built: unknown, or its plugin does not load."""


def load_environment(
    config: EnvironmentConfig, tokenizer: PreTrainedTokenizerBase, sampling: SamplingConfig
) -> Environment:
    """The multi-turn environment ``config.name`` names, built; :class:`EnvironmentLoadError` names
    the plugin and why when it cannot load (a job fails at its start with that one line)."""
    name = config.name
    try:
        if name in BUILT_IN:
            module, attr = BUILT_IN[name]
            cls = getattr(importlib.import_module(module), attr)
        else:
            found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
            if not found:
                raise EnvironmentLoadError(
                    f"no environment {name!r}; known: {', '.join(environment_names())} "
                    f"(a plugin publishes one under the entry-point group {ENTRY_POINT_GROUP!r})"
                )
            cls = found[0].load()
        environment = cls(config, tokenizer, sampling)
    except EnvironmentLoadError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever a plugin raises on import or construction
        raise EnvironmentLoadError(f"environment {name!r} does not load: {type(exc).__name__}: {exc}") from exc
    missing = [m for m in ("name", "needs_sandbox", "rollout", "score") if not hasattr(environment, m)]
    if missing:
        raise EnvironmentLoadError(
            f"environment {name!r} ({type(environment).__name__}) lacks {', '.join(missing)}; "
            "see posttrain.training.environments.base.Environment"
        )
    return environment


__all__ = [
    "ENTRY_POINT_GROUP",
    "Environment",
    "EnvironmentLoadError",
    "Episode",
    "PolicyClient",
    "environment_names",
    "load_environment",
]
