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

from posttrain.platform.sandbox import Sandbox
from posttrain.platform.tasks.domains.families.repair_tasks import MODULE
from posttrain.platform.tasks.episodes import PROJECT_TOOLS, grade_project, is_project
from posttrain.platform.verifiers import TaskSpec, Verdict, VerifierService
from posttrain.training.environments.base import Episode
from posttrain.training.environments.tool_use import ToolUse


class CodeRepair(ToolUse):
    name = "code_repair"
    default_tools = PROJECT_TOOLS

    def prepare(self, task: TaskSpec, sandbox: Sandbox | None) -> None:
        if not is_project(task):
            raise ValueError(
                f"task {task.task_id or task.domain!r} has no project to repair (metadata.files with "
                f"{MODULE}); train code_repair on the repair.* domains"
            )
        super().prepare(task, sandbox)

    def score(self, episode: Episode, service: VerifierService, sandbox: Sandbox | None) -> Verdict:
        assert sandbox is not None
        graded, verdict = grade_project(episode.task, sandbox, service)
        episode.answer = graded if graded is not None else episode.answer  # what was graded, stored with the episode
        return verdict
