"""Start ``spawn`` processes safely from inside a Streamlit script (or any runner that swaps ``__main__``).

multiprocessing's spawn start method re-runs the parent's ``__main__`` script in every
child. Streamlit replaces ``sys.modules["__main__"]`` with the page being run, so a
process pool started from a console page would run that page again in each worker.
:func:`neutral_main` hides the script while the children start.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import types
from collections.abc import Iterator

_lock = threading.Lock()


@contextlib.contextmanager
def neutral_main() -> Iterator[None]:
    """While active, ``__main__`` is an empty module, so spawned children import nothing of the parent's script."""
    with _lock:
        main = sys.modules.get("__main__")
        script = getattr(main, "__file__", None) and getattr(getattr(main, "__spec__", None), "name", None) is None
        if script:
            sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            if script and main is not None:
                sys.modules["__main__"] = main
