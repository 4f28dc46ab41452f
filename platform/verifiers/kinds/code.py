"""Code tasks: the spec, how a program is assembled from a completion, and the registry slot.

Running the program belongs to the sandbox (posttrain.platform.sandbox). Until a runner is
registered, the 'code' kind answers every check with an infrastructure error. To plug one in::

    from posttrain.platform.verifiers import VerifierKind, register_verifier
    from posttrain.platform.verifiers.kinds.code import CodeTestsSpec, assemble_program

    def check_code_in_sandbox(spec: CodeTestsSpec, completion: str, task: TaskSpec) -> Verdict:
        program = assemble_program(spec, completion)
        ...  # run `program` with python in a sandbox, limit spec.timeout_s; exit 0 = pass

    register_verifier(
        VerifierKind(name="code", spec_model=CodeTestsSpec, check=check_code_in_sandbox,
                     isolation="thread", default_timeout_s=60.0),
        replace=True,
    )
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import ConfigDict, Field

from posttrain.platform.verifiers.models import TaskSpec, Verdict
from posttrain.platform.verifiers.registry import BaseSpec, VerifierKind


class CodeTestsSpec(BaseSpec):
    """A Python program is ``prelude + completion's code + tests + test_call``; it passes
    when it exits with status 0. ``entry_point``: the function the tests call."""

    language: Literal["python"] = "python"
    tests: str = Field(min_length=1)
    entry_point: str | None = None
    prelude: str = ""
    test_call: str | None = None


_FENCE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(completion: str) -> str:
    """The code in a completion: the fenced blocks joined, or the text itself."""
    blocks = _FENCE.findall(completion)
    return "\n\n".join(blocks) if blocks else completion


def assemble_program(spec: CodeTestsSpec, completion: str) -> str:
    """The whole program to run for ``completion``: prelude, code, tests, then the test call."""
    parts = [spec.prelude, extract_code(completion), "", spec.tests]
    if spec.test_call:
        parts.append(spec.test_call)
    return "\n".join(part.rstrip("\n") if part else part for part in parts) + "\n"


def check_code_not_installed(spec: CodeTestsSpec, completion: str, task: TaskSpec) -> Verdict:
    return Verdict.infra(
        "the code verifier is not installed yet: register one with "
        "register_verifier(VerifierKind(name='code', spec_model=CodeTestsSpec, check=..., "
        "isolation='thread'), replace=True) (see posttrain.platform.verifiers.kinds.code)",
        kind="code",
    )


class ToolUseSpec(BaseSpec):
    """Placeholder spec of the tool-use outcome kind (defined with the sandbox)."""

    model_config = ConfigDict(extra="allow")


def check_tool_use_not_installed(spec: Any, completion: str, task: TaskSpec) -> Verdict:
    return Verdict.infra(
        "the tool_use verifier is not installed yet: register one with "
        "register_verifier(VerifierKind(name='tool_use', ...), replace=True)",
        kind="tool_use",
    )


CODE_SLOT = VerifierKind(
    name="code",
    spec_model=CodeTestsSpec,
    check=check_code_not_installed,
    isolation="thread",
    default_timeout_s=60.0,
    description="unit tests run in a sandbox (slot: replaced by the sandbox's runner)",
    placeholder=True,
)
TOOL_USE_SLOT = VerifierKind(
    name="tool_use",
    spec_model=ToolUseSpec,
    check=check_tool_use_not_installed,
    isolation="thread",
    default_timeout_s=60.0,
    description="outcome of a tool-using episode (slot: replaced with the sandbox)",
    placeholder=True,
)
