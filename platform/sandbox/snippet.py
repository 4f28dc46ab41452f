"""Run a person's snippet in a sandbox: the console's snippet runner, as an audited operator action."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from posttrain.platform.auth import AUDITED_CHARS, Identity, action, audit
from posttrain.platform.db.models import Role
from posttrain.platform.sandbox.result import ToolResult

Tool = Literal["python", "bash"]


@action("sandbox.run", Role.operator)
def run_snippet(
    identity: Identity, pool: Callable[[], Any], tool: Tool, code: str, *, url: str | None = None
) -> ToolResult:
    """Run ``code`` with ``tool`` in a sandbox lent by ``pool()`` (a :class:`~posttrain.platform.sandbox.SandboxPool`
    or its Ray twin, asked for only after the role check: a refused caller starts none); the snippet is
    audited, its first characters kept, before it runs."""
    if tool not in ("python", "bash"):
        raise ValueError(f"tool {tool!r} is not python or bash")
    audit(
        identity.username,
        "sandbox.run",
        target=tool,
        details={"code": code[:AUDITED_CHARS], "chars": len(code)},
        url=url,
    )
    with pool().acquire() as sandbox:
        return sandbox.run_python(code) if tool == "python" else sandbox.run_bash(code)
