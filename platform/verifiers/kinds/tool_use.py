"""Tool-use tasks: checks run in the episode's sandbox after the agent stopped.

The caller lends the episode's sandbox (still checked out) through the context::

    with pool.acquire() as sandbox:
        episode = run_agent(model, sandbox, task_messages)
        verdict = verify(task, episode.answer or "", context=VerifyContext(sandbox=sandbox))

Spec: one check, or ``{"checks": [...]}`` with several; the score is the fraction that pass.

* ``{"check": "file_contains", "path": "out.txt", "expected": "42"}``: the file (relative to
  the work directory) holds the text (``match``: "contains" (default), "equals" or "regex");
* ``{"check": "command_output", "command": "python3 sol.py", "expected": "42"}``: the command's
  stdout matches (``match``: "equals" (default), "contains" or "regex"; ``strip`` trims
  surrounding whitespace of both) and it exits with ``exit_code`` (default 0; None: any);
* ``{"check": "answer_contains", "expected": "42"}``: the agent's final answer (the completion).

Before each check that reads the sandbox, every process in it is killed and a fresh interpreter
started (files are kept): nothing the agent ran or patched in its interpreter answers for a check,
and nothing a checked command started (a process it left behind) can change what a later check
finds. Commands run with a clean environment; the comparison with the expected text is made here,
on the host, from the command's raw output and exit code. A command that times out or fails its
exit code fails its check. A sandbox that fails gives an ``infra_error`` verdict. The agent's own
interpreter can never be the one that checks: ``fresh_interpreter`` may only be true.
"""

from __future__ import annotations

import re
import shlex
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from posttrain.platform.sandbox import CallStatus, Sandbox
from posttrain.platform.verifiers.models import TaskSpec, Verdict
from posttrain.platform.verifiers.registry import BaseSpec, VerifierKind, VerifyContext

DEFAULT_TIMEOUT_S = 30.0
_SHOWN = 200
CLEAN_ENV = "/usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/tmp LANG=C.UTF-8 LC_ALL=C.UTF-8"

Match = Literal["contains", "equals", "regex"]


class _Check(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FileContains(_Check):
    check: Literal["file_contains"]
    path: str = Field(min_length=1)
    expected: str
    match: Match = "contains"
    max_bytes: int = Field(default=1 << 20, ge=1, le=64 << 20)


class CommandOutput(_Check):
    check: Literal["command_output"]
    command: str = Field(min_length=1)
    expected: str
    match: Match = "equals"
    strip: bool = True
    exit_code: int | None = 0


class AnswerContains(_Check):
    check: Literal["answer_contains"]
    expected: str
    match: Match = "contains"


Check = Annotated[FileContains | CommandOutput | AnswerContains, Field(discriminator="check")]


class ToolUseSpec(BaseSpec):
    """``checks``: what must hold in the sandbox after the episode (a single check may be
    given inline, without ``checks``). ``fresh_interpreter``: kill what is running in the sandbox
    and start a fresh interpreter before each check (files are kept); always on."""

    checks: list[Check] = Field(min_length=1)
    fresh_interpreter: bool = True

    @field_validator("fresh_interpreter")
    @classmethod
    def _always_fresh(cls, value: bool) -> bool:
        if not value:
            raise ValueError(
                "must be true: with false the agent's own (possibly patched) interpreter would answer "
                "for the checks, and what it left running could change their results"
            )
        return value

    _sandbox: Sandbox | None = PrivateAttr(default=None)  # lent by the caller's VerifyContext

    @model_validator(mode="before")
    @classmethod
    def _one_check_inline(cls, data: Any) -> Any:
        if isinstance(data, dict) and "check" in data and "checks" not in data:
            data = dict(data)
            shared = {k: data.pop(k) for k in ("timeout_s", "fresh_interpreter") if k in data}
            return {"checks": [data], **shared}
        return data


def _matches(text: str, expected: str, match: Match) -> bool:
    if match == "equals":
        return text == expected
    if match == "contains":
        return expected in text
    return re.search(expected, text, re.MULTILINE) is not None


def _show(text: str) -> str:
    return repr(text if len(text) <= _SHOWN else text[:_SHOWN] + "...")


class _Infra(Exception):
    """The sandbox failed: the verdict is an infrastructure error."""


def _run_check(check: Check, sandbox: Sandbox | None, completion: str, timeout_s: float) -> tuple[bool, str]:
    """(passed, what was found) for one check."""
    if isinstance(check, AnswerContains):
        ok = _matches(completion, check.expected, check.match)
        return (
            ok,
            "the answer matches"
            if ok
            else f"the answer {_show(completion)} does not {check.match} {_show(check.expected)}",
        )
    assert sandbox is not None
    if isinstance(check, FileContains):
        result = sandbox.read_file(check.path, max_bytes=check.max_bytes)
        if result.is_infrastructure_failure:
            raise _Infra(result.detail or str(result.error))
        if not result.ok and result.status is not CallStatus.OUTPUT_TRUNCATED:
            why = f"{result.error.type}: {result.error.message}" if result.error else result.status.value
            return False, f"{check.path}: cannot be read ({why})"
        text = str(result.value or "")
        ok = _matches(text, check.expected, check.match)
        return (
            ok,
            f"{check.path} matches"
            if ok
            else f"{check.path} holds {_show(text)}, which does not {check.match} {_show(check.expected)}",
        )
    result = sandbox.run_bash(
        f"{CLEAN_ENV} /bin/bash --noprofile --norc -c {shlex.quote(check.command)}", timeout=timeout_s
    )
    if result.is_infrastructure_failure:
        raise _Infra(result.detail or str(result.error))
    if result.status is CallStatus.TIMEOUT:
        return False, f"`{check.command}` did not finish within {timeout_s:g} s"
    if check.exit_code is not None and result.exit_code != check.exit_code:
        return (
            False,
            f"`{check.command}` exited with {result.exit_code} (expected {check.exit_code}); stderr {_show(result.stderr)}",
        )
    output, expected = (
        (result.stdout.strip(), check.expected.strip()) if check.strip else (result.stdout, check.expected)
    )
    ok = _matches(output, expected, check.match)
    return (
        ok,
        f"`{check.command}` output matches"
        if ok
        else f"`{check.command}` printed {_show(output)}, which does not {check.match} {_show(expected)}",
    )


def prepare_tool_use(spec: ToolUseSpec, completion: str, task: TaskSpec, context: VerifyContext) -> ToolUseSpec:
    """Carry the episode's sandbox (``VerifyContext.sandbox``) to the check."""
    bound = spec.model_copy()
    bound._sandbox = context.sandbox
    return bound


def check_tool_use(spec: ToolUseSpec, completion: str, task: TaskSpec) -> Verdict:
    sandbox = spec._sandbox
    needs_sandbox = any(not isinstance(c, AnswerContains) for c in spec.checks)
    if needs_sandbox and sandbox is None:
        return Verdict.infra(
            "the tool_use verifier needs the episode's sandbox: pass context=VerifyContext(sandbox=...) "
            "while the sandbox is still checked out",
            kind="tool_use",
        )
    deadline = time.monotonic() + (spec.timeout_s or DEFAULT_TIMEOUT_S)
    results: list[dict[str, Any]] = []
    try:
        for check in spec.checks:
            if not isinstance(check, AnswerContains):
                assert sandbox is not None
                # Before every check that reads the sandbox: nothing left running (by the agent, or by a
                # command an earlier check ran) can answer for it or change what it finds.
                if not sandbox.reset(wipe=False):
                    return Verdict.infra(
                        f"the episode's sandbox (slot {sandbox.slot}) did not restart its interpreter", kind="tool_use"
                    )
            remaining = max(deadline - time.monotonic(), 0.5)
            ok, found = _run_check(check, sandbox, completion, remaining)
            results.append({"check": check.check, "passed": ok, "found": found})
    except _Infra as error:
        return Verdict.infra(f"the episode's sandbox failed during the checks: {error}", kind="tool_use")
    passed = sum(r["passed"] for r in results)
    failing = [r["found"] for r in results if not r["passed"]]
    details = f"{passed}/{len(results)} checks passed" + (f"; {failing[0]}" if failing else "")
    return Verdict.of_score(passed / len(results), details, breakdown={"checks": results})


TOOL_USE = VerifierKind(
    name="tool_use",
    spec_model=ToolUseSpec,
    check=check_tool_use,
    prepare=prepare_tool_use,
    isolation="thread",
    default_timeout_s=DEFAULT_TIMEOUT_S,
    wait_margin_s=30.0,
    description="checks run in the episode's sandbox after the agent stopped (files, command output, answer)",
)
