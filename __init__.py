"""posttrain: a platform for post-training large models.

One import package over the repository's top folders: ``posttrain.platform``,
``posttrain.preprocess``, ``posttrain.training`` and ``posttrain.ui``.
"""

import ast as _ast
import functools as _functools
import sys as _sys
import threading as _threading

__version__ = "0.1.0"


def _parse_one_thread_at_a_time() -> None:
    """CPython before 3.11.8 and 3.12.2 keeps the AST constructor's recursion depth in one process-wide
    counter, and a garbage collection inside it can switch threads: two threads parsing at once then
    fail with ``SystemError: AST constructor recursion depth mismatch`` (cpython gh-106905). Checks run
    in threads (VerifierService.verify_batch) and parse in many places (the code verifier's tests and
    reports through ``ast.literal_eval``, sympy under the math verifier), so on those versions every
    ``ast.parse`` in a process that imports posttrain takes turns (``literal_eval`` calls it too)."""
    affected = _sys.version_info < (3, 11, 8) or (3, 12) <= _sys.version_info < (3, 12, 2)
    if not affected or getattr(_ast.parse, "__posttrain_locked__", False):
        return
    bare, turn = _ast.parse, _threading.RLock()  # reentrant: a finalizer that parses may run inside a parse

    @_functools.wraps(bare)
    def parse(*args, **kwargs):
        with turn:
            return bare(*args, **kwargs)

    parse.__posttrain_locked__ = True  # type: ignore[attr-defined]
    _ast.parse = parse


_parse_one_thread_at_a_time()
