"""Code tests that graded code can pass by rewriting its arguments in place: a static check with ``ast``.

A test that hands a mutable value to the program and reads it again afterwards compares against something the
program controls::

    xs = [3, 1, 2]
    assert f(xs) == sorted(xs)      # f may return [] after xs.clear(): sorted([]) == []

Python lets a function rewrite a list it is given, the reference harness does too, and the grader writes such
changes back (platform/sandbox/graded.py), so the verifier keeps grading these tests as they are; this check only
names them, for the build report and the Tasks page. A test (one counted test, as the code verifier splits them:
:func:`posttrain.platform.verifiers.kinds.code.build_plan`) is flagged when a name bound to a value the grader
writes back (a list, dict, set or bytearray: a display or comprehension, ``list(...)``, ``sorted(...)``,
``dict(...)``, a copy of one, an element of a list of lists, a loop variable over one, ...) is a positional argument
of a call of the program (its entry point, HumanEval's ``candidate`` in ``def check(candidate)``, or another name the
tests take from the program, such as a class of its own they construct; ``*args`` passes each element), and the same
object is read again later: in the same test (``assert f(xs) == xs``, or on a loop's next round), or in a later test
of the same function (``f(xs)`` then ``assert xs == [1, 2, 3]``). A bare name a comparison holds (``xs == f(xs)``)
is read when it compares, after the call.

Not flagged: literals passed inline (``f([3, 1, 2])``); copies passed (``f(xs[:])``, ``f(copy.deepcopy(xs))``);
values read only before the call (``expected = sorted(xs)`` first); what the grader does not write back (a keyword
argument, a tuple, a ``Counter`` or ``deque``, a name inside a display passed: ``f([xs])``), though plain Python
would; immutable values; the same name passed to the program again (it gains nothing it could not keep itself); an
assert's message; and names whose value the check cannot tell (a helper's return value, a parameter): it errs
towards no flag.

Example::

    forgeable_tests("xs = [3, 1, 2]\\nassert f(xs) == sorted(xs)\\n", entry_point="f")
    # [ForgeableTest(test=0, code='assert f(xs) == sorted(xs)', argument='xs', callee='f', entry_point='f', read_as=None)]
    # .reason: "passes `xs` to `f` and reads it again: code that rewrites `xs` in place can pass"
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from posttrain.platform.verifiers.kinds.code import (
    CodeTestsSpec,
    _called_function,
    _is_future_import,
    _is_test,
    _label,
    build_plan,
)
from posttrain.platform.verifiers.models import TaskSpec

MAX_REPEATED_LOOPS = 4
"""Loops nested deeper than this are walked once (a loop's body is walked twice above it): bounded time on any input."""
METADATA_KEY = "forgeable_by_mutation"
"""Where an importer records a code task's flagged tests: ``TaskSpec.metadata[METADATA_KEY]``, a list of
:meth:`ForgeableTest.to_json` objects (absent when none is flagged)."""


@dataclass(frozen=True)
class ForgeableTest:
    """One flagged test: its index among the task's counted tests (0-based, as the verifier counts them), its code
    (the verifier's label for it), the argument read again, and the program name it was passed to."""

    test: int
    code: str
    argument: str
    callee: str
    entry_point: str | None = None
    read_as: str | None = None  # another name bound to the same object, when that is what the test reads

    @property
    def reason(self) -> str:
        callee = f"`{self.callee}`" + (
            f" (the entry point `{self.entry_point}`)" if self.entry_point and self.entry_point != self.callee else ""
        )
        again = f" (as `{self.read_as}`)" if self.read_as else ""
        return f"passes `{self.argument}` to {callee} and reads it again{again}: code that rewrites `{self.argument}` in place can pass"

    def to_json(self) -> dict[str, Any]:
        return {
            "test": self.test,
            "code": self.code,
            "argument": self.argument,
            "callee": self.callee,
            "reason": self.reason,
        }


# --------------------------------------------------------------------------- what a value is


@dataclass(frozen=True)
class _Val:
    """What the check knows of a value: its kind (``list``, ``dict``, ``set``, ``bytearray``, ``tuple``, ``immutable``
    for a number, string or the like, ``other`` for another object; None when it cannot tell), what its elements are
    (iterating or indexing it), and a display's positions (for unpacking)."""

    kind: str | None = None
    items: _Val | None = None
    parts: tuple[_Val, ...] | None = None


WRITTEN_BACK = frozenset({"list", "dict", "set", "bytearray"})
"""The kinds of a positional argument the grader updates in place after a call changed it (graded.py ``_write_back``)."""
UNKNOWN = _Val()
IMMUTABLE = _Val("immutable")


def _join(a: _Val | None, b: _Val | None) -> _Val | None:
    """A value that is either ``a`` or ``b``."""
    if a is None or b is None:
        return a if b is None else b
    parts = (
        tuple(_join(x, y) or UNKNOWN for x, y in zip(a.parts, b.parts))
        if a.parts and b.parts and len(a.parts) == len(b.parts)
        else None
    )
    return _Val(a.kind if a.kind == b.kind else None, _join(a.items, b.items), parts)


def _join_all(values: Iterable[_Val]) -> _Val | None:
    out: _Val | None = None
    for value in values:
        out = _join(out, value)
    return out


_COPIES = {"copy", "deepcopy", "copy.copy", "copy.deepcopy"}  # a value of the same kind as the argument
_OF_ITEMS = {"list": "list", "sorted": "list", "set": "set", "bytearray": "bytearray", "tuple": "tuple", "dict": "dict",
             "deque": "other", "collections.deque": "other", "reversed": "other", "iter": "other", "Counter": "other",
             "collections.Counter": "other", "defaultdict": "other", "collections.defaultdict": "other",
             "OrderedDict": "other", "collections.OrderedDict": "other"}  # fmt: skip
_IMMUTABLE_CALLS = {
    "int", "float", "complex", "str", "bool", "bytes", "len", "abs", "round", "repr", "ord", "chr", "hash",
    "frozenset", "sum", "pow", "divmod", "hex", "oct", "bin", "format", "isinstance", "any", "all", "id", "ascii",
}  # fmt: skip


def _call_name(func: ast.expr) -> str | None:
    """``name`` or ``module.name`` (``copy.deepcopy``) of a called function."""
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
        return f"{func.value.id}.{func.attr}"
    return None


# --------------------------------------------------------------------------- the walk


@dataclass
class _Scope:
    env: dict[str, _Val] = field(default_factory=dict)
    ids: dict[str, int] = field(default_factory=dict)  # the object a name is bound to (same id: an alias)
    handed: dict[int, tuple[str, str]] = field(default_factory=dict)  # object id -> (argument name, callee)


class _Walker:
    """Walks test code in (close to) the order Python runs it, tracking what each name holds, which objects were
    handed to the program, and, within a test, every later read of one."""

    def __init__(self, callees: set[str]) -> None:
        self.callees = callees
        self.scope = _Scope()
        self.in_test = False
        self.found: dict[tuple[str, str], str | None] = {}  # (argument, callee) -> the other name read, if any
        self.loops = 0  # loops around the node walked: a loop's body is walked twice, up to MAX_REPEATED_LOOPS deep
        self._next_id = 0

    # names ----------------------------------------------------------------------------------------
    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def bind(self, target: ast.expr, value: _Val, source: ast.expr | None = None) -> None:
        if isinstance(target, ast.Name):
            self.scope.env[target.id] = value
            same = self.scope.ids.get(source.id) if isinstance(source, ast.Name) else None
            self.scope.ids[target.id] = same if same is not None else self._new_id()
        elif isinstance(target, (ast.Tuple, ast.List)):
            parts = value.parts if value.parts and len(value.parts) == len(target.elts) else None
            for i, elt in enumerate(target.elts):
                if isinstance(elt, ast.Starred):
                    self.bind(elt.value, _Val("list", value.items))
                else:
                    self.bind(elt, parts[i] if parts else (value.items or UNKNOWN))
        elif isinstance(target, ast.Starred):
            self.bind(target.value, _Val("list", value.items))
        else:  # an attribute or a subscript: evaluates its parts
            self.visit(target)

    def bind_name(self, name: str, value: _Val = UNKNOWN) -> None:
        self.scope.env[name] = value
        self.scope.ids[name] = self._new_id()

    def read(self, name: str) -> None:
        obj = self.scope.ids.get(name)
        if not self.in_test or obj is None or obj not in self.scope.handed:
            return
        argument, callee = self.scope.handed[obj]
        self.found.setdefault((argument, callee), None if name == argument else name)

    # values ---------------------------------------------------------------------------------------
    def value(self, node: ast.expr) -> _Val:
        """What ``node`` evaluates to (no side effects: the walk visits it separately)."""
        if isinstance(node, (ast.Constant, ast.JoinedStr, ast.UnaryOp, ast.Compare)):
            return IMMUTABLE
        if isinstance(node, ast.Name):
            return self.scope.env.get(node.id, UNKNOWN)
        if isinstance(node, (ast.List, ast.Tuple)):
            parts = tuple(self.value(e) for e in node.elts)
            return _Val("list" if isinstance(node, ast.List) else "tuple", _join_all(parts), parts)
        if isinstance(node, ast.Set):
            return _Val("set", _join_all(self.value(e) for e in node.elts))
        if isinstance(node, (ast.Dict, ast.DictComp)):
            return _Val("dict")
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp)):
            kind = {ast.ListComp: "list", ast.SetComp: "set", ast.GeneratorExp: "other"}[type(node)]
            return _Val(kind, self._comprehension_item(node))
        if isinstance(node, ast.Call):
            return self._call_value(node)
        if isinstance(node, ast.BinOp):
            left, right = self.value(node.left), self.value(node.right)
            for kind in ("list", "tuple"):  # xs + ys, [0] * n
                if kind in (left.kind, right.kind) and isinstance(node.op, (ast.Add, ast.Mult)):
                    return _Val(
                        kind,
                        _join(left.items if left.kind == kind else None, right.items if right.kind == kind else None),
                    )
            return IMMUTABLE if left.kind == right.kind == "immutable" else UNKNOWN
        if isinstance(node, ast.BoolOp):
            return _join_all(self.value(v) for v in node.values) or UNKNOWN
        if isinstance(node, ast.IfExp):
            return _join(self.value(node.body), self.value(node.orelse)) or UNKNOWN
        if isinstance(node, ast.NamedExpr):
            return self.value(node.value)
        if isinstance(node, ast.Subscript):
            container = self.value(node.value)
            if isinstance(node.slice, ast.Slice):  # a copy of the same kind
                return _Val(container.kind, container.items) if container.kind is not None else UNKNOWN
            if container.parts and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, int):
                if -len(container.parts) <= node.slice.value < len(container.parts):
                    return container.parts[node.slice.value]
            return container.items or UNKNOWN
        return UNKNOWN

    def _comprehension_item(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp) -> _Val | None:
        saved = dict(self.scope.env)
        for gen in node.generators:
            self.bind_name_tree(gen.target, self.value(gen.iter).items or UNKNOWN)
        item = self.value(node.elt)
        self.scope.env = saved
        return item

    def bind_name_tree(self, target: ast.expr, value: _Val) -> None:
        """Bind ``target``'s names to ``value`` in the environment only (no ids, nothing visited)."""
        if isinstance(target, ast.Name):
            self.scope.env[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            parts = value.parts if value.parts and len(value.parts) == len(target.elts) else None
            for i, elt in enumerate(target.elts):
                self.bind_name_tree(
                    elt.value if isinstance(elt, ast.Starred) else elt, parts[i] if parts else (value.items or UNKNOWN)
                )

    def _call_value(self, node: ast.Call) -> _Val:
        name = _call_name(node.func)
        first = self.value(node.args[0]) if node.args and not isinstance(node.args[0], ast.Starred) else None
        if name in _COPIES and first is not None:
            return first
        if isinstance(node.func, ast.Attribute) and node.func.attr == "copy" and not node.args:  # xs.copy()
            return self.value(node.func.value)
        if name in _OF_ITEMS:
            return _Val(_OF_ITEMS[name], first.items if first is not None and name not in ("dict", "Counter") else None)
        if name == "range":
            return _Val("immutable", IMMUTABLE)
        if name == "enumerate" and first is not None:
            return _Val("other", _Val("tuple", None, (IMMUTABLE, first.items or UNKNOWN)))
        if name == "zip" and node.args:
            return _Val("other", _Val("tuple", None, tuple(self.value(a).items or UNKNOWN for a in node.args)))
        if name in ("min", "max") and first is not None and len(node.args) == 1:
            return first.items or UNKNOWN
        if name in _IMMUTABLE_CALLS:
            return IMMUTABLE
        return UNKNOWN

    # statements -------------------------------------------------------------------------------------
    def run(self, statements: Iterable[ast.stmt]) -> None:
        for stmt in statements:
            self.visit(stmt)

    def visit(self, node: ast.AST) -> None:
        method = getattr(self, f"visit_{type(node).__name__}", None)
        if method is not None:
            method(node)
        else:
            for child in ast.iter_child_nodes(node):
                self.visit(child)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self.read(node.id)
        elif isinstance(node.ctx, ast.Del):
            self.scope.ids.pop(node.id, None)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        value, source = self.value(node.value), node.value
        for target in node.targets:  # xs = ys = [1]: one object
            self.bind(target, value, source)
            source = target if isinstance(target, ast.Name) else source

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
            self.bind(node.target, self.value(node.value), node.value)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.visit(node.value)
        if isinstance(node.target, ast.Name):  # xs += [1] extends xs in place: the same object, read
            self.read(node.target.id)
        else:
            self.visit(node.target)

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        self.bind(node.target, self.value(node.value), node.value)

    def rounds(self) -> range:
        """How many times to walk a loop's body: twice (a round's reads come after the previous round's calls), once
        when ``MAX_REPEATED_LOOPS`` loops already hold it (so nested loops cost no more than that many doublings)."""
        return range(2 if self.loops < MAX_REPEATED_LOOPS else 1)

    def visit_For(self, node: ast.For | ast.AsyncFor) -> None:
        self.visit(node.iter)
        item = self.value(node.iter).items or UNKNOWN
        rounds, self.loops = self.rounds(), self.loops + 1
        for _ in rounds:
            self.bind(node.target, item)
            self.run(node.body)
        self.loops -= 1
        self.run(node.orelse)

    visit_AsyncFor = visit_For

    def visit_While(self, node: ast.While) -> None:
        rounds, self.loops = self.rounds(), self.loops + 1
        for _ in rounds:
            self.visit(node.test)
            self.run(node.body)
        self.loops -= 1
        self.run(node.orelse)

    def visit_With(self, node: ast.With | ast.AsyncWith) -> None:
        for item in node.items:
            self.visit(item.context_expr)
            if item.optional_vars is not None:
                self.bind(item.optional_vars, UNKNOWN)
        self.run(node.body)

    visit_AsyncWith = visit_With

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.type is not None:
            self.visit(node.type)
        if node.name:
            self.bind_name(node.name)
        self.run(node.body)

    def visit_Assert(self, node: ast.Assert) -> None:
        self.visit(node.test)  # not the message: it runs only once the test has failed

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> None:
        for decorator in node.decorator_list:
            self.visit(decorator)
        self.bind_name(node.name)  # its body runs only when called

    visit_AsyncFunctionDef = visit_FunctionDef
    visit_ClassDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        return

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        for alias in node.names:
            self.bind_name((alias.asname or alias.name).split(".")[0])

    visit_ImportFrom = visit_Import

    # expressions ------------------------------------------------------------------------------------
    def visit_Call(self, node: ast.Call) -> None:
        callee = node.func.id if isinstance(node.func, ast.Name) and node.func.id in self.callees else None
        self.visit(node.func)
        if callee is None:
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                self.visit(arg)
            return
        handed: list[tuple[str, bool]] = []  # (name, whether its elements are what is handed)
        for arg in node.args:
            self._visit_argument(arg, handed, positional=True)
        for keyword in node.keywords:  # the grader writes back positional arguments only
            self._visit_argument(keyword.value, handed, positional=False)
        for name, starred in handed:
            value = self.scope.env.get(name, UNKNOWN)
            kind = (value.items or UNKNOWN).kind if starred else value.kind
            obj = self.scope.ids.get(name)
            if kind in WRITTEN_BACK and obj is not None:
                self.scope.handed.setdefault(obj, (name, callee))

    def _visit_argument(self, arg: ast.expr, handed: list[tuple[str, bool]], *, positional: bool) -> None:
        """An argument of a call of the program. A name passed positionally (itself, or its elements with ``*``) hands
        its object over: the grader writes back a list, dict, set or bytearray argument the call changed. A name
        read there, handed or not, is no read-again: passing it again gains the program nothing it could not keep."""
        if isinstance(arg, ast.Name):
            if positional:
                handed.append((arg.id, False))
        elif isinstance(arg, ast.Starred) and isinstance(arg.value, ast.Name):
            if positional:
                handed.append((arg.value.id, True))
        elif isinstance(arg, ast.Starred) and isinstance(arg.value, (ast.List, ast.Tuple)):
            for elt in arg.value.elts:  # f(*[xs, ys]): each element is a positional argument
                self._visit_argument(elt, handed, positional=positional)
        elif isinstance(arg, (ast.List, ast.Tuple, ast.Set)):  # a new container: written back is it, not its elements
            for elt in arg.elts:
                self._visit_argument(elt, handed, positional=False)
        elif isinstance(arg, ast.Dict):
            for key, val in zip(arg.keys, arg.values):
                if key is not None:
                    self.visit(key)
                self._visit_argument(val, handed, positional=False)
        else:
            self.visit(arg)

    def visit_Compare(self, node: ast.Compare) -> None:
        held: list[str] = []  # bare names the comparison holds: read when it compares, after every operand ran
        for operand in [node.left, *node.comparators]:
            self._visit_operand(operand, held)
        for name in held:
            self.read(name)

    def _visit_operand(self, operand: ast.expr, held: list[str]) -> None:
        if isinstance(operand, ast.Name) and isinstance(operand.ctx, ast.Load):
            held.append(operand.id)
        elif isinstance(operand, (ast.List, ast.Tuple, ast.Set)):
            for elt in operand.elts:
                self._visit_operand(elt, held)
        else:
            self.visit(operand)

    def _visit_comprehension(self, node: ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp) -> None:
        saved = (dict(self.scope.env), dict(self.scope.ids))
        self.visit(node.generators[0].iter)
        rounds, self.loops = self.rounds(), self.loops + 1
        for _ in rounds:
            for i, gen in enumerate(node.generators):
                if i:
                    self.visit(gen.iter)
                self.bind(gen.target, self.value(gen.iter).items or UNKNOWN)
                for condition in gen.ifs:
                    self.visit(condition)
            if isinstance(node, ast.DictComp):
                self.visit(node.key)
                self.visit(node.value)
            else:
                self.visit(node.elt)
        self.loops -= 1
        env, ids = saved
        for name in _target_names(node.generators):  # a comprehension's variables do not leak out of it
            for table, old in ((self.scope.env, env), (self.scope.ids, ids)):
                if name in old:
                    table[name] = old[name]  # type: ignore[assignment]
                else:
                    table.pop(name, None)

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _visit_comprehension


def _target_names(generators: list[ast.comprehension]) -> Iterator[str]:
    for gen in generators:
        for node in ast.walk(gen.target):
            if isinstance(node, ast.Name):
                yield node.id


# --------------------------------------------------------------------------- tests as the verifier counts them


def forgeable_tests(
    tests: str, test_call: str | None = None, *, entry_point: str | None = None, prelude: str = ""
) -> list[ForgeableTest]:
    """The tests of a code task (its spec's ``tests``, ``test_call``, ``entry_point`` and ``prelude``) that the
    program can pass by rewriting an argument in place, numbered and labelled as the verifier counts them."""
    return _analyse(tests, test_call, entry_point, prelude)[0]


def _analyse(
    tests: str, test_call: str | None, entry_point: str | None, prelude: str
) -> tuple[list[ForgeableTest], list[str]]:
    """The flagged tests, and the label of every test in the order the check counted them (the verifier's own
    labels, in its order: a test says so)."""
    program_names = build_plan(tests, test_call, prelude, entry_point).program_names
    body = [s for s in ast.parse(tests).body if not _is_future_import(s)]
    call_module = ast.parse(test_call) if test_call else None
    target = _called_function(call_module) if call_module is not None else None
    definitions = [s for s in body if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef)) and s.name == target]
    called = definitions[-1] if definitions else None  # the definition the test call reaches
    rewritten = called if called is not None and any(map(_is_test, called.body)) else None
    walker = _Walker(set(program_names))
    flagged: list[ForgeableTest] = []
    labels: list[str] = []

    def walk(
        statements: list[ast.stmt], label: str | None, enter: ast.FunctionDef | ast.AsyncFunctionDef | None = None
    ) -> None:
        """Run ``statements`` (a counted test when ``label`` is given), then ``enter``'s body as they call it."""
        walker.in_test, walker.found = label is not None, {}
        walker.run(statements)
        if enter is not None and call_module is not None:
            outer = walker.scope
            _enter(walker, enter, call_module)
            walker.run(enter.body)
            walker.scope = outer
        if label is not None:
            flagged.extend(
                ForgeableTest(len(labels), label, arg, callee, entry_point, read_as)
                for (arg, callee), read_as in walker.found.items()
            )
            labels.append(label)
        walker.in_test = False

    for stmt in body:
        defines = isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
        walk([stmt], _label(stmt) if not defines and _is_test(stmt) else None)
    if call_module is not None and rewritten is not None:
        _enter(walker, rewritten, call_module)
        for stmt in rewritten.body:
            walk([stmt], _label(stmt) if _is_test(stmt) else None)
    elif call_module is not None:  # the test call is one test, with the body of the function it calls
        call = call_module.body
        walk(call, _label(call[0]) if len(call) == 1 else "the test call", called)
    if not labels:  # no assert anywhere: the whole test code is one test
        walker.scope, flagged = _Scope(), []
        walk(body, "the test code")
    return flagged, labels


def _enter(walker: _Walker, function: ast.FunctionDef | ast.AsyncFunctionDef, call_module: ast.Module) -> None:
    """Start the scope of ``function`` as the test call calls it: its parameters, the program names passed in as
    arguments (HumanEval's ``check(candidate)``) among the callees, the module's names kept."""
    call = call_module.body[0].value  # type: ignore[attr-defined]
    params = [*function.args.posonlyargs, *function.args.args]
    walker.scope = _Scope(dict(walker.scope.env), dict(walker.scope.ids), dict(walker.scope.handed))
    for param in [*params, *function.args.kwonlyargs]:
        walker.bind_name(param.arg)
    if function.args.vararg:
        walker.bind_name(function.args.vararg.arg)
    if function.args.kwarg:
        walker.bind_name(function.args.kwarg.arg)
    passed = list(zip(params, call.args)) + [
        (p, k.value) for k in call.keywords for p in [*params, *function.args.kwonlyargs] if p.arg == k.arg
    ]
    for param, arg in passed:
        if isinstance(arg, ast.Name) and arg.id in walker.callees:
            walker.callees = walker.callees | {param.arg}


def forgeable_in_task(task: TaskSpec) -> list[ForgeableTest]:
    """:func:`forgeable_tests` of a code task; nothing for a task of another kind."""
    if task.verifier.kind != "code":
        return []
    spec = CodeTestsSpec.model_validate(task.verifier.spec)
    return forgeable_tests(spec.tests, spec.test_call, entry_point=spec.entry_point, prelude=spec.prelude)


def flag_tasks(tasks: Iterable[TaskSpec]) -> list[TaskSpec]:
    """Record each code task's flagged tests in its metadata (``METADATA_KEY``; removed when none is flagged, so an
    imported file cannot claim any or hide one), the tasks returned in order."""
    out = []
    for task in tasks:
        try:
            flags = forgeable_in_task(task)
        except (SyntaxError, ValueError, RecursionError, MemoryError):  # tests the verifier itself cannot plan
            flags = []
        metadata = {k: v for k, v in task.metadata.items() if k != METADATA_KEY}
        if flags:
            metadata[METADATA_KEY] = [f.to_json() for f in flags]
        out.append(task.model_copy(update={"metadata": metadata}))
    return out


def flagged_lines(tasks: Iterable[TaskSpec]) -> list[str]:
    """One line per flagged test recorded in ``tasks``' metadata: ``<task id>, test <n>: `<code>` <reason>``."""
    return [
        f"{task.task_id}, test {flag['test'] + 1}: `{flag['code']}` {flag['reason']}"
        for task in tasks
        for flag in task.metadata.get(METADATA_KEY) or []
    ]


MAX_REPORTED = 200


def mutation_report(tasks: Sequence[TaskSpec]) -> dict[str, Any]:
    """What a build's report says of its code tasks' tests (nothing when it has no code task): how many tests, in how
    many tasks, the program can pass by rewriting an argument in place, and a line for each (the first
    ``MAX_REPORTED``)."""
    code = [t for t in tasks if t.verifier.kind == "code"]
    if not code:
        return {}
    lines = flagged_lines(code)
    report: dict[str, Any] = {
        "tests_forgeable_by_mutation": len(lines),
        "tasks_with_tests_forgeable_by_mutation": sum(1 for t in code if t.metadata.get(METADATA_KEY)),
    }
    if lines:
        report["forgeable_by_mutation"] = lines[:MAX_REPORTED] + (
            [f"... and {len(lines) - MAX_REPORTED} more"] if len(lines) > MAX_REPORTED else []
        )
    return report
