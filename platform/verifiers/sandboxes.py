"""The sandbox pool that verifiers run code in: one per process, started on first use.

The 'code' kind takes its pool from, in order: the caller's ``VerifyContext(sandbox_pool=...)``,
a pool installed with ``set_shared_pool`` (a training run that already owns one), or the
pool started here from the global settings (``settings.sandbox``: backend, pool size, limits;
its work directories go under ``settings.sandbox_root``). Example::

    from posttrain.platform.verifiers.sandboxes import shared_pool
    pool = shared_pool()          # started once, closed at exit
"""

from __future__ import annotations

import atexit
import threading
from typing import cast

from posttrain.platform.sandbox import SandboxPool, make_pool
from posttrain.platform.settings import get_settings

_lock = threading.Lock()
_pool: SandboxPool | None = None
_owned = False
_atexit_registered = False


def shared_pool() -> SandboxPool:
    """The process-wide pool; the first call starts it from the settings (and blocks until its
    sandboxes are warm). Raises ``SandboxUnavailableError`` / ``SandboxStartError`` when the
    host cannot run sandboxes; a later call tries again."""
    global _pool, _owned, _atexit_registered
    with _lock:
        if _pool is None:
            settings = get_settings()
            # a RaySandboxPool has SandboxPool's interface
            _pool = cast(SandboxPool, make_pool(settings.sandbox, settings.data_dir, settings.ray_address))
            _owned = True
            if not _atexit_registered:
                atexit.register(close_shared_pool)
                _atexit_registered = True
        return _pool


def set_shared_pool(pool: SandboxPool | None) -> SandboxPool | None:
    """Make ``pool`` the process-wide pool (the caller keeps owning it and closes it); ``None``
    goes back to a pool started from the settings on next use. Returns the previous pool, which
    is closed here if it was the one started from the settings."""
    global _pool, _owned
    with _lock:
        previous, owned = _pool, _owned
        _pool, _owned = pool, False
    if previous is not None and owned and previous is not pool:
        previous.close()
        return None
    return previous


def close_shared_pool() -> None:
    """Close the pool started from the settings (a pool set with ``set_shared_pool`` is only
    forgotten: its owner closes it)."""
    global _pool, _owned
    with _lock:
        pool, owned = _pool, _owned
        _pool, _owned = None, False
    if pool is not None and owned:
        pool.close()
