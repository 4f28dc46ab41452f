"""Sandboxes for tool calls and unit tests: bubblewrap isolation, a warm pool,
tools with OpenAI schemas, a tool-call parser and the agent loop.

Typical use (a code verifier)::

    from posttrain.platform.sandbox import SandboxConfig, SandboxPool

    with SandboxPool(SandboxConfig(), data_dir=Path("var")) as pool:
        with pool.acquire() as sandbox:
            sandbox.write_file("solution.py", completion)
            result = sandbox.run_bash("python3 -m unittest -q test_solution", timeout=30)
            passed = result.ok

``make_pool(config, data_dir, ray_address)`` picks the pool: ``RaySandboxPool``
(platform/sandbox/ray_backend.py, one pool actor per node of a Ray cluster) when
``config.backend == "ray"`` or a Ray address is set, else ``SandboxPool``.
"""

from posttrain.platform.sandbox.agent import EpisodeResult, ModelFn, run_agent
from posttrain.platform.sandbox.backends import ProcessBackendWarning, SandboxUnavailableError
from posttrain.platform.sandbox.factory import make_pool, uses_ray
from posttrain.platform.sandbox.parser import ParsedTurn, ToolCall, parse_tool_calls
from posttrain.platform.sandbox.pool import PoolClosedError, PoolExhaustedError, SandboxPool
from posttrain.platform.sandbox.result import CallError, CallRecord, CallStatus, PoolStatus, ToolResult
from posttrain.platform.sandbox.sandbox import Sandbox, SandboxStartError
from posttrain.platform.sandbox.tools import TOOL_SCHEMAS, execute_tool_call, tool_schemas
from posttrain.platform.settings.sandbox import SandboxConfig

__all__ = [
    "TOOL_SCHEMAS",
    "CallError",
    "CallRecord",
    "CallStatus",
    "EpisodeResult",
    "ModelFn",
    "ParsedTurn",
    "PoolClosedError",
    "PoolExhaustedError",
    "PoolStatus",
    "ProcessBackendWarning",
    "Sandbox",
    "SandboxConfig",
    "SandboxPool",
    "SandboxStartError",
    "SandboxUnavailableError",
    "ToolCall",
    "ToolResult",
    "execute_tool_call",
    "make_pool",
    "parse_tool_calls",
    "run_agent",
    "tool_schemas",
    "uses_ray",
]
