"""Graded code in a child process; the tests that judge it in the parent, out of its reach. Standard library only.

The code verifier ships this module into a sandbox's episode interpreter (its source, or its bytecode
when the sandbox's Python reads ours) and drives it with two tool calls on one freshly reset sandbox:

1. ``start(source)``: the interpreter (the *parent*, which never runs graded code) forks a *child*, which
   closes every file descriptor but one socket to the parent (the sandbox's channel to the host among
   them), sends its output to /dev/null, and executes the graded program (prelude + completion). The
   parent sends nothing about the tests before this call: the child is forked from a process that has
   never held them, so nothing in its memory tells it what the tests expect.
2. ``run(tests_code, nonce, count, max_failures, names, entry)``: the parent executes the tests, rewritten
   so that each one records its own outcome, in a namespace of its own: the parent's builtins, the
   prompt's helpers (run from the task's clean copy as the tests' first statements), and of the program's
   names only ``names`` (its entry point, and what the tests read that nothing else defines), as proxies:
   calling one, reading an attribute or an item of one is a request to the child over the socket,
   answered with plain data. The parent's outcome lists go back to the host as the call's value; the
   host computes the score.

What the child can do to the result is answer requests: whatever it answers is what its functions
returned. It cannot write into the parent (the sandbox's interpreters are not dumpable, so no ptrace,
no /proc/<pid>/mem, no fd stealing), cannot reach the host's channel (closed in it), cannot change the
parent's builtins, modules or files it imports (the parent imports nothing from a writable directory),
and never learns the expected values unless a test passes them to it as arguments. Killing or stopping
the parent, or exiting itself, only costs it its own tests.

How values cross (:func:`encode`): ``None``, ``bool``, ``int``, ``float``, ``complex``, ``str``,
``bytes``, ``bytearray``, lists, tuples, dicts, sets and frozensets (recursively), ``Fraction`` and
``Decimal`` travel as data and are rebuilt in the parent as the builtin values they are (a subclass of
one, such as ``Counter``, a named tuple or an ``IntEnum``, as its builtin value). Anything else stays in
the child and reaches the parent as a :class:`Remote` handle whose calls, attributes, items, ``len``,
``bool``, ``str``, ``int``, ``float`` and iteration are requests to the child. Tests compare with the
parent's own operators, so they never run a method of the graded code's classes: a handle equals only
itself (``==`` is identity), and ordering or arithmetic on a handle is a ``TypeError``. An object that
"equals everything" therefore equals nothing but itself. A ``StopIteration`` the code raises answering any
request but ``next`` is an error of the code, never the end of the test's own loop (:meth:`Peer._error`). A list, dict, set or bytearray a test passes
to the child's function is updated in place afterwards when the function changed it; a function or
object of the tests passed to the child can be called back by it (and nothing else: no attribute of it
is readable from the child); a builtin function or type travels by name.
"""

from __future__ import annotations

import builtins
import os
import signal
import socket
import sys

if __package__:  # the host: the platform's own copy
    from posttrain.platform.sandbox import _wire
else:  # a sandbox: the copy its server loaded beside itself (platform/sandbox/_server.py)
    _wire = sys.modules["posttrain_wire"]
_send, _recv = _wire.send, _wire.recv

# The grader's own names for the builtins: graded code that patches the builtins module (in the child)
# does not change the functions that answer for it, and so does not lose answers it would have given.
globals().update({name: value for name, value in vars(builtins).items() if not name.startswith("__")})
MESSAGE_CHARS = 400
TRACE_CHARS = 1500
MAX_DEPTH = 200
BIG_INT = 1 << 63
PR_SET_PDEATHSIG = 1

_DATA_TYPES = (type(None), bool, int, float, str)
_LENT_OPS = frozenset(
    {"call", "list", "len", "bool", "str", "repr", "contains", "getitem", "next", "int", "index", "float"}
)
"""What the child may ask of an object the tests lent it (a call-back, a range): never its attributes."""


_ASKED = {
    "call": "a call",
    "getattr": "an attribute read",
    "setattr": "an attribute write",
    "getitem": "an item read",
    "setitem": "an item write",
    "delitem": "an item deletion",
    "contains": "an `in` test",
    "len": "len()",
    "bool": "bool()",
    "list": "iteration",
    "str": "str()",
    "repr": "repr()",
    "int": "int()",
    "index": "an index",
    "float": "float()",
}
"""What each request is, in the message of an error raised while answering it."""


class SolutionError(Exception):
    """The graded code raised an exception of its own class, or answered in a way the tests cannot read."""


class SolutionExit(Exception):
    """The graded code raised SystemExit (or another BaseException that is not an Exception) inside a test."""


class SolutionDied(Exception):
    """The child ended (exit, signal) or closed its socket: this and every later request fails."""


class _TooDeep(Exception):
    pass


# --------------------------------------------------------------------------- values


class Remote:
    """An object of the other process. In the parent: the graded code's object; every use of it below is
    a request to the child. Equality is identity and there is no ordering or arithmetic, so that a test's
    comparison never runs a method of the graded code."""

    __slots__ = ("_pt_peer", "_pt_id", "_pt_name", "__weakref__")

    def __init__(self, peer: Peer, ident: int, name: str) -> None:
        object.__setattr__(self, "_pt_peer", peer)
        object.__setattr__(self, "_pt_id", ident)
        object.__setattr__(self, "_pt_name", name)

    def _pt_ask(self, op: str, **args: object) -> object:
        return self._pt_peer.request({"op": op, "h": self._pt_id, **args})  # type: ignore[attr-defined]

    def __call__(self, *args: object, **kwargs: object) -> object:
        return self._pt_peer.call(self._pt_id, args, kwargs)  # type: ignore[attr-defined]

    def __getattr__(self, name: str) -> object:
        if name.startswith("__") and name.endswith("__") or name.startswith("_pt_"):
            raise AttributeError(name)
        return self._pt_ask("getattr", n=name)

    def __setattr__(self, name: str, value: object) -> None:
        if name.startswith("_pt_"):
            raise AttributeError(name)
        self._pt_ask("setattr", n=name, v=self._pt_peer.encode(value))  # type: ignore[attr-defined]

    def __getitem__(self, key: object) -> object:
        return self._pt_ask("getitem", k=self._pt_peer.encode(key))  # type: ignore[attr-defined]

    def __setitem__(self, key: object, value: object) -> None:
        self._pt_ask("setitem", k=self._pt_peer.encode(key), v=self._pt_peer.encode(value))  # type: ignore[attr-defined]

    def __delitem__(self, key: object) -> None:
        self._pt_ask("delitem", k=self._pt_peer.encode(key))  # type: ignore[attr-defined]

    def __contains__(self, item: object) -> bool:
        return _expect(self._pt_ask("contains", v=self._pt_peer.encode(item)), bool, "in")  # type: ignore[attr-defined, return-value]

    def __len__(self) -> int:
        value = _expect(self._pt_ask("len"), int, "len()")
        if value < 0:  # type: ignore[operator]
            raise ValueError("__len__() should return >= 0")
        return value  # type: ignore[return-value]

    def __bool__(self) -> bool:
        return _expect(self._pt_ask("bool"), bool, "bool()")  # type: ignore[return-value]

    def __iter__(self):
        return iter(_expect(self._pt_ask("list"), list, "iter()"))

    def __next__(self) -> object:
        return self._pt_ask("next")

    def __str__(self) -> str:
        return _expect(self._pt_ask("str"), str, "str()")  # type: ignore[return-value]

    def __repr__(self) -> str:
        return _expect(self._pt_ask("repr"), str, "repr()")  # type: ignore[return-value]

    def __int__(self) -> int:
        return _expect(self._pt_ask("int"), int, "int()")  # type: ignore[return-value]

    def __index__(self) -> int:
        return _expect(self._pt_ask("index"), int, "an index")  # type: ignore[return-value]

    def __float__(self) -> float:
        return _expect(self._pt_ask("float"), float, "float()")  # type: ignore[return-value]

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    __hash__ = object.__hash__

    def __copy__(self) -> Remote:
        return self

    def __deepcopy__(self, memo: object) -> Remote:
        return self

    def __reduce_ex__(self, protocol: object) -> object:  # type: ignore[override]  # it only raises
        raise TypeError(f"cannot pickle {self._pt_name}, an object of the graded code")


def _expect(value: object, kind: type, what: str) -> object:
    if type(value) is not kind:
        raise TypeError(f"{what} of an object of the graded code gave a {type(value).__name__}, not a {kind.__name__}")
    return value


_BASES = (
    (int, lambda x: int.__add__(x, 0)),
    (float, float.__float__),
    (str, lambda x: str.__getitem__(x, slice(None))),
    (list, list.copy),
    (tuple, lambda x: tuple.__getitem__(x, slice(None))),
    (dict, dict.copy),
    (frozenset, frozenset.copy),
    (set, set.copy),
    (bytes, lambda x: bytes.__getitem__(x, slice(None))),
    (bytearray, bytearray.copy),
    (complex, lambda x: complex.__add__(x, 0)),
)


class Peer:
    """One end of the socket between parent and child: requests, answers, and the two tables of objects
    that cross by reference (``local``: ours, lent to the other side; ``remotes``: the other side's)."""

    def __init__(self, sock: socket.socket, *, parent: bool, pid: int = 0) -> None:
        self.sock = sock
        self.parent = parent
        self.pid = pid
        self.local: list[object] = []
        self.local_ids: dict[int, int] = {}
        self.remotes: dict[int, Remote] = {}
        self.death: str | None = None

    # -------------------------------------------------------------- encoding
    def encode(self, value: object, depth: int = 0) -> object:
        t = type(value)
        if t in _DATA_TYPES:
            if t is int and not -BIG_INT < value < BIG_INT:  # type: ignore[operator]
                return {"I": format(value, "x")}
            return value
        if depth > MAX_DEPTH:
            raise _TooDeep()
        if t is list:
            return {"L": [self.encode(v, depth + 1) for v in value]}  # type: ignore[attr-defined]
        if t is tuple:
            return {"T": [self.encode(v, depth + 1) for v in value]}  # type: ignore[attr-defined]
        if t is dict:
            return {"D": [[self.encode(k, depth + 1), self.encode(v, depth + 1)] for k, v in value.items()]}  # type: ignore[attr-defined]
        if t is set:
            return {"S": [self.encode(v, depth + 1) for v in value]}  # type: ignore[attr-defined]
        if t is frozenset:
            return {"F": [self.encode(v, depth + 1) for v in value]}  # type: ignore[attr-defined]
        if t is bytes:
            return {"B": value.hex()}  # type: ignore[attr-defined]
        if t is bytearray:
            return {"A": value.hex()}  # type: ignore[attr-defined]
        if t is complex:
            return {"C": [value.real, value.imag]}  # type: ignore[attr-defined]
        if t is Remote and value._pt_peer is self:  # type: ignore[attr-defined]
            return {"Y": value._pt_id}  # type: ignore[attr-defined]
        module, name = getattr(t, "__module__", ""), getattr(t, "__qualname__", "")
        if module == "fractions" and name == "Fraction":
            return {"Q": [int(value.numerator), int(value.denominator)]}  # type: ignore[attr-defined]
        if module == "decimal" and name == "Decimal":
            return {"E": str(value)}
        for base, convert in _BASES:
            if issubclass(t, base):  # a subclass of a builtin value (Counter, a named tuple): travels as that value
                return self.encode(convert(value), depth)  # type: ignore[arg-type]  # an instance of base
        if (
            self.parent
            and isinstance(value, (type, type(len)))
            and getattr(builtins, getattr(value, "__name__", ""), None) is value
        ):
            return {"G": value.__name__}  # type: ignore[union-attr]  # a builtin function or type: the child uses its own
        return {"H": self._lend(value), "n": _describe(value)}

    def encode_value(self, value: object) -> object:
        """``encode``, with a value too deep or cyclic to copy lent by reference instead."""
        try:
            return self.encode(value)
        except (_TooDeep, RecursionError):
            return {"H": self._lend(value), "n": _describe(value)}

    def _lend(self, value: object) -> int:
        ident = self.local_ids.get(id(value))
        if ident is None or self.local[ident] is not value:
            ident = len(self.local)
            self.local.append(value)
            self.local_ids[id(value)] = ident
        return ident

    def decode(self, obj: object) -> object:
        if type(obj) in _DATA_TYPES:
            return obj
        if type(obj) is list or type(obj) is not dict or len(obj) not in (1, 2):
            raise ValueError("not a value")
        (tag, body), *rest = obj.items()
        if tag == "L":
            return [self.decode(v) for v in _list(body)]
        if tag == "T":
            return tuple(self.decode(v) for v in _list(body))
        if tag == "D":
            out = {}
            for pair in _list(body):
                if type(pair) is not list or len(pair) != 2:
                    raise ValueError("not a dict item")
                out[self.decode(pair[0])] = self.decode(pair[1])
            return out
        if tag == "S":
            return {self.decode(v) for v in _list(body)}
        if tag == "F":
            return frozenset(self.decode(v) for v in _list(body))
        if tag == "B":
            return bytes.fromhex(_str(body))
        if tag == "A":
            return bytearray.fromhex(_str(body))
        if tag == "I":
            return int(_str(body), 16)
        if tag == "C":
            real, imag = _list(body)
            if type(real) is not float or type(imag) is not float:
                raise ValueError("not a complex")
            return complex(real, imag)
        if tag == "Q":
            num, den = _list(body)
            if type(num) is not int or type(den) is not int:
                raise ValueError("not a fraction")
            from fractions import Fraction  # sandbox side: only for a value of that type

            return Fraction(num, den)
        if tag == "E":
            from decimal import Decimal  # sandbox side: only for a value of that type

            return Decimal(_str(body))
        if tag == "Y":
            if type(body) is not int or not 0 <= body < len(self.local):
                raise ValueError("no such object")
            return self.local[body]
        if tag == "H":
            if type(body) is not int or body < 0:
                raise ValueError("not a handle")
            remote = self.remotes.get(body)
            if remote is None:
                remote = self.remotes[body] = Remote(self, body, str(obj.get("n", "object"))[:80])
            return remote
        if tag == "G" and not self.parent:  # the parent never takes a builtin by name from the child
            found = getattr(builtins, _str(body), None)
            if found is None:
                raise ValueError("no such builtin")
            return found
        raise ValueError(f"unknown tag {tag!r}")

    # -------------------------------------------------------------- requests
    def call(self, ident: int, args: tuple, kwargs: dict) -> object:
        encoded = [self.encode_value(a) for a in args]
        named = [[str(k), self.encode_value(v)] for k, v in kwargs.items()]
        reply = self._exchange({"op": "call", "h": ident, "a": encoded, "k": named})
        for item in reply.get("w") or []:  # arguments the callee changed in place
            self._write_back(args, item)
        return self._value(reply)

    def request(self, message: dict) -> object:
        return self._value(self._exchange(message))

    def _value(self, reply: dict) -> object:
        try:
            return self.decode(reply["ok"])
        except Exception as error:  # noqa: BLE001 - whatever the child sent, it is no value
            raise SolutionError(
                f"the graded code answered with a value the tests cannot read ({type(error).__name__}: {error})"[
                    :MESSAGE_CHARS
                ]
            ) from None

    def _write_back(self, args: tuple, item: object) -> None:
        if type(item) is not list or len(item) != 2 or type(item[0]) is not int or not 0 <= item[0] < len(args):
            raise SolutionError("the graded code answered with an argument update the tests cannot read")
        target = args[item[0]]
        try:
            new = self.decode(item[1])
        except Exception as error:  # noqa: BLE001
            raise SolutionError(
                f"the graded code changed an argument into a value the tests cannot read ({error})"
            ) from None
        if type(target) is list and type(new) is list:
            target[:] = new
        elif type(target) is dict and type(new) is dict:
            target.clear()
            target.update(new)
        elif type(target) is set and type(new) is set:
            target.clear()
            target.update(new)
        elif type(target) is bytearray and type(new) is bytearray:
            target[:] = new

    def _exchange(self, message: dict) -> dict:
        """Send a request, serve the other side's requests (call-backs) until its answer arrives."""
        if self.death is not None:
            raise SolutionDied(self.death)
        try:
            _send(self.sock, message)
        except OSError:
            raise SolutionDied(self._died()) from None
        while True:
            reply = self._receive()
            if "op" in reply:
                self._send_answer(self.serve_one(reply))
                continue
            if "err" in reply:
                raise self._error(reply["err"], message["op"])
            if "ok" not in reply:
                raise self._broken("an answer without a value")
            return reply

    def _receive(self) -> dict:
        try:
            reply = _recv(self.sock)
        except OSError:
            reply = None
        except (ValueError, RecursionError, MemoryError) as error:
            raise self._broken(f"a message that does not parse ({type(error).__name__})") from None
        if reply is None:
            raise SolutionDied(self._died())
        if type(reply) is not dict:
            raise self._broken("a message that is not an object")
        return reply

    def _send_answer(self, answer: dict) -> None:
        try:
            _send(self.sock, answer)
        except OSError:
            raise SolutionDied(self._died()) from None
        except ValueError as error:  # too big: say so instead
            _send(self.sock, {"err": {"t": "MemoryError", "m": "builtins", "s": str(error)}})

    def _broken(self, why: str) -> SolutionDied:
        self.death = f"the code broke the channel to the tests: {why}"
        self._stop_child()
        return SolutionDied(self.death)

    def _died(self) -> str:
        if self.death is None:
            self.death = "the code ended its interpreter" + self._exit_status()
        return self.death

    def _exit_status(self) -> str:
        if not self.parent or not self.pid:
            return ""
        for _ in range(200):
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return ""
            if pid:
                self.pid = 0
                if os.WIFSIGNALED(status):
                    return f" (killed by signal {os.WTERMSIG(status)})"
                return f" (exit status {os.waitstatus_to_exitcode(status)})"
            import time  # sandbox side: only while waiting for the child

            time.sleep(0.001)
        return " (it closed its end of the channel)"

    def _stop_child(self) -> None:
        if self.parent and self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except OSError:
                pass

    def _error(self, err: object, op: str) -> BaseException:
        """The exception the other side's answer to request ``op`` stands for, raised in the asker.

        A builtin exception is rebuilt as itself (a test may expect a ``ValueError``), except the two that end the
        asker's loop: a ``StopIteration`` (or ``StopAsyncIteration``) raised while answering any request but
        ``next`` would end the test's own ``map``, ``filter``, ``zip`` or ``next(it, default)`` (``all(map(lambda
        x: f(x)[0] == x, xs))`` true at once), so it is an error of the code instead, as PEP 479 makes it in a
        generator. From ``next`` it is what it means in Python, the end of the code's iterator."""
        if type(err) is not dict:
            return self._broken("an error that is not an object")
        name, module, text = (
            str(err.get("t", "Exception"))[:80],
            str(err.get("m", "")),
            str(err.get("s", ""))[:MESSAGE_CHARS],
        )
        trace = str(err.get("tb", ""))[-TRACE_CHARS:]
        found = getattr(builtins, name, None) if module == "builtins" else None
        error: BaseException | None = None
        if found is StopAsyncIteration or found is StopIteration and op != "next":
            error = SolutionError(f"the code raised {name} from {_ASKED.get(op, op)}")
        elif isinstance(found, type) and issubclass(found, BaseException):
            if not issubclass(found, Exception):
                error = SolutionExit(
                    f"the code raised {name}({text}) inside the test"
                    if text
                    else f"the code raised {name} inside the test"
                )
            else:
                try:
                    error = found(text) if text else found()
                except Exception:  # noqa: BLE001 - a builtin whose constructor wants other arguments
                    error = None
        if error is None:
            error = SolutionError(f"{name}: {text}" if text else name)
        if trace:
            error.__notes__ = [trace]
        return error

    # -------------------------------------------------------------- serving
    def serve_one(self, message: dict) -> dict:
        """The answer to one request of the other side."""
        try:
            op, ident = message.get("op"), message.get("h")
            if type(ident) is not int or not 0 <= ident < len(self.local):
                raise ValueError("no such object")
            target = self.local[ident]
            if self.parent and op not in _LENT_OPS:  # no attribute of the tests' objects is the child's to read
                raise PermissionError(f"the graded code may not {op} an object of the tests")
            if op == "call":
                args = [self.decode(a) for a in _list(message.get("a"))]
                kwargs = {}
                for pair in _list(message.get("k") or []):
                    key, value = _list(pair)
                    kwargs[_str(key)] = self.decode(value)
                before = [self.encode_value(a) if type(a) in (list, dict, set, bytearray) else None for a in args]
                result = target(*args, **kwargs)  # type: ignore[operator]
                answer: dict = {"ok": self.encode_value(result)}
                changed = []
                for i, a in enumerate(args):
                    if before[i] is not None:
                        after = self.encode_value(a)
                        if after != before[i]:
                            changed.append([i, after])
                if changed:
                    answer["w"] = changed
                return answer
            if op == "getattr":
                result = getattr(target, _str(message.get("n")))
            elif op == "setattr":
                setattr(target, _str(message.get("n")), self.decode(message.get("v")))
                result = None
            elif op == "getitem":
                result = target[self.decode(message.get("k"))]  # type: ignore[index]
            elif op == "setitem":
                target[self.decode(message.get("k"))] = self.decode(message.get("v"))  # type: ignore[index]
                result = None
            elif op == "delitem":
                del target[self.decode(message.get("k"))]  # type: ignore[attr-defined]
                result = None
            elif op == "contains":
                result = self.decode(message.get("v")) in target  # type: ignore[operator]
            elif op == "len":
                result = len(target)  # type: ignore[arg-type]
            elif op == "bool":
                result = bool(target)
            elif op == "list":
                result = list(target)  # type: ignore[call-overload]
            elif op == "next":
                result = next(target)  # type: ignore[call-overload]
            elif op == "str":
                result = str(target)
            elif op == "repr":
                result = repr(target)
            elif op == "int":
                result = int(target)  # type: ignore[call-overload]
            elif op == "index":
                result = target.__index__()  # type: ignore[attr-defined]
            elif op == "float":
                result = float(target)  # type: ignore[arg-type]
            else:
                raise ValueError(f"unknown request {op!r}")
            return {"ok": self.encode_value(result)}
        except SolutionDied:
            raise
        except BaseException as error:  # noqa: BLE001 - anything the code raises is its answer
            if type(error).__name__ == "CallTimeout":  # the sandbox's time limit: it ends the whole run
                raise
            return {"err": _describe_error(error)}


def _list(obj: object) -> list:
    if type(obj) is not list:
        raise ValueError("not a list")
    return obj


def _str(obj: object) -> str:
    if type(obj) is not str:
        raise ValueError("not a string")
    return obj


def _describe(value: object) -> str:
    try:
        name = getattr(value, "__qualname__", None) or type(value).__qualname__
        return str(name)[:80]
    except BaseException:  # noqa: BLE001
        return "object"


def _describe_error(error: BaseException) -> dict:
    try:
        kind = type(error)
        text = str(error)[:MESSAGE_CHARS]
    except BaseException:  # noqa: BLE001 - a __str__ that raises
        text = ""
    out = {"t": kind.__name__, "m": getattr(kind, "__module__", ""), "s": text}
    try:
        import traceback  # sandbox side: inside the guard

        lines = traceback.format_exception(kind, error, error.__traceback__)
        trace = "".join(line for line in lines if "<solution>" in line)
        if trace:
            out["tb"] = trace[-TRACE_CHARS:]
    except BaseException:  # noqa: BLE001
        pass
    return out


# --------------------------------------------------------------------------- the child


def _child(sock: socket.socket, source: str, path: list[str]) -> None:
    """Run the graded program, report its names, then answer the parent's requests until it is gone."""
    code = 70
    try:
        keep = sock.fileno()
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(null, 2)
        os.closerange(3, keep)  # the sandbox's channel to the host among them
        os.closerange(keep + 1, 1 << 16)
        signal.setitimer(signal.ITIMER_REAL, 0)
        for sig in (signal.SIGALRM, signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        try:
            import ctypes  # may be missing in a sandbox: inside the try

            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except Exception:  # noqa: BLE001 - the parent's death also closes the socket
            pass
        sys.path[:] = path
        peer = Peer(sock, parent=False)
        program: dict = {"__name__": "__main__", "__builtins__": builtins}
        status: dict = {}
        try:
            compiled = compile(source, "<solution>", "exec")
        except BaseException as error:  # noqa: BLE001
            status = {"error": "the code does not compile: " + _why(error)}
        else:
            try:
                exec(compiled, program)  # noqa: S102 - the graded code, alone in this process
            except SystemExit as error:
                status = {"exit": _why(error)}
            except BaseException as error:  # noqa: BLE001
                trace = _describe_error(error).get("tb", "")
                status = {"error": ("the code raised " + _why(error) + ("\n" + trace if trace else ""))[:2000]}
        names = []
        if "error" not in status:
            for name, value in list(program.items()):
                if type(name) is str and not name.startswith("__"):
                    try:
                        names.append([name, peer.encode_value(value)])
                    except Exception:  # noqa: BLE001 - a value that cannot even be described is left out
                        continue
        try:
            _send(sock, {"ready": status, "names": names})
        except ValueError:  # too big to copy: every name by reference
            lent = [[name, {"H": peer._lend(program[name]), "n": _describe(program[name])}] for name, _ in names]
            _send(sock, {"ready": status, "names": lent})
        while True:
            message = _recv(sock)
            if message is None:
                break
            if type(message) is not dict or "op" not in message:
                continue  # a stray answer: the parent asked nothing
            answer = peer.serve_one(message)
            try:
                _send(sock, answer)
            except ValueError as error:
                _send(sock, {"err": {"t": "MemoryError", "m": "builtins", "s": str(error)}})
        code = 0
    except BaseException:  # noqa: BLE001
        pass
    finally:
        os._exit(code)


def _why(error: BaseException) -> str:
    try:
        if isinstance(error, SystemExit):
            return f"the code called sys.exit({error.code!r})"
        text = str(error)
        return (type(error).__name__ + (": " + text if text else ""))[:MESSAGE_CHARS]
    except BaseException:  # noqa: BLE001
        return type(error).__name__


# --------------------------------------------------------------------------- the parent

STATE: dict = {}


def _trusted_path(path: list[str]) -> list[str]:
    """``sys.path`` without the directories the graded code can write (the work directory, /tmp): the
    parent must never import a module the child wrote."""
    kept = []
    for entry in path:
        if not entry or entry == ".":
            continue
        try:
            writable = os.access(entry, os.W_OK)
        except (OSError, ValueError):
            writable = True
        if not writable:
            kept.append(entry)
    return kept


def start(source: str) -> tuple:
    """Fork the child that runs ``source`` and return at once (``("started", None)``): the child runs
    while the host sends the tests."""
    path = list(sys.path)
    sys.path[:] = _trusted_path(path)
    import gc  # sandbox side: after sys.path is trimmed

    gc.freeze()  # the child's collections then leave the parent's objects (and their pages) alone
    mine, theirs = socket.socketpair()
    pid = os.fork()
    if pid == 0:
        mine.close()
        _child(theirs, source, path)  # never returns
    theirs.close()
    STATE.clear()
    STATE.update(peer=Peer(mine, parent=True, pid=pid), names={})
    return ("started", None)


def _ready() -> tuple:
    """Wait for the child's report of its start: ``("ready", note)``, ``("error", message)`` or
    ``("died", message)``; the program's names go into ``STATE`` as sent (decoded only when the tests take one)."""
    peer: Peer = STATE["peer"]
    try:
        message = _recv(peer.sock)
    except OSError:
        message = None
    except (ValueError, RecursionError, MemoryError) as error:
        peer._broken(f"a report that does not parse ({type(error).__name__})")
        return ("error", "the code broke the channel to the tests before they ran")
    if message is None:
        return ("died", peer._died())
    if type(message) is not dict or type(message.get("ready")) is not dict or type(message.get("names")) is not list:
        peer._broken("a report of the wrong shape")
        return ("error", "the code broke the channel to the tests before they ran")
    status = message["ready"]
    if "error" in status:
        peer._stop_child()
        return ("error", str(status["error"])[:2000])
    STATE["names"] = {
        item[0]: item[1]
        for item in message["names"]
        if type(item) is list and len(item) == 2 and type(item[0]) is str and not item[0].startswith("__")
    }
    return ("ready", str(status["exit"])[:MESSAGE_CHARS] if "exit" in status else None)


def run(tests: object, nonce: str, count: int, max_failures: int, names: list[str], entry: str | None) -> tuple:
    """Run the rewritten tests (code object or source) against the child; the raw outcomes for the host:
    ``(nonce, count, passed, failures, state)``, or the start's ``(kind, message)`` when it did not start.

    The tests' namespace holds this interpreter's own builtins (the child cannot change them) and, of the
    program's names, only ``names``: the entry point, and what the tests read that nothing else defines.
    A name that is one of the builtins or a standard-library module is never taken from the program, unless it is
    the entry point itself: the tests import such a module themselves (the plan adds the import where they read it
    without one)."""
    started = _ready()
    if started[0] != "ready":
        return started
    peer: Peer = STATE["peer"]
    ok: list[int] = []
    failures: dict[int, str] = {}
    state: dict = {"abort": None, "died": None, "exit": started[1]}

    def passed(index: int) -> None:
        ok.append(index)

    def failed(index: int, error: BaseException) -> None:
        failures[index] = _why(error) if len(failures) < max_failures else ""

    namespace = {"__name__": "__main__", "__builtins__": builtins}
    for name in names:
        if name in STATE["names"] and (
            name == entry or not (hasattr(builtins, name) or name in sys.stdlib_module_names)
        ):
            try:
                namespace[name] = peer.decode(STATE["names"][name])
            except Exception:  # noqa: BLE001 - a name whose value does not parse is not defined
                continue
    namespace.update(
        __pt_caught=(Exception, SystemExit), __pt_passed=passed, __pt_failed=failed, __pt_state=state, __pt_why=_why
    )
    code = compile(tests, "<tests>", "exec") if isinstance(tests, str) else tests
    exec(code, namespace)  # type: ignore[arg-type]  # noqa: S102 - the task's own tests: a code object or compiled here
    state["died"] = peer.death
    peer._stop_child()
    return (nonce, count, ok, failures, state)
