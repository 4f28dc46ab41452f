"""A task as an episode with sandbox tools: how it is put, laid out and graded, wherever the replies come from.

The ``tool_use`` and ``code_repair`` training environments (token in, token out) and the Tasks page's "Try a
model" (a deployment answering chat messages) run a task the same way through this module and the one agent
loop (:mod:`posttrain.platform.sandbox.agent`):

- :func:`episode_messages`: the task's messages with the tools described in the system message, in the
  Hermes ``<tool_call>`` form the policy writes its calls in (what a model trained in the environment saw);
- :func:`lay_out`: a project task's files (``metadata["files"]``: the ``repair.*`` domains) written into the
  episode's sandbox before the first turn;
- :func:`settle` then :func:`grade_answer` or :func:`grade_project`: the rubric. The sandbox is settled first
  (every process the policy left is killed, a fresh interpreter started, its files kept), so nothing it left
  running can answer for the checks. A project is graded on its final module alone, read out of the sandbox
  and run against the hidden tests in the verifier's own fresh sandbox.

    with pool.acquire() as sandbox:
        lay_out(task, sandbox)
        result = run_agent(reply, sandbox, episode_messages(task_messages(task), tool_schemas(tools)), tools=tools)
        graded, verdict = grade_project(task, sandbox, service)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from posttrain.platform.sandbox import CallStatus, Sandbox
from posttrain.platform.tasks.domains.families.repair_tasks import MODULE
from posttrain.platform.verifiers import TaskSpec, Verdict, VerifierService
from posttrain.platform.verifiers.registry import VerifyContext

TOOLS_PROMPT = """You can use tools. To call one, write on a line of its own:
<tool_call>{{"name": "<tool name>", "arguments": {{<its arguments>}}}}</tool_call>
Its result comes back in the next message. When you know the answer, reply with the answer alone, without a tool call.
Tools:
{tools}"""
ANSWER_TOOLS = ["python", "bash"]  # a task answered after using tools (the tool_use environment's)
PROJECT_TOOLS = ["bash", "read_file", "write_file", "edit_file", "list_dir"]  # a project to repair (code_repair's)


def is_project(task: TaskSpec) -> bool:
    """Whether ``task`` is a project laid into the sandbox and graded on its module (a ``repair.*`` task)."""
    files = task.metadata.get("files")
    return isinstance(files, dict) and MODULE in files


def task_messages(task: TaskSpec) -> list[dict[str, Any]]:
    """The task's prompt as chat-template messages."""
    return [{"role": m.role, "content": m.content} for m in task.prompt]


def tools_prompt(schemas: Sequence[dict[str, Any]]) -> str:
    return TOOLS_PROMPT.format(tools="\n".join(json.dumps(s["function"], ensure_ascii=False) for s in schemas))


def episode_messages(messages: list[dict[str, Any]], schemas: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with the tools described in the system message (after the task's own system message)."""
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": messages[0]["content"] + "\n\n" + tools_prompt(schemas)}, *messages[1:]]
    return [{"role": "system", "content": tools_prompt(schemas)}, *messages]


def lay_out(task: TaskSpec, sandbox: Sandbox) -> None:
    """Write a project task's files into the sandbox (nothing for a task without files)."""
    files = task.metadata.get("files")
    for path, text in files.items() if isinstance(files, dict) else ():
        result = sandbox.write_file(str(path), str(text))
        if not result.ok:
            raise RuntimeError(f"could not lay out {path} in the sandbox: {result.to_message_content()}")


def settle(sandbox: Sandbox) -> str | None:
    """Kill everything running in the episode's sandbox and start a fresh interpreter, keeping its files,
    before anything reads it for the reward; why it could not (None when it did). A sandbox that cannot
    restart its interpreter in place (a Ray lease) is left as it is: the verifiers that read it restart
    it themselves where they can."""
    reset = getattr(sandbox, "reset", None)
    if reset is None:
        return None
    if not reset(wipe=False):
        return f"the episode's sandbox (slot {getattr(sandbox, 'slot', '?')}) did not restart its interpreter before scoring"
    return None


def grade_answer(task: TaskSpec, answer: str, sandbox: Sandbox | None, service: VerifierService) -> Verdict:
    """The task's verifier on the final answer, with the settled sandbox in its context (a ``tool_use`` task checks
    the files the policy left)."""
    if sandbox is not None and (problem := settle(sandbox)) is not None:
        return Verdict.infra(problem)
    return service.verify(task, answer, context=VerifyContext(sandbox=sandbox) if sandbox is not None else None)


def as_file(task: TaskSpec) -> TaskSpec:
    """``task`` with its code verifier told that a completion is a source file, graded whole (a ``` inside a
    docstring of the module is code, not the fence of a reply)."""
    verifier = task.verifier.model_copy(update={"spec": {**task.verifier.spec, "completion": "file"}})
    return task.model_copy(update={"verifier": verifier})


def grade_project(task: TaskSpec, sandbox: Sandbox, service: VerifierService) -> tuple[str | None, Verdict]:
    """The final module read out of the settled sandbox, and its verdict: the hidden tests, in the verifier's own
    fresh sandbox, on the module whole. Nothing else the episode wrote reaches the grading."""
    if (problem := settle(sandbox)) is not None:  # nothing left running rewrites the module as it is read
        return None, Verdict.infra(problem)
    final = sandbox.read_file(MODULE)
    if final.is_infrastructure_failure:
        return None, Verdict.infra(
            f"could not read {MODULE} back from the episode's sandbox: {final.to_message_content()}"
        )
    if final.status is not CallStatus.OK or not isinstance(final.value, str):
        return None, Verdict(
            score=0.0,
            passed=False,
            details=f"{MODULE} is gone or unreadable after the episode: {final.to_message_content()[:200]}",
        )
    return final.value, service.verify(as_file(task), final.value)
