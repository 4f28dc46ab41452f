"""Code tasks: unit tests run in a warm sandbox, scored by the fraction of tests that pass.

A task's program is ``prelude + completion's code + tests + test_call`` (``assemble_program``).
The verifier runs it in one call to a sandbox from a pool (no interpreter is started per
check: the pool's interpreters are already running), as a harness that:

* executes ``prelude + code`` first, compiled on its own, so the completion cannot change how
  the tests parse; a ``sys.exit()`` in it ends only that part, the tests still run;
* counts each test separately: every top-level statement of ``tests`` that holds an
  ``assert`` is one test, and so is every such statement of the function ``test_call``
  calls (HumanEval's ``check(candidate)``), rewritten with ``ast`` so that each one records
  its own pass or failure; a ``test_call`` that is not such a call is one test itself; tests
  without any assert count as one test;
* reports through the value of its last expression, tagged with a fresh random nonce.

Score: passed tests / tests. Code that times out, runs out of memory, kills its interpreter or
ends the run before the report scores 0 with the reason. A sandbox that fails (not the
code's doing) gives an ``infra_error`` verdict. Example::

    from posttrain.platform.verifiers import TaskSpec, VerifyContext, verify

    task = TaskSpec(domain="demo", prompt="write add(a, b)", verifier={"kind": "code", "spec": {
        "tests": "assert add(1, 2) == 3\\nassert add(-1, 1) == 0\\n", "entry_point": "add"}})
    verify(task, "def add(a, b):\\n    return a + b\\n")            # score 1.0, passed
    verify(task, "def add(a, b):\\n    return 3\\n")                 # score 0.5, details name the failing test
    verify(task, code, context=VerifyContext(sandbox_pool=pool))   # on your own SandboxPool

Trust: the tests run in the same interpreter as the completion (as in HumanEval). The
sandbox contains whatever the code does to the host, and the nonce and the checks on the
report stop accidental or blind forgeries (printing "passed", exiting early); code written
to read and rewrite this harness from inside the interpreter is not ruled out.
"""

from __future__ import annotations

import ast
import collections
import functools
import importlib.util
import marshal
import re
import secrets
import subprocess
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator

from posttrain.platform.sandbox import CallStatus, PoolClosedError, PoolExhaustedError, SandboxPool, ToolResult
from posttrain.platform.verifiers.models import TaskSpec, Verdict
from posttrain.platform.verifiers.registry import BaseSpec, VerifierKind, VerifyContext

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


def extract_code(completion: str) -> str:
    """The code in a completion: the fenced blocks joined, or the text itself."""
    blocks = _FENCE.findall(completion)
    return "\n\n".join(blocks) if blocks else completion


def solution_source(spec: CodeTestsSpec, completion: str) -> str:
    """The part of the program before the tests: the prelude, then the completion's code."""
    return "\n".join([spec.prelude.rstrip("\n") if spec.prelude else spec.prelude, extract_code(completion)])


def assemble_program(spec: CodeTestsSpec, completion: str) -> str:
    """The whole program to run for ``completion``: prelude, code, tests, then the test call."""
    parts = [spec.prelude, extract_code(completion), "", spec.tests]
    if spec.test_call:
        parts.append(spec.test_call)
    return "\n".join(part.rstrip("\n") if part else part for part in parts) + "\n"


# --------------------------------------------------------------------------- the harness

_HEAD = '''\
import builtins as __pt_b
import traceback as __pt_tb
__pt_caught = (__pt_b.Exception, __pt_b.SystemExit)
__pt_ok = []
__pt_fail = {}
__pt_state = {"abort": None, "solution_error": None, "solution_exit": None}
def __pt_why(e):
    try:
        if isinstance(e, __pt_b.SystemExit):
            return "the code called sys.exit(%r)" % (e.code,)
        text = type(e).__name__ + (": " + __pt_b.str(e) if __pt_b.str(e) else "")
    except __pt_b.BaseException:
        text = type(e).__name__
    return text[:MESSAGE_CHARS]
def __pt_passed(i):
    __pt_ok.append(i)
def __pt_failed(i, e):
    if len(__pt_fail) < MAX_FAILURES:
        __pt_fail[i] = __pt_why(e)
    else:
        __pt_fail[i] = ""
def __pt_solution(source):
    try:
        code = __pt_b.compile(source, "<solution>", "exec")
    except __pt_caught as e:
        __pt_state["solution_error"] = "the code does not compile: " + __pt_why(e)
        return False
    try:
        __pt_b.exec(code, __pt_b.globals())
    except __pt_b.SystemExit as e:
        __pt_state["solution_exit"] = __pt_why(e)
    except __pt_b.Exception as e:
        lines = __pt_tb.format_exception(type(e), e, e.__traceback__)
        trace = "".join(line for line in lines if "<solution>" in line or line is lines[-1])
        __pt_state["solution_error"] = ("the code raised " + __pt_why(e) + "\\n" + trace[-1500:])[:2000]
        return False
    return True
'''


@dataclass(frozen=True)
class TestPlan:
    """The harness for one spec's tests (minus the solution and the nonce): its source and one
    label per counted test (the test's code, shortened, for the details)."""

    tests_source: str
    labels: tuple[str, ...]

    @functools.cached_property
    def harness_source(self) -> str:
        """The harness up to the report: it expects the solution's source in ``__pt_src``."""
        head = _HEAD.replace("MESSAGE_CHARS", str(_MESSAGE_CHARS)).replace("MAX_FAILURES", str(MAX_FAILURES_REPORTED))
        return head + "if __pt_solution(__pt_src):\n" + _indent(self.tests_source)

    @functools.cached_property
    def harness_bytecode(self) -> bytes:
        """The harness compiled here once (marshal format of this interpreter)."""
        return marshal.dumps(compile(self.harness_source, "<tests>", "exec"))

    def program(self, solution: str, nonce: str, *, bytecode: bool = False) -> str:
        """The source sent to the sandbox. With ``bytecode`` (the sandbox's interpreter reads this
        one's marshal format) the harness travels compiled, so the sandbox compiles only the
        solution; the solution is always compiled in the sandbox, never here."""
        if bytecode:
            # bytes.fromhex: no module to import in the fresh interpreter (binascii costs ms there).
            harness = f"exec(__import__('marshal').loads(bytes.fromhex('{self.harness_bytecode.hex()}')))\n"
        else:
            harness = self.harness_source
        return f"__pt_src = {solution!r}\n" + harness + f"({nonce!r}, {len(self.labels)}, __pt_ok, __pt_fail, __pt_state)\n"


@functools.lru_cache(maxsize=16)
def reads_our_bytecode(python_executable: str) -> bool:
    """Whether ``python_executable`` loads this interpreter's marshalled code (same magic number)."""
    probe = "import importlib.util; print(importlib.util.MAGIC_NUMBER.hex())"
    try:
        out = subprocess.run([python_executable, "-I", "-c", probe], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return out.strip() == importlib.util.MAGIC_NUMBER.hex()


def _indent(source: str) -> str:
    return "".join(f"    {line}\n" if line.strip() else "\n" for line in source.splitlines()) or "    pass\n"


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
        body=[ast.Expr(ast.Call(ast.Name("__pt_failed", ast.Load()), [ast.Constant(index), ast.Name("__pt_e", ast.Load())], []))],
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
def build_plan(tests: str, test_call: str | None) -> TestPlan:
    """Rewrite ``tests`` (and ``test_call``) so that each test records its own outcome."""
    module = ast.parse(tests)
    module.body = [s for s in module.body if not (isinstance(s, ast.ImportFrom) and s.module == "__future__")]
    call_module = ast.parse(test_call) if test_call else None
    target = _called_function(call_module) if call_module is not None else None
    definitions = [s for s in module.body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == target]
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
        body=body,
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
    return TestPlan(source + "\n", tuple(labels))


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
    code = extract_code(completion)
    if len(code) + len(spec.prelude) > MAX_PROGRAM_CHARS:
        return Verdict.failure(
            f"the code is {len(code):,} characters, over the limit of {MAX_PROGRAM_CHARS:,}; it was not run",
            code_chars=len(code),
        )
    try:
        plan = build_plan(spec.tests, spec.test_call)
    except SyntaxError as error:  # a spec built without validation
        return Verdict.infra(f"the task's tests are not valid Python: {error}", kind="code")
    nonce = secrets.token_hex(16)
    program = plan.program(solution_source(spec, completion), nonce, bytecode=reads_our_bytecode(pool.config.python_executable))
    wait = min(pool.config.acquire_timeout_s, ACQUIRE_TIMEOUT_S) if acquire_timeout_s is None else acquire_timeout_s
    deadline = time.monotonic() + wait
    gate = _gate(pool)
    if not gate.acquire(timeout=wait):
        return Verdict.infra(f"no sandbox to run the tests in: none free within {wait:g} s", kind="code")
    try:
        try:
            sandbox = pool.checkout(timeout=max(deadline - time.monotonic(), 0.001))
        except (PoolExhaustedError, PoolClosedError) as error:
            return Verdict.infra(f"no sandbox to run the tests in: {error}", kind="code")
        try:
            result = sandbox.run_python(program, timeout=limit)
        finally:
            pool.release(sandbox)
    finally:
        gate.release()
    return _verdict(result, plan, nonce, limit, pool)


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


def _verdict(result: ToolResult, plan: TestPlan, nonce: str, limit: float, pool: SandboxPool) -> Verdict:
    status = result.status
    breakdown: dict[str, Any] = {"tests": len(plan.labels), "passed": 0, "status": status.value, "run_ms": round(result.duration_ms, 3)}
    if status is CallStatus.INFRA:
        return Verdict.infra(f"the sandbox failed: {result.detail or result.error}", kind="code")
    if status is CallStatus.TIMEOUT:
        return Verdict.failure(f"the code did not finish within {limit:g} s (wall clock or CPU limit); no test counted", **breakdown)
    if status is CallStatus.MEMORY:
        return Verdict.failure(f"the code ran out of memory (limit {pool.config.memory_mb} MB); no test counted", **breakdown)
    if status is CallStatus.KILLED:
        why = result.error.message if result.error else result.detail
        return Verdict.failure(f"the code ended its interpreter before the tests reported ({why}); no test counted", **breakdown)
    if status is CallStatus.ERROR:
        error = result.error
        what = f"{error.type}: {error.message}" if error else "an error"
        return Verdict.failure(f"the code raised {what[:_MESSAGE_CHARS]} outside any test; no test counted", **breakdown)
    report = _parse_report(result.value, nonce, len(plan.labels))
    if report is None:
        return Verdict.failure(
            "the tests did not report: the code ended or replaced the test run before it finished (e.g. sys.exit, "
            "os._exit, or tampering with the harness); no test counted",
            **breakdown,
        )
    ok, failures, state = report
    if state.get("solution_error"):
        return Verdict.failure(str(state["solution_error"]), **breakdown)
    notes: list[str] = []
    if state.get("solution_exit"):
        notes.append(f"{state['solution_exit']} before the tests; they ran anyway")
    total = len(plan.labels)
    breakdown["passed"] = len(ok)
    listed = [
        {"test": index, "code": plan.labels[index], "error": failures[index]}
        for index in sorted(failures)
        if failures[index]
    ][:MAX_FAILURES_REPORTED]
    if listed:
        breakdown["failures"] = listed
    not_run = total - len(ok) - len(failures)
    if state.get("abort"):
        breakdown["aborted"] = state["abort"]
        notes.append(f"the tests stopped early: {state['abort']} ({not_run} not run)")
    summary = f"{len(ok)}/{total} tests passed"
    if listed:
        first = listed[0]
        summary += f"; test {first['test'] + 1} failed: `{first['code']}`: {first['error'] or 'failed'}"
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
    if tag != nonce or count != total or not isinstance(ok, list) or not isinstance(failures, dict) or not isinstance(state, dict):
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
        from posttrain.platform.verifiers.sandboxes import shared_pool

        try:
            pool = shared_pool()
        except Exception as error:  # noqa: BLE001 - no sandbox on this host: not the completion's fault
            return Verdict.infra(f"could not start the verifiers' sandbox pool: {type(error).__name__}: {error}", kind="code")
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
