"""Code tasks: unit tests run in a warm sandbox, scored by the fraction of tests that pass.

A task's program is ``prelude + completion's code``; its tests are ``tests + test_call``
(``assemble_program`` joins them for reading). The verifier checks one completion in two calls to one
sandbox from a pool (no interpreter is started per check: the pool's interpreters are already
running), with the grader of platform/sandbox/graded.py:

* the first call forks, from the sandbox's fresh interpreter, a child that runs ``prelude + code``
  and nothing else: it has no channel to the host, its output goes nowhere, and it was forked before
  the tests were sent, so nothing in its memory says what they expect; a ``sys.exit()`` at its top
  level ends only that part, the tests still run;
* the second call runs the tests in the interpreter itself, which the child cannot write into, with
  the program's names as proxies: a call of the program's function is a request to the child, its
  result comes back as plain data (see graded.py for what crosses and how a test compares);
* each test is counted separately: every top-level statement of ``tests`` that holds an ``assert``
  is one test, and so is every such statement of the function ``test_call`` calls (HumanEval's
  ``check(candidate)``), rewritten with ``ast`` so that each one records its own pass or failure; a
  ``test_call`` that is not such a call is one test itself; tests without any assert count as one;
* the interpreter reports the raw outcomes (which tests passed, which failed and why) as the call's
  value, and the score is computed here, on the host.

Score: passed tests / tests. Code that does not compile or raises at its top level, times out, runs
out of memory, or ends its process before the tests ran scores 0 with the reason; code that ends its
process during a test fails that test and every later one. A sandbox that fails (not the code's
doing) gives an ``infra_error`` verdict. Example::

    from posttrain.platform.verifiers import TaskSpec, VerifyContext, verify

    task = TaskSpec(domain="demo", prompt="write add(a, b)", verifier={"kind": "code", "spec": {
        "tests": "assert add(1, 2) == 3\\nassert add(-1, 1) == 0\\n", "entry_point": "add"}})
    verify(task, "def add(a, b):\\n    return a + b\\n")            # score 1.0, passed
    verify(task, "def add(a, b):\\n    return 3\\n")                 # score 0.5, details name the failing test
    verify(task, code, context=VerifyContext(sandbox_pool=pool))   # on your own SandboxPool

Trust: the graded code cannot change how its tests are counted. It can patch its own builtins, exit,
print anything, rewrite files, kill or stop the interpreter, fork, or return objects whose ``__eq__``
says yes to everything: at most it loses its own tests. The tests compare strictly by value: a result
is compared as the builtin value it is (a ``bool``, ``int``, ``str``, list, dict...; a subclass of one,
such as ``Counter``, as that builtin value), with Python's own ``==`` (so ``1 == 1.0 == True`` as in
Python), and an object of the code's own classes equals only itself, so no method of the graded code
ever decides a comparison. What it cannot be stopped from is what any program may do: compute its
answers, or read what a test hands it as arguments.

What the tests see of the program is its entry point and the names they read that nothing else defines (a
class of the program's they construct); never anything else it binds. Builtins are the grading
interpreter's own, and the prompt's helpers (HumanEval's ``encode_cyclic``, its imports) run from a clean
copy of the prelude beside the tests (:func:`prompt_helpers`), so ``abs = lambda x: 0``, ``def range(*a)``
or a redefined helper in the completion changes nothing the tests read. A standard-library module the tests
read without importing it (``math.isclose`` with no ``import math``) is the grader's own import, never the
program's ``math``. A ``StopIteration`` raised by the program's code answering a call, an item, an attribute,
``len``, ``bool``, ``str`` or any other request but ``next`` is an error of the code, never the end of the
caller's loop.
"""

from __future__ import annotations

import ast
import builtins
import collections
import functools
import importlib.util
import marshal
import re
import secrets
import subprocess
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator

from posttrain.platform.sandbox import CallStatus, PoolClosedError, PoolExhaustedError, SandboxPool, ToolResult, graded
from posttrain.platform.sandbox._server import GRADER_MODULE
from posttrain.platform.verifiers.models import TaskSpec, Verdict
from posttrain.platform.verifiers.registry import BaseSpec, VerifierKind, VerifyContext
from posttrain.platform.verifiers.sandboxes import shared_pool

DEFAULT_TIMEOUT_S = 15.0
ACQUIRE_TIMEOUT_S = 60.0
"""Longest wait for a free sandbox (the pool's ``acquire_timeout_s`` when that is shorter)."""
WAIT_MARGIN_S = ACQUIRE_TIMEOUT_S + 30.0
"""How long past the time limit a caller waits: a sandbox to be free, a runaway program killed."""
MAX_PROGRAM_CHARS = 4 * 1024 * 1024
MAX_FAILURES_REPORTED = 5
_MESSAGE_CHARS = 400


class CodeTestsSpec(BaseSpec):
    """A Python program is ``prelude + completion's code + tests + test_call``; it passes
    when every test passes (see the module's docstring for what a test is).
    ``entry_point``: the function the tests call."""

    language: Literal["python"] = "python"
    tests: str = Field(min_length=1)
    entry_point: str | None = None
    prelude: str = ""
    test_call: str | None = None
    completion: Literal["reply", "file"] = "reply"
    """What a completion is: a chat ``reply`` (its fenced code blocks are the code, else the whole text) or
    a source ``file`` graded whole, fences and all (the module a code_repair episode left)."""

    _pool: SandboxPool | None = PrivateAttr(default=None)  # lent by the caller's VerifyContext

    @field_validator("tests", "test_call")
    @classmethod
    def _must_parse(cls, value: str | None) -> str | None:
        problem = None if value is None else _syntax_problem(value)
        if problem is not None:
            raise ValueError(f"is not valid Python ({problem}); fix the task's test code")
        return value


@functools.lru_cache(maxsize=4096)
def _syntax_problem(source: str) -> str | None:
    """Why ``source`` does not parse, or None (cached: a task's tests are checked on every verify)."""
    try:
        ast.parse(source)
    except SyntaxError as error:
        return f"{error.msg}, line {error.lineno}"
    return None


_FENCE = re.compile(r"```(?:python|py|python3)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(spec: CodeTestsSpec, completion: str) -> str:
    """The code in a completion: a ``file`` whole; a ``reply``'s fenced blocks joined, or the text itself."""
    if spec.completion == "file":
        return completion
    blocks = _FENCE.findall(completion)
    return "\n\n".join(blocks) if blocks else completion


def solution_source(spec: CodeTestsSpec, completion: str) -> str:
    """The part of the program before the tests: the prelude, then the completion's code."""
    return "\n".join([spec.prelude.rstrip("\n") if spec.prelude else spec.prelude, extract_code(spec, completion)])


def assemble_program(spec: CodeTestsSpec, completion: str) -> str:
    """The whole program to run for ``completion``: prelude, code, tests, then the test call."""
    parts = [spec.prelude, extract_code(spec, completion), "", spec.tests]
    if spec.test_call:
        parts.append(spec.test_call)
    return "\n".join(part.rstrip("\n") if part else part for part in parts) + "\n"


# --------------------------------------------------------------------------- the harness


@functools.lru_cache(maxsize=1)
def _grader_source() -> str:
    """The in-sandbox grader (platform/sandbox/graded.py), shipped as text into each check's sandbox."""
    return Path(graded.__file__).read_text()


@functools.lru_cache(maxsize=1)
def _grader_bytecode() -> bytes:
    return marshal.dumps(compile(_grader_source(), "<grader>", "exec"))


def _shipped(source: str, bytecode: bytes | None) -> str:
    """An expression that yields ``source``'s code in the sandbox: its marshalled bytecode (when the
    sandbox's interpreter reads ours; bytes.fromhex needs no import there), else the source itself."""
    if bytecode is not None:
        return f"__import__('marshal').loads(bytes.fromhex('{bytecode.hex()}'))"
    return f"compile({source!r}, '<grader>', 'exec')"


def start_program(solution: str, *, ship: bool = False, bytecode: bool = False) -> str:
    """The first call of a check: start the graded program in a child of the fresh interpreter, with the
    grader the sandbox preloaded (``("missing", None)`` when it has none), or with ``ship`` the grader
    sent along. Nothing of the tests is in it."""
    if not ship:
        return (
            f"__pt_g = __import__('sys').modules.get({GRADER_MODULE!r})\n"
            f"('missing', None) if __pt_g is None else __pt_g.start({solution!r})\n"
        )
    code = _shipped(_grader_source(), _grader_bytecode() if bytecode else None)
    return (
        f"__pt_g = type(__import__('sys'))({GRADER_MODULE!r})\nexec({code}, __pt_g.__dict__)\n"
        f"__pt_g.start({solution!r})\n"
    )


@dataclass(frozen=True)
class TestPlan:
    """The tests of one spec, rewritten so that each counted test records its own outcome; one label per
    counted test (the test's code, shortened, for the details); and the names the tests take from the graded
    program (its entry point, and what the tests read that neither they, the prelude's helpers nor the
    builtins define)."""

    tests_source: str
    labels: tuple[str, ...]
    program_names: tuple[str, ...] = ()
    entry_point: str | None = None

    @functools.cached_property
    def harness_bytecode(self) -> bytes:
        """The tests compiled here once (marshal format of this interpreter)."""
        return marshal.dumps(compile(self.tests_source, "<tests>", "exec"))

    def program(self, nonce: str, *, bytecode: bool = False) -> str:
        """The second call of a check: run the tests against the child started by :func:`start_program`.
        With ``bytecode`` (the sandbox's interpreter reads this one's marshal format) the tests travel
        compiled; else as source, compiled in the sandbox's parent interpreter."""
        tests = (
            f"__import__('marshal').loads(bytes.fromhex('{self.harness_bytecode.hex()}'))"
            if bytecode
            else repr(self.tests_source)
        )
        return (
            f"__pt_g.run({tests}, {nonce!r}, {len(self.labels)}, {MAX_FAILURES_REPORTED}, "
            f"{list(self.program_names)!r}, {self.entry_point!r})\n"
        )


@functools.lru_cache(maxsize=16)
def reads_our_bytecode(python_executable: str) -> bool:
    """Whether ``python_executable`` loads this interpreter's marshalled code (same magic number)."""
    probe = "import importlib.util; print(importlib.util.MAGIC_NUMBER.hex())"
    try:
        out = subprocess.run(
            [python_executable, "-I", "-c", probe], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return out.strip() == importlib.util.MAGIC_NUMBER.hex()


class _AssertFinder(ast.NodeVisitor):
    """Does a statement hold an ``assert`` that tests something (not ``assert True``), outside
    nested functions and classes?"""

    def __init__(self) -> None:
        self.found = False

    def visit_Assert(self, node: ast.Assert) -> None:
        if not isinstance(node.test, ast.Constant):
            self.found = True

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        return

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        return

    def visit_Lambda(self, node: ast.Lambda) -> None:
        return


def _is_test(stmt: ast.stmt) -> bool:
    finder = _AssertFinder()
    finder.visit(stmt)
    return finder.found


def _label(stmt: ast.stmt) -> str:
    text = ast.unparse(stmt)
    first, _, rest = text.partition("\n")
    if len(first) > 160:
        first = first[:157] + "..."
    return first + (" ..." if rest else "")


def _counted(stmt: ast.stmt, index: int) -> ast.Try:
    """``try: <stmt> except __pt_caught as __pt_e: __pt_failed(i, __pt_e) else: __pt_passed(i)``."""
    handler = ast.ExceptHandler(
        type=ast.Name("__pt_caught", ast.Load()),
        name="__pt_e",
        body=[
            ast.Expr(
                ast.Call(ast.Name("__pt_failed", ast.Load()), [ast.Constant(index), ast.Name("__pt_e", ast.Load())], [])
            )
        ],
    )
    passed = ast.Expr(ast.Call(ast.Name("__pt_passed", ast.Load()), [ast.Constant(index)], []))
    return ast.Try(body=[stmt], handlers=[handler], orelse=[passed], finalbody=[])


def _count_statements(body: list[ast.stmt], labels: list[str]) -> list[ast.stmt]:
    out: list[ast.stmt] = []
    for stmt in body:
        if _is_test(stmt):
            out.append(_counted(stmt, len(labels)))
            labels.append(_label(stmt))
        else:
            out.append(stmt)
    return out


def _called_function(test_call: ast.Module) -> str | None:
    """``name`` when the test call is the single statement ``name(...)``."""
    if len(test_call.body) == 1 and isinstance(test_call.body[0], ast.Expr):
        call = test_call.body[0].value
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
            return call.func.id
    return None


@functools.lru_cache(maxsize=4096)
def prompt_helpers(prelude: str, entry_point: str | None) -> str:
    """The statements of a task's prompt code that its tests may read (imports, helper functions, constants),
    without the entry point's own definition, as source. The tests run beside this clean copy, never beside the
    graded program's names, which may redefine any of them. A prelude that ends inside a definition (the
    signature a completion goes on from) keeps its longest start of whole lines that parses."""
    lines = prelude.splitlines(keepends=True)
    for end in range(len(lines), 0, -1):
        try:
            module = ast.parse("".join(lines[:end]))
        except SyntaxError:
            continue
        kept = [
            s
            for s in module.body
            if not _is_future_import(s)
            and not (isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and s.name == entry_point)
        ]
        return ast.unparse(ast.Module(body=kept, type_ignores=[])) + "\n" if kept else ""
    return ""


def _is_future_import(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.ImportFrom) and stmt.module == "__future__"


def _names_read_and_bound(*trees: ast.AST) -> tuple[set[str], set[str]]:
    """The names the code reads, and every name it binds anywhere (any scope, any kind of binding)."""
    read: set[str] = set()
    bound: set[str] = set()
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                bound.add(node.name)
            elif isinstance(node, ast.arg):
                bound.add(node.arg)
            elif isinstance(node, ast.alias):
                bound.add((node.asname or node.name).split(".")[0])
            elif isinstance(node, (ast.ExceptHandler, ast.MatchAs, ast.MatchStar)) and node.name:
                bound.add(node.name)
            elif isinstance(node, ast.MatchMapping) and node.rest:
                bound.add(node.rest)
    return read, bound


def _program_names(entry_point: str | None, *trees: ast.AST) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What the tests take from the graded program: the entry point, and each name they read that nothing
    else defines (a class or helper of the program's that the tests use); and the standard-library modules
    they read without importing (``math.isclose`` with no ``import math``), which the plan imports for them.
    Never a builtin's or a standard-library module's name, nor one the tests or the prompt's helpers bind:
    those come from the clean copies, so no name the program binds can stand in for them."""
    read, bound = _names_read_and_bound(*trees)
    free = {n for n in read - bound if not n.startswith("__") and not hasattr(builtins, n) and n != entry_point}
    modules = free & sys.stdlib_module_names
    return tuple(sorted(free - modules | ({entry_point} if entry_point else set()))), tuple(sorted(modules))


def _imports(modules: tuple[str, ...]) -> list[ast.stmt]:
    """``try: import m`` ``except ImportError: pass`` for each module: one the sandbox's Python lacks stays
    undefined (the tests that read it fail), never the program's."""
    return [
        ast.Try(
            body=[ast.Import([ast.alias(m)])],
            handlers=[ast.ExceptHandler(ast.Name("ImportError", ast.Load()), None, [ast.Pass()])],
            orelse=[],
            finalbody=[],
        )
        for m in modules
    ]


@functools.lru_cache(maxsize=4096)
def build_plan(tests: str, test_call: str | None, prelude: str = "", entry_point: str | None = None) -> TestPlan:
    """Rewrite ``tests`` (and ``test_call``) so that each test records its own outcome, after the prompt's
    helpers (:func:`prompt_helpers` of ``prelude``), and find the names the tests take from the program."""
    module = ast.parse(tests)
    module.body = [s for s in module.body if not _is_future_import(s)]
    helpers = ast.parse(prompt_helpers(prelude, entry_point)) if prelude else ast.Module(body=[], type_ignores=[])
    call_module = ast.parse(test_call) if test_call else None
    names, modules = _program_names(entry_point, module, helpers, *([call_module] if call_module else []))
    target = _called_function(call_module) if call_module is not None else None
    definitions = [
        s for s in module.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == target
    ]
    # The last definition of the target is the one the call reaches; rewrite it when it asserts.
    rewritten = definitions[-1] if definitions and any(map(_is_test, definitions[-1].body)) else None
    labels: list[str] = []
    body: list[ast.stmt] = []
    for stmt in module.body:
        if stmt is rewritten:
            stmt.body = _count_statements(stmt.body, labels)
            body.append(stmt)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            body.append(stmt)
        else:
            body.extend(_count_statements([stmt], labels))
    if call_module is not None:
        if rewritten is not None:
            body.extend(call_module.body)
        else:
            call: list[ast.stmt] = list(call_module.body)
            if len(call) == 1:
                body.append(_counted(call[0], len(labels)))
            else:
                body.append(_counted(ast.If(ast.Constant(True), call, []), len(labels)))
            labels.append(_label(call[0]) if len(call) == 1 else "the test call")
    if not labels:  # no assert anywhere: the whole test code is one test
        labels.append("the test code")
        body = [_counted(ast.If(ast.Constant(True), body or [ast.Pass()], []), 0)]
    guarded = ast.Try(
        body=[*_imports(modules), *helpers.body, *body],
        handlers=[
            ast.ExceptHandler(
                type=ast.Name("__pt_caught", ast.Load()),
                name="__pt_e",
                body=[ast.parse('__pt_state["abort"] = __pt_why(__pt_e)').body[0]],
            )
        ],
        orelse=[],
        finalbody=[],
    )
    source = ast.unparse(ast.fix_missing_locations(ast.Module(body=[guarded], type_ignores=[])))
    return TestPlan(source + "\n", tuple(labels), names, entry_point)


# --------------------------------------------------------------------------- running it


def run_code_tests(
    spec: CodeTestsSpec,
    completion: str,
    pool: SandboxPool,
    *,
    timeout_s: float | None = None,
    acquire_timeout_s: float | None = None,
) -> Verdict:
    """Run ``spec``'s tests against ``completion`` in a sandbox of ``pool``; never raises for
    anything the completion does. ``timeout_s``: limit of the run (default: the spec's, else
    15 s). The sandbox is released (and wiped in the background) before this returns."""
    limit = timeout_s or spec.timeout_s or DEFAULT_TIMEOUT_S
    code = extract_code(spec, completion)
    if len(code) + len(spec.prelude) > MAX_PROGRAM_CHARS:
        return Verdict.failure(
            f"the code is {len(code):,} characters, over the limit of {MAX_PROGRAM_CHARS:,}; it was not run",
            code_chars=len(code),
        )
    try:
        plan = build_plan(spec.tests, spec.test_call, spec.prelude, spec.entry_point)
    except SyntaxError as error:  # a spec built without validation
        return Verdict.infra(f"the task's tests are not valid Python: {error}", kind="code")
    nonce = secrets.token_hex(16)
    bytecode = reads_our_bytecode(pool.config.python_executable)
    wait = min(pool.config.acquire_timeout_s, ACQUIRE_TIMEOUT_S) if acquire_timeout_s is None else acquire_timeout_s
    deadline = time.monotonic() + wait
    gate = _gate(pool)
    if not gate.acquire(timeout=wait):
        return Verdict.infra(f"no sandbox to run the tests in: none free within {wait:g} s", kind="code")
    second: ToolResult | None = None
    try:
        try:
            sandbox = pool.checkout(timeout=max(deadline - time.monotonic(), 0.001))
        except (PoolExhaustedError, PoolClosedError) as error:
            return Verdict.infra(f"no sandbox to run the tests in: {error}", kind="code")
        try:
            # Two calls on one freshly reset sandbox: the graded program starts in a child of the sandbox's
            # interpreter before that interpreter has seen the tests; then the tests run in it.
            started = time.monotonic()
            source = solution_source(spec, completion)
            first = sandbox.run_python(start_program(source), timeout=limit)
            if first.status is CallStatus.OK and _parse_start(first.value) == ("missing", None):  # a sandbox without it
                first = sandbox.run_python(start_program(source, ship=True, bytecode=bytecode), timeout=limit)
            if first.status is CallStatus.OK and _parse_start(first.value) == ("started", None):
                left = max(limit - (time.monotonic() - started), 0.05)
                second = sandbox.run_python(plan.program(nonce, bytecode=bytecode), timeout=left)
        finally:
            pool.release(sandbox)
    finally:
        gate.release()
    return _verdict(first, second, plan, nonce, limit, pool)


class _FairGate:
    """A first-come, first-served semaphore: a released slot is handed to the longest waiter,
    so under a steady stream of checks none waits past its turn (``threading.Semaphore`` lets
    a newcomer take a slot ahead of the threads already waiting)."""

    def __init__(self, slots: int) -> None:
        self._free = slots
        self._lock = threading.Lock()
        self._waiters: collections.deque[threading.Event] = collections.deque()

    def acquire(self, timeout: float) -> bool:
        with self._lock:
            if self._free > 0 and not self._waiters:
                self._free -= 1
                return True
            turn = threading.Event()
            self._waiters.append(turn)
        if turn.wait(timeout):
            return True
        with self._lock:
            if turn.is_set():  # the slot arrived as the wait ran out
                return True
            self._waiters.remove(turn)
            return False

    def release(self) -> None:
        with self._lock:
            if self._waiters:
                self._waiters.popleft().set()
            else:
                self._free += 1


_gates: weakref.WeakKeyDictionary[SandboxPool, _FairGate] = weakref.WeakKeyDictionary()
_gates_lock = threading.Lock()


def _gate(pool: SandboxPool) -> _FairGate:
    """At most pool-size checks of this process wait on the pool itself (which wakes every
    waiter on each release); the rest queue here in order, woken one at a time."""
    with _gates_lock:
        gate = _gates.get(pool)
        if gate is None:
            gate = _gates[pool] = _FairGate(pool.config.pool_size)
        return gate


def _failed_run(result: ToolResult, breakdown: dict[str, Any], limit: float, pool: SandboxPool) -> Verdict | None:
    """The verdict for a call that did not end normally (None when it did)."""
    status = result.status
    if status is CallStatus.INFRA:
        return Verdict.infra(f"the sandbox failed: {result.detail or result.error}", kind="code")
    if status is CallStatus.TIMEOUT:
        return Verdict.failure(
            f"the code did not finish within {limit:g} s (wall clock or CPU limit); no test counted", **breakdown
        )
    if status is CallStatus.MEMORY:
        return Verdict.failure(
            f"the code ran out of memory (limit {pool.config.memory_mb} MB); no test counted", **breakdown
        )
    if status is CallStatus.KILLED:
        why = result.error.message if result.error else result.detail
        return Verdict.failure(
            f"the code ended its interpreter before the tests reported ({why}); no test counted", **breakdown
        )
    if status is CallStatus.ERROR:
        error = result.error
        what = f"{error.type}: {error.message}" if error else "an error"
        return Verdict.failure(
            f"the code raised {what[:_MESSAGE_CHARS]} outside any test; no test counted", **breakdown
        )
    return None


def _parse_start(value: Any) -> tuple[str, str | None] | None:
    """A grader's ``(kind, message)``: "started" or "missing" (the first call), "error" or "died" (the
    second, when the code did not get as far as its tests); None for anything else."""
    if not isinstance(value, str):
        return None
    try:
        kind, text = ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if kind not in ("started", "error", "died", "missing") or not (text is None or isinstance(text, str)):
        return None
    return kind, text


def _verdict(
    first: ToolResult, second: ToolResult | None, plan: TestPlan, nonce: str, limit: float, pool: SandboxPool
) -> Verdict:
    run_ms = first.duration_ms + (second.duration_ms if second is not None else 0.0)
    breakdown: dict[str, Any] = {
        "tests": len(plan.labels),
        "passed": 0,
        "status": first.status.value,
        "run_ms": round(run_ms, 3),
    }
    failed = _failed_run(first, breakdown, limit, pool)
    if failed is not None:
        return failed
    started = _parse_start(first.value)
    if (
        started is None or started[0] != "started"
    ):  # never the sandbox's doing alone: scored, so no completion earns a redo
        if started is not None and started[0] == "missing":
            return Verdict.infra("the sandbox has no code grader, and sending it did not help", kind="code")
        return Verdict.failure(
            f"the grader did not start the code (value {str(first.value)[:200]!r}); no test counted", **breakdown
        )
    if second is None:  # not reached: a started program always gets its tests
        return Verdict.failure("the tests were not run after the code started; no test counted", **breakdown)
    breakdown["status"] = second.status.value
    failed = _failed_run(second, breakdown, limit, pool)
    if failed is not None:
        return failed
    start = _parse_start(second.value)  # the code did not get as far as its tests
    if start is not None and start[0] == "error":
        return Verdict.failure(str(start[1]), **breakdown)
    if start is not None and start[0] == "died":
        return Verdict.failure(f"{start[1]} before the tests ran; no test counted", **breakdown)
    report = _parse_report(second.value, nonce, len(plan.labels))
    if report is None:
        return Verdict.failure(
            f"the grader's report is missing or does not add up (value {str(second.value)[:200]!r}); no test counted",
            **breakdown,
        )
    ok, failures, state = report
    notes: list[str] = []
    if state.get("exit"):
        notes.append(f"{state['exit']} before the tests; they ran anyway")
    total = len(plan.labels)
    breakdown["passed"] = len(ok)
    listed: list[dict[str, Any]] = [
        {"test": index, "code": plan.labels[index], "error": failures[index]}
        for index in sorted(failures)
        if failures[index]
    ][:MAX_FAILURES_REPORTED]
    if listed:
        breakdown["failures"] = listed
    not_run = total - len(ok) - len(failures)
    if state.get("died"):
        breakdown["died"] = str(state["died"])
        notes.append(f"{state['died']} during the tests; every test after that failed")
    if state.get("abort"):
        breakdown["aborted"] = state["abort"]
        notes.append(f"the tests stopped early: {state['abort']} ({not_run} not run)")
    summary = f"{len(ok)}/{total} tests passed"
    if listed:
        first_failure = listed[0]
        summary += f"; test {first_failure['test'] + 1} failed: `{first_failure['code']}`: {first_failure['error'] or 'failed'}"
    verdict = Verdict.of_score(len(ok) / total, "; ".join([summary, *notes]), breakdown=breakdown)
    return verdict.model_copy(update={"passed": len(ok) == total and not state.get("abort")})


def _parse_report(value: Any, nonce: str, total: int) -> tuple[list[int], dict[int, str], dict[str, Any]] | None:
    """The harness's report, or None when it is missing or does not add up."""
    if not isinstance(value, str):
        return None
    try:
        tag, count, ok, failures, state = ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    if (
        tag != nonce
        or count != total
        or not isinstance(ok, list)
        or not isinstance(failures, dict)
        or not isinstance(state, dict)
    ):
        return None
    if not all(isinstance(i, int) and 0 <= i < total for i in [*ok, *failures]):
        return None
    if len(set(ok)) != len(ok) or set(ok) & set(failures):
        return None
    return ok, {int(k): str(v) for k, v in failures.items()}, state


# --------------------------------------------------------------------------- the kind


def prepare_code(spec: CodeTestsSpec, completion: str, task: TaskSpec, context: VerifyContext) -> CodeTestsSpec:
    """Carry the caller's pool (``VerifyContext.sandbox_pool``) to the check."""
    if context.sandbox_pool is None:
        return spec
    bound = spec.model_copy()
    bound._pool = context.sandbox_pool
    return bound


def check_code(spec: CodeTestsSpec, completion: str, task: TaskSpec) -> Verdict:
    """The 'code' kind's check: the caller's pool, else the process-wide one."""
    pool = spec._pool
    if pool is None:
        try:
            pool = shared_pool()
        except Exception as error:  # noqa: BLE001 - no sandbox on this host: not the completion's fault
            return Verdict.infra(
                f"could not start the verifiers' sandbox pool: {type(error).__name__}: {error}", kind="code"
            )
    started = time.monotonic()
    verdict = run_code_tests(spec, completion, pool, timeout_s=spec.timeout_s)
    breakdown = {**verdict.breakdown, "check_ms": round((time.monotonic() - started) * 1000, 3)}
    return verdict.model_copy(update={"breakdown": breakdown}) if not verdict.is_infra_error else verdict


CODE = VerifierKind(
    name="code",
    spec_model=CodeTestsSpec,
    check=check_code,
    prepare=prepare_code,
    isolation="thread",
    default_timeout_s=DEFAULT_TIMEOUT_S,
    wait_margin_s=WAIT_MARGIN_S,
    description="unit tests run in a warm sandbox; score = fraction of tests passed",
)
