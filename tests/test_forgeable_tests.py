"""The static check that names code tests a program can pass by rewriting its arguments in place: clear positives and
negatives, HumanEval's ``check(candidate)``, the real HumanEval tests, and the flag against the real grader."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from posttrain.platform.sandbox import SandboxConfig, SandboxPool
from posttrain.platform.tasks.importers.humaneval import import_humaneval
from posttrain.platform.verifiers import TaskSpec
from posttrain.platform.verifiers.forgeable_tests import _analyse, forgeable_in_task, forgeable_tests, mutation_report
from posttrain.platform.verifiers.kinds.code import CodeTestsSpec, build_plan, run_code_tests


def flags(tests: str, test_call: str | None = None, entry_point: str = "f") -> list[tuple[int, str, str]]:
    return [(t.test, t.argument, t.callee) for t in forgeable_tests(tests, test_call, entry_point=entry_point)]


FORGEABLE = {
    "the expected value computed from it after the call": "xs = [3, 1, 2]\nassert f(xs) == sorted(xs)\n",
    "the argument compared with the result": "xs = [3, 1, 2]\nassert f(xs) == xs\n",
    "a bare name the comparison holds until after the call": "xs = [3, 1, 2]\nassert xs == f(xs)\n",
    "read in the test after a call before it": "xs = [3, 1, 2]\nf(xs)\nassert xs == [1, 2, 3]\n",
    "a result kept, the argument read later": "xs = [3, 1, 2]\nr = f(xs)\nassert r == sorted(xs)\n",
    "a dict": "d = {'a': 1}\nassert f(d) == len(d)\n",
    "a set from set()": "s = set([1, 2])\nassert f(s) == sum(s)\n",
    "list() of a range": "xs = list(range(5))\nassert f(xs) == sum(xs)\n",
    "sorted() makes a list": "xs = sorted([3, 1])\nassert f(xs) == xs[0]\n",
    "an element of a list of lists": "cases = [[3, 1], [2]]\nxs = cases[0]\nassert f(xs) == sorted(xs)\n",
    "a loop variable over lists": "for xs in [[3, 1], [2, 1]]:\n    assert f(xs) == sorted(xs)\n",
    "unpacked from rows": "for xs, n in [([3, 1], 2), ([1], 1)]:\n    assert f(xs) == len(xs) - n + n\n",
    "a call chain": "xs = [3, 1, 2]\nassert f(xs).count(1) == xs.count(1)\n",
    "starred rows": "for args in [([1], [2])]:\n    assert f(*args) == args[0]\n",
    "a starred display": "xs = [3, 1]\nassert f(*[xs]) == sorted(xs)\n",
    "a bytearray": "b = bytearray(b'ab')\nassert f(b) == bytes(b)\n",
    "read on the loop's next round": "xs = [3, 1]\nfor _ in range(2):\n    assert sorted(xs) == f(xs)\n",
    "an alias read": "xs = [3, 1]\nys = xs\nassert f(xs) == sorted(ys)\n",
    "bound together": "xs = ys = [3, 1]\nassert f(ys) == sorted(xs)\n",
    "a comprehension": "rows = [[3, 1], [2]]\nassert all(f(r) == sorted(r) for r in rows)\n",
    "in a boolean chain": "xs = [3, 1]\nassert f(xs) is None and xs == [1, 3]\n",
    "a deep copy is still a list": "import copy\nxs = copy.deepcopy([3, 1])\nassert f(xs) == sorted(xs)\n",
    "a .copy() is still a list": "base = [3, 1]\nxs = base.copy()\nassert f(xs) == sorted(xs)\n",
}

NOT_FORGEABLE = {
    "literals inline": "assert f([3, 1, 2]) == [1, 2, 3]\n",
    "the expected value computed first": "xs = [3, 1, 2]\nexpected = sorted(xs)\nassert f(xs) == expected\n",
    "read only before the call, copied": "xs = [3, 1, 2]\nassert sorted(xs) == f(xs)\n",
    "a string": "s = 'abc'\nassert f(s) == s[::-1]\n",
    "a number": "n = 4\nassert f(n) == n * 2\n",
    "a tuple of numbers": "t = (1, 2)\nassert f(t) == t[0]\n",
    "a slice copy passed": "xs = [3, 1, 2]\nassert f(xs[:]) == sorted(xs)\n",
    "list() copy passed": "xs = [3, 1, 2]\nassert f(list(xs)) == sorted(xs)\n",
    "deepcopy passed": "import copy\nxs = [3, 1]\nassert f(copy.deepcopy(xs)) == sorted(xs)\n",
    "a .copy() passed": "xs = [3, 1]\nassert f(xs.copy()) == sorted(xs)\n",
    # what the grader does not write back (graded.py): plain Python would let these be rewritten
    "a keyword argument": "xs = [1]\nassert f(items=xs) == len(xs)\n",
    "inside a display argument": "xs = [1]\nassert f([xs, 2]) == len(xs)\n",
    "a tuple holding a list": "t = ([1, 2], 3)\nassert f(t) == t[0]\n",
    "a collections.deque": "import collections\nq = collections.deque([1])\nassert f(q) == len(q)\n",
    "a Counter": "from collections import Counter\nc = Counter('aab')\nassert f(c) == len(c)\n",
    "passed again, never read": "xs = [3, 1]\nassert f(xs) == 1\nassert f(xs) == 1\n",
    "only the assert's message reads it": "xs = [3, 1]\nassert f(xs) == [1, 3], xs\n",
    "rebound before the read": "xs = [3, 1]\nf(xs)\nxs = [1, 3]\nassert xs == [1, 3]\n",
    "a loop variable rebound each round": "for xs in [[3, 1], [2]]:\n    assert sorted(xs) == f(xs)\n",
    "passed to a helper, not the program": "xs = [3, 1]\nassert sorted(xs) == xs\nassert f([1]) == 1\n",
    "an unknown value": "def make():\n    return [3, 1]\nxs = make()\nassert f(xs) == sorted(xs)\n",
    "read inside the same call's arguments": "xs = [3, 1]\nassert f(xs, len(xs)) == 2\n",
}


@pytest.mark.parametrize("name", list(FORGEABLE))
def test_forgeable_by_mutation(name: str) -> None:
    found = flags(FORGEABLE[name])
    assert found and found[0][2] == "f", found


@pytest.mark.parametrize("name", list(NOT_FORGEABLE))
def test_not_forgeable(name: str) -> None:
    assert flags(NOT_FORGEABLE[name]) == []


def test_nested_loops_are_checked_in_bounded_time() -> None:
    import time

    depth = 18  # walking every loop's body twice would be 2**18 walks of the innermost test
    tests = "xs = [3, 1]\n" + "".join("    " * i + f"for i{i} in range(2):\n" for i in range(depth))
    tests += "    " * depth + "assert sorted(xs) == f(xs)\n"
    started = time.monotonic()
    assert flags(tests) == [(0, "xs", "f")]  # the next round reads what this one passed
    assert time.monotonic() - started < 2.0


def test_the_flag_names_the_test_the_argument_and_why() -> None:
    (flag,) = forgeable_tests("xs = [3, 1, 2]\nassert f([1]) == [1]\nassert f(xs) == sorted(xs)\n", entry_point="f")
    assert (flag.test, flag.code, flag.argument, flag.callee) == (1, "assert f(xs) == sorted(xs)", "xs", "f")
    assert flag.reason == "passes `xs` to `f` and reads it again: code that rewrites `xs` in place can pass"
    (alias,) = forgeable_tests("xs = [3]\nys = xs\nassert f(xs) == ys\n", entry_point="f")
    assert "reads it again (as `ys`)" in alias.reason


def test_a_later_test_reads_what_an_earlier_test_passed() -> None:
    tests = "xs = [3, 1, 2]\nassert f(xs) is None\nassert xs == [1, 2, 3]\nassert f([2, 1]) is None\n"
    assert flags(tests) == [(1, "xs", "f")]


HUMANEVAL_STYLE = """
METADATA = {}


def check(candidate):
    lst = [3, 1, 2]
    assert candidate([5, 4]) == [4, 5]
    assert candidate(lst) == sorted(lst)
    assert candidate(list(range(3))) == [0, 1, 2]
    grid = [[1, 2], [3]]
    out = candidate(grid[0])
    assert out == [1, 2]
    for row in grid:
        assert candidate(row) == sorted(row)
"""


def test_humaneval_style_check_candidate() -> None:
    found = forgeable_tests(HUMANEVAL_STYLE, "check(sort_it)", entry_point="sort_it")
    assert [(t.test, t.argument, t.callee) for t in found] == [(1, "lst", "candidate"), (4, "row", "candidate")]
    assert found[0].reason.startswith("passes `lst` to `candidate` (the entry point `sort_it`) and reads it again")
    # the entry point called by its own name inside check counts as well, and so does a name only the program defines;
    # a helper the tests define does not
    assert flags("def check(candidate):\n    xs = [1]\n    assert f(xs) == xs\n", "check(f)") == [(0, "xs", "f")]
    assert flags("def check(candidate):\n    xs = [1]\n    assert g(xs) == xs\n", "check(f)") == [(0, "xs", "g")]
    helper = "def g(xs):\n    return list(xs)\n"
    assert flags(helper + "def check(candidate):\n    xs = [1]\n    assert g(xs) == xs\n", "check(f)") == []


def test_a_check_without_asserts_of_its_own_is_one_test_with_its_body() -> None:
    helper = "def is_sorted(xs):\n    return xs == sorted(xs)\n"
    tests = (
        helper
        + "def check(candidate):\n    for xs in [[2, 1]]:\n        candidate(xs)\n        if not is_sorted(xs):\n            raise AssertionError\n"
    )
    assert flags(tests, "check(f)") == [(0, "xs", "candidate")]  # no assert in check: the call is the one test
    tests = helper + "def check(candidate):\n    if candidate([2, 1]) != [1, 2]:\n        raise AssertionError\n"
    assert flags(tests, "check(f)") == []


def test_a_program_class_the_tests_construct_counts_as_the_program() -> None:
    tests = "xs = [1, 2]\nbox = Box(xs)\nassert box.total() == sum(xs)\n"
    assert flags(tests, entry_point="make_box") == [(0, "xs", "Box")]


def test_the_tests_are_split_and_labelled_as_the_verifier_counts_them() -> None:
    samples = [*FORGEABLE.values(), *NOT_FORGEABLE.values(), "x = 1\n", "print(f([1]))\n"]
    for tests in samples:
        assert tuple(_analyse(tests, None, "f", "")[1]) == build_plan(tests, None, "", "f").labels, tests
    for test_call in ["check(f)", "check(f)\ncheck(f)", "f([1])"]:
        tests = "def check(candidate):\n    xs = [1]\n    assert candidate(xs) == xs\n"
        assert tuple(_analyse(tests, test_call, "f", "")[1]) == build_plan(tests, test_call, "", "f").labels
    for task in import_humaneval():
        spec = CodeTestsSpec.model_validate(task.verifier.spec)
        labels = _analyse(spec.tests, spec.test_call, spec.entry_point, spec.prelude)[1]
        assert tuple(labels) == build_plan(spec.tests, spec.test_call, spec.prelude, spec.entry_point).labels, (
            task.task_id
        )


def humaneval(task_id: str) -> TaskSpec:
    return next(t for t in import_humaneval() if t.task_id == task_id)


def test_no_humaneval_test_is_forgeable_and_the_near_misses_are_right() -> None:
    tasks = import_humaneval()
    assert len(tasks) == 164 and [t.task_id for t in tasks if forgeable_in_task(t)] == []
    # HumanEval/151 passes a list by name, but computes the expected sum before the call: moved after it, it is flagged
    task = humaneval("HumanEval/151")
    spec = task.verifier.spec
    assert "lst = list(range(-99, 100, 2))" in spec["tests"]
    moved = spec["tests"].replace(
        "assert candidate(lst) == odd_sum", "assert candidate(lst) == sum([i**2 for i in lst if i%2!=0 and i > 0])"
    )
    assert moved != spec["tests"]
    assert [
        (t.test, t.argument)
        for t in forgeable_tests(moved, spec["test_call"], entry_point=spec["entry_point"], prelude=spec["prelude"])
    ] == [(6, "lst")]
    # HumanEval/32 reads coeffs after the call, but passed a deep copy; passed itself, it is flagged
    spec = humaneval("HumanEval/32").verifier.spec
    assert "candidate(copy.deepcopy(coeffs))" in spec["tests"]
    bare = spec["tests"].replace("candidate(copy.deepcopy(coeffs))", "candidate(coeffs)")
    found = forgeable_tests(bare, spec["test_call"], entry_point=spec["entry_point"], prelude=spec["prelude"])
    assert [(t.test, t.argument) for t in found] == [(0, "coeffs")]  # read by the prompt's own poly(), after the call
    # without the prompt, poly is a name the program defines: coeffs passed to it is handed over again, not read
    assert forgeable_tests(bare, spec["test_call"], entry_point=spec["entry_point"]) == []


def test_the_report_counts_and_lists_flagged_tests() -> None:
    import json

    from posttrain.platform.tasks.importers import parse_jsonl_lines

    rows = [
        {
            "prompt": "sort",
            "verifier": {
                "kind": "code",
                "spec": {"tests": "xs = [3, 1]\nassert f(xs) == sorted(xs)\n", "entry_point": "f"},
            },
            "id": "weak",
        },
        {
            "prompt": "sort",
            "verifier": {"kind": "code", "spec": {"tests": "assert f([3, 1]) == [1, 3]\n", "entry_point": "f"}},
            "id": "fine",
        },
        {"prompt": "2+2?", "answer": "4", "verifier": {"kind": "numeric", "spec": {"value": 4}}},
    ]
    tasks = parse_jsonl_lines([json.dumps(r) for r in rows], domain="d")
    report = mutation_report(tasks)
    assert report["tests_forgeable_by_mutation"] == 1 and report["tasks_with_tests_forgeable_by_mutation"] == 1
    assert report["forgeable_by_mutation"] == [
        "weak, test 1: `assert f(xs) == sorted(xs)` passes `xs` to `f` and reads it again: code that rewrites `xs` in place can pass"
    ]
    assert mutation_report(tasks[1:]) == {"tests_forgeable_by_mutation": 0, "tasks_with_tests_forgeable_by_mutation": 0}
    assert mutation_report(tasks[2:]) == {}


# --------------------------------------------------------------------------- the flag against the real grader

# wrong for every non-empty list, but clears whatever list it is given (found inside a list too)
CHEAT = (
    "def f(xs):\n    for x in xs:\n        if type(x) is list:\n            x.clear()\n    xs.clear()\n    return []\n"
)
HONEST = "def f(xs):\n    return [sorted(x) for x in xs] if xs and type(xs[0]) is list else sorted(xs)\n"


@pytest.fixture(scope="module")
def pool() -> Iterator[SandboxPool]:
    from conftest import reachable_dir

    data_dir = reachable_dir()
    with SandboxPool(SandboxConfig(pool_size=1, kill_grace_s=0.5), data_dir=data_dir) as pool:
        yield pool
    shutil.rmtree(data_dir, ignore_errors=True)


@pytest.mark.requires("bubblewrap")
@pytest.mark.parametrize(
    ("tests", "flagged"),
    [
        ("xs = [3, 1, 2]\nassert f(xs) == sorted(xs)\n", True),
        ("xs = [1, 2, 3]\nassert f(xs) == xs\n", True),
        ("def check(candidate):\n    xs = [3, 1, 2]\n    assert candidate(xs) == sorted(xs)\n", True),
        ("xs = [3, 1, 2]\nassert f(*[xs]) == sorted(xs)\n", True),
        ("xs = [3, 1, 2]\nexpected = sorted(xs)\nassert f(xs) == expected\n", False),
        ("assert f([3, 1, 2]) == [1, 2, 3]\n", False),
        ("import copy\nxs = [3, 1, 2]\nassert f(copy.deepcopy(xs)) == sorted(xs)\n", False),
        ("xs = [3, 1, 2]\nassert f(xs=xs) == sorted(xs)\n", False),
        ("xs = [3, 1, 2]\nassert f([xs])[0] == sorted(xs)\n", False),
    ],
    ids=[
        "sorted-after",
        "compared-with-itself",
        "check-candidate",
        "starred-display",
        "expected-first",
        "literal",
        "deepcopy",
        "keyword",
        "inside-a-display",
    ],
)
def test_a_flagged_test_is_passed_by_code_that_rewrites_its_argument(
    pool: SandboxPool, tests: str, flagged: bool
) -> None:
    """The check flags exactly the tests that wrong code which rewrites its argument passes on the real grader."""
    test_call = "check(f)" if "def check" in tests else None
    spec = CodeTestsSpec(tests=tests, test_call=test_call, entry_point="f")
    assert bool(forgeable_tests(tests, test_call, entry_point="f")) is flagged
    cheat = run_code_tests(spec, CHEAT, pool)
    honest = run_code_tests(spec, HONEST, pool)
    assert not cheat.is_infra_error and honest.passed, (cheat, honest)
    assert cheat.passed is flagged, cheat
