"""The tools a model may call, as OpenAI tool JSON schemas, and their dispatch."""

from __future__ import annotations

import time
from typing import Any

from posttrain.platform.sandbox.parser import ToolCall
from posttrain.platform.sandbox.result import CallError, CallStatus, ToolResult
from posttrain.platform.sandbox.sandbox import Sandbox


def _function(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": required,
                "additionalProperties": False,
            },
        },
    }


TOOL_SCHEMAS: dict[str, dict[str, Any]] = {
    "python": _function(
        "python",
        "Execute Python code in a persistent interpreter (variables survive between calls of this "
        "episode). Returns stdout, stderr and the repr of the last expression. No network.",
        {"code": {"type": "string", "description": "Python source to execute"}},
        ["code"],
    ),
    "bash": _function(
        "bash",
        "Run a shell command with bash in the work directory. Returns stdout, stderr and the exit code. No network.",
        {"command": {"type": "string", "description": "the command line"}},
        ["command"],
    ),
    "read_file": _function(
        "read_file",
        "Read a text file from the work directory.",
        {"path": {"type": "string", "description": "path relative to the work directory"}},
        ["path"],
    ),
    "write_file": _function(
        "write_file",
        "Write (or with append=true, append to) a text file in the work directory; parent directories are created.",
        {
            "path": {"type": "string", "description": "path relative to the work directory"},
            "content": {"type": "string", "description": "the text to write"},
            "append": {"type": "boolean", "description": "append instead of overwrite", "default": False},
        },
        ["path", "content"],
    ),
    "edit_file": _function(
        "edit_file",
        "Replace one piece of a text file of the work directory: old must occur in the file exactly once "
        "(copy it with its indentation); it becomes new. Fails, saying how many times old occurs, otherwise.",
        {
            "path": {"type": "string", "description": "path relative to the work directory"},
            "old": {"type": "string", "description": "the exact text to replace, once in the file"},
            "new": {"type": "string", "description": "the text to put in its place"},
        },
        ["path", "old", "new"],
    ),
    "list_dir": _function(
        "list_dir",
        "List a directory of the work directory: names, types and sizes.",
        {"path": {"type": "string", "description": "path relative to the work directory", "default": "."}},
        [],
    ),
}

_TYPES = {"string": str, "boolean": bool}


def tool_schemas(names: list[str] | None = None) -> list[dict[str, Any]]:
    """Schemas to pass as ``tools=`` to an OpenAI-compatible chat API."""
    chosen = list(TOOL_SCHEMAS) if names is None else names
    unknown = [n for n in chosen if n not in TOOL_SCHEMAS]
    if unknown:
        raise ValueError(f"unknown tools {unknown}; available: {sorted(TOOL_SCHEMAS)}")
    return [TOOL_SCHEMAS[n] for n in chosen]


def _invalid(call: ToolCall, message: str) -> ToolResult:
    return ToolResult(tool=call.name, status=CallStatus.ERROR, error=CallError("InvalidToolCall", message))


def validate_arguments(name: str, arguments: dict[str, Any]) -> str | None:
    """An error message for the model, or None when the arguments fit the schema."""
    params = TOOL_SCHEMAS[name]["function"]["parameters"]
    missing = [key for key in params["required"] if key not in arguments]
    if missing:
        return f"tool {name!r} needs the argument(s) {missing}"
    for key, value in arguments.items():
        spec = params["properties"].get(key)
        if spec is None:
            return f"tool {name!r} has no argument {key!r}; it takes {sorted(params['properties'])}"
        if not isinstance(value, _TYPES[spec["type"]]):
            return f"argument {key!r} of tool {name!r} must be a {spec['type']}"
    return None


def execute_tool_call(
    sandbox: Sandbox, call: ToolCall, *, allowed: list[str] | None = None, timeout: float | None = None
) -> ToolResult:
    """Run one parsed tool call in ``sandbox``. Malformed calls become ERROR results (the model's fault)."""
    if call.error is not None:
        return _invalid(call, call.error)
    names = list(TOOL_SCHEMAS) if allowed is None else allowed
    if call.name not in names:
        return _invalid(call, f"unknown tool {call.name!r}; available: {names}")
    problem = validate_arguments(call.name, call.arguments)
    if problem is not None:
        return _invalid(call, problem)
    args = call.arguments
    if call.name == "python":
        return sandbox.run_python(args["code"], timeout)
    if call.name == "bash":
        return sandbox.run_bash(args["command"], timeout)
    if call.name == "read_file":
        return sandbox.read_file(args["path"])
    if call.name == "write_file":
        return sandbox.write_file(args["path"], args["content"], bool(args.get("append", False)))
    if call.name == "edit_file":
        return sandbox.edit_file(args["path"], args["old"], args["new"])
    return sandbox.list_dir(args.get("path", "."))


def execute_turn(
    sandbox: Sandbox, calls: list[ToolCall], *, allowed: list[str], deadline: float, timeout: float | None = None
) -> list[tuple[ToolCall, ToolResult]]:
    """Run one turn's tool calls in order, each within ``timeout`` (default: the sandbox's call limit)
    and what is left until ``deadline`` (``time.monotonic()``); stops after an infrastructure failure
    and before a call with no time left (the calls not run are not returned)."""
    done: list[tuple[ToolCall, ToolResult]] = []
    for call in calls:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        result = execute_tool_call(
            sandbox, call, allowed=allowed, timeout=min(timeout or sandbox.config.call_timeout_s, remaining)
        )
        done.append((call, result))
        if result.is_infrastructure_failure:
            break
    return done
