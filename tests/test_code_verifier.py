"""The 'code' and 'tool_use' verifiers with real bubblewrap sandboxes: HumanEval, the procedural
code domains, partial credit, bad completions, the shared pool, and checks after an agent episode."""

from __future__ import annotations

import ast
import contextlib
import gc
import json
import shutil
import sys
import threading
import time
from collections.abc import Iterator

import psutil
import pytest
from conftest import reachable_dir, wait_for

from posttrain.platform.sandbox import SandboxConfig, SandboxPool, run_agent
from posttrain.platform.settings import get_settings
from posttrain.platform.tasks.domains.registry import generate, list_domains
from posttrain.platform.tasks.importers.humaneval import import_humaneval
from posttrain.platform.verifiers import (
    PoolConfig,
    TaskSpec,
    Verdict,
    VerifierService,
    VerifierSpecError,
    VerifyContext,
    get_verifier,
    validate_spec,
)
from posttrain.platform.verifiers.kinds.code import CodeTestsSpec, build_plan, run_code_tests
from posttrain.platform.verifiers.sandboxes import close_shared_pool, set_shared_pool, shared_pool

pytestmark = pytest.mark.requires("bubblewrap")

POOL_SIZE = 4


@pytest.fixture(scope="module")
def pool() -> Iterator[SandboxPool]:
    data_dir = reachable_dir()
    with SandboxPool(SandboxConfig(pool_size=POOL_SIZE, kill_grace_s=0.5), data_dir=data_dir) as pool:
        yield pool
    shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def service() -> Iterator[VerifierService]:
    with VerifierService(PoolConfig(workers=1)) as svc:
        yield svc


@pytest.fixture(scope="module")
def ctx(pool: SandboxPool) -> VerifyContext:
    return VerifyContext(sandbox_pool=pool)


@pytest.fixture(scope="module")
def humaneval() -> list[TaskSpec]:
    tasks = import_humaneval()
    assert len(tasks) == 164
    return tasks


def code_task(
    tests: str,
    *,
    entry_point: str | None = "f",
    test_call: str | None = None,
    prelude: str = "",
    timeout_s: float | None = None,
) -> TaskSpec:
    spec: dict[str, object] = {"tests": tests, "entry_point": entry_point, "prelude": prelude}
    if test_call is not None:
        spec["test_call"] = test_call
    if timeout_s is not None:
        spec["timeout_s"] = timeout_s
    return TaskSpec(domain="test.code", prompt="write f", verifier={"kind": "code", "spec": spec})


def with_timeout(task: TaskSpec, timeout_s: float) -> TaskSpec:
    spec = {**task.verifier.spec, "timeout_s": timeout_s}
    return task.model_copy(update={"verifier": task.verifier.model_copy(update={"spec": spec})})


def assert_scored_zero(verdict: Verdict, reason: str) -> None:
    assert not verdict.is_infra_error, verdict
    assert verdict.score == 0 and not verdict.passed, verdict
    assert reason in verdict.details, verdict.details


THREE_TESTS = "assert f(1) == 2\nassert f(2) == 3\nassert f(-1) == 0\n"


# ----------------------------------------------------------------------------- the kind


def test_code_kind_is_the_sandbox_runner() -> None:
    kind = get_verifier("code")
    assert not kind.placeholder and kind.isolation == "thread" and kind.prepare is not None
    assert not get_verifier("tool_use").placeholder


def test_partial_credit_names_the_failing_test(service: VerifierService, ctx: VerifyContext) -> None:
    task = code_task(THREE_TESTS)
    full = service.verify(task, "def f(x):\n    return x + 1\n", context=ctx)
    assert full.passed and full.score == 1 and full.breakdown["tests"] == 3, full
    partial = service.verify(task, "def f(x):\n    return x + 1 if x > 0 else 7\n", context=ctx)
    assert not partial.passed and partial.score == pytest.approx(2 / 3), partial
    assert "2/3 tests passed" in partial.details and "assert f(-1) == 0" in partial.details
    assert partial.breakdown["failures"] == [{"test": 2, "code": "assert f(-1) == 0", "error": "AssertionError"}]
    # The message of a failing assert reaches the details; fenced code is extracted.
    message = service.verify(
        code_task("assert f(1) == 2, 'f(1) must be 2'\n"), "Sure:\n```python\ndef f(x):\n    return 0\n```", context=ctx
    )
    assert message.score == 0 and "f(1) must be 2" in message.details, message


def test_humaneval_check_function_counts_each_assert(
    service: VerifierService, ctx: VerifyContext, humaneval: list[TaskSpec]
) -> None:
    task = humaneval[0]  # has_close_elements: seven asserts in check(candidate)
    assert len(build_plan(task.verifier.spec["tests"], task.verifier.spec["test_call"]).labels) == 7
    # A solution that is right only when the threshold is small passes some asserts, not all.
    half = "    return any(abs(a - b) < min(threshold, 0.3) for i, a in enumerate(numbers) for b in numbers[i + 1:])\n"
    verdict = service.verify(task, half, context=ctx)
    assert 0 < verdict.score < 1 and not verdict.passed and verdict.breakdown["tests"] == 7, verdict


def test_plan_rules() -> None:
    # `assert True` tests nothing; setup statements are not tests; a loop of asserts is one test.
    plan = build_plan(
        "import math\nassert True\nfor i in range(3):\n    assert f(i) == i + 1\nassert f(0) == 1\n", None
    )
    assert plan.labels == ("for i in range(3): ...", "assert f(0) == 1")
    # A test call that is not a call of an asserting function is one test of its own.
    assert build_plan("def helper():\n    return 1\n", "assert f(helper()) == 2").labels == ("assert f(helper()) == 2",)
    # No assert at all: the whole test code is one test.
    assert build_plan("x = f(1)\nif x != 2:\n    raise ValueError(x)\n", None).labels == ("the test code",)
    with pytest.raises(VerifierSpecError, match="tests"):
        validate_spec("code", {"tests": "assert f(1) ==", "entry_point": "f"})


def test_plan_takes_from_the_program_only_its_entry_point_and_the_names_nothing_else_defines() -> None:
    from posttrain.platform.verifiers.kinds.code import prompt_helpers

    tests = "import math\nassert abs(f(1)) == 2\nassert Box(1).n == 1\nfor i in range(2):\n    assert helper(i) == i\n"
    prelude = 'from typing import List\n\ndef helper(x):\n    return x\n\ndef f(x: int) -> int:\n    """Add one."""\n'
    plan = build_plan(tests, None, prelude, "f")
    assert plan.program_names == (
        "Box",
        "f",
    )  # not abs, range, math, helper: builtins, the tests' import, the prompt's helper
    # The prompt's helpers run first in the tests, without the entry point's stub; a prelude that stops inside
    # a definition keeps its longest start that parses.
    assert (
        plan.tests_source.index("def helper") < plan.tests_source.index("abs(f(1))")
        and "def f" not in plan.tests_source
    )
    assert prompt_helpers("import math\nK = 2\ndef f(x):\n", "f") == "import math\nK = 2\n"


def test_a_source_file_is_graded_whole_fences_in_its_docstrings_and_all(
    service: VerifierService, ctx: VerifyContext
) -> None:
    """A code_repair episode's final module is a file, not a chat reply: a ``` in a docstring is code."""
    from posttrain.platform.tasks.episodes import as_file

    module = 'def f(x):\n    """Add one:\n\n    ```python\n    f(1) == 2\n    ```\n    """\n    return x + 1\n'
    reply = code_task(THREE_TESTS)
    assert not service.verify(reply, module, context=ctx).passed  # read as a reply, only the fenced line would run
    assert service.verify(as_file(reply), module, context=ctx).passed


class _Churn:
    """Garbage in a cycle whose finalizer is Python code: a collection runs it, and the interpreter may
    switch threads there, inside whatever C code triggered the collection."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        time.sleep(0)


def parse_from_threads(parser, seconds: float) -> list[str]:  # type: ignore[no-untyped-def]
    """Four threads at different stack depths parsing one module while collections run often; the
    SystemErrors they met (each thread stops at its first)."""
    source = "\n".join(
        f"def f{i}(x):\n    return [a + b * {i} for a in range(x) for b in (1, 2)] if x else {{'k': (x, {i})}}"
        for i in range(40)
    )
    errors: list[str] = []
    stop = time.monotonic() + seconds

    def work(depth: int) -> None:
        if depth:
            return work(depth - 1)
        while time.monotonic() < stop and not errors:
            for _ in range(3):
                _Churn()
            try:
                parser(source)
            except SystemError as error:
                errors.append(str(error))
                return
        return

    threshold = gc.get_threshold()
    gc.set_threshold(50, 1, 1)
    try:
        threads = [threading.Thread(target=work, args=(7 * d,)) for d in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        gc.set_threshold(*threshold)
    return errors


def test_checks_in_threads_parse_without_cpythons_ast_race() -> None:
    # CI met "SystemError: AST constructor recursion depth mismatch" in batches of code checks (cpython
    # gh-106905, fixed in 3.11.8 and 3.12.2), once from ast.parse and once from ast.literal_eval (a
    # grader's report); importing posttrain makes every ast.parse of the process take turns
    affected = sys.version_info < (3, 11, 8) or (3, 12) <= sys.version_info < (3, 12, 2)
    if affected:  # the peer: the same load on the bare constructor meets the race here (5 of 5 runs within 2 s)
        bare = lambda source: compile(source, "<bare>", "exec", ast.PyCF_ONLY_AST)  # noqa: E731
        assert parse_from_threads(bare, 10), "the bare constructor did not meet the race: the load no longer shows it"
    report = repr(("nonce", 3, [0, 1], {2: "AssertionError"}, {"nested": [(1, 2.5), {"k": None}] * 20}))
    assert parse_from_threads(lambda source: (ast.parse(source), ast.literal_eval(report)), 3) == []


def test_setup_failure_keeps_the_tests_already_passed(service: VerifierService, ctx: VerifyContext) -> None:
    tests = "assert f(1) == 2\nvalue = f('boom')\nassert f(2) == 3\n"
    verdict = service.verify(code_task(tests), "def f(x):\n    return x + 1\n", context=ctx)
    assert verdict.score == pytest.approx(0.5) and not verdict.passed, verdict
    assert "stopped early" in verdict.details and "TypeError" in verdict.details


# ----------------------------------------------------------------------------- HumanEval


def test_all_humaneval_canonical_solutions_pass(
    service: VerifierService, ctx: VerifyContext, humaneval: list[TaskSpec]
) -> None:
    # The peer: as many checks of a three-line solution, through the same service and pool.
    started = time.monotonic()
    trivial = service.verify_batch([code_task(THREE_TESTS)] * len(humaneval), ["def f(x):\n    return x + 1\n"] * len(humaneval),
                                   context=ctx)  # fmt: skip
    peer = time.monotonic() - started
    assert all(v.passed for v in trivial)
    started = time.monotonic()
    verdicts = service.verify_batch(humaneval, [t.reference or "" for t in humaneval], context=ctx)
    took = time.monotonic() - started
    failed = [(t.task_id, v.details, v.infra_error) for t, v in zip(humaneval, verdicts) if not v.passed]
    assert not failed, failed
    assert all(v.score == 1 for v in verdicts)
    # HumanEval's tests cost 1.2-2.1x the peer's (measured quiet and with every core busy): no
    # per-check overhead (a fresh sandbox, a wait for a free one) hides behind the batch.
    assert took < 6 * peer, (took, peer)


@pytest.mark.slow
def test_broken_humaneval_solutions_fail_within_the_limit(
    service: VerifierService, ctx: VerifyContext, humaneval: list[TaskSpec]
) -> None:
    """Every problem's body replaced by `return None`, and every fourth by an infinite loop (2 s limit; each
    loop holds a sandbox for the whole limit, so all 164 would cost minutes of the suite), run concurrently:
    each one fails with a score below 1, none is an infra error, none hangs."""
    loop_limit = 2.0
    looping = list(humaneval)[::4]
    tasks = list(humaneval) + [with_timeout(t, loop_limit) for t in looping]
    completions = ["    return None\n"] * len(humaneval) + ["    while True:\n        pass\n"] * len(looping)
    started = time.monotonic()
    verdicts = service.verify_batch(tasks, completions, context=ctx)
    wall = time.monotonic() - started
    wrong = [
        (t.task_id, c[:20], v.details) for t, c, v in zip(tasks, completions, verdicts) if v.passed or v.is_infra_error
    ]
    assert not wrong, wrong
    none_verdicts, loop_verdicts = verdicts[: len(humaneval)], verdicts[len(humaneval) :]
    assert all(v.score < 1 for v in none_verdicts)
    assert all(v.score == 0 and "did not finish within 2 s" in v.details for v in loop_verdicts), [
        v.details for v in loop_verdicts if v.score
    ]
    # The run's own time (not the wait for a free sandbox) stays near the limit: the limit, the
    # pool's kill grace (0.5 s) and slack for a loaded 2-core machine.
    slowest = max(v.breakdown["run_ms"] for v in loop_verdicts)
    assert slowest < (loop_limit + 4) * 1000, slowest
    # 41 loops of 2 s on POOL_SIZE sandboxes, plus the rest: a minute or two at most, never an hour.
    assert wall < len(looping) * loop_limit / POOL_SIZE + 120, wall


# ----------------------------------------------------------------------------- procedural code domains


def test_procedural_code_domains_references_pass_and_wrong_answers_fail(
    service: VerifierService, ctx: VerifyContext
) -> None:
    names = [d.name for d in list_domains(family="code")]
    assert len(names) == 21, names
    tasks = [
        task for name in names for difficulty in (1, 3, 5) for task in generate(name, 2, seed=7, difficulty=difficulty)
    ]
    references = [t.reference or "" for t in tasks]
    wrong_none = [f"def {t.verifier.spec['entry_point']}(*args):\n    return None\n" for t in tasks]
    wrong_raise = [f"def {t.verifier.spec['entry_point']}(*args):\n    raise NotImplementedError\n" for t in tasks]
    verdicts = service.verify_batch(tasks * 3, references + wrong_none + wrong_raise, context=ctx)
    n = len(tasks)
    assert all(v.passed and v.score == 1 for v in verdicts[:n]), [v.details for v in verdicts[:n] if not v.passed]
    for verdict in verdicts[n:]:
        assert not verdict.passed and not verdict.is_infra_error and verdict.score < 1, verdict
    assert all("NotImplementedError" in v.details for v in verdicts[2 * n :])


# ----------------------------------------------------------------------------- bad completions


def test_exit_calls_cannot_make_a_wrong_solution_pass(service: VerifierService, ctx: VerifyContext) -> None:
    task = code_task(THREE_TESTS)
    for completion in (
        "import sys\ndef f(x):\n    return -5\nsys.exit(0)\n",  # exit before the tests run
        "import sys\nsys.exit(0)\n",
        "def f(x):\n    raise SystemExit(0)\n",  # exit from inside a test
        "import os\ndef f(x):\n    return -5\nos._exit(0)\n",  # kill the interpreter: status 0
        "import os\ndef f(x):\n    os._exit(0)\n",
        "import atexit, os\natexit.register(lambda: os._exit(0))\ndef f(x):\n    return -5\n",
    ):
        verdict = service.verify(task, completion, context=ctx)
        assert not verdict.passed and verdict.score == 0 and not verdict.is_infra_error, (completion, verdict)
    # A right solution that exits at import still gets its tests run (and passes).
    ok = service.verify(task, "import sys\ndef f(x):\n    return x + 1\nsys.exit(0)\n", context=ctx)
    assert ok.passed and "sys.exit(0)" in ok.details, ok
    died = service.verify(task, "import os\ndef f(x):\n    os._exit(0)\n", context=ctx)
    assert_scored_zero(died, "ended its interpreter")


def test_forged_reports_do_not_count(service: VerifierService, ctx: VerifyContext) -> None:
    forged = (
        "def f(x):\n    return -5\nprint(repr(('0' * 32, 3, [0, 1, 2], {}, {})))\n('0' * 32, 3, [0, 1, 2], {}, {})\n"
    )
    verdict = service.verify(code_task(THREE_TESTS), forged, context=ctx)
    assert verdict.score == 0 and not verdict.passed, verdict


def test_hanging_code_scores_zero_within_the_limit(service: VerifierService, ctx: VerifyContext) -> None:
    cases = {
        "while True:\n    pass\n": "did not finish within 2 s",  # at import
        "def f(x):\n    while True:\n        pass\n": "did not finish within 2 s",  # in a test
        # Ignores the in-process alarm: the host kills it after the grace period.
        "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\ndef f(x):\n    while True:\n        pass\n": "did not finish",
        "import time\ndef f(x):\n    time.sleep(3600)\n": "did not finish within 2 s",
    }
    # The peer: a right solution that takes 1.5 s of the 2 s limit (three tests of 0.5 s) and passes.
    started = time.monotonic()
    slow_but_right = service.verify(code_task(THREE_TESTS, timeout_s=2),
                                    "import time\ndef f(x):\n    time.sleep(0.5)\n    return x + 1\n", context=ctx)  # fmt: skip
    peer = time.monotonic() - started
    assert slow_but_right.passed, slow_but_right
    for completion, reason in cases.items():
        started = time.monotonic()
        verdict = service.verify(code_task(THREE_TESTS, timeout_s=2), completion, context=ctx)
        took = time.monotonic() - started
        assert_scored_zero(verdict, reason)
        # Cut off at the limit (plus the 0.5 s kill grace for the one ignoring the alarm): measured
        # 2.0-2.5 s against the peer's 1.5 s, quiet or with every core busy.
        assert took < 3 * peer, (completion, took, peer)


def test_crashing_and_flooding_code(service: VerifierService, ctx: VerifyContext) -> None:
    task = code_task(THREE_TESTS)
    assert_scored_zero(service.verify(task, "def f(x:\n    return x\n", context=ctx), "does not compile")
    assert_scored_zero(service.verify(task, "def f(x):\n    return x + 1\nundefined_name\n", context=ctx), "NameError")
    assert_scored_zero(service.verify(task, "x = 'a' * (4 << 30)\n", context=ctx), "MemoryError")
    recursion = service.verify(task, "def f(x):\n    return f(x)\n", context=ctx)
    assert recursion.score == 0 and "RecursionError" in recursion.details, recursion
    # Killing the sandbox's init from inside does nothing; killing its own interpreter is a 0.
    assert_scored_zero(
        service.verify(task, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", context=ctx),
        "ended its interpreter",
    )
    survived = service.verify(
        task,
        "import os, signal\ntry:\n    os.kill(1, signal.SIGKILL)\nexcept OSError:\n    pass\ndef f(x):\n    return x + 1\n",
        context=ctx,
    )
    assert survived.passed, survived
    # Megabytes of output do not hide the result.
    loud = service.verify(task, "def f(x):\n    print('y' * 10_000_000)\n    return x + 1\n", context=ctx)
    assert loud.passed, loud


def test_huge_completions(service: VerifierService, ctx: VerifyContext) -> None:
    task = code_task(THREE_TESTS)
    megabytes = service.verify(task, "def f(x):\n    return x + 1\n" + "#" * 3_000_000, context=ctx)
    assert_scored_zero(megabytes, "over the limit")
    # Under the service's limit, a big program still runs (and through the direct API too).
    big = "def f(x):\n    return x + 1\n" + "DATA = " + repr("z" * 200_000) + "\n"
    assert service.verify(task, big, context=ctx).passed
    spec = CodeTestsSpec(tests=THREE_TESTS, entry_point="f")
    pool = ctx.sandbox_pool
    assert pool is not None
    direct = run_code_tests(spec, "def f(x):\n    return x + 1\n# " + "x" * 5_000_000, pool)
    assert_scored_zero(direct, "over the limit")


def test_the_pool_stays_healthy(service: VerifierService, ctx: VerifyContext, pool: SandboxPool) -> None:
    """After all the abuse above, every sandbox is back, warm, with no infrastructure failure."""
    assert pool.wait_ready(timeout=30)
    status = pool.status()
    assert status.ready == POOL_SIZE and status.infra_failures == 0, status
    assert service.verify(code_task(THREE_TESTS), "def f(x):\n    return x + 1\n", context=ctx).passed


# ----------------------------------------------------------------------------- the shared pool


def test_shared_pool_from_settings_and_an_installed_pool(
    service: VerifierService, pool: SandboxPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    data_dir = reachable_dir()
    monkeypatch.setenv("POSTTRAIN_DATA_DIR", str(data_dir))
    monkeypatch.setenv("POSTTRAIN_SANDBOX__POOL_SIZE", "1")
    get_settings.cache_clear()
    close_shared_pool()
    try:
        task = code_task(THREE_TESTS)
        verdict = service.verify(task, "def f(x):\n    return x + 1\n")  # no context: the shared pool
        assert verdict.passed, verdict
        started = shared_pool()
        assert started.config.pool_size == 1 and started.directory.is_relative_to(data_dir)
        assert shared_pool() is started  # started once
        # A training run installs its own pool; the one from the settings is closed.
        assert set_shared_pool(pool) is None
        assert shared_pool() is pool and not started.directory.exists()
        assert service.verify(task, "def f(x):\n    return x + 1\n").passed
        assert set_shared_pool(None) is pool  # the owner of `pool` keeps it open
        assert pool.status().ready > 0
    finally:
        close_shared_pool()
        get_settings.cache_clear()
        shutil.rmtree(data_dir, ignore_errors=True)


# ----------------------------------------------------------------------------- tool_use


def tool_task(spec: dict[str, object]) -> TaskSpec:
    return TaskSpec(
        domain="test.tools", prompt="write the answer to out.txt", verifier={"kind": "tool_use", "spec": spec}
    )


def scripted(*replies: str):  # type: ignore[no-untyped-def]
    """A model that answers with the given replies in turn (tool calls as Hermes text)."""
    queue = list(replies)
    return lambda messages, tools: queue.pop(0)


def call(name: str, **arguments: object) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def test_tool_use_checks_run_in_the_episode_sandbox(service: VerifierService, pool: SandboxPool) -> None:
    spec = {
        "checks": [
            {"check": "file_contains", "path": "out.txt", "expected": "answer: 42"},
            {"check": "command_output", "command": "python3 solve.py 6 7", "expected": "42"},
            {"check": "answer_contains", "expected": "42"},
        ]
    }
    model = scripted(
        call("write_file", path="out.txt", content="the answer: 42\n"),
        call("write_file", path="solve.py", content="import sys\nprint(int(sys.argv[1]) * int(sys.argv[2]))\n"),
        "Done: 42.",
    )
    with pool.acquire() as sandbox:
        episode = run_agent(model, sandbox, [{"role": "user", "content": "go"}])
        assert episode.stop_reason == "answer"
        verdict = service.verify(tool_task(spec), episode.answer or "", context=VerifyContext(sandbox=sandbox))
        assert verdict.passed and verdict.score == 1, verdict
        assert verdict.kind == "tool_use" and len(verdict.breakdown["checks"]) == 3

        wrong = {
            "checks": [
                {"check": "file_contains", "path": "out.txt", "expected": "answer: 43"},
                {"check": "file_contains", "path": "missing.txt", "expected": "x"},
                {"check": "command_output", "command": "python3 solve.py 6 8", "expected": "42"},
                {"check": "command_output", "command": "exit 3", "expected": ""},
                {"check": "file_contains", "path": "out.txt", "expected": r"answer: \d+$", "match": "regex"},
            ]
        }
        partial = service.verify(tool_task(wrong), "", context=VerifyContext(sandbox=sandbox))
        assert partial.score == pytest.approx(1 / 5) and not partial.passed and not partial.is_infra_error, partial
        found = [c["found"] for c in partial.breakdown["checks"]]
        assert "does not contains 'answer: 43'" in found[0] and "missing.txt: cannot be read" in found[1]
        assert "printed '48'" in found[2] and "exited with 3" in found[3]
        # A single check can be given inline.
        inline = {"check": "command_output", "command": "cat out.txt", "expected": "the answer: 42"}
        assert service.verify(tool_task(inline), "", context=VerifyContext(sandbox=sandbox)).passed


def test_tool_use_checks_ignore_what_the_agent_left_running(service: VerifierService, pool: SandboxPool) -> None:
    """The agent patches its interpreter and leaves a process that would rewrite the file; the
    checks run after both are gone."""
    spec = {
        "checks": [
            {"check": "command_output", "command": "cat out.txt", "expected": "right"},
            {"check": "file_contains", "path": "out.txt", "expected": "right", "match": "equals"},
        ]
    }
    with pool.acquire() as sandbox:
        assert sandbox.write_file("out.txt", "right").ok
        sneaky = (
            "import subprocess, os\n"
            "subprocess.Popen(['/bin/bash', '-c', 'sleep 1; echo -n forged > out.txt'], start_new_session=True)\n"
            "os.environ['PATH'] = '/nonexistent'\n"
        )
        assert sandbox.run_python(sneaky).ok
        assert sandbox.pid is not None
        box = psutil.Process(sandbox.pid)

        def writers() -> list[psutil.Process]:
            found = []
            for proc in box.children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    if proc.name() in ("bash", "sleep") and proc.status() != psutil.STATUS_ZOMBIE:
                        found.append(proc)
            return found

        wait_for(writers, timeout=10, interval=0.01, message="the background writer to start")
        verdict = service.verify(tool_task(spec), "", context=VerifyContext(sandbox=sandbox))
        assert verdict.passed, verdict
        assert writers() == [], "the background writer outlived the checks"  # it can never forge the file
        assert sandbox.read_file("out.txt").value == "right"


def test_tool_use_without_a_sandbox_is_an_infra_error(service: VerifierService) -> None:
    verdict = service.verify(tool_task({"check": "file_contains", "path": "a", "expected": "b"}), "")
    assert verdict.is_infra_error and "VerifyContext(sandbox=" in verdict.infra_error
    # Checks of the answer alone need no sandbox.
    assert service.verify(tool_task({"check": "answer_contains", "expected": "42"}), "it is 42").passed
    with pytest.raises(VerifierSpecError, match="check"):
        validate_spec("tool_use", {"check": "file_exists_somewhere", "path": "a"})


def test_the_gate_serves_waiters_in_order() -> None:
    import threading

    from posttrain.platform.verifiers.kinds.code import _FairGate

    gate = _FairGate(1)
    assert gate.acquire(timeout=1)
    assert not gate.acquire(timeout=0.05)  # full: the wait runs out
    order: list[int] = []

    def waiter(i: int) -> None:
        assert gate.acquire(timeout=10)
        order.append(i)
        gate.release()

    threads = []
    for i in range(5):
        thread = threading.Thread(target=waiter, args=(i,))
        thread.start()
        threads.append(thread)
        # queue them in a known order: the next starts once this one is in the queue
        wait_for(lambda: len(gate._waiters) == i + 1, timeout=10, interval=0.005, message=f"waiter {i} queued")
    gate.release()
    assert gate.acquire(timeout=10)  # a newcomer waits behind the queue, not ahead of it
    order.append(99)
    gate.release()
    for thread in threads:
        thread.join(10)
        assert not thread.is_alive(), "a waiter never got its turn"
    assert order == [0, 1, 2, 3, 4, 99]


def test_the_grader_is_sent_along_when_the_sandbox_has_none(pool: SandboxPool) -> None:
    """A sandbox whose zygote did not preload the grader still grades: the first call says so, and the
    verifier sends the grader with the program (source or bytecode)."""
    from posttrain.platform.verifiers.kinds.code import _parse_report, _parse_start, solution_source, start_program

    spec = CodeTestsSpec(tests=THREE_TESTS, entry_point="f")
    plan = build_plan(spec.tests, None)
    for bytecode in (False, True):
        with pool.acquire() as sandbox:
            assert sandbox.run_python("import sys\ndel sys.modules['posttrain_graded']").ok
            source = solution_source(spec, "def f(x):\n    return x + 1 if x > 0 else 7\n")
            assert _parse_start(sandbox.run_python(start_program(source)).value) == ("missing", None)
            assert _parse_start(sandbox.run_python(start_program(source, ship=True, bytecode=bytecode)).value) == (
                "started",
                None,
            )
            report = _parse_report(sandbox.run_python(plan.program("n" * 32, bytecode=bytecode)).value, "n" * 32, 3)
            assert report is not None and report[0] == [0, 1] and list(report[1]) == [2], report
