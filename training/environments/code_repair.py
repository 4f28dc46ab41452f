"""``environment: {name: code_repair}``: the terminal-programming workload. A small Python project is laid
into the episode's sandbox (the task's ``metadata["files"]``: a module with a planted defect and its
visible tests, from the ``repair.*`` domains); over up to ``max_turns`` turns the policy reads and writes
files and runs the tests with the sandbox tools, reading the errors, until it replies without a tool call.

The rubric settles the episode's sandbox (every process the policy left is killed, a fresh interpreter
started), reads only the final module (``solution.py``) out of it and hands its text to the task's
``code`` verifier, which runs the hidden tests on it in a fresh sandbox of the verifier's own pool: the
module runs in a child process there, the tests in its parent, which the module cannot write into, and
the score is computed on the host from the raw outcomes (platform/verifiers/kinds/code.py). Nothing
else the episode wrote (a test file, a ``conftest.py``, a ``sitecustomize.py``, a process left
running) reaches the grading. The reward is the fraction of hidden tests that pass.
"""

from __future__ import annotations

from posttrain.platform.sandbox import CallStatus, Sandbox
from posttrain.platform.tasks.domains.families.repair_tasks import MODULE
from posttrain.platform.verifiers import TaskSpec, Verdict, VerifierService
from posttrain.training.environments.base import Episode
from posttrain.training.environments.tool_use import ToolUse, settle

def as_file(task: TaskSpec) -> TaskSpec:
    """``task`` with its code verifier told that a completion is a source file, graded whole (a ``` inside a
    docstring of the module is code, not the fence of a reply)."""
    verifier = task.verifier.model_copy(update={"spec": {**task.verifier.spec, "completion": "file"}})
    return task.model_copy(update={"verifier": verifier})


class CodeRepair(ToolUse):
    name = "code_repair"
    default_tools = ["bash", "read_file", "write_file", "edit_file", "list_dir"]

    def prepare(self, task: TaskSpec, sandbox: Sandbox | None) -> None:
        files = task.metadata.get("files")
        if not isinstance(files, dict) or MODULE not in files:
            raise ValueError(f"task {task.task_id or task.domain!r} has no project to repair (metadata.files with "
                             f"{MODULE}); train code_repair on the repair.* domains")
        assert sandbox is not None
        for path, text in files.items():
            result = sandbox.write_file(str(path), str(text))
            if not result.ok:
                raise RuntimeError(f"could not lay out {path} in the sandbox: {result.to_message_content()}")

    def score(self, episode: Episode, service: VerifierService, sandbox: Sandbox | None) -> Verdict:
        assert sandbox is not None
        if (problem := settle(sandbox)) is not None:  # nothing left running rewrites the module as it is read
            return Verdict.infra(problem)
        final = sandbox.read_file(MODULE)
        if final.is_infrastructure_failure:
            return Verdict.infra(f"could not read {MODULE} back from the episode's sandbox: {final.to_message_content()}")
        if final.status is not CallStatus.OK or not isinstance(final.value, str):
            return Verdict(score=0.0, passed=False, details=f"{MODULE} is gone or unreadable after the episode: "
                                                           f"{final.to_message_content()[:200]}")
        episode.answer = final.value  # what was graded, stored with the episode
        # hidden tests, in the verifier's own fresh sandbox, on the module whole (a file, not a chat reply)
        return service.verify(as_file(episode.task), final.value)
