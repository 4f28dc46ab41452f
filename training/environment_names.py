"""The environments a config may name: ``single_turn``, the built-in multi-turn ones and the plugins published
under the ``posttrain.environments`` entry-point group. Below both :mod:`posttrain.training.config` (which
validates a name) and :mod:`posttrain.training.environments` (which loads one)."""

from __future__ import annotations

from importlib.metadata import entry_points

ENTRY_POINT_GROUP = "posttrain.environments"
BUILT_IN: dict[str, tuple[str, str]] = {  # name: (module, class)
    "tool_use": ("posttrain.training.environments.tool_use", "ToolUse"),
    "code_repair": ("posttrain.training.environments.code_repair", "CodeRepair"),
}


def environment_names() -> list[str]:
    return sorted({"single_turn", *BUILT_IN, *(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))})
