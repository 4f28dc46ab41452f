"""Typed outcome of one tool call."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any


class CallStatus(str, Enum):
    """How a tool call ended.

    ``INFRA`` is the only status that is not the model's doing: the sandbox
    could not be started, or died for reasons outside the call.
    """

    OK = "ok"
    ERROR = "error"  # the code raised, or the command exited non-zero
    TIMEOUT = "timeout"  # wall-clock or CPU limit
    MEMORY = "memory"  # address-space limit (MemoryError) or killed for memory
    OUTPUT_TRUNCATED = "output_truncated"  # finished, but printed more than the cap
    KILLED = "killed"  # the interpreter died (signal, os._exit, protocol abuse)
    INFRA = "infrastructure_failure"


@dataclass(frozen=True)
class CallError:
    type: str
    message: str
    traceback: str = ""


@dataclass(frozen=True)
class ToolResult:
    """What one tool call produced. ``value`` depends on the tool: the repr of
    the last expression (python), file text (read_file), bytes written
    (write_file), a list of entries (list_dir)."""

    tool: str
    status: CallStatus
    stdout: str = ""
    stderr: str = ""
    value: Any = None
    exit_code: int | None = None
    error: CallError | None = None
    truncated: bool = False
    duration_ms: float = 0.0
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status is CallStatus.OK

    @property
    def is_infrastructure_failure(self) -> bool:
        return self.status is CallStatus.INFRA

    def to_message_content(self) -> str:
        """Text for the ``tool`` message the model sees next."""
        parts: list[str] = []
        if self.status is not CallStatus.OK:
            parts.append(f"[status: {self.status.value}]")
        if self.detail:
            parts.append(f"[{self.detail}]")
        if self.stdout:
            parts.append(self.stdout)
        if self.stderr:
            parts.append(f"[stderr]\n{self.stderr}")
        if self.value is not None:
            parts.append(self.value if isinstance(self.value, str) else json.dumps(self.value))
        if self.exit_code not in (None, 0):
            parts.append(f"[exit code {self.exit_code}]")
        if self.error is not None:
            parts.append(self.error.traceback or f"{self.error.type}: {self.error.message}")
        if self.truncated:
            parts.append("[output truncated]")
        return "\n".join(parts)


def infra_failure(tool: str, message: str, started: float | None = None) -> ToolResult:
    elapsed = 0.0 if started is None else (time.monotonic() - started) * 1000
    return ToolResult(
        tool=tool,
        status=CallStatus.INFRA,
        error=CallError("SandboxInfrastructureError", message),
        duration_ms=elapsed,
        detail=message,
    )


@dataclass(frozen=True)
class CallRecord:
    """One entry of the pool's bounded latency record."""

    at: float  # time.time() when the call ended
    slot: int
    tool: str
    status: CallStatus
    duration_ms: float


@dataclass(frozen=True)
class PoolStatus:
    backend: str
    size: int
    ready: int
    busy: int
    starting: int
    failures: int  # sandboxes that died or failed to start, since the pool began
    infra_failures: int  # calls that ended in CallStatus.INFRA
    episodes: int
    calls: int
    last_error: str = ""
    latency_ms: dict[str, float] = field(default_factory=dict)
    # What confines each sandbox: memory_and_processes, work_dir, syscalls; a line starting with
    # "weaker: " says what the host does not allow and why (limits.py).
    limits: dict[str, str] = field(default_factory=dict)


class ToolMethods:
    """The tools every sandbox offers, over one ``_call(op, args, timeout)`` transport
    (a local sandbox's pipe, or a Ray actor's lease)."""

    def _call(self, op: str, args: dict[str, Any], timeout: float | None) -> ToolResult:  # pragma: no cover
        raise NotImplementedError

    def run_python(self, code: str, timeout: float | None = None) -> ToolResult:
        """Execute ``code`` in the episode's persistent interpreter; the value of a final
        expression comes back in ``value`` (as its repr)."""
        return self._call("python", {"code": code}, timeout)

    def run_bash(self, command: str, timeout: float | None = None) -> ToolResult:
        """Run ``command`` with /bin/bash -c in the work directory."""
        return self._call("bash", {"command": command}, timeout)

    def read_file(self, path: str, max_bytes: int | None = None) -> ToolResult:
        return self._call("read_file", {"path": path, "max_bytes": max_bytes}, None)

    def write_file(self, path: str, content: str, append: bool = False) -> ToolResult:
        return self._call("write_file", {"path": path, "content": content, "append": append}, None)

    def edit_file(self, path: str, old: str, new: str) -> ToolResult:
        """Replace the one occurrence of ``old`` in the file with ``new`` (an error that says how many there
        are when not exactly one; the file is left as it was)."""
        return self._call("edit_file", {"path": path, "old": old, "new": new}, None)

    def list_dir(self, path: str = ".") -> ToolResult:
        return self._call("list_dir", {"path": path}, None)
