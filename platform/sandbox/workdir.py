"""A sandbox's work directory as a tmpfs of its own, mounted on the host at ``<slot>/work``.

Writing past ``work_size_mb`` fails inside the sandbox with ENOSPC, and nothing the sandbox writes
reaches the host's disk (where the database lives). The host keeps its view of the directory at the
same path, so a caller may lay files into it or read them back. Its pages count toward the sandbox's
memory budget (the cgroup charges whoever writes them).

Mounting needs root (CAP_SYS_ADMIN); :func:`tmpfs_support` says once whether this process may.
"""

from __future__ import annotations

import ctypes
import functools
import os
import tempfile
from pathlib import Path

MS_NOSUID = 0x2
MS_NODEV = 0x4
MNT_DETACH = 0x2


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def mount_tmpfs(path: Path, size_mb: int, owner: tuple[int, int] | None) -> None:
    """Mount a tmpfs of ``size_mb`` on ``path`` (owned by ``owner``); raises OSError."""
    options = f"size={size_mb}m,mode=0755"
    if owner is not None:
        options += f",uid={owner[0]},gid={owner[1]}"
    if _libc().mount(b"tmpfs", os.fsencode(path), b"tmpfs", MS_NOSUID | MS_NODEV, options.encode()) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"mounting a tmpfs on {path}: {os.strerror(code)}")


def unmount(path: Path) -> None:
    """Detach the mount on ``path``, if there is one (its files go once nothing holds them)."""
    _libc().umount2(os.fsencode(path), MNT_DETACH)


def unmount_stale(pool_prefixes: tuple[str, ...]) -> list[Path]:
    """Detach the work tmpfs of every sandbox whose pool's process is gone, wherever its data directory
    is: ``.../<prefix><pid>-*/slot-<n>/work`` (a pool killed with its process, a Ray actor or a verifier
    worker, leaves them mounted). Returns those pools' directories, for the caller to remove."""
    pools: list[Path] = []
    with open("/proc/self/mountinfo") as fh:
        mounts = [(line.split()[4].replace("\\040", " "), line.partition(" - ")[2].split()[0]) for line in fh]
    for point, fstype in mounts:
        work = Path(point)
        pool = work.parent.parent
        if fstype != "tmpfs" or work.name != "work" or not work.parent.name.startswith("slot-"):
            continue
        for prefix in pool_prefixes:
            pid = pool.name[len(prefix) :].split("-")[0] if pool.name.startswith(prefix) else ""
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                unmount(work)
                pools.append(pool)
    return pools


@functools.cache
def tmpfs_support() -> str | None:
    """None if this process can mount the work directories' tmpfs, else why not."""
    with tempfile.TemporaryDirectory(prefix="posttrain-mount-probe-") as where:
        try:
            mount_tmpfs(Path(where), 1, None)
        except OSError as exc:
            return f"mounting a tmpfs failed ({exc.strerror}): it needs root or CAP_SYS_ADMIN"
        unmount(Path(where))
    return None
